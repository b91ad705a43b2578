"""Loss scaling and master weights: runs, sweeps and a widget (lesson 02).

The lesson's experiments train a small classifier on scikit-learn's digits in float16 with and
without loss scaling, and the widget drives the real ``torch.amp.GradScaler`` with injected
infs. The graded exercises (a dynamic loss scaler written by hand, fp32 master weights) are
left to the student: nothing here implements them.
"""

from __future__ import annotations

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

from course.data import digits, mlp
from course.device import one_cpu_thread
from course.plotting import new_figure

#: The weight lesson 02 puts on its loss: it stands in for the tiny gradients of big models.
LOSS_WEIGHT = 2.0**-16


def small_model_threads(device: torch.device | str) -> AbstractContextManager[None]:
    """Run the block on one CPU thread (lesson 02's tiny models); see ``one_cpu_thread``."""
    return one_cpu_thread(device)


@dataclass
class RunHistory:
    """What one training run recorded, step by step (lesson 02)."""

    label: str
    losses: list[float] = field(default_factory=list)
    zero_fraction: list[float] = field(default_factory=list)
    scales: list[float] = field(default_factory=list)
    skipped: list[bool] = field(default_factory=list)
    test_accuracy: float = float("nan")

    @property
    def skipped_steps(self) -> list[int]:
        """The indices of the steps whose optimizer step was skipped."""
        return [i for i, s in enumerate(self.skipped) if s]


def _zero_fraction(model: nn.Module) -> float:
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total = sum(g.numel() for g in grads)
    zeros = sum(int((g == 0).sum()) for g in grads)
    return zeros / total if total else 0.0


def train_digits(
    device: torch.device | str,
    mode: str = "fp32",
    steps: int = 150,
    static_scale: float = 1.0,
    scaler: Any = None,
    loss_weight: float = LOSS_WEIGHT,
    batch_size: int = 256,
    lr: float = 2e-3,
    seed: int = 0,
) -> RunHistory:
    """Train an MLP on digits with Adam and record every step (lesson 02).

    ``mode`` is ``"fp32"`` (no autocast) or ``"fp16"`` (float16 autocast on ``device``). The loss
    is multiplied by ``loss_weight``; Adam with a tiny ``eps`` ignores the overall size of the
    gradients, so in float32 the weight changes nothing, while in float16 it pushes gradients
    below the smallest subnormal. With ``static_scale`` the loss is multiplied by that constant
    before ``backward`` and the gradients divided by it afterwards, in float32, with no check for
    inf. With ``scaler`` (``torch.amp.GradScaler`` or any object with ``scale``, ``step``,
    ``update`` and ``get_scale``), the scaler does the scaling and decides which steps to skip.
    """
    if mode not in ("fp32", "fp16"):
        raise ValueError(f"mode should be 'fp32' or 'fp16', got {mode!r}")
    device = torch.device(device)
    x, y, x_test, y_test = digits(device, seed=seed)
    torch.manual_seed(seed)
    model = mlp((64, 64, 64, 10)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr, eps=1e-12)
    batches = torch.Generator().manual_seed(seed + 1)
    label = mode if scaler is None else f"{mode} + {type(scaler).__name__}"
    if static_scale != 1.0:
        label += f" x 2^{math.log2(static_scale):g}"
    history = RunHistory(label)
    with small_model_threads(device):
        for _ in range(steps):
            idx = torch.randint(0, len(x), (batch_size,), generator=batches).to(device)
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.float16, enabled=mode == "fp16"):
                loss = nn.functional.cross_entropy(model(x[idx]), y[idx]) * loss_weight
            if scaler is not None:
                scaler.scale(loss).backward()
                history.zero_fraction.append(_zero_fraction(model))
                before = scaler.get_scale()
                scaler.step(opt)
                scaler.update()
                history.scales.append(scaler.get_scale())
                history.skipped.append(history.scales[-1] < before)
            else:
                (loss * static_scale).backward()
                history.zero_fraction.append(_zero_fraction(model))
                if static_scale != 1.0:
                    for p in model.parameters():
                        p.grad.div_(static_scale)
                opt.step()
                history.scales.append(static_scale)
                history.skipped.append(False)
            history.losses.append(loss.item() / loss_weight)
    with torch.no_grad():
        pred = model(x_test).argmax(1)
    history.test_accuracy = float((pred == y_test).float().mean())
    return history


def scale_sweep(
    device: torch.device | str,
    log2_scales: list[int],
    loss_weight: float = LOSS_WEIGHT,
    batch_size: int = 256,
    seed: int = 0,
) -> dict[str, list[float]]:
    """At the untrained model of :func:`train_digits`, what a static scale does (lesson 02).

    For each ``2**k`` the float16 autocast backward runs on the scaled loss. Returns the fraction
    of the weight-gradient elements that are non-zero in float32 but zero in float16 (``lost``),
    the fraction that are inf or nan (``overflow``), and the relative error of the unscaled
    float16 gradients against float32 (``rel_error``, nan when anything overflowed).
    """
    device = torch.device(device)
    x, y, _, _ = digits(device, seed=seed)
    torch.manual_seed(seed)
    model = mlp((64, 64, 64, 10)).to(device)
    xb, yb = x[:batch_size], y[:batch_size]

    def grads(scale: float, amp: bool) -> list[torch.Tensor]:
        model.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.float16, enabled=amp):
            loss = nn.functional.cross_entropy(model(xb), yb) * loss_weight
        (loss * scale).backward()
        return [p.grad.detach().clone() / scale for p in model.parameters()]

    with small_model_threads(device):
        ref = grads(1.0, False)
        nonzero = sum(int((g != 0).sum()) for g in ref)
        norm = sum(float(g.abs().sum()) for g in ref)
        out: dict[str, list[float]] = {
            "log2_scale": [],
            "lost": [],
            "overflow": [],
            "rel_error": [],
        }
        for k in log2_scales:
            half = grads(2.0**k, True)
            lost = sum(int(((h == 0) & (r != 0)).sum()) for h, r in zip(half, ref, strict=True))
            bad = sum(int((~torch.isfinite(h)).sum()) for h in half)
            err = sum(float((h - r).abs().sum()) for h, r in zip(half, ref, strict=True))
            out["log2_scale"].append(float(k))
            out["lost"].append(lost / nonzero)
            out["overflow"].append(bad / sum(h.numel() for h in half))
            out["rel_error"].append(err / norm if bad == 0 else float("nan"))
    return out


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
    device: torch.device | str, seed: int = 0
) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A float16 linear classifier for digits and the data in float16 inputs (lesson 02).

    The weights start uniform in [-1, 1], so small SGD updates fall below the 2^-11
    relative step float16 can take. Returns ``(model, (x, y, x_test, y_test))``.
    """
    device = torch.device(device)
    x, y, x_test, y_test = digits(device, seed=seed)
    torch.manual_seed(seed)
    model = nn.Linear(64, 10)
    with torch.no_grad():
        model.weight.uniform_(-1.0, 1.0)
        model.bias.uniform_(-1.0, 1.0)
    return model.to(device).half(), (x.half(), y, x_test.half(), y_test)


def simulate_grad_scaler(
    steps: int = 300,
    overflow_rate: float = 0.0,
    growth_interval: int = 20,
    growth_factor: float = 2.0,
    backoff_factor: float = 0.5,
    init_scale: float = 2.0**16,
    ceiling_log2: float | None = None,
    seed: int = 0,
    scaler_factory: Callable[..., Any] | None = None,
) -> dict[str, list]:
    """Drive a real ``torch.amp.GradScaler("cpu")`` with injected infs (lesson 02).

    Each step one float32 parameter gets a gradient of 1.0 times the current scale, or inf when
    the step overflows: at random with probability ``overflow_rate``, and always when the scale is
    above ``2**ceiling_log2`` (a stand-in for the largest gradient of a real model). Returns the
    scale after each ``update()`` and which steps overflowed. ``scaler_factory`` (same keyword
    arguments as GradScaler, without the device) lets the lesson run another scaler, such as the
    student's, through the same steps.
    """
    if not 0.0 <= overflow_rate <= 1.0:
        raise ValueError(f"overflow_rate must lie in [0, 1], got {overflow_rate}")
    rng = random.Random(seed)
    kwargs = dict(
        init_scale=init_scale,
        growth_factor=growth_factor,
        backoff_factor=backoff_factor,
        growth_interval=growth_interval,
    )
    scaler = (
        torch.amp.GradScaler("cpu", **kwargs)
        if scaler_factory is None
        else scaler_factory(**kwargs)
    )
    param = nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.0)
    scales: list[float] = []
    overflowed: list[bool] = []
    for _ in range(steps):
        scaled = scaler.scale(torch.ones((), requires_grad=True))
        too_big = ceiling_log2 is not None and scaler.get_scale() > 2.0**ceiling_log2
        bad = too_big or rng.random() < overflow_rate
        param.grad = torch.full((1,), float("inf") if bad else float(scaled.detach()))
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
        overflowed.append(bad)
    return {"scales": scales, "overflowed": overflowed}


class ScaleTrajectoryExplorer:
    """Lesson 02's widget: the loss scale over steps for an overflow rate, interval and factors.

    Every redraw runs the real ``torch.amp.GradScaler`` through :func:`simulate_grad_scaler`.
    State is kept on the object (``result``, ``summary``) so tests can drive the controls.
    """

    def __init__(self, steps: int = 300, seed: int = 0) -> None:
        self.steps = steps
        self.seed = seed
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
        )
        scales = self.result["scales"]
        over = self.result["overflowed"]
        logs = [math.log2(s) for s in scales]
        self.ax.clear()
        self.ax.step(range(1, len(logs) + 1), logs, where="post", label="log2(scale) after update")
        bad = [i + 1 for i, b in enumerate(over) if b]
        self.ax.plot(bad, [logs[i - 1] for i in bad], "rv", ms=4, label="skipped (overflow)")
        if ceiling is not None:
            self.ax.axhline(ceiling, color="tab:purple", ls=":", label="overflow above this")
        self.ax.set_xlabel("optimizer step")
        self.ax.set_ylabel("log2(scale)")
        self.ax.set_title("torch.amp.GradScaler's scale, driven with injected infs")
        self.ax.legend(loc="lower right", fontsize="small")
        self.summary.value = (
            f"skipped <b>{sum(over)}</b> of {len(over)} steps ({sum(over) / len(over):.1%}) "
            f"&nbsp;|&nbsp; final scale <b>{scales[-1]:.6g}</b> = 2<sup>{logs[-1]:.2f}</sup> "
            f"&nbsp;|&nbsp; mean log2(scale) over the last half "
            f"<b>{sum(logs[len(logs) // 2 :]) / (len(logs) - len(logs) // 2):.2f}</b>"
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        display(self.widget)
