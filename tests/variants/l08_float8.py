"""Wrong answers to lesson 08's exercises that the graders must reject, and valid ones they keep."""

LESSON = "08-float8"

_CURRENT_HEAD = """
def quantize_current(x, fmt=torch.float8_e4m3fn, axis=None):
    fmax = torch.finfo(fmt).max
    xf = x.float()
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

_MX_DEQUANTIZE = """

def mx_dequantize(x_fp8, scale_exp, block=32):
    n = x_fp8.shape[-1]
    factor = torch.exp2(scale_exp.float()).repeat_interleave(block, dim=-1)[..., :n]
    return x_fp8.float() * factor
"""


def _mx(exponent: str, zero_block: str = "-127", clamp: str = ".clamp(-fmax, fmax)") -> str:
    """An mx_quantize that pads the last block, with the exponent rule and clamp given."""
    return (
        """
def mx_quantize(x, block=32, fmt=torch.float8_e4m3fn):
    n = x.shape[-1]
    nblocks = -(-n // block)
    blocks = torch.nn.functional.pad(x.float(), (0, nblocks * block - n)).unflatten(
        -1, (nblocks, block))
    amax = blocks.abs().amax(dim=-1)
    emax = fp8_emax(fmt)
    fmax = torch.finfo(fmt).max
"""
        + f"    scale_exp = {exponent}\n"
        + f"    scale_exp = torch.where(amax > 0, scale_exp, {zero_block}).to(torch.int32)\n"
        + "    scaled = blocks * torch.exp2(-scale_exp.float()).unsqueeze(-1)\n"
        + f"    x_fp8 = scaled{clamp}.to(fmt).flatten(-2)[..., :n]\n"
        + "    return x_fp8, scale_exp\n"
        + _MX_DEQUANTIZE
    )


_FREXP = "(torch.frexp(amax)[1] - 1 - emax).clamp(-127, 127)"

VARIANTS = {
    # No case for an all-zero tensor or row: fmax / 0 = inf, and 0 * inf = NaN.
    "current_zero_gives_nan": (
        "current_scaling",
        _CURRENT_HEAD
        + """
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=-1, keepdim=True)
    scale = fmax / amax
    return (xf * scale).clamp(-fmax, fmax).to(fmt), scale
""",
    ),
    # Takes "per row" as one amax per column (over the first dimension).
    "current_rows_are_columns": (
        "current_scaling",
        _CURRENT_HEAD
        + """
    dim = None if axis is None else 0
    amax = xf.abs().amax() if dim is None else xf.abs().amax(dim=0, keepdim=True)
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    return (xf * scale).clamp(-fmax, fmax).to(fmt), scale
""",
    ),
    # Returns the dequantization factor (amax / fmax) and divides by it: the opposite convention.
    "current_inverted_scale": (
        "current_scaling",
        _CURRENT_HEAD
        + """
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / fmax, torch.ones_like(amax))
    return (xf / scale).clamp(-fmax, fmax).to(fmt), scale
""",
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
    # Relies on the cast to saturate: e5m2 has infinities, so values beyond its range become inf.
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
    # Scales from the most recent amax only, ignoring the rest of the history window.
    "scaling_uses_last_amax_only": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = self.amax_history[-1] if self.amax_history else 0.0
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[:-self.history_len]
        return x_fp8, scale
""",
    ),
    # floor(torch.log2(amax)): float32 log2 rounds up just below a power of two.
    "mx_log2_rounds_up": (
        "mx_block_quantize",
        _mx("(torch.floor(torch.log2(amax)).to(torch.int32) - emax).clamp(-127, 127)"),
    ),
    # Leaves saturation to the cast: fine for e4m3fn on some builds, inf for e5m2.
    "mx_no_clamp": ("mx_block_quantize", _mx(_FREXP, clamp="")),
    # Chooses the exponent so that nothing saturates (ceil of log2(amax / fmax)): not OCP MX's rule.
    "mx_ceil_avoids_saturation": (
        "mx_block_quantize",
        _mx("torch.ceil(torch.log2(amax / fmax)).to(torch.int32).clamp(-127, 127)"),
    ),
    # An all-zero block gets exponent 0 rather than E8M0's smallest, -127.
    "mx_zero_block_exponent_0": ("mx_block_quantize", _mx(_FREXP, zero_block="0")),
    # Forgets E8M0's range: blocks of float32 subnormals get exponents below -127.
    "mx_no_e8m0_range": (
        "mx_block_quantize",
        _mx("torch.frexp(amax)[1] - 1 - emax", zero_block="-127"),
    ),
    # The short last block borrows the exponent of the block before it instead of its own amax.
    "mx_tail_shares_previous_block": (
        "mx_block_quantize",
        """
def mx_quantize(x, block=32, fmt=torch.float8_e4m3fn):
    n = x.shape[-1]
    nblocks = -(-n // block)
    blocks = torch.nn.functional.pad(x.float(), (0, nblocks * block - n)).unflatten(
        -1, (nblocks, block))
    amax = blocks.abs().amax(dim=-1)
    if n % block and nblocks > 1:
        amax = torch.cat([amax[..., :-1], amax[..., -2:-1]], dim=-1)
    fmax = torch.finfo(fmt).max
    scale_exp = (torch.frexp(amax)[1] - 1 - fp8_emax(fmt)).clamp(-127, 127)
    scale_exp = torch.where(amax > 0, scale_exp, -127).to(torch.int32)
    scaled = blocks * torch.exp2(-scale_exp.float()).unsqueeze(-1)
    x_fp8 = scaled.clamp(-fmax, fmax).to(fmt).flatten(-2)[..., :n]
    return x_fp8, scale_exp
"""
        + _MX_DEQUANTIZE,
    ),
}

VALID = {
    # The infinity norm for the amax, and the zero case handled by a safe denominator.
    "current_vector_norm": (
        "current_scaling",
        """
def quantize_current(x, fmt=torch.float8_e4m3fn, axis=None):
    fmax = torch.finfo(fmt).max
    xf = x.float()
    if axis is None:
        amax = torch.linalg.vector_norm(xf, ord=float("inf"))
    else:
        amax = torch.linalg.vector_norm(xf, ord=float("inf"), dim=-1, keepdim=True)
    zero = amax == 0
    scale = (fmax / amax.masked_fill(zero, 1.0)).masked_fill(zero, 1.0)
    return torch.clamp(xf * scale, min=-fmax, max=fmax).to(fmt), scale
""",
    ),
    # A deque as the history window (a list is not required to be the container).
    "scaling_with_deque": (
        "fp8_scaler",
        """
from collections import deque


class DelayedScaling:
    def __init__(self, fmt=torch.float8_e4m3fn, history_len=16, margin=0):
        self.fmt, self.margin = fmt, margin
        self.amax_history = deque(maxlen=history_len)

    def quantize(self, x):
        fmax = torch.finfo(self.fmt).max
        top = max(self.amax_history) if self.amax_history else 0.0
        scale = fmax / top / 2**self.margin if top > 0 else 1.0
        out = torch.clamp(x.float() * scale, -fmax, fmax).to(self.fmt)
        self.amax_history.append(x.abs().max().item())
        return out, scale

    def dequantize(self, x_fp8, scale):
        return x_fp8.to(torch.float32) / scale
""",
    ),
    # One block at a time with math.frexp on Python floats and torch.ldexp for the power of two.
    "mx_block_loop": (
        "mx_block_quantize",
        """
def mx_quantize(x, block=32, fmt=torch.float8_e4m3fn):
    fmax = torch.finfo(fmt).max
    xf = x.float()
    n = xf.shape[-1]
    emax = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}[fmt]
    q_parts, exps = [], []
    for start in range(0, n, block):
        part = xf[..., start:start + block]
        flat_amax = part.abs().amax(dim=-1).reshape(-1).tolist()
        e = [max(-127, min(127, math.frexp(a)[1] - 1 - emax)) if a > 0 else -127
             for a in flat_amax]
        e = torch.tensor(e, dtype=torch.int32).reshape(part.shape[:-1])
        exps.append(e)
        q_parts.append(torch.ldexp(part, -e.unsqueeze(-1).long()).clamp(-fmax, fmax).to(fmt))
    return torch.cat(q_parts, dim=-1), torch.stack(exps, dim=-1)


def mx_dequantize(x_fp8, scale_exp, block=32):
    n = x_fp8.shape[-1]
    out = []
    for j, start in enumerate(range(0, n, block)):
        part = x_fp8[..., start:start + block].float()
        out.append(torch.ldexp(part, scale_exp[..., j:j + 1].long()))
    return torch.cat(out, dim=-1)
""",
    ),
}
