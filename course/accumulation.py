"""Gradient accumulation, clipping and checkpoints with a GradScaler (lesson 05).

Helpers for measuring what an accumulated step did, and the lesson's widget. Nothing here
performs an accumulated optimizer step or saves a training state: the lesson asks students to
write those (``accumulated_step``, ``save_training_state``, ``load_training_state``), and the
widget runs the student's ``accumulated_step``.
"""

from __future__ import annotations

import copy
import html
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import ipywidgets as W
import torch
from IPython.display import display
from torch import nn

from course.data import mlp
from course.plotting import new_figure

MicroBatches = list[tuple[torch.Tensor, torch.Tensor]]


def split_batch(x: torch.Tensor, y: torch.Tensor, count: int) -> MicroBatches:
    """Split a batch ``(x, y)`` into ``count`` micro-batches of equal size (lesson 05).

    Equal sizes matter: with a mean-reduced loss, dividing each micro-batch's loss by ``count``
    reproduces the full batch's mean only when every micro-batch holds the same number of
    examples. Raises ValueError when ``len(x)`` is not a multiple of ``count``.
    """
    if count < 1:
        raise ValueError(f"the micro-batch count must be at least 1, got {count}")
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} examples but y has {len(y)}")
    if len(x) % count:
        raise ValueError(
            f"a batch of {len(x)} examples does not split into {count} equal micro-batches"
        )
    return list(zip(x.chunk(count), y.chunk(count), strict=True))


def dropout_mlp(sizes: Sequence[int] = (64, 128, 128, 10), p: float = 0.2) -> nn.Sequential:
    """An MLP with ReLU and Dropout between its layers (lesson 05).

    Dropout draws a random mask on every training forward pass, so resuming its training
    bit-identically needs the random number generator's state as well as the weights.
    """
    return mlp(tuple(sizes), dropout=p)


def full_batch_grads(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> list[torch.Tensor]:
    """The float32 gradients of ``loss_fn(model(x), y)`` over the whole batch (lesson 05).

    No autocast and no scaler: this is the reference an accumulated step is compared with.
    One tensor per parameter (zeros where a parameter gets no gradient); the model's ``.grad``
    fields are left as they were.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        with torch.autocast(x.device.type, enabled=False):
            loss_fn(model(x), y).backward()
        return [
            p.grad.detach().float().clone() if p.grad is not None else torch.zeros_like(p)
            for p in params
        ]
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = g


def relative_difference(actual: Sequence[torch.Tensor], expected: Sequence[torch.Tensor]) -> float:
    """``||actual - expected|| / ||expected||`` over lists of tensors, in float64 (lesson 05).

    Returns ``inf`` when ``actual`` holds an inf or NaN, and the absolute norm of the difference
    when ``expected`` is all zero.
    """
    if len(actual) != len(expected):
        raise ValueError(f"{len(actual)} tensors compared with {len(expected)}")
    if not expected:
        return 0.0
    a = torch.cat([t.detach().double().flatten().cpu() for t in actual])
    e = torch.cat([t.detach().double().flatten().cpu() for t in expected])
    if a.shape != e.shape:
        raise ValueError(f"{a.numel()} elements compared with {e.numel()}")
    if not bool(torch.isfinite(a).all()):
        return float("inf")
    diff = float((a - e).norm())
    ref = float(e.norm())
    return diff / ref if ref > 0 else diff


class RecordingSGD(torch.optim.SGD):
    """Plain SGD that keeps a copy of the gradients it was asked to step with (lesson 05).

    ``seen`` holds the gradients (one tensor per parameter, ``None`` where a parameter had no
    gradient) of the latest call to ``step``; ``steps`` counts the calls. ``GradScaler.step``
    calls ``optimizer.step()`` only when it does not skip, and only after unscaling, so this shows
    exactly what an update was made of. With ``lr=0`` the parameters never move.
    """

    def __init__(self, params: Iterable, lr: float = 0.0, **kwargs) -> None:
        super().__init__(params, lr=lr, **kwargs)
        self.seen: list[torch.Tensor | None] | None = None
        self.steps = 0

    @torch.no_grad()
    def step(self, closure=None):  # noqa: D102 - documented on the class
        self.seen = [
            None if p.grad is None else p.grad.detach().clone()
            for group in self.param_groups
            for p in group["params"]
        ]
        self.steps += 1
        return super().step(closure)


def peak_memory_bytes(fn: Callable[[], object], device: torch.device | str) -> int | None:
    """Peak CUDA memory allocated while ``fn()`` runs, above what was allocated before (lesson 05).

    Measured with ``torch.cuda.max_memory_allocated``. Returns ``None`` on any other device: the
    CPU has no comparable counter, so nothing is measured there.
    """
    device = torch.device(device)
    if device.type != "cuda":
        fn()
        return None
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return int(torch.cuda.max_memory_allocated(device) - base)


@dataclass(frozen=True)
class AccumulationResult:
    """What one call of an accumulated step did, as the widget measured it (lesson 05)."""

    count: int
    dtype: torch.dtype
    peak_bytes: int | None
    difference: float | None
    stepped: bool | None
    error: str | None = None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class AccumulationExplorer:
    """Lesson 05's widget: micro-batch count against peak memory and gradient error.

    ``step_fn`` is the student's ``accumulated_step``. For each micro-batch count the widget
    splits one batch, runs ``step_fn`` once with a :class:`RecordingSGD` at ``lr=0`` (so the
    model never changes) and a fresh GradScaler (enabled for float16, disabled for bfloat16),
    and shows the gradients the optimizer received against the float32 full-batch gradients.
    Peak memory is measured on CUDA only; on the CPU the widget says it is not measured.
    """

    def __init__(
        self,
        step_fn: Callable[..., bool] | None,
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy,
        counts: Sequence[int] = (1, 2, 4, 8, 16, 32),
        dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16),
        count: int | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if not counts or not dtypes:
            raise ValueError("AccumulationExplorer needs at least one count and one dtype")
        for k in counts:
            split_batch(x, y, k)  # raises early when a count does not divide the batch
        self.step_fn = step_fn
        self.model = model
        self.x, self.y, self.loss_fn = x, y, loss_fn
        self.device = x.device
        self.counts = tuple(int(k) for k in counts)
        self.reference = full_batch_grads(model, x, y, loss_fn)
        #: ``{dtype: {count: AccumulationResult}}``, filled as the controls ask for them.
        self.results: dict[torch.dtype, dict[int, AccumulationResult]] = {}
        self.count_slider = W.SelectionSlider(
            options=self.counts,
            value=count if count is not None else self.counts[0],
            description="micro-batches",
            continuous_update=False,
            layout=W.Layout(width="60%"),
        )
        self.dtype_menu = W.Dropdown(
            options=[(_dtype_name(d), d) for d in dtypes],
            value=dtype if dtype is not None else dtypes[0],
            description="autocast",
        )
        self.stats = W.HTML()
        self.output = W.Output()
        self.figure, (self.ax_mem, self.ax_diff) = new_figure(9, 3.4, ncols=2)
        self.count_slider.observe(lambda ch: self.update(ch["new"], None), names="value")
        self.dtype_menu.observe(lambda ch: self.update(None, ch["new"]), names="value")
        self.widget = W.VBox(
            [W.HBox([self.count_slider, self.dtype_menu]), self.stats, self.output]
        )
        self.update(self.count_slider.value, self.dtype_menu.value)

    def measure(self, count: int, dtype: torch.dtype) -> AccumulationResult:
        """Run ``step_fn`` once with ``count`` micro-batches under ``dtype`` autocast."""
        if self.step_fn is None:
            return AccumulationResult(count, dtype, None, None, None, "no step function given")
        model = copy.deepcopy(self.model)
        optimizer = RecordingSGD(model.parameters(), lr=0.0)
        scaler = torch.amp.GradScaler(self.device.type, enabled=dtype == torch.float16)
        micro = split_batch(self.x, self.y, count)
        box: dict[str, object] = {}

        def run() -> None:
            box["stepped"] = self.step_fn(
                model, optimizer, scaler, micro, self.loss_fn, self.device.type, dtype
            )

        try:
            peak = peak_memory_bytes(run, self.device)
        except NotImplementedError:
            return AccumulationResult(
                count, dtype, None, None, None, "write accumulated_step above to see it"
            )
        except Exception as exc:  # noqa: BLE001 - shown to the student, not raised
            message = f"your accumulated_step raised {type(exc).__name__}: {exc}"
            return AccumulationResult(count, dtype, None, None, None, message)
        stepped = box.get("stepped")
        stepped = stepped if isinstance(stepped, bool) else None
        if optimizer.seen is None:
            return AccumulationResult(count, dtype, peak, None, stepped)
        seen = [
            torch.zeros_like(r) if g is None else g
            for g, r in zip(optimizer.seen, self.reference, strict=True)
        ]
        return AccumulationResult(
            count, dtype, peak, relative_difference(seen, self.reference), stepped
        )

    def curve(self, dtype: torch.dtype) -> dict[int, AccumulationResult]:
        """Every count's result for ``dtype`` (measured once, then kept)."""
        if dtype not in self.results:
            self.results[dtype] = {k: self.measure(k, dtype) for k in self.counts}
        return self.results[dtype]

    def update(self, count: int | None = None, dtype: torch.dtype | None = None) -> None:
        """Show ``count`` micro-batches under ``dtype`` (``None`` keeps the current choice)."""
        count = self.count_slider.value if count is None else count
        dtype = self.dtype_menu.value if dtype is None else dtype
        curve = self.curve(dtype)
        now = curve[count]
        #: What is highlighted now, so tests can see the display follow the controls.
        self.selected = now
        self._draw(curve, now)
        self.stats.value = self._describe(now)
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _describe(self, r: AccumulationResult) -> str:
        head = (
            f"{r.count} micro-batch{'es' if r.count > 1 else ''} of "
            f"{len(self.x) // r.count} under {_dtype_name(r.dtype)} autocast"
        )
        if r.error:
            return f"{head}: <b>{html.escape(r.error)}</b>"
        if self.device.type == "cuda":
            mem = f"{r.peak_bytes / 2**20:.2f} MiB" if r.peak_bytes is not None else "?"
            mem = f"peak memory during the step: <b>{mem}</b>"
        else:
            mem = (
                "peak memory: <b>not measured on the CPU</b> "
                "(torch.cuda.max_memory_allocated is CUDA only)"
            )
        if r.difference is None:
            diff = "<b>no optimizer step was taken</b>"
        else:
            diff = f"<b>{r.difference:.2e}</b>"
        return (
            f"{head} &nbsp;|&nbsp; {mem} &nbsp;|&nbsp; gradient difference from the float32 "
            f"full batch: {diff} &nbsp;|&nbsp; returned {r.stepped!r}"
        )

    def _draw(self, curve: dict[int, AccumulationResult], now: AccumulationResult) -> None:
        ks = list(curve)
        name = _dtype_name(now.dtype)
        self.ax_mem.clear()
        self.ax_diff.clear()
        mem = [curve[k].peak_bytes for k in ks]
        if self.device.type == "cuda" and all(m is not None for m in mem):
            self.ax_mem.plot(ks, [m / 2**20 for m in mem], "o-")
            if now.peak_bytes is not None:
                self.ax_mem.plot([now.count], [now.peak_bytes / 2**20], "o", ms=12, mfc="none")
            self.ax_mem.set_ylabel("peak MiB during the step")
        else:
            why = "not measured on the CPU" if self.device.type != "cuda" else "nothing measured"
            self.ax_mem.text(
                0.5, 0.5, why, ha="center", va="center", transform=self.ax_mem.transAxes
            )
        self.ax_mem.set_xscale("log", base=2)
        self.ax_mem.set_xlabel("micro-batches per step")
        self.ax_mem.set_title("peak memory")
        diffs = [(k, curve[k].difference) for k in ks if curve[k].difference is not None]
        if diffs:
            self.ax_diff.plot([k for k, _ in diffs], [max(d, 1e-12) for _, d in diffs], "o-")
            if now.difference is not None:
                self.ax_diff.plot([now.count], [max(now.difference, 1e-12)], "o", ms=12, mfc="none")
            self.ax_diff.set_yscale("log")
        else:
            self.ax_diff.text(
                0.5,
                0.5,
                "nothing to show yet",
                ha="center",
                va="center",
                transform=self.ax_diff.transAxes,
            )
        self.ax_diff.set_xscale("log", base=2)
        self.ax_diff.set_xlabel("micro-batches per step")
        self.ax_diff.set_ylabel("relative difference")
        self.ax_diff.set_title(f"{name} gradients vs float32 full batch")

    def _ipython_display_(self) -> None:
        display(self.widget)
