"""Lesson 01's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's inputs with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them.
"""

from __future__ import annotations

import math

import torch

from course.checks import (
    CheckFailed,
    check,
    check_close,
    check_dtype,
    check_equal,
    check_tensor_equal,
)
from grader.lessons.l01_number_formats.inputs import (
    EDGE_POWERS,
    WIDE_CANDIDATES,
    bits_patterns,
    fate_inputs,
    kahan_inputs,
    safe_scale_inputs,
    tiny_bfloat16,
    underflow_inputs,
)
from grader.observations import Observations, Raised

NAMES = ("sign", "exponent", "mantissa")


def _ref_fp16_bits(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = t.view(torch.int16).to(torch.int32) & 0xFFFF
    return b >> 15, (b >> 10) & 0x1F, b & 0x3FF


def fp16_bits(obs: Observations) -> None:
    """Random bit patterns of several shapes; the input is left as it was."""
    seed = obs.seed
    for shape, raw in bits_patterns(seed):
        x = raw.view(torch.float16)
        got = obs.next("bits")
        check(isinstance(got, tuple) and len(got) == 3, "fp16_bits should return three tensors")
        for name, part, want in zip(NAMES, got, _ref_fp16_bits(x), strict=True):
            check(
                type(part) is torch.Tensor
                and not part.is_floating_point()
                and part.dtype != torch.bool,
                f"the {name} should be an integer tensor",
            )
            check_tensor_equal(
                part.long(),
                want.long(),
                f"the {name} for random bit patterns of shape {shape} (seed {seed})",
                check_dtype_=True,
            )
        after = obs.next("input after")
        check(
            type(after) is torch.Tensor and torch.equal(after.view(torch.int16), raw),
            "fp16_bits must not modify its input",
        )


def _ref_fate(t: torch.Tensor) -> torch.Tensor:
    h = t.half()
    f = torch.zeros(t.shape, dtype=torch.long)
    f[(h != 0) & (h.abs() < 2.0**-14)] = 1
    f[(h == 0) & (t != 0)] = 2
    f[torch.isinf(h) & torch.isfinite(t)] = 3
    return f


def fp16_fate(obs: Observations) -> None:
    """Log-uniform magnitudes over every fate, the range's edges, a 2-D tensor."""
    seed = obs.seed
    inputs = fate_inputs(seed)
    what = {
        "random": f"fp16_fate on random values (seed {seed})",
        "edges": "fp16_fate at the edges of the range",
        "grid": "fp16_fate on a 2-D tensor",
    }
    for label, x in inputs.items():
        check_tensor_equal(obs.next(label), _ref_fate(x), what[label], inputs=x)
    after = obs.next("input after")
    check(
        type(after) is torch.Tensor and torch.equal(after, inputs["random"]),
        "fp16_fate must not modify its input",
    )


def _ref_kahan_state(values: object, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    xs = torch.as_tensor(values, dtype=dtype).flatten()
    s = torch.zeros((), dtype=dtype)
    c = torch.zeros((), dtype=dtype)
    for v in xs:
        y = v - c
        t = s + y
        c = (t - s) - y
        s = t
    return s, c


def _ref_kahan(values: object, dtype: torch.dtype) -> torch.Tensor:
    return _ref_kahan_state(values, dtype)[0]


def kahan_sum(obs: Observations) -> None:
    """Sums of several kinds in three dtypes, pairs whose compensation is rounded, and sums on
    which a wider accumulator rounds differently."""
    seed = obs.seed
    inputs = kahan_inputs(seed)
    for dtype, kind, vals, as_list in inputs["sums"]:
        want = _ref_kahan(vals, dtype)
        got = obs.next("sum")
        check_dtype(got, dtype, f"kahan_sum(..., dtype={dtype})")
        check(got.dim() == 0, "kahan_sum should return a 0-d tensor")
        exact = torch.as_tensor(vals, dtype=dtype).double().sum().item()
        check_tensor_equal(
            got,
            want,
            f"kahan_sum of {len(vals)} {kind} values in {dtype} given as a "
            f"{'list' if as_list else 'tensor'} (exact sum {exact:.6g}, "
            f"seed {seed}); every step must run in {dtype}",
        )
    check_tensor_equal(obs.next("empty"), torch.tensor(0.0), "kahan_sum([]) in float32")
    # A small value, then a large one with an odd last mantissa bit, the small one half its gap:
    # the compensation c is itself rounded there, so a final correction (s - c or s + c) changes
    # the result. The recurrence as stated returns s alone.
    telling = {torch.float16: 0, torch.bfloat16: 0}
    for dtype, pair in inputs["pairs"]:
        want, c = _ref_kahan_state(pair, dtype)
        telling[dtype] += not torch.equal(want - c, want) and not torch.equal(want + c, want)
        check_tensor_equal(
            obs.next("pair"),
            want,
            f"kahan_sum({pair}, dtype={dtype}) (seed {seed}): the recurrence "
            f"ends with s = {want.item()} and c = {c.item()}; return s itself",
        )
    check(min(telling.values()) >= 4, f"internal: too few telling pairs (seed {seed})")
    # Sums of 20 values; on those where a wider accumulator (float32, float64) rounds differently
    # from Kahan run in float16 or bfloat16, summing wide and casting at the end cannot pass.
    got_all = obs.next("twenty")
    check(
        isinstance(got_all, list) and len(got_all) == WIDE_CANDIDATES,
        "internal: the driver's sums of 20 values are missing",
    )
    found = 0
    for got, (dtype, vals) in zip(got_all, inputs["twenty"], strict=True):
        want = _ref_kahan(vals, dtype)
        wide = torch.as_tensor(vals, dtype=dtype).double().sum().to(dtype)
        telling = not torch.equal(want, wide)
        found += telling
        note = f"a float64 sum cast to {dtype} gives {wide.item()}; " if telling else ""
        check_tensor_equal(
            got,
            want,
            f"kahan_sum of 20 values in {dtype} ({note}seed {seed}): every step must run "
            f"in {dtype}",
        )
    check(found >= 6, f"internal: too few distinguishing inputs found (seed {seed})")


def _ref_underflow(gs: list[torch.Tensor], s: float) -> float:
    nz = lost = 0
    for g in gs:
        g = g.float()
        k = g != 0
        nz += int(k.sum())
        lost += int(((g * s).half() == 0)[k].sum())
    return lost / nz if nz else 0.0


def _float_result(got: object, what: str) -> None:
    check(
        isinstance(got, float),
        f"underflow_fraction should return {what}, got {type(got).__name__}: {got!r}",
    )


def underflow_fraction(obs: Observations) -> None:
    """Random gradients in three dtypes at several scales, with 2^-25 (the tie) and its float32
    neighbours after scaling, all-zero lists, inf and nan, a bfloat16 product that must be taken
    in float32, the lesson's MLP's gradients."""
    seed = obs.seed
    for gs, s in underflow_inputs(seed):
        # A count divided by a count: exact up to the rounding of the division, which may be
        # done in float32 (torch's default for a tensor quotient) and is then within 2^-24 of
        # the fraction. Any miscount is off by at least 1 / (number of elements), far more.
        got = obs.next("random")
        _float_result(got, "a Python float")
        tie = (
            f"; the gradients include {float(gs[-1][0])!r}, whose product with the scale is "
            "exactly 2^-25 and rounds (to even) to 0 in float16, and its float32 neighbours"
            if math.log2(s).is_integer()
            else ""
        )
        check_close(
            got,
            _ref_underflow(gs, s),
            f"underflow_fraction on random gradients at scale {s} (seed {seed}{tie})",
            rtol=2.0**-23,
            atol=0,
        )
    for _ in range(2):
        got = obs.next("all zero")
        _float_result(got, "the Python float 0.0 when no element is non-zero")
        check_close(got, 0.0, "underflow_fraction of all-zero gradients")
    check_close(
        obs.next("special"),
        2 / 5,
        "underflow_fraction with inf and nan present (they are non-zero and do not flush)",
    )
    tiny = tiny_bfloat16()
    check(
        bool(((tiny * 10.0).half() == 0)[:2].all() and ((tiny.float() * 10.0).half() != 0).all()),
        "internal: the bfloat16 case does not tell the two products apart",
    )
    check_close(
        obs.next("bfloat16 product"),
        0.0,
        f"underflow_fraction([{tiny.tolist()} in bfloat16], 10.0): each product, taken in "
        f"float32 as g.float() * scale, is above 2^-25 and survives the cast to float16",
    )
    # The lesson's gradients come from the notebook (the driver records them as they were).
    grads = obs.next("grads")
    check(
        isinstance(grads, list) and all(type(g) is torch.Tensor for g in grads),
        "internal: the notebook's grads should be a list of tensors",
    )
    check_close(
        obs.next("mlp"),
        _ref_underflow(grads, 1.0),
        "underflow_fraction on the trained MLP's gradients",
        rtol=2.0**-23,
        atol=0,
    )


def _ref_safe(gs: list[torch.Tensor]) -> float:
    a = max((g.detach().abs().max().double().item() for g in gs if g.numel()), default=0.0)
    k = math.floor(math.log2(65504.0 / a))
    while a * 2.0 ** (k + 1) <= 65504.0:
        k += 1
    while a * 2.0**k > 65504.0:
        k -= 1
    return float(2.0**k)


def _raised(got: object, what: str) -> None:
    """Like ``course.checks.check_raises(ValueError, ...)`` on what the driver observed."""
    if isinstance(got, Raised):
        if not got.is_a("ValueError"):
            raise CheckFailed(
                f"{what} should raise ValueError, but raised {got.type}: {got.message}"
            )
        return
    raise CheckFailed(f"{what} should raise ValueError, but returned {got!r}")


def max_safe_scale(obs: Observations) -> None:
    """Gradients near random powers of two in three dtypes, non-zero gradients that sum to 0,
    the exact boundary and just above it, a bfloat16 power of two, the smallest subnormal, and
    the two ValueError cases."""
    seed = obs.seed
    trials, cancelling = safe_scale_inputs(seed)
    for gs, e, dtype in trials:
        check_equal(
            obs.next("random"),
            _ref_safe(gs),
            f"max_safe_scale for gradients near 2^{e:.1f} in {dtype} (seed {seed})",
        )
    for gs in cancelling:
        check_equal(
            obs.next("cancelling"),
            _ref_safe(gs),
            f"max_safe_scale({[g.tolist() for g in gs]}) in {gs[-1].dtype}: the elements sum to "
            "0 but are not all zero, so there is a largest magnitude and a scale",
        )
    for j in EDGE_POWERS:
        edge = 65504.0 * 2.0**j
        check_equal(
            obs.next("edge"), 2.0**-j, f"max_safe_scale([{edge!r}]) (exactly on the boundary)"
        )
        above = math.nextafter(edge, math.inf)
        check_equal(
            obs.next("above"),
            2.0 ** (-j - 1),
            f"max_safe_scale([{above!r}]) (just above the boundary)",
        )
    # A power of two in bfloat16: 2^16 is then a bfloat16 number, and 65504 is not (it rounds to
    # 65536 in bfloat16), so the comparison must not be made in the gradient's dtype.
    check_equal(
        obs.next("bfloat16 one"),
        2.0**15,
        "max_safe_scale([[1.0] in bfloat16]) (1.0 * 2^16 = 65536 is more than 65504)",
    )
    check_equal(obs.next("subnormal"), 2.0**164, "max_safe_scale of the smallest float32 subnormal")
    _raised(obs.next("empty"), "max_safe_scale([])")
    _raised(obs.next("zeros"), "max_safe_scale of zeros and -0.0")


JUDGES = {
    "fp16_bits_tests": ("fp16_bits", fp16_bits),
    "fp16_fate_tests": ("fp16_fate", fp16_fate),
    "kahan_sum_tests": ("kahan_sum", kahan_sum),
    "underflow_fraction_tests": ("underflow_fraction", underflow_fraction),
    "max_safe_scale_tests": ("max_safe_scale", max_safe_scale),
}
