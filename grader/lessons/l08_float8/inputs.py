"""Lesson 08's hidden tests: the inputs built from a seed, and the drivers that feed them to the
student's quantizers.

The judges (``judge.py``) build the same inputs with the same functions and read the drivers'
observations in the order the drivers made them. Every quantizer is graded under casts that give
NaN beyond the range (as some devices' do: :func:`with_nan_overflow`), so only the clamp
saturates. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

from course.float8 import FP8_FORMATS, CastsOverflowToNaN, fp8_max
from grader.lessons.drive import observer


def with_nan_overflow(fn: Callable) -> Callable:
    """``fn`` wrapped to run under :class:`CastsOverflowToNaN` (lesson 08's graded calls)."""

    def strict(*args: object, **kwargs: object) -> object:
        with CastsOverflowToNaN():
            return fn(*args, **kwargs)

    return strict


def current_cases(
    gen: torch.Generator,
) -> Iterator[tuple[tuple[int, ...], int | None, torch.dtype, torch.dtype, torch.Tensor]]:
    """The random inputs of quantize_current, as the driver draws them: every shape with both
    axes, in every input dtype and both formats; some with an all-zero row, some all zero."""
    shapes = [(7,), (5, 9), (3, 4, 6), (1, 1), (16, 1), (2, 33), (4, 64)]
    cases = [
        (shape, axis, dtype, fmt)
        for shape in shapes
        for axis in (None, -1)
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
        for fmt in FP8_FORMATS
    ]
    for trial, (shape, axis, dtype, fmt) in enumerate(cases):
        x = torch.randn(shape, generator=gen)
        x = x * 2.0 ** (torch.rand(shape[:-1] + (1,), generator=gen) * 24 - 12)
        if trial % 4 == 1 and len(shape) > 1:
            x[..., 0, :] = 0.0
        if trial % 11 == 5:
            x = torch.zeros(shape)
        yield shape, axis, dtype, fmt, x.to(dtype)


def current_edges() -> list[torch.Tensor]:
    """An amax whose own product overflows fmax in float32, and amaxes below fmax / 3.4e38."""
    return [
        torch.tensor([[1.359375, -0.5, 0.25], [-1.359375, 1.0, 0.0]]),
        torch.tensor(
            [[1e-37, -4e-38, 0.0], [2.0**-149, 0.0, 0.0], [0.0, 0.0, 0.0], [3.0, -1.0, 0.0]]
        ),
    ]


def scaler_stream(gen: torch.Generator) -> Iterator[tuple[int, int, int, int, torch.Tensor]]:
    """The random streams of DelayedScaling, as the driver draws them: ``(fmt index,
    history_len, margin, step, x)``; magnitudes from 2^-18 to 2^18, spikes, zeros, bfloat16."""
    for f in range(len(FP8_FORMATS)):
        for hl, margin in [(1, 0), (3, 0), (5, 2), (16, 1), (16, 0)]:
            for step in range(14):
                shape = [(257,), (8, 33), (3, 4, 5), (1,)][step % 4]
                log_mag = float(torch.rand((), generator=gen) * 36 - 18)
                x = torch.randn(shape, generator=gen) * 2.0**log_mag
                if step % 5 == 4:
                    x = x * 2.0**12
                if step % 7 == 6:
                    x = torch.zeros(shape)
                if step % 3 == 1:
                    x = x.to(torch.bfloat16)
                yield f, hl, margin, step, x


def scaler_subnormals() -> list[torch.Tensor]:
    """Histories of float32 subnormals: fmax / amax is beyond float32."""
    return [
        torch.tensor([1e-40, 0.0]),
        torch.tensor([1e-40, -3e-41, 0.0]),
        torch.tensor([2.0**-149, 0.0, -(2.0**-149)]),
    ]


MX_CASES = [
    ((3, 70), 32),
    ((2, 3, 64), 32),
    ((5,), 32),
    ((1, 1), 32),
    ((4, 33), 16),
    ((6, 50), 7),
    ((2, 96), 32),
    ((3, 31), 8),
]


def mx_random(
    gen: torch.Generator,
) -> Iterator[tuple[int, tuple[int, ...], int, torch.dtype, torch.dtype, torch.Tensor]]:
    """The 32 random inputs of mx_quantize, as the driver draws them."""
    for trial in range(32):
        shape, block = MX_CASES[trial % len(MX_CASES)]
        fmt = FP8_FORMATS[(trial // len(MX_CASES)) % 2]
        dtype = (torch.float32, torch.bfloat16, torch.float16, torch.float32)[trial % 4]
        x = torch.randn(shape, generator=gen)
        lim = 12 if dtype == torch.float16 else 40
        x = x * 2.0 ** (torch.randint(-lim, lim, shape[:-1] + (1,), generator=gen)).float()
        yield trial, shape, block, dtype, fmt, x.to(dtype)


def mx_edges(gen: torch.Generator) -> list[torch.Tensor]:
    """Edge blocks: zeros, float32 subnormals, amaxes at and just below powers of two, at the
    format's max, beyond it after scaling, huge values, elements below float8's subnormals."""
    k = torch.randint(-30, 30, (8,), generator=gen)
    pow2 = torch.ldexp(torch.ones(8), k)
    return [
        torch.zeros(32),
        torch.ldexp(torch.randn(32, generator=gen), torch.full((32,), -140)),
        torch.ldexp(torch.ones(32), torch.full((32,), -149)),
        torch.cat([torch.nextafter(pow2, torch.zeros(8)), torch.randn(24, generator=gen) * 1e-3]),
        torch.cat([pow2 * 1.75, -pow2 * 1.75, torch.randn(16, generator=gen)]),
        torch.cat([pow2 * 1.99, pow2 * 1.8, pow2 * 1.875, pow2 * 1.76]),
        torch.tensor([3.0e38, -2.5e38] + [1.0] * 30),
        torch.tensor([1e-30] * 31 + [0.0]),
        torch.cat([torch.ones(1), torch.ldexp(torch.full((31,), 1.5), -torch.arange(10, 41))]),
    ]


def current_inputs(seed: int) -> list[tuple[Any, ...]]:
    """``(shape, axis, dtype, fmt, x)`` of quantize_current's random inputs
    (:func:`current_cases`)."""
    return list(current_cases(torch.Generator().manual_seed(seed)))


def drive_current_scaling(namespace: dict[str, Any], quantize_current: Callable) -> None:
    """What quantize_current returns on the random inputs (and each input after the call), a
    bfloat16 product, a 0-d tensor, huge and tiny elements side by side, the edges."""
    obs, seed = observer("current_scaling", namespace)
    print(f"hidden tests: seed {seed}")
    qc = with_nan_overflow(quantize_current)
    for _, axis, _, fmt, x in current_inputs(seed):
        obs.call("random", qc, x, fmt, axis=axis)
        obs.record("input after", x)
    # The product is taken in float32, not in x's dtype.
    for axis in (None, -1):
        xb = torch.tensor([4.0, 229 / 256], dtype=torch.bfloat16)
        obs.call("bfloat16 product", qc, xb, axis=axis)
    # A 0-d tensor (axis=None): a 0-d scale and a 0-d x_fp8.
    obs.call("0-d", qc, torch.tensor(-3.0), torch.float8_e5m2)
    # Huge and tiny elements beside each other: each row's amax lands on exactly ±fmax.
    for fmt in FP8_FORMATS:
        x = torch.tensor([[3.0e38, -1.0, 2.0**-120], [-5.0, 5.0, 0.0]])
        obs.call("huge and tiny", qc, x, fmt, axis=-1)
    for x in current_edges():
        for fmt in FP8_FORMATS:
            for axis in (None, -1):
                obs.call("edge", qc, x, fmt, axis=axis)
    obs.done()


def scaler_inputs(seed: int) -> list[tuple[int, int, int, int, torch.Tensor]]:
    """``(fmt index, history_len, margin, step, x)`` of DelayedScaling's streams
    (:func:`scaler_stream`)."""
    return list(scaler_stream(torch.Generator().manual_seed(seed)))


def drive_fp8_scaler(namespace: dict[str, Any], DelayedScaling: type) -> None:  # noqa: N803
    """Records each call's result, call by call; the judge runs its reference scaler beside."""
    obs, seed = observer("fp8_scaler", namespace)
    print(f"hidden tests: seed {seed}")
    strict = with_nan_overflow
    ds = None
    for f, hl, margin, step, x in scaler_inputs(seed):
        if step == 0:
            ds = DelayedScaling(FP8_FORMATS[f], history_len=hl, margin=margin)
        q, s = obs.call("quantize", strict(ds.quantize), x)
        obs.raises("dequantize", ds.dequantize, q, s)
        obs.record("input after", x)
        obs.record("history", list(ds.amax_history))
    # The product is taken in float32, not in x's dtype.
    dsb = DelayedScaling()
    strict(dsb.quantize)(torch.tensor([4.0]))
    xb = torch.tensor([229 / 256, -1.0], dtype=torch.bfloat16)
    obs.call("bfloat16 product", strict(dsb.quantize), xb)
    for fmt in FP8_FORMATS:
        # The window: an old spike stops mattering once it leaves the history.
        dw = DelayedScaling(fmt, history_len=3)
        for a in (100.0, 1.0, 1.0, 1.0, 1.0):
            obs.call("window", strict(dw.quantize), torch.tensor([a, -a / 2]))
        # Zeros: no information, scale stays 1 and zeros stay zeros.
        dz = DelayedScaling(fmt, margin=3)
        for _ in range(2):
            obs.call("zeros", strict(dz.quantize), torch.zeros(10))
        # Saturation, never inf or NaN, even on the first call and far beyond the range.
        fmax = fp8_max(fmt)
        big = torch.tensor([3e38, -3e38, 1e9, fmax * 1.01, -fmax * 1.6, 0.5])
        obs.call("huge", strict(DelayedScaling(fmt).quantize), big)
        dj = DelayedScaling(fmt, history_len=2)
        strict(dj.quantize)(torch.tensor([1e-3]))
        obs.call("jump", strict(dj.quantize), torch.tensor([5.0, -7.0, 1e-4]))
    for fmt in FP8_FORMATS:
        for margin in (0, 3):
            dt = DelayedScaling(fmt, history_len=2, margin=margin)
            for x in scaler_subnormals():
                q, s = obs.call("quantize", strict(dt.quantize), x)
                obs.raises("dequantize", dt.dequantize, q, s)
    obs.done()


def mx_inputs(seed: int) -> list[tuple[torch.Tensor, int, torch.dtype]]:
    """``(x, block, fmt)`` of every mx_quantize call: the random tensors (:func:`mx_random`),
    then for each format the edge blocks (:func:`mx_edges`) one by one, in rows of 8, and all in
    one row that ends in a short block."""
    gen = torch.Generator().manual_seed(seed)
    inputs = [(x, block, fmt) for _, _, block, _, fmt, x in mx_random(gen)]
    edges = mx_edges(gen)
    for fmt in FP8_FORMATS:
        for blk in edges:
            inputs += [(blk.reshape(1, 32), 32, fmt), (blk.reshape(4, 8), 8, fmt)]
        inputs.append((torch.cat(edges)[: 32 * 8 - 5].reshape(1, -1), 32, fmt))
    return inputs


def drive_mx_block_quantize(
    namespace: dict[str, Any], mx_quantize: Callable, mx_dequantize: Callable
) -> None:
    """What mx_quantize returns on every input (and the input after), and mx_dequantize on it."""
    obs, seed = observer("mx_block_quantize", namespace)
    print(f"hidden tests: seed {seed}")
    for x, block, fmt in mx_inputs(seed):
        q, e = obs.call("quantize", with_nan_overflow(mx_quantize), x, block, fmt)
        obs.record("input after", x)
        obs.raises("dequantize", mx_dequantize, q, e, block)
    obs.done()
