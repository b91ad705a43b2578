"""Wrong answers to lesson 09's exercises that the graders must reject, and valid alternatives
that must keep full marks."""

LESSON = "09-capstone"

_COMPARE_HEAD = """
def train_compare(model_fn, data, steps, device_type, amp_dtype, seed, lr=1e-3, batch_size=8):
    train_tokens, val_tokens = data
    dev = train_tokens.device
    out = {}
"""

# One run; SEED_HERE, SCALER_ON, TRAIN_AUTOCAST, EVAL_TOKENS are replaced per variant.
_COMPARE_RUN = """
        SEED_HERE
        model = model_fn().to(dev)
        block = model.config.block_size
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device_type, enabled=SCALER_ON)
        batches = random_batches(train_tokens, batch_size, block, seed, device=dev)
        losses = []
        for _ in range(steps):
            x, y = next(batches)
            with torch.autocast(device_type, dtype=amp_dtype, enabled=TRAIN_AUTOCAST):
                loss = lm_loss(model(x), y)
            optimizer.zero_grad()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            losses.append(loss.item())
        xv, yv = val_batch(EVAL_TOKENS, block, device=dev)
        with torch.no_grad(), torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
            out[f"{name}_val_loss"] = lm_loss(model(xv), yv).item()
        out[f"{name}_losses"] = losses
    out["difference"] = out["amp_val_loss"] - out["fp32_val_loss"]
    return out
"""

_RIGHT = {
    "SEED_HERE": "torch.manual_seed(seed)",
    "SCALER_ON": "amp and amp_dtype == torch.float16",
    "TRAIN_AUTOCAST": "amp",
    "EVAL_TOKENS": "val_tokens",
}


def _compare(seed_once: bool = False, **changes: str) -> str:
    run = _COMPARE_RUN
    for key, value in {**_RIGHT, **changes}.items():
        run = run.replace(key, value)
    loop = '    for name, amp in (("fp32", False), ("amp", True)):'
    if seed_once:
        return (
            _COMPARE_HEAD
            + "    torch.manual_seed(seed)\n"
            + loop
            + run.replace("        torch.manual_seed(seed)\n", "", 1)
        )
    return _COMPARE_HEAD + loop + run


_FLOPS_HEAD = """
def transformer_flops(config, tokens):
    d, t, L = config.d_model, config.block_size, config.n_layer
"""

VARIANTS = {
    # Seeds once for both runs: the AMP run starts from different initial weights.
    "train_compare_seeds_once": ("train_compare", _compare(seed_once=True)),
    # float16 without a GradScaler: small gradients underflow to zero in float16.
    "train_compare_no_scaler_in_fp16": ("train_compare", _compare(SCALER_ON="False")),
    # Autocast only at evaluation: the "AMP" run trains in fp32.
    "train_compare_autocast_only_at_eval": ("train_compare", _compare(TRAIN_AUTOCAST="False")),
    # Validation loss on the training text: measures memorisation, not generalisation.
    "train_compare_evaluates_on_train": ("train_compare", _compare(EVAL_TOKENS="train_tokens")),
    # Computes the loss outside autocast: the 16-bit logits go into cross-entropy as they are, so
    # the loss (and its gradient) is computed in 16 bits instead of autocast's float32.
    "train_compare_loss_outside_autocast": (
        "train_compare",
        _compare().replace(
            "                loss = lm_loss(model(x), y)\n",
            "                logits = model(x)\n            loss = lm_loss(logits, y)\n",
        ),
    ),
    # Evaluates the AMP run in float32: the validation loss is not the mixed-precision model's.
    "train_compare_evaluates_amp_in_fp32": (
        "train_compare",
        _compare().replace(
            "dtype=amp_dtype, enabled=amp):\n            out[", "enabled=False):\n            out["
        ),
    ),
    # Counts the forward pass only: training also runs backward, 2x the forward.
    "flops_forgets_backward": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 4 * t * d
    return tokens * (L * per_layer + 2 * d * config.vocab_size)
""",
    ),
    # Counts the projections but not attention's score and value matmuls.
    "flops_forgets_attention": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff)
    return 3 * tokens * (L * per_layer + 2 * d * config.vocab_size)
""",
    ),
    # Counts the tied matrix twice, as if the embedding lookup were a matmul as well.
    "flops_counts_tied_head_twice": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 4 * t * d
    return 3 * tokens * (L * per_layer + 2 * 2 * d * config.vocab_size)
""",
    ),
    # Halves attention's score and value matmuls for the causal mask, against the stated
    # convention (the full context is counted).
    "flops_causal_half_attention": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 2 * t * d
    return 3 * tokens * (L * per_layer + 2 * d * config.vocab_size)
""",
    ),
    # Adds the embedding lookups as matmuls (token and position), against the stated convention.
    "flops_counts_position_embedding": (
        "transformer_flops",
        _FLOPS_HEAD
        + """
    per_layer = 2 * (4 * d * d + 2 * d * config.d_ff) + 4 * t * d
    return 3 * tokens * (L * per_layer + 2 * d * config.vocab_size + 2 * d * t)
""",
    ),
    # Measures instead of deriving: the course's own FlopCounterMode count gives the right number,
    # so only the hidden tests' refusal of FlopCounterMode tells it apart.
    "flops_measured_with_the_course_counter": (
        "transformer_flops",
        """
from course.benchmark import count_gpt_flops


def transformer_flops(config, tokens):
    return int(count_gpt_flops(config, tokens // config.block_size))
""",
    ),
}

VALID = {
    # One helper per run, plain backward when the scaler is off, set_to_none spelled out, the
    # loss through F.cross_entropy directly: the same computation, written differently.
    "train_compare_helper_per_run": (
        "train_compare",
        """
def train_compare(model_fn, data, steps, device_type, amp_dtype, seed, lr=1e-3, batch_size=8):
    train_tokens, val_tokens = data

    def run(amp):
        torch.manual_seed(seed)
        model = model_fn().to(train_tokens.device)
        block = model.config.block_size
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        use_scaler = amp and amp_dtype == torch.float16
        scaler = torch.amp.GradScaler(device_type, enabled=use_scaler)
        stream = random_batches(train_tokens, batch_size, block, seed, device=train_tokens.device)
        losses = []
        for _, (x, y) in zip(range(steps), stream):
            with torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
                logits = model(x)
                loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            if use_scaler:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            losses.append(loss.item())
        model.eval()
        xv, yv = val_batch(val_tokens, block, device=val_tokens.device)
        with torch.no_grad():
            with torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
                val = float(lm_loss(model(xv), yv))
        return val, losses

    fp32_val, fp32_losses = run(False)
    amp_val, amp_losses = run(True)
    return {"fp32_val_loss": fp32_val, "amp_val_loss": amp_val,
            "difference": amp_val - fp32_val,
            "fp32_losses": fp32_losses, "amp_losses": amp_losses}
""",
    ),
    # The two runs as data (a settings table), torch.amp.autocast spelled out, the scaler always
    # built and switched by `enabled`, evaluation in eval() mode: again the same computation.
    "train_compare_settings_table": (
        "train_compare",
        """
def train_compare(model_fn, data, steps, device_type, amp_dtype, seed, lr=1e-3, batch_size=8):
    train_tokens, val_tokens = data
    device = train_tokens.device
    settings = {"fp32": dict(autocast=False, scale=False),
                "amp": dict(autocast=True, scale=amp_dtype == torch.float16)}
    result = {}
    for name, s in settings.items():
        torch.manual_seed(seed)
        model = model_fn().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device_type, enabled=s["scale"])
        batches = iter(random_batches(train_tokens, batch_size, model.config.block_size, seed,
                                      device=device))
        history = []
        for _ in range(steps):
            inputs, targets = next(batches)
            optimizer.zero_grad()
            with torch.amp.autocast(device_type, dtype=amp_dtype, enabled=s["autocast"]):
                loss = lm_loss(model(inputs), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            history.append(loss.detach().item())
        model.eval()
        inputs, targets = val_batch(val_tokens, model.config.block_size, device=device)
        with torch.no_grad(), torch.amp.autocast(device_type, dtype=amp_dtype,
                                                 enabled=s["autocast"]):
            result[f"{name}_val_loss"] = lm_loss(model(inputs), targets).item()
        result[f"{name}_losses"] = history
    result["difference"] = result["amp_val_loss"] - result["fp32_val_loss"]
    return result
""",
    ),
    # Per-layer sums, matmul by matmul, as (rows, inner, columns) products.
    "flops_per_matmul_sum": (
        "transformer_flops",
        """
def transformer_flops(config, tokens):
    d, t, f = config.d_model, config.block_size, config.d_ff
    seqs = tokens // t
    forward = 0
    for _layer in range(config.n_layer):
        for rows, inner, cols in ((tokens, d, 3 * d), (tokens, d, d), (tokens, d, f),
                                  (tokens, f, d)):
            forward += 2 * rows * inner * cols
        forward += seqs * config.n_head * 2 * t * (d // config.n_head) * t  # scores
        forward += seqs * config.n_head * 2 * t * t * (d // config.n_head)  # values
    forward += 2 * tokens * d * config.vocab_size
    return int(forward + 2 * forward)
""",
    ),
    # The closed form: 6 FLOPs per matmul weight per token, plus 12 * L * T * d per token.
    "flops_closed_form": (
        "transformer_flops",
        """
def transformer_flops(config, tokens):
    d = config.d_model
    matmul_weights = config.n_layer * (4 * d * d + 2 * d * config.d_ff) + d * config.vocab_size
    return 6 * matmul_weights * tokens + 12 * config.n_layer * config.block_size * d * tokens
""",
    ),
}
