"""Lesson 08's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's inputs with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them. The drivers
call the student's quantizers under ``course.float8.CastsOverflowToNaN`` (casts beyond the range
give NaN), so a quantizer that leaves saturation to the cast returns NaN, which the judges see in
what was recorded.
"""

from __future__ import annotations

import math

import torch

from course.checks import (
    CheckFailed,
    check,
    check_close,
    check_dtype,
    check_shape,
    check_tensor_equal,
)
from course.float8 import FP8_FORMATS, fp8_max
from grader.lessons.l08_float8.inputs import (
    current_edges,
    current_inputs,
    mx_inputs,
    scaler_inputs,
    scaler_subnormals,
)
from grader.observations import Observations, Raised

_TOP32 = torch.finfo(torch.float32).max


def _pair(got: object, what: str) -> tuple:
    """The two values a quantizer returned (the old test unpacked them)."""
    check(
        isinstance(got, (tuple, list)) and len(got) == 2,
        f"{what} should return two values (x_fp8, scale), got {type(got).__name__}",
    )
    return tuple(got)


def _returned(got: object, what: str) -> object:
    """What a call recorded with the driver's ``raises`` returned; its exception fails the test."""
    if isinstance(got, Raised):
        raise CheckFailed(f"{what} raised {got.type}: {got.message}")
    return got


# --------------------------------------------------------------------------------------------
# current_scaling


def _ref_scale(x: torch.Tensor, fmt: torch.dtype, axis: int | None) -> torch.Tensor:
    fmax = torch.finfo(fmt).max
    a = x.float().abs()
    amax = a.amax() if axis is None else a.amax(dim=-1, keepdim=True)
    return torch.where(amax > 0, (fmax / amax).clamp(max=_TOP32), torch.ones_like(amax))


def current_scaling(obs: Observations) -> None:
    """Random tensors of several shapes, dtypes, axes and formats; the product in float32; a 0-d
    tensor; huge and tiny elements side by side; the clamp on the amax itself; capped scales."""
    seed = obs.seed
    for shape, axis, dtype, fmt, x in current_inputs(seed):
        where = f"({fmt}, axis={axis}, shape {tuple(shape)}, {dtype}, seed {seed})"
        q, s = _pair(obs.next("random"), "quantize_current")
        after = obs.next("input after")
        check(
            type(after) is torch.Tensor and torch.equal(after, x),
            f"quantize_current must not modify its input {where}",
        )
        want = _ref_scale(x, fmt, axis)
        check_dtype(s, torch.float32, f"the scale {where}")
        check_shape(s, tuple(want.shape), f"the scale {where}")
        check_close(s, want, f"the scale {where}", rtol=3e-7, atol=0)
        check_dtype(q, fmt, f"x_fp8 {where}")
        check_shape(q, tuple(x.shape), f"x_fp8 {where}")
        fmax = torch.finfo(fmt).max
        expect = (x.float() * s).clamp(-fmax, fmax).to(fmt)
        check_tensor_equal(
            q.float(),
            expect.float(),
            f"x_fp8 {where}: (x.float() * scale).clamp(-fmax, fmax).to(fmt)",
        )
    # The product is taken in float32, not in x's dtype: 229/256 * 112 = 100.1875 rounds to 104
    # in e4m3fn, while bfloat16 first rounds it to 100.0, a tie that float8 rounds down to 96.
    for axis in (None, -1):
        xb = torch.tensor([4.0, 229 / 256], dtype=torch.bfloat16)
        q, _ = _pair(obs.next("bfloat16 product"), "quantize_current")
        check_tensor_equal(
            q.float(),
            torch.tensor([448.0, 104.0]),
            f"x_fp8 of bfloat16 [4, 229/256] (axis={axis}): x.float() * scale, then the clamp "
            "and the cast",
            inputs=xb,
        )
    q, s = _pair(obs.next("0-d"), "quantize_current")
    check_shape(s, (), "the scale of a 0-d tensor")
    check_shape(q, (), "x_fp8 of a 0-d tensor")
    check_tensor_equal(q.float(), torch.tensor(-57344.0), "x_fp8 of the 0-d tensor -3.0 in e5m2")
    for fmt in FP8_FORMATS:
        q, _ = _pair(obs.next("huge and tiny"), "quantize_current")
        fmax = torch.finfo(fmt).max
        check_tensor_equal(
            q.float()[:, :2].abs().amax(dim=-1),
            torch.tensor([fmax, fmax]),
            f"each row's amax must land on ±{fmax:g} ({fmt})",
        )
    # The clamp on the tensor's own amax: in float32, 1.359375 * (fmax / 1.359375) is one
    # rounding step above fmax, so an unclamped product leaves the range, and the driver's cast
    # makes it NaN. A finite amax below fmax / 3.4e38 overflows fmax / amax: the scale is capped.
    for x in current_edges():
        for fmt in FP8_FORMATS:
            for axis in (None, -1):
                where = f"({fmt}, axis={axis}, x = {x.tolist()})"
                q, s = _pair(obs.next("edge"), "quantize_current")
                want = _ref_scale(x, fmt, axis)
                check(
                    bool(torch.isfinite(s).all()),
                    f"the scale {where} must be finite (at most torch.finfo(torch.float32).max "
                    f"= {_TOP32:g}), got {s.tolist()}",
                )
                check_close(s, want, f"the scale {where}", rtol=3e-7, atol=0)
                fmax = torch.finfo(fmt).max
                check(
                    bool(torch.isfinite(q.float()).all()),
                    f"x_fp8 {where} holds NaN or inf ({q.float().tolist()}): clamp x * scale to "
                    f"±{fmax:g} before the cast (the grader's cast turns values beyond the range "
                    "into NaN), and cap the scale at float32's max",
                )
                expect = (x.float() * want).clamp(-fmax, fmax).to(fmt)
                check_tensor_equal(q.float(), expect.float(), f"x_fp8 {where}", inputs=x)


# --------------------------------------------------------------------------------------------
# fp8_scaler


class _RefScaling:
    """The delayed scaler's scale and history, replayed beside the student's."""

    def __init__(self, fmt: torch.dtype, history_len: int, margin: int) -> None:
        self.fmt, self.history_len, self.margin = fmt, history_len, margin
        self.fmax = float(torch.finfo(fmt).max)
        self.amax_history: list[float] = []

    def scale(self) -> float:
        top = max(self.amax_history, default=0.0)
        scale = self.fmax / top / 2.0**self.margin if top > 0 else 1.0
        return min(scale, _TOP32)

    def push(self, x: torch.Tensor) -> None:
        self.amax_history.append(float(x.detach().abs().max()))
        del self.amax_history[: -self.history_len]


def _check_quantized(
    got: object, back: object, x: torch.Tensor, fmt: torch.dtype, want_scale: float, what: str
) -> None:
    """One ``quantize`` call's result and the ``dequantize`` of it, as the driver recorded them."""
    q, s = _pair(got, "quantize")
    check(isinstance(s, float), f"the scale {what} must be a Python float, got {type(s).__name__}")
    check_close(s, want_scale, f"the scale {what}", rtol=1e-6, atol=0)
    check_dtype(q, fmt, f"x_fp8 {what}")
    check_shape(q, x.shape, f"x_fp8 {what}")
    qf = q.float().flatten()
    check(
        bool(torch.isfinite(qf).all()),
        f"x_fp8 {what} contains NaN or inf: values beyond the range must saturate to "
        f"±{torch.finfo(fmt).max:g}",
    )
    fmax = float(torch.finfo(fmt).max)
    # The contract fixes the computation, so x_fp8 must equal it exactly for the scale returned.
    expect = (x.float() * float(s)).clamp(-fmax, fmax).to(fmt).float().flatten()
    bad = qf != expect
    if bool(bad.any()):
        j = int(bad.nonzero()[0][0])
        check(
            False,
            f"x_fp8 {what} should be (x.float() * scale).clamp(-{fmax:g}, {fmax:g})"
            f".to({fmt}); wrong in {int(bad.sum())} of {bad.numel()} elements, e.g. x = "
            f"{x.flatten()[j].item()!r}: expected {expect[j].item()!r}, got {qf[j].item()!r}",
        )
    back = _returned(back, f"dequantize {what}")
    check_dtype(back, torch.float32, f"dequantize {what}")
    check_close(
        back.flatten(), qf / float(s), f"dequantize(x_fp8, scale) {what}", rtol=1e-6, atol=0
    )


def fp8_scaler(obs: Observations) -> None:
    """Random streams with spikes and zeros in both formats, history lengths and margins; the
    product in float32; the window; zeros; saturation; histories of float32 subnormals."""
    seed = obs.seed
    ref = None
    for f, hl, margin, step, x in scaler_inputs(seed):
        fmt = FP8_FORMATS[f]
        if step == 0:
            ref = _RefScaling(fmt, hl, margin)
        where = f"({fmt}, history_len={hl}, margin={margin}, seed {seed})"
        want = ref.scale()
        got, back = obs.next("quantize"), obs.next("dequantize")
        _check_quantized(got, back, x, fmt, want, f"at step {step + 1} {where}")
        ref.push(x)
        after = obs.next("input after")
        check(
            type(after) is torch.Tensor and torch.equal(after, x),
            f"quantize must not modify its input {where}",
        )
        hist = obs.next("history")
        check(
            all(isinstance(h, float) for h in hist),
            f"amax_history must hold Python floats, got {[type(h).__name__ for h in hist]} {where}",
        )
        check(
            len(hist) == len(ref.amax_history),
            f"amax_history should hold {len(ref.amax_history)} entries after {step + 1} calls "
            f"{where}, it holds {len(hist)}",
        )
        check_close(
            torch.tensor([float(h) for h in hist], dtype=torch.float64),
            torch.tensor(ref.amax_history, dtype=torch.float64),
            f"amax_history after {step + 1} calls {where}",
            rtol=1e-6,
            atol=0,
        )
    # The product is taken in float32, not in x's dtype (bfloat16 would round 100.1875 to 100, a
    # tie that e4m3fn rounds down to 96 instead of 104).
    xb = torch.tensor([229 / 256, -1.0], dtype=torch.bfloat16)
    q, _ = _pair(obs.next("bfloat16 product"), "quantize")
    check_tensor_equal(
        q.float(),
        torch.tensor([104.0, -112.0]),
        "x_fp8 of bfloat16 [229/256, -1] with scale 112: x.float() * scale, then the clamp and "
        "the cast",
        inputs=xb,
    )
    for fmt in FP8_FORMATS:
        fmax = fp8_max(fmt)
        scales = [float(_pair(obs.next("window"), "quantize")[1]) for _ in range(5)]
        check_close(
            torch.tensor(scales, dtype=torch.float64),
            torch.tensor([1.0, fmax / 100, fmax / 100, fmax / 100, fmax], dtype=torch.float64),
            f"scales for amaxes 100, 1, 1, 1, 1 with history_len=3 ({fmt})",
            rtol=1e-6,
        )
        for _ in range(2):
            q, s = _pair(obs.next("zeros"), "quantize")
            check_close(s, 1.0, f"the scale after only all-zero tensors ({fmt})", rtol=0, atol=0)
            check_tensor_equal(q.float(), torch.zeros(10), f"x_fp8 of zeros ({fmt})")
        big = torch.tensor([3e38, -3e38, 1e9, fmax * 1.01, -fmax * 1.6, 0.5])
        q, s = _pair(obs.next("huge"), "quantize")
        check_tensor_equal(
            q.float(),
            torch.tensor([fmax, -fmax, fmax, fmax, -fmax, 0.5]),
            f"the first quantize of huge values in {fmt} (scale 1: saturate to ±{fmax:g})",
            inputs=big,
        )
        q, s = _pair(obs.next("jump"), "quantize")
        check_close(s, fmax / 1e-3, f"the scale after an amax of 1e-3 ({fmt})", rtol=1e-6)
        check_tensor_equal(
            q.float()[:2],
            torch.tensor([fmax, -fmax]),
            f"a jump to 5000x the history's amax must saturate in {fmt}, not overflow",
        )
    # A history of float32 subnormals: fmax / amax is beyond float32, so the scale is capped at
    # its max, and zeros stay zeros (an uncapped scale is inf in float32, and 0 * inf is NaN).
    for fmt in FP8_FORMATS:
        for margin in (0, 3):
            ref = _RefScaling(fmt, 2, margin)
            for x in scaler_subnormals():
                want = ref.scale()
                ref.push(x)
                what = f"after amaxes {ref.amax_history[:-1]} ({fmt}, margin={margin})"
                got, back = obs.next("quantize"), obs.next("dequantize")
                s = _pair(got, "quantize")[1]
                check(
                    isinstance(s, float) and math.isfinite(s) and s <= _TOP32,
                    f"the scale {what} must be a finite Python float, at most "
                    f"torch.finfo(torch.float32).max = {_TOP32:g}; got {s!r}",
                )
                _check_quantized(got, back, x, fmt, want, what)


# --------------------------------------------------------------------------------------------
# mx_block_quantize


def _ref_mx(
    x: torch.Tensor, block: int, fmt: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    n = x.shape[-1]
    nb = -(-n // block)
    xf = torch.cat([x.float(), x.new_zeros(x.shape[:-1] + (nb * block - n,)).float()], dim=-1)
    blocks = xf.reshape(x.shape[:-1] + (nb, block))
    amax = blocks.abs().amax(dim=-1)
    emax = {torch.float8_e4m3fn: 8, torch.float8_e5m2: 15}[fmt]
    exps = torch.frexp(amax)[1].to(torch.int64) - 1 - emax
    exps = torch.where(amax == 0, torch.full_like(exps, -127), exps.clamp(-127, 127))
    fmax = torch.finfo(fmt).max
    q = (blocks * torch.ldexp(torch.ones_like(blocks), -exps.unsqueeze(-1))).clamp(-fmax, fmax)
    q = q.to(fmt).reshape(x.shape[:-1] + (nb * block,))[..., :n]
    factor = torch.ldexp(torch.ones(exps.shape + (block,)), exps.unsqueeze(-1))
    back = q.float() * factor.reshape(x.shape[:-1] + (nb * block,))[..., :n]
    return q, exps.to(torch.int32), back


def _check_mx(obs: Observations, x: torch.Tensor, block: int, fmt: torch.dtype, what: str) -> None:
    want_q, want_e, want_back = _ref_mx(x, block, fmt)
    got = obs.next("quantize")
    after = obs.next("input after")
    back = obs.next("dequantize")
    check(
        isinstance(got, (tuple, list)) and len(got) == 2,
        f"mx_quantize should return two values (x_fp8, scale_exp), got {type(got).__name__}",
    )
    q, e = got
    check(
        type(after) is torch.Tensor and torch.equal(after, x),
        f"mx_quantize must not modify its input {what}",
    )
    check_dtype(e, torch.int32, f"scale_exp {what}")
    check_shape(e, tuple(want_e.shape), f"scale_exp {what}")
    if not torch.equal(e, want_e):
        j = tuple(int(i) for i in (e != want_e).nonzero()[0])
        blk = x.float()[j[:-1]][j[-1] * block : (j[-1] + 1) * block]
        check(
            False,
            f"scale_exp {what} is wrong in {int((e != want_e).sum())} of {e.numel()} blocks, "
            f"e.g. block {j}: amax {blk.abs().max().item()!r}, expected {int(want_e[j])}, got "
            f"{int(e[j])}",
        )
    check_dtype(q, fmt, f"x_fp8 {what}")
    check_shape(q, tuple(x.shape), f"x_fp8 {what}")
    bad = q.view(torch.uint8) != want_q.view(torch.uint8)
    if bool(bad.any()):
        j = tuple(int(i) for i in bad.nonzero()[0])
        check(
            False,
            f"x_fp8 {what} differs from the reference in {int(bad.sum())} of {bad.numel()} "
            f"elements, e.g. at {j}: x = {x.float()[j].item()!r}, block exponent "
            f"{int(want_e[j[:-1] + (j[-1] // block,)])}, expected {want_q.float()[j].item()!r}, "
            f"got {q.float()[j].item()!r}",
        )
    back = _returned(back, f"mx_dequantize {what}")
    check_dtype(back, torch.float32, f"mx_dequantize {what}")
    check_shape(back, tuple(x.shape), f"mx_dequantize {what}")
    check_tensor_equal(back, want_back, f"mx_dequantize {what}")


def mx_block_quantize(obs: Observations) -> None:
    """Random tensors in three dtypes, both formats and several block sizes, then edge blocks
    one by one, in rows of 8, and all in one row that ends in a short block."""
    seed = obs.seed
    for x, block, fmt in mx_inputs(seed):
        what = f"({fmt}, block {block}, shape {tuple(x.shape)}, {x.dtype}, seed {seed})"
        _check_mx(obs, x, block, fmt, what)


JUDGES = {
    "current_scaling_tests": ("current_scaling", current_scaling),
    "fp8_scaler_tests": ("fp8_scaler", fp8_scaler),
    "mx_block_quantize_tests": ("mx_block_quantize", mx_block_quantize),
}
