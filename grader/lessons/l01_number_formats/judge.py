"""Lesson 01's judges: the references of its hidden tests and the comparisons.

Each judge rebuilds the inputs its driver (the hidden part of the test cell in
``solutions/01-number-formats``) built from the same seed, in the same order, and reads the
driver's observations in the order it made them.
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
from grader.observations import Observations, Raised

NAMES = ("sign", "exponent", "mantissa")


def _ref_fp16_bits(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    b = t.view(torch.int16).to(torch.int32) & 0xFFFF
    return b >> 15, (b >> 10) & 0x1F, b & 0x3FF


def fp16_bits(obs: Observations) -> None:
    """Random bit patterns of several shapes; the input is left as it was."""
    seed = obs.seed
    gen = torch.Generator().manual_seed(seed)
    for shape in [(4096,), (7, 13), (2, 3, 5), (0,), ()]:
        raw = torch.randint(-32768, 32768, shape, dtype=torch.int32, generator=gen).to(torch.int16)
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


def fate_edges() -> torch.Tensor:
    """The edges of float16's range that fp16_fate is tested at (the driver builds the same)."""
    return torch.tensor(
        [
            2.0**-14,
            torch.nextafter(torch.tensor(2.0**-14), torch.tensor(0.0)).item(),
            2.0**-14 - 2.0**-26,
            2.0**-24,
            2.0**-25,
            torch.nextafter(torch.tensor(2.0**-25), torch.tensor(1.0)).item(),
            3 * 2.0**-26,
            65504.0,
            65519.99,
            65520.0,
            -65520.0,
            1e-40,
            -1e-40,
            3e38,
            -float("inf"),
            -float("nan"),
            -0.0,
            0.0,
            2.0**15,
            -(2.0**-24),
        ],
        dtype=torch.float32,
    )


def fp16_fate(obs: Observations) -> None:
    """Log-uniform magnitudes over every fate, the range's edges, a 2-D tensor."""
    seed = obs.seed
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.rand(20000, generator=gen) * 50 - 30)
    sign = torch.where(torch.rand(20000, generator=gen) < 0.5, -1.0, 1.0)
    x = (mag * sign).float()
    check_tensor_equal(
        obs.next("random"), _ref_fate(x), f"fp16_fate on random values (seed {seed})", inputs=x
    )
    edges = fate_edges()
    check_tensor_equal(
        obs.next("edges"), _ref_fate(edges), "fp16_fate at the edges of the range", inputs=edges
    )
    grid = torch.randn(6, 50, generator=gen) * 1e-5
    check_tensor_equal(obs.next("grid"), _ref_fate(grid), "fp16_fate on a 2-D tensor", inputs=grid)
    after = obs.next("input after")
    check(
        type(after) is torch.Tensor and torch.equal(after, x), "fp16_fate must not modify its input"
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


#: How many sums of 20 values the driver asks for; at least 6 must tell a wide accumulator apart
#: (about one in eighteen does, so 600 hold 6 on every seed but with odds below 1e-7).
WIDE_CANDIDATES = 600


def kahan_sum(obs: Observations) -> None:
    """Sums of several kinds in three dtypes, pairs whose compensation is rounded, and sums on
    which a wider accumulator rounds differently."""
    seed = obs.seed
    gen = torch.Generator().manual_seed(seed)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n, kind in [(1, "one"), (700, "uniform"), (500, "mixed signs"), (300, "tiny")]:
            if kind == "mixed signs":
                vals = torch.randn(n, generator=gen) * 3
            elif kind == "tiny":
                vals = torch.rand(n, generator=gen) * 1e-4
            else:
                vals = torch.rand(n, generator=gen)
            as_list = bool(torch.rand((), generator=gen) < 0.5)
            want = _ref_kahan(vals, dtype)
            got = obs.next("sum")
            check_dtype(got, dtype, f"kahan_sum(..., dtype={dtype})")
            check(got.dim() == 0, "kahan_sum should return a 0-d tensor")
            exact = torch.as_tensor(vals, dtype=dtype).double().sum().item()
            check_tensor_equal(
                got,
                want,
                f"kahan_sum of {n} {kind} values in {dtype} given as a "
                f"{'list' if as_list else 'tensor'} (exact sum {exact:.6g}, "
                f"seed {seed}); every step must run in {dtype}",
            )
    check_tensor_equal(obs.next("empty"), torch.tensor(0.0), "kahan_sum([]) in float32")
    # A small value, then a large one with an odd last mantissa bit, the small one half its gap:
    # the compensation c is itself rounded there, so a final correction (s - c or s + c) changes
    # the result. The recurrence as stated returns s alone.
    for dtype, bits in ((torch.float16, 10), (torch.bfloat16, 7)):
        telling = 0
        for _ in range(8):
            e = int(torch.randint(2, 12, (), generator=gen))
            m = 2 * int(torch.randint(0, 2 ** (bits - 1), (), generator=gen)) + 1
            sign = float(torch.randint(0, 2, (), generator=gen)) * 2 - 1
            pair = [sign * 2.0 ** (e - bits - 1), sign * (2**bits + m) * 2.0 ** (e - bits)]
            want, c = _ref_kahan_state(pair, dtype)
            telling += not torch.equal(want - c, want) and not torch.equal(want + c, want)
            check_tensor_equal(
                obs.next("pair"),
                want,
                f"kahan_sum({pair}, dtype={dtype}) (seed {seed}): the recurrence "
                f"ends with s = {want.item()} and c = {c.item()}; return s itself",
            )
        check(telling >= 4, f"internal: too few telling pairs in {dtype} (seed {seed})")
    # Sums of 20 values; on those where a wider accumulator (float32, float64) rounds differently
    # from Kahan run in float16 or bfloat16, summing wide and casting at the end cannot pass.
    got_all = obs.next("twenty")
    check(
        isinstance(got_all, list) and len(got_all) == WIDE_CANDIDATES,
        "internal: the driver's sums of 20 values are missing",
    )
    found = 0
    for attempt, got in enumerate(got_all):
        dtype = (torch.float16, torch.bfloat16)[attempt % 2]
        vals = torch.rand(20, generator=gen)
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


def tiny_bfloat16() -> torch.Tensor:
    """Two bfloat16 values whose product with 10 survives in float32 but flushes in bfloat16."""
    tiny = torch.tensor(2.0**-25 / 10, dtype=torch.bfloat16)
    while float(tiny) * 10 <= 2.0**-25:
        tiny = (tiny.view(torch.int16) + 1).view(torch.bfloat16)
    return torch.stack([tiny, -tiny, torch.tensor(1.0, dtype=torch.bfloat16)])


def _float_result(got: object, what: str) -> None:
    check(
        isinstance(got, float),
        f"underflow_fraction should return {what}, got {type(got).__name__}: {got!r}",
    )


#: The scales of underflow_fraction's random trials, in turn.
UNDERFLOW_SCALES = (1.0, 2.0**10, 2.0**24, 1000.0, 0.5)


def tie_gradients(scale: float) -> torch.Tensor:
    """float32 gradients whose products with ``scale`` are 2^-25 (the tie, which rounds to even,
    0, in float16), its negative, the float32 number just above it (which rounds up to 2^-24) and
    the one just below it. For a power-of-two scale every product is exact, so it is the same in
    float32, in float64 and as a threshold."""
    tie = torch.tensor(2.0**-25 / scale, dtype=torch.float32)
    above = torch.nextafter(tie, torch.tensor(1.0))
    below = torch.nextafter(tie, torch.tensor(0.0))
    return torch.stack([tie, -tie, above, -below])


def underflow_inputs(seed: int) -> list[tuple[list[torch.Tensor], float]]:
    """The random trials of underflow_fraction for a seed: ``(grads, scale)`` for each, the tie
    gradients appended where the scale is a power of two (the driver builds the same)."""
    gen = torch.Generator().manual_seed(seed)
    trials = []
    for trial in range(12):
        gs = []
        for _ in range(int(torch.randint(1, 5, (), generator=gen))):
            g = torch.randn(int(torch.randint(1, 400, (), generator=gen)), generator=gen)
            g = g * torch.exp2(torch.rand(g.shape, generator=gen) * -40)
            g[torch.rand(g.shape, generator=gen) < 0.1] = 0.0
            pick = int(torch.randint(0, 3, (), generator=gen))
            gs.append(g.to([torch.float32, torch.float16, torch.bfloat16][pick]))
        s = UNDERFLOW_SCALES[trial % 5]
        if math.log2(s).is_integer():
            gs.append(tie_gradients(s))
        trials.append((gs, s))
    return trials


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


def safe_scale_gradients(
    gen: torch.Generator, trial: int
) -> tuple[list[torch.Tensor] | None, float]:
    """One trial's gradient list for max_safe_scale (None: all zero, skipped) and the power of
    two they lie near; the driver draws the same."""
    dtype = [torch.float32, torch.float16, torch.bfloat16][trial % 3]
    lo, hi = (-20.0, 12.0) if dtype == torch.float16 else (-60.0, 60.0)
    e = float(lo + torch.rand((), generator=gen) * (hi - lo))
    g = torch.randn(int(torch.randint(1, 200, (), generator=gen)), generator=gen) * 2.0**e
    gs = [g.to(dtype), torch.zeros(3)]
    for _ in range(int(torch.randint(0, 3, (), generator=gen))):
        shrink = 2.0 ** -float(1 + torch.rand((), generator=gen) * 6)
        gs.append((torch.randn(50, generator=gen) * 2.0**e * shrink).to(dtype))
    if torch.rand((), generator=gen) < 0.3:
        gs.append(torch.tensor([], dtype=dtype))
    gs = [gs[i] for i in torch.randperm(len(gs), generator=gen).tolist()]
    return (gs if any(bool((t != 0).any()) for t in gs) else None), e


def cancelling_gradients(gen: torch.Generator) -> list[list[torch.Tensor]]:
    """Three gradient lists whose elements are non-zero and sum to exactly 0: in one tensor, as a
    tensor and its negation, and split over two tensors beside zeros and an empty tensor. The
    values are small integers times a power of two, so every sum of them is exact in every dtype
    and order (the driver draws the same)."""
    lists = []
    for form in range(3):
        dtype = [torch.float32, torch.float16, torch.bfloat16][
            int(torch.randint(0, 3, (), generator=gen))
        ]
        e = int(torch.randint(-12, 8, (), generator=gen))
        k = torch.randint(1, 8, (int(torch.randint(1, 5, (), generator=gen)),), generator=gen)
        if form == 1:
            g = (k * 2.0**e).to(dtype)
            lists.append([g, -g])
            continue
        v = torch.cat([k, -k]).double() * 2.0**e
        v = v[torch.randperm(len(v), generator=gen)].to(dtype)
        if form == 0:
            lists.append([v])
        else:
            cut = len(v) // 2
            lists.append([torch.zeros(3), v[:cut], torch.tensor([], dtype=dtype), v[cut:]])
    return lists


def safe_scale_inputs(
    seed: int,
) -> tuple[list[tuple[list[torch.Tensor], float, torch.dtype]], list[list[torch.Tensor]]]:
    """max_safe_scale's drawn inputs for a seed: the random trials that hold a non-zero element,
    as ``(grads, e, dtype)``, then the cancelling lists (the driver draws the same)."""
    gen = torch.Generator().manual_seed(seed)
    trials = []
    for trial in range(40):
        dtype = [torch.float32, torch.float16, torch.bfloat16][trial % 3]
        gs, e = safe_scale_gradients(gen, trial)
        if gs is not None:
            trials.append((gs, e, dtype))
    return trials, cancelling_gradients(gen)


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
    for j in (-20, -3, 0, 5, 30):
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
