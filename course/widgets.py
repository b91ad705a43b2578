"""Interactive controls the lessons share (lesson 01 onwards).

Each widget keeps its state on the object and redraws through one ``update`` method, so tests
can drive it exactly as a slider does.
"""

from __future__ import annotations

from collections.abc import Callable

import ipywidgets as W
import torch
from IPython.display import display

from course.plotting import new_figure, plot_fp16_band


def overflow_fraction(tensors: list[torch.Tensor], scale: float) -> float:
    """Fraction of the finite non-zero elements that become ±inf in float16 after scaling.

    Cast on each tensor's own device, as ``(t.float() * scale).half()`` (lesson 01's widget).
    """
    total = bad = 0
    for t in tensors:
        t = t.detach().float()
        keep = (t != 0) & torch.isfinite(t)
        total += int(keep.sum())
        bad += int((torch.isinf((t * scale).half()) & keep).sum())
    return bad / total if total else 0.0


class LossScaleExplorer:
    """Lesson 01's widget: a loss-scale slider over a histogram of real gradients.

    ``underflow_fn`` is the student's ``underflow_fraction``: the widget shows what it returns
    for the chosen scale, or says that it is not written yet. The tensors stay on their device,
    so the float16 casts behind both fractions run where the lesson runs.
    """

    def __init__(
        self,
        grads: list[torch.Tensor],
        underflow_fn: Callable[[list[torch.Tensor], float], float] | None = None,
        log2_scale: int = 0,
    ) -> None:
        if not grads:
            raise ValueError("LossScaleExplorer needs at least one gradient tensor")
        self.grads = [g.detach() for g in grads]
        self.underflow_fn = underflow_fn
        self.slider = W.IntSlider(
            value=log2_scale,
            min=-8,
            max=40,
            step=1,
            description="log2(scale)",
            continuous_update=False,
            layout=W.Layout(width="60%"),
        )
        self.stats = W.HTML()
        self.output = W.Output()
        self.figure, (self.ax,) = new_figure(8, 3.6)
        self.slider.observe(lambda change: self.update(change["new"]), names="value")
        self.widget = W.VBox([self.slider, self.stats, self.output])
        self.update(log2_scale)

    def update(self, log2_scale: int) -> None:
        """Redraw the histogram and the fractions for ``scale = 2**log2_scale``."""
        scale = 2.0**log2_scale
        self.ax.clear()
        #: The bar heights now drawn, so tests can see the plot move.
        self.heights = plot_fp16_band(self.ax, self.grads, scale)
        over = overflow_fraction(self.grads, scale)
        if self.underflow_fn is None:
            under = "not measured (no underflow_fraction given)"
        else:
            try:
                under = f"{float(self.underflow_fn(self.grads, scale)):.2%}"
            except NotImplementedError:
                under = "write <code>underflow_fraction</code> above to see it"
            except Exception as exc:  # noqa: BLE001 - shown to the student, not raised
                under = f"your underflow_fraction raised {type(exc).__name__}: {exc}"
        self.stats.value = (
            f"scale = 2<sup>{log2_scale}</sup> = {scale:.6g} &nbsp; | &nbsp; "
            f"underflow: <b>{under}</b> &nbsp; | &nbsp; overflow: <b>{over:.2%}</b>"
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        display(self.widget)
