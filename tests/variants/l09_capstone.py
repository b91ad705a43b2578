"""Wrong answers to lesson 09's exercises that the graders must reject."""

LESSON = "09-capstone"

_TRAIN_COMPARE_HEAD = """
def train_compare(model_fn, data, epochs, device_type, amp_dtype, seed, lr=0.05, batch_size=64):
    x_train, y_train, x_test, y_test = data
    out = {}
"""

_TRAIN_COMPARE_RUN = """
        model = model_fn().to(x_train.device)
        optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
        scaler = torch.amp.GradScaler(device_type, enabled=amp and amp_dtype == torch.float16)
        losses = []
        for _ in range(epochs):
            total, batches = 0.0, 0
            for i in range(0, len(x_train), batch_size):
                xb, yb = x_train[i:i + batch_size], y_train[i:i + batch_size]
                with torch.autocast(device_type, dtype=amp_dtype, enabled=AUTOCAST_ON):
                    loss = F.cross_entropy(model(xb), yb)
                optimizer.zero_grad()
                scaler.scale(loss).backward()
                scaler.step(optimizer)
                scaler.update()
                total += loss.item()
                batches += 1
            losses.append(total / batches)
        with torch.no_grad(), torch.autocast(device_type, dtype=amp_dtype, enabled=AUTOCAST_ON):
            correct = (model(x_test).argmax(dim=1) == y_test).sum().item()
        out[f"{name}_acc"] = correct / len(y_test)
        out[f"{name}_losses"] = losses
    out["difference"] = out["fp32_acc"] - out["amp_acc"]
    return out
"""

_SCALING_HEAD = """
class DelayedScaling:
    def __init__(self, fmt=torch.float8_e4m3fn, history_len=16, margin=0):
        self.fmt = fmt
        self.history_len = history_len
        self.margin = margin
        self.fmax = float(torch.finfo(fmt).max)
        self.amax_history = []

    def dequantize(self, x_fp8, scale):
        return x_fp8.float() / scale
"""

VARIANTS = {
    # Seeds once for both runs: the AMP run starts from different initial weights.
    "train_compare_seeds_once": (
        "train_compare",
        _TRAIN_COMPARE_HEAD
        + "    torch.manual_seed(seed)\n"
        + '    for name, amp in (("fp32", False), ("amp", True)):'
        + _TRAIN_COMPARE_RUN.replace("AUTOCAST_ON", "amp"),
    ),
    # The "AMP" run never enables autocast (it only switches the scaler on for float16).
    "train_compare_no_autocast": (
        "train_compare",
        _TRAIN_COMPARE_HEAD
        + '    for name, amp in (("fp32", False), ("amp", True)):\n'
        + "        torch.manual_seed(seed)"
        + _TRAIN_COMPARE_RUN.replace("AUTOCAST_ON", "False"),
    ),
    # Updates the history with this tensor's amax before computing the scale ("current scaling").
    "scaling_updates_history_first": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[:-self.history_len]
        top = max(self.amax_history)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        return x_fp8, scale
""",
    ),
    # Relies on the cast to saturate: true for e4m3fn on torch 2.13's CPU, but e5m2 becomes inf.
    "scaling_lets_e5m2_overflow": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).to(self.fmt)
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[:-self.history_len]
        return x_fp8, scale
""",
    ),
}
