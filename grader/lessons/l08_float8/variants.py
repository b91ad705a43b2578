"""Wrong answers to lesson 08's exercises that the graders must reject, and valid ones they keep."""

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

_CAP = "torch.finfo(torch.float32).max"

WRONG_CLAMPS = {
    # Clamps only for e5m2, whose cast overflows to inf, and leaves e4m3fn to the cast (which
    # saturates on some devices and releases and gives NaN on others).
    "current_clamps_only_e5m2": (
        "current_scaling",
        _CURRENT_HEAD
        + f"""
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, (fmax / amax).clamp(max={_CAP}), torch.ones_like(amax))
    scaled = xf * scale
    if fmt == torch.float8_e5m2:
        scaled = scaled.clamp(-fmax, fmax)
    return scaled.to(fmt), scale
""",
    ),
    # No clamp at all ("the scale puts the amax on fmax, so nothing is beyond it"): in float32
    # amax * (fmax / amax) can be one rounding step above fmax.
    "current_no_clamp": (
        "current_scaling",
        _CURRENT_HEAD
        + f"""
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, (fmax / amax).clamp(max={_CAP}), torch.ones_like(amax))
    return (xf * scale).to(fmt), scale
""",
    ),
    # No cap on the scale: for an amax below ~1e-36, fmax / amax is inf and 0 * inf is NaN.
    "current_scale_overflows_for_tiny_amax": (
        "current_scaling",
        _CURRENT_HEAD
        + """
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    return (xf * scale).clamp(-fmax, fmax).to(fmt), scale
""",
    ),
    # Clamps only for e5m2 and leaves e4m3fn's saturation to the cast.
    "scaling_clamps_only_e5m2": (
        "fp8_scaler",
        _SCALING_HEAD
        + f"""
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = min(self.fmax / top / 2.0**self.margin, {_CAP}) if top > 0 else 1.0
        scaled = x.float() * scale
        if self.fmt == torch.float8_e5m2:
            scaled = scaled.clamp(-self.fmax, self.fmax)
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[:-self.history_len]
        return scaled.to(self.fmt), scale
""",
    ),
    # No cap on the scale: a history of float32 subnormals gives a scale beyond float32.
    "scaling_scale_overflows_for_tiny_amax": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[:-self.history_len]
        return x_fp8, scale
""",
    ),
}

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
    # Multiplies in x's own dtype: a bfloat16 x times a 0-d float32 scale stays bfloat16, so
    # x * scale is rounded to 8 bits before the cast to float8 (a double rounding).
    "current_product_in_input_dtype": (
        "current_scaling",
        _CURRENT_HEAD
        + """
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    return (x * scale).clamp(-fmax, fmax).to(fmt), scale
""",
    ),
    # Guards the division with an epsilon: an all-zero row gets fmax / 1e-12, not the scale 1.
    "current_epsilon_for_zero_rows": (
        "current_scaling",
        _CURRENT_HEAD
        + """
    amax = xf.abs().amax() if axis is None else xf.abs().amax(dim=-1, keepdim=True)
    scale = fmax / amax.clamp_min(1e-12)
    return (xf * scale).clamp(-fmax, fmax).to(fmt), scale
""",
    ),
    # Takes the amax as the largest value, not the largest magnitude: negative outliers saturate.
    "current_signed_max": (
        "current_scaling",
        _CURRENT_HEAD
        + """
    amax = xf.amax() if axis is None else xf.amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, fmax / amax, torch.ones_like(amax))
    return (xf * scale).clamp(-fmax, fmax).to(fmt), scale
""",
    ),
    # Keeps 0-d tensors in the history (no float()), so the scale comes back as a tensor.
    "scaling_keeps_tensors": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        self.amax_history.append(x.detach().abs().max())
        del self.amax_history[:-self.history_len]
        return x_fp8, scale
""",
    ),
    # Multiplies in x's own dtype: bfloat16 times a Python float stays bfloat16 (double rounding).
    "scaling_product_in_input_dtype": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[:-self.history_len]
        return x_fp8, scale
""",
    ),
    # Leaves all-zero tensors out of the history ("they carry no information").
    "scaling_skips_zero_amax": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        amax = float(x.detach().abs().max())
        if amax > 0:
            self.amax_history.append(amax)
            del self.amax_history[:-self.history_len]
        return x_fp8, scale
""",
    ),
    # Reads the margin as extra scale instead of headroom: multiplies by 2**margin.
    "scaling_margin_multiplies": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top * 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[:-self.history_len]
        return x_fp8, scale
""",
    ),
    # Trims the history before appending: it ends up history_len + 1 long.
    "scaling_history_one_too_long": (
        "fp8_scaler",
        _SCALING_HEAD
        + """
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        del self.amax_history[:-self.history_len]
        self.amax_history.append(float(x.detach().abs().max()))
        return x_fp8, scale
""",
    ),
    # Clamps only from above: negative elements beyond -fmax are left to the cast (-inf in e5m2).
    "mx_clamps_only_above": ("mx_block_quantize", _mx(_FREXP, clamp=".clamp(max=fmax)")),
    # No case for all-zero blocks: frexp(0) has exponent 0, so the block gets -1 - emax.
    "mx_zero_block_from_frexp": (
        "mx_block_quantize",
        _mx(_FREXP, zero_block="scale_exp"),
    ),
    # Clamps only for e5m2 and leaves e4m3fn's saturation to the cast.
    "mx_clamps_only_e5m2": (
        "mx_block_quantize",
        _mx(_FREXP, clamp="").replace(
            "    x_fp8 = scaled.to(fmt)",
            "    if fmt == torch.float8_e5m2:\n"
            "        scaled = scaled.clamp(-fmax, fmax)\n"
            "    x_fp8 = scaled.to(fmt)",
        ),
    ),
    **WRONG_CLAMPS,
    # Cuts the flattened tensor into blocks of 32, so blocks run across rows.
    "mx_blocks_across_rows": (
        "mx_block_quantize",
        """
def mx_quantize(x, block=32, fmt=torch.float8_e4m3fn):
    n = x.shape[-1]
    flat = x.float().reshape(-1)
    total = flat.numel()
    nb_all = -(-total // block)
    blocks = torch.nn.functional.pad(flat, (0, nb_all * block - total)).reshape(nb_all, block)
    amax = blocks.abs().amax(dim=-1)
    fmax = torch.finfo(fmt).max
    e = (torch.frexp(amax)[1] - 1 - fp8_emax(fmt)).clamp(-127, 127)
    e = torch.where(amax > 0, e, -127).to(torch.int32)
    q = (blocks * torch.exp2(-e.float()).unsqueeze(-1)).clamp(-fmax, fmax).to(fmt)
    q = q.reshape(-1)[:total].reshape(x.shape)
    nblocks = -(-n // block)
    want = x.numel() // n * nblocks
    e = torch.cat([e, e.new_full((max(0, want - nb_all),), -127)])[:want]
    return q, e.reshape(x.shape[:-1] + (nblocks,))
"""
        + _MX_DEQUANTIZE,
    ),
    # The float32 cap taken before the margin (min(fmax / amax, max) / 2**margin): with a
    # history of float32 subnormals and a margin the scale falls 2**margin below float32's max.
    "scaling_caps_before_margin": (
        "fp8_scaler",
        _SCALING_HEAD
        + f"""
    def quantize(self, x):
        top = max(self.amax_history, default=0.0)
        scale = min(self.fmax / top, {_CAP}) / 2.0**self.margin if top > 0 else 1.0
        x_fp8 = (x.float() * scale).clamp(-self.fmax, self.fmax).to(self.fmt)
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[: -self.history_len]
        return x_fp8, scale
""",
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
    scale = torch.nan_to_num(scale, posinf=torch.finfo(torch.float32).max)
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
        scale = min(fmax / top / 2**self.margin, torch.finfo(torch.float32).max) if top else 1.0
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
    # The scale divided in float64 and rounded once to float32 (the same value: a float64
    # quotient of two float32 numbers rounds to the correctly rounded float32 quotient).
    "current_scale_in_float64": (
        "current_scaling",
        """
def quantize_current(x, fmt=torch.float8_e4m3fn, axis=None):
    fmax = float(torch.finfo(fmt).max)
    xf = x.to(torch.float32)
    dims = tuple(range(xf.dim())) if axis is None else (-1,)
    amax = xf.abs().amax(dim=dims, keepdim=axis is not None).double()
    quotient = torch.minimum(fmax / amax, torch.tensor(torch.finfo(torch.float32).max).double())
    scale = torch.where(amax == 0, 1.0, quotient).to(torch.float32)
    out = torch.minimum(torch.maximum(xf * scale, torch.tensor(-fmax)), torch.tensor(fmax))
    return out.to(fmt), scale
""",
    ),
    # math.ldexp for the margin and a list trimmed with pop(0).
    "scaling_ldexp_and_pop": (
        "fp8_scaler",
        """
class DelayedScaling:
    def __init__(self, fmt=torch.float8_e4m3fn, history_len=16, margin=0):
        self.fmt, self.history_len, self.margin = fmt, history_len, margin
        self.amax_history = []

    def quantize(self, x):
        fmax = float(torch.finfo(self.fmt).max)
        top = max(self.amax_history) if self.amax_history else 0.0
        scale = math.ldexp(fmax / top, -self.margin) if top > 0 else 1.0
        scale = min(scale, float.fromhex("0x1.fffffep127"))  # float32's largest finite value
        x_fp8 = x.to(torch.float32).mul(scale).clamp(min=-fmax, max=fmax).to(self.fmt)
        self.amax_history.append(x.abs().amax().item())
        if len(self.amax_history) > self.history_len:
            self.amax_history.pop(0)
        return x_fp8, scale

    def dequantize(self, x_fp8, scale):
        return x_fp8.float().div(scale)
""",
    ),
    # Pads by repeating the last element (the short block's amax is unchanged) and divides by
    # the power of two instead of multiplying by its inverse (both exact).
    "mx_replicate_pad_and_divide": (
        "mx_block_quantize",
        """
def mx_quantize(x, block=32, fmt=torch.float8_e4m3fn):
    n = x.shape[-1]
    nblocks = (n + block - 1) // block
    xf = x.float()
    flat = xf.reshape(-1, n)
    if nblocks * block > n:
        flat = torch.cat([flat, flat[:, -1:].expand(-1, nblocks * block - n)], dim=1)
    blocks = flat.reshape(-1, nblocks, block)
    amax = blocks.abs().amax(dim=-1)
    mant, e = torch.frexp(amax)
    exp = torch.clamp(e - 1 - fp8_emax(fmt), min=-127, max=127)
    exp = torch.where(mant == 0, torch.full_like(exp, -127), exp).to(torch.int32)
    fmax = torch.finfo(fmt).max
    q = (blocks / torch.exp2(exp.float())[..., None]).clamp(-fmax, fmax).to(fmt)
    q = q.reshape(-1, nblocks * block)[:, :n].reshape(x.shape)
    return q, exp.reshape(x.shape[:-1] + (nblocks,))


def mx_dequantize(x_fp8, scale_exp, block=32):
    n = x_fp8.shape[-1]
    idx = torch.arange(n) // block
    return x_fp8.float() * torch.exp2(scale_exp.float()[..., idx])
""",
    ),
    # floor(log2(amax)) from a float64 log2: exact for every float32 amax (the rounding that
    # makes float32's torch.log2 say 8.0 just below 2**8 is float32's, not log2's).
    "mx_log2_in_float64": (
        "mx_block_quantize",
        """
def mx_quantize(x, block=32, fmt=torch.float8_e4m3fn):
    n = x.shape[-1]
    nblocks = -(-n // block)
    blocks = torch.nn.functional.pad(x.float(), (0, nblocks * block - n)).unflatten(
        -1, (nblocks, block))
    amax = blocks.abs().amax(dim=-1)
    floor_log2 = torch.log2(amax.double()).floor().nan_to_num(0.0, 0.0, 0.0).to(torch.int32)
    scale_exp = torch.where(amax > 0, (floor_log2 - fp8_emax(fmt)).clamp(-127, 127), -127)
    scale_exp = scale_exp.to(torch.int32)
    fmax = torch.finfo(fmt).max
    scaled = blocks * torch.exp2(-scale_exp.float()).unsqueeze(-1)
    return scaled.clamp(-fmax, fmax).to(fmt).flatten(-2)[..., :n], scale_exp
"""
        + _MX_DEQUANTIZE,
    ),
}
