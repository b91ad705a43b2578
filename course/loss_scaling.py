"""Loss scaling and master weights: data, logs, sweeps, plots and a widget (lesson 02).

The lesson's training loop itself (autocast, ``scaler.scale(loss).backward()``, ``step``,
``update``) is written in the notebook; this module holds its plumbing: the batches, what each
step records, the static-scale sweep, the float16 neighbours of a weight, and the widget that
drives the real ``torch.amp.GradScaler`` with injected infs. The graded exercises (a dynamic
loss scaler written by hand, fp32 master weights) are left to the student: nothing here
implements them.
"""

from __future__ import annotations

import inspect
import math
import random
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import ipywidgets as W
import torch
from IPython.display import display
from torch import nn

from course.data import digits
from course.device import one_cpu_thread
from course.plotting import new_figure


def small_model_threads(device: torch.device | str) -> AbstractContextManager[None]:
    """Run the block on one CPU thread (lesson 02's tiny models); see ``one_cpu_thread``."""
    return one_cpu_thread(device)


def digit_batches(
    device: torch.device | str, steps: int, batch_size: int = 256, seed: int = 0
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], tuple[torch.Tensor, torch.Tensor]]:
    """``steps`` random training batches of the digits and the test set (lesson 02).

    Every run of the lesson trains on the same list, so runs differ only in their precision and
    loss scaling. Returns ``(batches, (x_test, y_test))``, float32 inputs on ``device``.
    """
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be positive, got {steps}, {batch_size}")
    x, y, x_test, y_test = digits(device, seed=seed)
    gen = torch.Generator().manual_seed(seed + 1)
    batches = []
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch_size,), generator=gen).to(x.device)
        batches.append((x[idx], y[idx]))
    return batches, (x_test, y_test)


def zero_grad_fraction(model: nn.Module) -> float:
    """The fraction of the model's gradient elements that are exactly zero (lesson 02)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = sum(g.numel() for g in grads)
    zeros = sum(int((g == 0).sum()) for g in grads)
    return zeros / total if total else 0.0


@dataclass
class RunLog:
    """What one training run recorded, step by step (lesson 02).

    The lesson's training loop calls :meth:`record` once per step, after ``scaler.update()`` and
    before the gradients are cleared, and :meth:`finish` at the end.
    """

    label: str
    losses: list[float] = field(default_factory=list)
    zero_fraction: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    test_accuracy: float = float("nan")

    def record(self, loss: torch.Tensor, model: nn.Module, before: float, after: float) -> None:
        """Log the step's loss, its zero gradients and the scale; a scale that went down (from
        ``before`` to ``after``) means the scaler skipped this step."""
        self.losses.append(float(loss.detach()))
        self.zero_fraction.append(zero_grad_fraction(model))
        self.scales.append(float(after))
        self.skipped.append(float(after) < float(before))

    def finish(self, model: nn.Module, x_test: torch.Tensor, y_test: torch.Tensor) -> RunLog:
        """Measure the test accuracy (in float32, without autocast) and return the log."""
        with torch.no_grad():
            pred = model(x_test).argmax(1)
        self.test_accuracy = float((pred == y_test).float().mean())
        return self

    @property
    def skipped_steps(self) -> list[int]:
        """The indices of the steps whose optimizer step was skipped."""
        return [i for i, s in enumerate(self.skipped) if s]


def plot_runs(runs: dict[str, RunLog], title: str) -> None:
    """Lesson 02's two panels: the training loss and the fraction of zero gradients per step."""
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.6))
    for name, log in runs.items():
        ax1.plot(log.losses, label=name)
        ax2.plot(log.zero_fraction, label=name)
    ax1.set(xlabel="step", ylabel="training loss", title=title)
    ax2.set(xlabel="step", ylabel="fraction of gradient elements == 0",
            title="gradients that are exactly zero", ylim=(0, 1.02))  # fmt: skip
    ax1.legend(fontsize="small")
    ax2.legend(fontsize="small")
    plt.show()


def scale_sweep(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    log2_scales: list[int],
    dtype: torch.dtype = torch.float16,
) -> dict[str, list[float]]:
    """What a static loss scale does to one backward pass of ``model`` (lesson 02).

    For each ``2**k`` the cross-entropy of ``model(x)`` under ``dtype`` autocast (on ``x``'s
    device) is multiplied by the scale and back-propagated. Returns the fraction of float32's
    non-zero gradient elements that are zero here (``lost``), the fraction of all elements that
    are inf or nan (``overflow``), and the relative error of the unscaled gradients against float32
    (``rel_error``, nan when anything overflowed). The model's gradients are cleared afterwards.
    """
    device_type = x.device.type

    def grads(scale: float, amp: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with torch.amp.autocast(device_type, dtype=dtype, enabled=amp):
            loss = nn.functional.cross_entropy(model(x), y)
        (loss * scale).backward()
        return [p.grad.detach().float() / scale for p in model.parameters()]

    with small_model_threads(x.device):
        ref = grads(1.0, False)
        nonzero = sum(int((g != 0).sum()) for g in ref)
        norm = sum(float(g.abs().sum()) for g in ref)
        out: dict[str, list[float]] = {
            "log2_scale": [], "lost": [], "overflow": [], "rel_error": []
        }  # fmt: skip
        for k in log2_scales:
            half = grads(2.0**k, True)
            lost = sum(int(((h == 0) & (r != 0)).sum()) for h, r in zip(half, ref, strict=True))
            bad = sum(int((~torch.isfinite(h)).sum()) for h in half)
            err = sum(float((h - r).abs().sum()) for h, r in zip(half, ref, strict=True))
            out["log2_scale"].append(float(k))
            out["lost"].append(lost / nonzero)
            out["overflow"].append(bad / sum(h.numel() for h in half))
            out["rel_error"].append(err / norm if bad == 0 else float("nan"))
    model.zero_grad(set_to_none=True)
    return out


def fp16_neighbours(w: float) -> tuple[float, float, float]:
    """``(below, w16, above)``: ``w`` rounded to float16 and its two float16 neighbours (lesson 02).

    Found by stepping the bit pattern by one, as lesson 01 decoded it; for a positive power of two
    the gap below is half the gap above.
    """
    w16 = torch.tensor(w, dtype=torch.float16)
    if not bool(torch.isfinite(w16)) or float(w16) == 0.0:
        raise ValueError(f"{w} is zero or not finite in float16")
    bits = w16.view(torch.int16)
    below = (bits - 1).view(torch.float16) if w > 0 else (bits + 1).view(torch.float16)
    above = (bits + 1).view(torch.float16) if w > 0 else (bits - 1).view(torch.float16)
    return float(below), float(w16), float(above)


def lost_update_fraction(
    ratios: torch.Tensor, steps: int = 1, dtype: torch.dtype = torch.float16, n: int = 4096
) -> torch.Tensor:
    """For each ratio ``r``, the fraction of weights that ``w + r*w`` leaves unchanged (lesson 02).

    The weights are spread evenly (in log scale) over one binade, ``[1, 2)``, so the result
    shows where between ``2**-12`` and ``2**-11`` updates start to be rounded away in float16.
    """
    w = torch.exp2(torch.linspace(0, 1, n + 1, dtype=torch.float64)[:-1]).to(dtype)
    out = torch.empty(len(ratios), dtype=torch.float64)
    for i, r in enumerate(ratios.tolist()):
        upd = (w.double() * r).to(dtype)
        cur = w.clone()
        for _ in range(steps):
            cur = cur + upd
        out[i] = float((cur == w).double().mean())
    return out


def accumulate(
    start: float, update: float, steps: int, master: bool, dtype: torch.dtype = torch.float16
) -> torch.Tensor:
    """Add ``update`` to a ``dtype`` weight ``steps`` times; returns the weight after each step.

    With ``master=True`` the additions happen in a float32 copy and the weight is that copy cast
    to ``dtype`` after each step (lesson 02).
    """
    w = torch.tensor(start, dtype=dtype)
    w32 = torch.tensor(start, dtype=torch.float32)
    u = torch.tensor(update, dtype=dtype)
    out = torch.empty(steps, dtype=torch.float64)
    for i in range(steps):
        if master:
            w32 = w32 + u.float()
            w = w32.to(dtype)
        else:
            w = w + u
        out[i] = float(w)
    return out


def digits_logistic_fp16(
    device: torch.device | str, weight_std: float = 0.02, seed: int = 0
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A float16 linear classifier for digits and the data as float16 inputs (lesson 02).

    The weights start normal with std ``weight_std`` (0.02 is GPT-2's and lesson 09's choice, and
    the size of typical pretrained linear weights) and the bias at zero. Returns
    ``(model, (x, y, x_test, y_test))``.
    """
    device = torch.device(device)
    x, y, x_test, y_test = digits(device, seed=seed)
    torch.manual_seed(seed)
    model = nn.Linear(64, 10)
    with torch.no_grad():
        model.weight.normal_(0.0, weight_std)
        model.bias.zero_()
    return model.to(device).half(), (x.half(), y, x_test.half(), y_test)


def simulate_grad_scaler(
    steps: int = 300,
    overflow_rate: float = 0.0,
    growth_interval: int = 20,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    init_scale: float | None = None,
    ceiling_log2: float | None = None,
    seed: int = 0,
    scaler_factory: Callable[..., Any] | None = None,
    device: torch.device | str = "cpu",
) -> dict[str, list]:
    """Drive a real ``torch.amp.GradScaler`` on ``device`` with injected infs (lesson 02).

    Each step one float32 parameter gets a gradient of 1.0 times the current scale, or inf when
    the step overflows: at random with probability ``overflow_rate``, and always when the scale is
    above ``2**ceiling_log2`` (a stand-in for the largest gradient of a real model). Returns the
    scale after each ``update()`` and which steps overflowed. ``scaler_factory`` (same keyword
    arguments as GradScaler, without the device) lets the lesson run another scaler, such as the
    student's, through the same steps. ``init_scale=None`` starts at GradScaler's own default,
    read from its signature. The parameter, its gradients and the scaler live on ``device``, so
    the scale is updated by that device's kernels.
    """
    if init_scale is None:
        init_scale = inspect.signature(torch.amp.GradScaler).parameters["init_scale"].default
    if not 0.0 <= overflow_rate <= 1.0:
        raise ValueError(f"overflow_rate must lie in [0, 1], got {overflow_rate}")
    rng = random.Random(seed)
    dev = torch.device(device)
    kwargs = dict(
        init_scale=init_scale,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
    )
    scaler = (
        torch.amp.GradScaler(dev.type, **kwargs)
        if scaler_factory is None
        else scaler_factory(**kwargs)
    )
    param = nn.Parameter(torch.zeros(1, device=dev))
    opt = torch.optim.SGD([param], lr=0.0)
    scales: list[float] = []
    overflowed: list[bool] = []
    for _ in range(steps):
        scaled = scaler.scale(torch.ones((), device=dev, requires_grad=True))
        too_big = ceiling_log2 is not None and scaler.get_scale() > 2.0**ceiling_log2
        bad = too_big or rng.random() < overflow_rate
        value = float("inf") if bad else float(scaled.detach())
        param.grad = torch.full((1,), value, device=dev)
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        overflowed.append(bad)
    return {"scales": scales, "overflowed": overflowed}


class ScaleTrajectoryExplorer:
    """Lesson 02's widget: the loss scale over steps for an overflow rate, interval and factors.

    Every redraw runs the real ``torch.amp.GradScaler`` on ``device`` through
    :func:`simulate_grad_scaler`. State is kept on the object (``result``, ``summary``) so tests
    can drive the controls.
    """

    def __init__(self, steps: int = 300, seed: int = 0, device: torch.device | str = "cpu") -> None:
        self.steps = steps
        self.seed = seed
        self.device = torch.device(device)
        style = {"description_width": "150px"}
        wide = W.Layout(width="60%")
        self.rate = W.FloatSlider(
            value=0.01, min=0.0, max=0.3, step=0.005, readout_format=".3f",
            description="overflow rate", continuous_update=False, style=style, layout=wide,
        )  # fmt: skip
        self.interval = W.IntSlider(
            value=20, min=1, max=200, description="growth_interval",
            continuous_update=False, style=style, layout=wide,
        )  # fmt: skip
        self.growth = W.FloatSlider(
            value=2.0, min=1.05, max=4.0, step=0.05, description="growth_factor",
            continuous_update=False, style=style, layout=wide,
        )  # fmt: skip
        self.backoff = W.FloatSlider(
            value=0.5, min=0.05, max=0.95, step=0.05, description="backoff_factor",
            continuous_update=False, style=style, layout=wide,
        )  # fmt: skip
        self.ceiling = W.IntSlider(
            value=24, min=0, max=40, description="overflow above 2^",
            continuous_update=False, style=style, layout=wide,
        )  # fmt: skip
        self.use_ceiling = W.Checkbox(value=True, description="gradients overflow above a scale")
        self.summary = W.HTML()
        self.output = W.Output()
        self.figure, (self.ax,) = new_figure(8, 3.4)
        self.result: dict[str, list] = {}
        controls = (
            self.rate, self.interval, self.growth, self.backoff, self.ceiling, self.use_ceiling
        )  # fmt: skip
        for control in controls:
            control.observe(lambda change: self.update(), names="value")
        self.widget = W.VBox([*controls, self.summary, self.output])
        self.update()

    def update(self) -> None:
        """Rerun GradScaler with the controls' values and redraw the trajectory."""
        ceiling = self.ceiling.value if self.use_ceiling.value else None
        self.result = simulate_grad_scaler(
            steps=self.steps,
            overflow_rate=self.rate.value,
            growth_interval=self.interval.value,
            growth_factor=self.growth.value,
            backoff_factor=self.backoff.value,
            ceiling_log2=ceiling,
            seed=self.seed,
            device=self.device,
        )
        scales = self.result["scales"]
        over = self.result["overflowed"]
        # A backoff can round the float32 scale below its smallest subnormal, to 0, and 0 times
        # growth_factor stays 0: log2 has no value there, so those steps are not drawn.
        zero_at = next((i + 1 for i, s in enumerate(scales) if s == 0.0), None)
        logs = [math.log2(s) if s > 0 else math.nan for s in scales]
        self.ax.clear()
        self.ax.step(range(1, len(logs) + 1), logs, where="post", label="log2(scale) after update")
        bad = [i + 1 for i, b in enumerate(over) if b and scales[i] > 0]
        self.ax.plot(bad, [logs[i - 1] for i in bad], "rv", ms=4, label="skipped (overflow)")
        if ceiling is not None:
            self.ax.axhline(ceiling, color="tab:purple", ls=":", label="overflow above this")
        if zero_at is not None:
            self.ax.axvline(
                zero_at, color="tab:red", ls="--", label=f"scale 0.0 from step {zero_at} on"
            )
        self.ax.set_xlabel("optimizer step")
        self.ax.set_ylabel("log2(scale)")
        self.ax.set_title(f"torch.amp.GradScaler's scale on {self.device.type}, with injected infs")
        self.ax.legend(loc="lower right", fontsize="small")
        half = scales[len(scales) // 2 :]
        if zero_at is None:
            final = f"final scale <b>{scales[-1]:.6g}</b> = 2<sup>{logs[-1]:.2f}</sup>"
            mean = f"<b>{sum(math.log2(s) for s in half) / len(half):.2f}</b>"
        else:
            stayed = all(s == 0.0 for s in scales[zero_at - 1 :])
            last = f"{scales[zero_at - 2]:.6g}" if zero_at > 1 else "the initial scale"
            final = (
                f"<b>the scale underflowed to 0.0</b> at step {zero_at}: a backoff from "
                f"{last} rounded it to 0 in float32"
                + (", and it stayed 0 (0 times growth_factor is 0)" if stayed else "")
            )
            mean = (
                "<b>-inf</b> (the scale is 0)"
                if 0.0 in half
                else f"<b>{sum(math.log2(s) for s in half) / len(half):.2f}</b>"
            )
        self.summary.value = (
            f"skipped <b>{sum(over)}</b> of {len(over)} steps ({sum(over) / len(over):.1%}) "
            f"&nbsp;|&nbsp; {final} "
            f"&nbsp;|&nbsp; mean log2(scale) over the last half {mean}"
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        display(self.widget)
