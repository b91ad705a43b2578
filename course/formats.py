"""Number formats: what each floating point dtype can hold (lesson 01).

The table and the spacing curve the lesson shows; the experiments themselves (the running sums
that swamp) and the graded exercises (bit decoding, cast fates, underflow fractions, safe scales,
compensated sums) are written in the notebook.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

#: The dtypes lesson 01 compares, in the order it shows them.
FORMATS: tuple[torch.dtype, ...] = (
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
)


#: An integer dtype of each width, to read a floating dtype's bit patterns (lesson 01).
_BITS_AS_INT: dict[int, torch.dtype] = {
    8: torch.uint8,
    16: torch.int16,
    32: torch.int32,
    64: torch.int64,
}


@dataclass(frozen=True)
class FormatInfo:
    """The numbers that decide what a dtype can hold (from ``torch.finfo``; lesson 01)."""

    dtype: torch.dtype
    bits: int
    exponent_bits: int
    mantissa_bits: int
    max: float
    smallest_normal: float
    smallest_subnormal: float
    eps: float


def smallest_subnormal(dtype: torch.dtype) -> float:
    """The smallest positive value of ``dtype``: its bit pattern 1, viewed as ``dtype``.

    Read off the bits rather than derived from ``finfo`` (lesson 01).
    """
    one = torch.ones((), dtype=_BITS_AS_INT[torch.finfo(dtype).bits])
    return float(one.view(dtype))


def format_info(dtype: torch.dtype) -> FormatInfo:
    """Range and precision of ``dtype``, read from ``torch.finfo`` and its bits (lesson 01)."""
    fi = torch.finfo(dtype)
    mantissa = round(-math.log2(fi.eps))
    exponent = fi.bits - 1 - mantissa
    return FormatInfo(
        dtype=dtype,
        bits=fi.bits,
        exponent_bits=exponent,
        mantissa_bits=mantissa,
        max=float(fi.max),
        smallest_normal=float(fi.smallest_normal),
        smallest_subnormal=smallest_subnormal(dtype),
        eps=float(fi.eps),
    )


def format_table(dtypes: tuple[torch.dtype, ...] = FORMATS) -> str:
    """A text table of :func:`format_info` for ``dtypes`` (lesson 01)."""
    head = (
        f"{'dtype':<16}{'bits':>5}{'exp':>5}{'man':>5}{'max':>14}"
        f"{'min normal':>14}{'min subnormal':>15}{'eps':>12}"
    )
    rows = [head, "-" * len(head)]
    for dtype in dtypes:
        i = format_info(dtype)
        rows.append(
            f"{str(dtype).removeprefix('torch.'):<16}{i.bits:>5}{i.exponent_bits:>5}"
            f"{i.mantissa_bits:>5}{i.max:>14.6g}{i.smallest_normal:>14.6g}"
            f"{i.smallest_subnormal:>15.6g}{i.eps:>12.6g}"
        )
    return "\n".join(rows)


def spacing(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gap from each ``|value|`` up to the next ``dtype`` number: one unit in the last place.

    For ``|x|`` in the dtype's normal range that is
    ``2**(floor(log2|x|) - mantissa_bits)``; below the smallest normal the gap is the smallest
    subnormal. Computed for the value as given, in float64, not first rounded to ``dtype``
    (lesson 01).
    """
    info = format_info(dtype)
    x = values.double().abs()
    exponent = torch.floor(torch.log2(x.clamp_min(info.smallest_normal)))
    return torch.exp2(exponent - info.mantissa_bits)
