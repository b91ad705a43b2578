"""Plots the lessons share (lesson 01 onwards)."""

from __future__ import annotations

import math

import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

#: Where float16 values live, as powers of two: subnormals from 2**-24, normals from 2**-14,
#: the largest finite value 65504 just under 2**16; casts from 65520 up round to inf.
FP16_SUBNORMAL_LOG2 = -24
FP16_NORMAL_LOG2 = -14
FP16_MAX_LOG2 = math.log2(65504.0)
FP16_INF_LOG2 = math.log2(65520.0)


def new_figure(width: float = 7.0, height: float = 3.5, ncols: int = 1) -> tuple[Figure, list]:
    """A figure not registered with pyplot, so widgets can redraw it without leaking figures.

    Introduced in lesson 01 (its loss-scale widget).
    """
    fig = Figure(figsize=(width, height), layout="constrained")
    axes = [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]
    return fig, axes


def log2_magnitudes(tensors: list[torch.Tensor], scale: float = 1.0) -> torch.Tensor:
    """log2 of every non-zero ``|t * scale|`` over a list of tensors, in float64 (lesson 01)."""
    if not tensors:
        return torch.empty(0, dtype=torch.float64)
    flat = torch.cat([t.detach().double().flatten().cpu() for t in tensors]) * scale
    flat = flat[(flat != 0) & torch.isfinite(flat)]
    return torch.log2(flat.abs())


def plot_fp16_band(
    ax: Axes, tensors: list[torch.Tensor], scale: float = 1.0, bins: int = 120, title: str = ""
) -> list[float]:
    """Histogram of ``log2|g * scale|`` over float16's zones: flushed, subnormal, normal, inf.

    Every tensor in ``tensors`` is pooled into one histogram of its non-zero finite elements;
    magnitudes outside the axis are counted in its first or last bin. The zones are where a
    value lands *after* rounding to float16: at most ``2**-25`` flushes to 0 (exactly ``2**-25``
    ties to even, 0), below about ``2**-14`` is subnormal, from 65520 up it is inf. Returns the
    bar heights drawn. Introduced in lesson 01.
    """
    logs = log2_magnitudes(tensors, scale)
    lo, hi = -40.0, 24.0
    ax.axvspan(lo, FP16_SUBNORMAL_LOG2 - 1, color="tab:red", alpha=0.12, label="flushes to 0")
    ax.axvspan(
        FP16_SUBNORMAL_LOG2 - 1,
        FP16_NORMAL_LOG2,
        color="tab:orange",
        alpha=0.15,
        label="subnormal (lost precision)",
    )
    ax.axvspan(FP16_NORMAL_LOG2, FP16_INF_LOG2, color="tab:green", alpha=0.10, label="normal")
    ax.axvspan(FP16_INF_LOG2, hi, color="tab:purple", alpha=0.12, label="overflows to inf")
    counts, _, _ = ax.hist(logs.clamp(lo, hi).numpy(), bins=bins, range=(lo, hi), color="tab:blue")
    ax.set_xlim(lo, hi)
    ax.set_xlabel(f"log2 |gradient x scale|, before the cast (outside [{lo:g}, {hi:g}]: end bins)")
    ax.set_ylabel("elements")
    ax.set_title(title or f"gradients x 2^{math.log2(scale):g} against float16's range")
    ax.legend(loc="upper left", fontsize="small")
    return [float(c) for c in counts]
