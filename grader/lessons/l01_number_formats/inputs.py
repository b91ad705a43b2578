"""Lesson 01's hidden tests: the inputs built from a seed, and the drivers that feed them to the
student's functions.

The judges (``judge.py``) build the same inputs with the same functions and read the drivers'
observations in the order the drivers made them. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from grader.lessons.drive import observer

Grads = list[torch.Tensor]


def bits_patterns(seed: int) -> list[tuple[tuple[int, ...], torch.Tensor]]:
    """Random float16 bit patterns (as int16) of several shapes, empty and 0-d among them."""
    gen = torch.Generator().manual_seed(seed)
    shapes: list[tuple[int, ...]] = [(4096,), (7, 13), (2, 3, 5), (0,), ()]
    return [
        (shape, torch.randint(-32768, 32768, shape, dtype=torch.int32, generator=gen).short())
        for shape in shapes
    ]


def drive_fp16_bits(namespace: dict[str, Any], fp16_bits: Callable) -> None:
    """Each pattern as float16: what fp16_bits returns, and the input after the call."""
    obs, seed = observer("fp16_bits", namespace)
    for _, raw in bits_patterns(seed):
        x = raw.view(torch.float16)
        obs.call("bits", fp16_bits, x)
        obs.record("input after", x)
    obs.done()


def fate_edges() -> torch.Tensor:
    """The edges of float16's range that fp16_fate is tested at."""
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


def fate_inputs(seed: int) -> dict[str, torch.Tensor]:
    """Log-uniform magnitudes from 2^-30 to 2^20 with random signs (every fate appears), the
    range's edges, a 2-D tensor of small values; by the label each is observed under."""
    gen = torch.Generator().manual_seed(seed)
    mag = torch.exp2(torch.rand(20000, generator=gen) * 50 - 30)
    sign = torch.where(torch.rand(20000, generator=gen) < 0.5, -1.0, 1.0)
    random = (mag * sign).float()
    edges = fate_edges()
    return {"random": random, "edges": edges, "grid": torch.randn(6, 50, generator=gen) * 1e-5}


def drive_fp16_fate(namespace: dict[str, Any], fp16_fate: Callable) -> None:
    """What fp16_fate returns on each input, and the random input after the calls."""
    obs, seed = observer("fp16_fate", namespace)
    inputs = fate_inputs(seed)
    for label, x in inputs.items():
        obs.call(label, fp16_fate, x)
    obs.record("input after", inputs["random"])
    obs.done()


#: How many sums of 20 values the driver asks for; at least 6 must tell a wide accumulator apart
#: (about one in eighteen does, so 600 hold 6 on every seed but with odds below 1e-7).
WIDE_CANDIDATES = 600

KAHAN_KINDS = [(1, "one"), (700, "uniform"), (500, "mixed signs"), (300, "tiny")]


def kahan_inputs(seed: int) -> dict[str, list]:
    """kahan_sum's inputs: ``sums`` ``(dtype, kind, values, as_list)`` of several kinds in three
    dtypes; ``pairs`` ``(dtype, [small, large])``, a large value with an odd last mantissa bit
    after a small one of half its gap, on which the compensation is itself rounded; ``twenty``
    ``(dtype, values)``, sums of 20 values in float16 and bfloat16 in turn."""
    gen = torch.Generator().manual_seed(seed)
    sums = []
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for n, kind in KAHAN_KINDS:
            if kind == "mixed signs":
                vals = torch.randn(n, generator=gen) * 3
            elif kind == "tiny":
                vals = torch.rand(n, generator=gen) * 1e-4
            else:
                vals = torch.rand(n, generator=gen)
            sums.append((dtype, kind, vals, bool(torch.rand((), generator=gen) < 0.5)))
    pairs = []
    for dtype, bits in ((torch.float16, 10), (torch.bfloat16, 7)):
        for _ in range(8):
            e = int(torch.randint(2, 12, (), generator=gen))
            m = 2 * int(torch.randint(0, 2 ** (bits - 1), (), generator=gen)) + 1
            sign = float(torch.randint(0, 2, (), generator=gen)) * 2 - 1
            small, large = sign * 2.0 ** (e - bits - 1), sign * (2**bits + m) * 2.0 ** (e - bits)
            pairs.append((dtype, [small, large]))
    twenty = [
        ((torch.float16, torch.bfloat16)[i % 2], torch.rand(20, generator=gen))
        for i in range(WIDE_CANDIDATES)
    ]
    return {"sums": sums, "pairs": pairs, "twenty": twenty}


def drive_kahan_sum(namespace: dict[str, Any], kahan_sum: Callable) -> None:
    """The sums (some given as lists), an empty sum, the pairs, and the sums of 20 values as one
    record."""
    obs, seed = observer("kahan_sum", namespace)
    inputs = kahan_inputs(seed)
    for dtype, _, vals, as_list in inputs["sums"]:
        obs.call("sum", kahan_sum, vals.tolist() if as_list else vals, dtype=dtype)
    obs.call("empty", kahan_sum, [], dtype=torch.float32)
    for dtype, pair in inputs["pairs"]:
        obs.call("pair", kahan_sum, pair, dtype=dtype)
    obs.record("twenty", [kahan_sum(v.tolist(), dtype=d) for d, v in inputs["twenty"]])
    obs.done()


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


def tiny_bfloat16() -> torch.Tensor:
    """Two bfloat16 values whose product with 10 survives in float32 but flushes in bfloat16."""
    tiny = torch.tensor(2.0**-25 / 10, dtype=torch.bfloat16)
    while float(tiny) * 10 <= 2.0**-25:
        tiny = (tiny.view(torch.int16) + 1).view(torch.bfloat16)
    return torch.stack([tiny, -tiny, torch.tensor(1.0, dtype=torch.bfloat16)])


def all_zero() -> list[Grads]:
    """Gradient lists with no non-zero element."""
    return [[], [torch.zeros(10), torch.zeros(3, 3)]]


def special() -> Grads:
    """inf and nan are non-zero and do not flush: 2 of these 5 flush at scale 1."""
    return [torch.tensor([float("inf"), float("nan"), 2.0**-40, -(2.0**-40), 1.0])]


def underflow_inputs(seed: int) -> list[tuple[Grads, float]]:
    """The random trials of underflow_fraction for a seed: ``(grads, scale)`` for each, in three
    dtypes with zeros among them, the tie gradients appended where the scale is a power of two."""
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


def drive_underflow_fraction(
    namespace: dict[str, Any], underflow_fraction: Callable, grads: Grads
) -> None:
    """``grads`` are the lesson's MLP's gradients (recorded as they are, then used)."""
    obs, seed = observer("underflow_fraction", namespace)
    for gs, s in underflow_inputs(seed):
        obs.call("random", underflow_fraction, gs, s)
    for none in all_zero():
        obs.call("all zero", underflow_fraction, none, 1.0)
    obs.call("special", underflow_fraction, special(), 1.0)
    obs.call("bfloat16 product", underflow_fraction, [tiny_bfloat16()], 10.0)
    obs.record("grads", grads)
    obs.call("mlp", underflow_fraction, grads, 1.0)
    obs.done()


def safe_scale_gradients(gen: torch.Generator, trial: int) -> tuple[Grads | None, float]:
    """One trial's gradient list for max_safe_scale (None: all zero, skipped) and the power of
    two they lie near: up to two more tensors of smaller magnitude, then a random order, so the
    largest magnitude may sit in any tensor of the list."""
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


def cancelling_gradients(gen: torch.Generator) -> list[Grads]:
    """Three gradient lists whose elements are non-zero and sum to exactly 0: in one tensor, as a
    tensor and its negation, and split over two tensors beside zeros and an empty tensor. The
    values are small integers times a power of two, so every sum of them is exact in every dtype
    and order."""
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
) -> tuple[list[tuple[Grads, float, torch.dtype]], list[Grads]]:
    """max_safe_scale's drawn inputs for a seed: the random trials that hold a non-zero element,
    as ``(grads, e, dtype)``, then the cancelling lists."""
    gen = torch.Generator().manual_seed(seed)
    trials = []
    for trial in range(40):
        dtype = [torch.float32, torch.float16, torch.bfloat16][trial % 3]
        gs, e = safe_scale_gradients(gen, trial)
        if gs is not None:
            trials.append((gs, e, dtype))
    return trials, cancelling_gradients(gen)


#: The powers of two at whose multiple of 65504 (and just above it) max_safe_scale is tested.
EDGE_POWERS = (-20, -3, 0, 5, 30)


def drive_max_safe_scale(namespace: dict[str, Any], max_safe_scale: Callable) -> None:
    """The random and cancelling lists, 65504 times powers of two and just above, a bfloat16 one,
    the smallest subnormal, and the two lists that must raise."""
    obs, seed = observer("max_safe_scale", namespace)
    trials, cancelling = safe_scale_inputs(seed)
    for gs, _, _ in trials:
        obs.call("random", max_safe_scale, gs)
    for gs in cancelling:
        obs.call("cancelling", max_safe_scale, gs)
    for j in EDGE_POWERS:
        edge = 65504.0 * 2.0**j
        obs.call("edge", max_safe_scale, [torch.tensor([edge], dtype=torch.float64)])
        above = math.nextafter(edge, math.inf)
        obs.call("above", max_safe_scale, [torch.tensor([above], dtype=torch.float64)])
    obs.call("bfloat16 one", max_safe_scale, [torch.tensor([1.0], dtype=torch.bfloat16)])
    obs.call("subnormal", max_safe_scale, [torch.tensor([2.0**-149])])
    obs.raises("empty", max_safe_scale, [])
    obs.raises("zeros", max_safe_scale, [torch.zeros(2, 2), torch.tensor([-0.0])])
    obs.done()
