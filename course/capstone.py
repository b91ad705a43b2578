"""The capstone's helpers: a benchmark dashboard, training curves and float8 demos (lesson 09).

The graded exercises (``train_compare`` and the ``DelayedScaling`` float8 scaler) are left to the
student; the helpers here measure, plot and replay what those exercises produce.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import ipywidgets as W
import torch
from IPython.display import display
from matplotlib.axes import Axes

from course.benchmark import BASE_MODES, Result, run_benchmark, unsupported_reason
from course.plotting import new_figure

#: The two float8 formats torch casts to, in the order the lesson shows them.
FP8_FORMATS: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)


def fp8_max(fmt: torch.dtype) -> float:
    """The largest finite value of a float8 format: 448 for e4m3fn, 57344 for e5m2 (lesson 09)."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"{fmt} is not one of the float8 formats {FP8_FORMATS}")
    return float(torch.finfo(fmt).max)


def cast_table(
    values: Sequence[float],
    dtypes: Sequence[torch.dtype] = FP8_FORMATS,
    device: torch.device | str = "cpu",
) -> str:
    """What a plain ``.to(dtype)`` on ``device`` does to each value, as a text table (lesson 09).

    Nothing is clamped or scaled here: the table shows the cast itself, on this torch build.
    """
    x = torch.tensor(list(values), dtype=torch.float32, device=device)
    names = [str(d).removeprefix("torch.") for d in dtypes]
    head = f"{'value':>14}" + "".join(f"{n:>16}" for n in names)
    rows = [head, "-" * len(head)]
    casts = [x.to(d).float() for d in dtypes]
    for i, v in enumerate(x.tolist()):
        rows.append(f"{v:>14.6g}" + "".join(f"{c[i].item():>16.6g}" for c in casts))
    return "\n".join(rows)


def drifting_tensors(
    steps: int = 60, numel: int = 4096, spike_at: int | None = 40, seed: int = 0
) -> list[torch.Tensor]:
    """A sequence of tensors shaped like one layer's activations over training (lesson 09).

    Their magnitude grows slowly (x1.05 per step) and, at ``spike_at``, jumps 8-fold for one step:
    the case delayed scaling handles worst, since its scale comes from earlier steps.
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        magnitude = 1.05**step * (8.0 if step == spike_at else 1.0)
        out.append(torch.randn(numel, generator=gen) * magnitude)
    return out


def replay_scaling(
    quantize: Callable[[torch.Tensor], tuple[torch.Tensor, float]],
    dequantize: Callable[[torch.Tensor, float], torch.Tensor],
    tensors: Sequence[torch.Tensor],
    fmt: torch.dtype,
) -> dict[str, list[float]]:
    """Quantize each tensor in turn and record what happened (lesson 09).

    Returns lists (one entry per tensor) of the ``scale`` used, the tensor's ``amax``, the
    fraction of elements that ``saturated`` (|x * scale| beyond the format's max) and the
    relative round-trip error ``rel_error`` = ||dequantize(quantize(x)) - x|| / ||x||.
    """
    top = fp8_max(fmt)
    log: dict[str, list[float]] = {"scale": [], "amax": [], "saturated": [], "rel_error": []}
    for x in tensors:
        q, scale = quantize(x)
        back = dequantize(q, scale).float()
        xf = x.float()
        log["scale"].append(float(scale))
        log["amax"].append(float(xf.abs().max()))
        log["saturated"].append(float(((xf * float(scale)).abs() > top).float().mean()))
        log["rel_error"].append(float((back - xf).norm() / xf.norm().clamp_min(1e-30)))
    return log


def plot_training_curves(ax: Axes, result: dict, amp_label: str = "AMP") -> list[list[float]]:
    """The fp32 and AMP loss curves of a ``train_compare`` result on one axes (lesson 09).

    The legend carries each run's test accuracy. Returns the two curves drawn.
    """
    curves = [list(map(float, result["fp32_losses"])), list(map(float, result["amp_losses"]))]
    labels = [
        f"fp32 (test accuracy {result['fp32_acc']:.2%})",
        f"{amp_label} (test accuracy {result['amp_acc']:.2%})",
    ]
    for curve, label, style in zip(curves, labels, ("-o", "--s"), strict=True):
        ax.plot(range(1, len(curve) + 1), curve, style, label=label, markersize=4)
    ax.set_xlabel("epoch")
    ax.set_ylabel("mean training loss")
    ax.set_yscale("log")
    ax.set_title(f"digits: fp32 vs {amp_label}, same data, same initial weights")
    ax.legend()
    return curves


class BenchmarkDashboard:
    """Lesson 09's widget: pick modes and a batch size, press run, see throughput and memory.

    It measures the device it runs on with :func:`course.benchmark.run_benchmark` (the MLP of
    width ``size``), shows an ``IntProgress`` bar while it runs, then draws two bar charts.
    Modes the device cannot run are shown disabled, with the reason. ``run()`` is what the button
    calls, so a test can drive it; the last results and bar heights stay on the object.
    """

    def __init__(
        self,
        device: torch.device | str,
        size: int = 256,
        batch_sizes: Sequence[int] = (16, 32, 64, 128, 256),
        batch_size: int = 64,
        modes: Sequence[str] = BASE_MODES,
        min_run_time: float = 0.05,
        repeats: int = 1,
        warmup: int = 1,
        runner: Callable[..., list[Result]] = run_benchmark,
    ) -> None:
        if batch_size not in batch_sizes:
            raise ValueError(f"batch_size {batch_size} is not among {tuple(batch_sizes)}")
        self.device = torch.device(device)
        self.size = size
        self.min_run_time = min_run_time
        self.repeats = repeats
        self.warmup = warmup
        self.runner = runner
        self.reasons = {m: unsupported_reason(m, self.device, "mlp") for m in modes}
        self.checkboxes = {
            m: W.Checkbox(
                value=not self.reasons[m],
                description=m,
                disabled=bool(self.reasons[m]),
                indent=False,
                tooltip=self.reasons[m] or f"measure {m}",
                layout=W.Layout(width="auto"),
            )
            for m in modes
        }
        self.batch = W.Dropdown(options=list(batch_sizes), value=batch_size, description="batch")
        self.button = W.Button(description="Run benchmark", button_style="primary", icon="play")
        self.progress = W.IntProgress(value=0, min=0, max=1, description="progress")
        self.status = W.HTML(
            "Tick modes, choose a batch size and press <b>Run benchmark</b>."
            + "".join(
                f"<br><i>{m} is off on {self.device.type}: {r}</i>"
                for m, r in self.reasons.items()
                if r
            )
        )
        self.output = W.Output()
        self.figure, (self.ax_speed, self.ax_memory) = new_figure(9.5, 3.4, ncols=2)
        #: Results of the last run, and the bar heights now drawn (``{mode: value}``).
        self.results: list[Result] = []
        self.throughput_bars: dict[str, float] = {}
        self.memory_bars: dict[str, float] = {}
        self.runs = 0
        self.button.on_click(lambda _button: self.run())
        self.widget = W.VBox(
            [
                W.HBox(list(self.checkboxes.values())),
                W.HBox([self.batch, self.button]),
                self.progress,
                self.status,
                self.output,
            ]
        )

    def selected_modes(self) -> list[str]:
        """The modes whose boxes are ticked (and enabled)."""
        return [m for m, box in self.checkboxes.items() if box.value and not box.disabled]

    def _on_progress(self, done: int, total: int, label: str) -> None:
        self.progress.max = max(total, 1)
        self.progress.value = done
        self.status.value = f"measured {label} ({done} of {total})"

    def run(self) -> list[Result]:
        """Measure the ticked modes at the chosen batch size and redraw the charts."""
        modes = self.selected_modes()
        if not modes:
            self.status.value = "Tick at least one mode to measure."
            return self.results
        self.button.disabled = True
        self.progress.value = 0
        self.progress.bar_style = "info"
        try:
            self.results = self.runner(
                modes,
                model="mlp",
                sizes=(self.size,),
                batch_size=int(self.batch.value),
                repeats=self.repeats,
                min_run_time=self.min_run_time,
                warmup=self.warmup,
                device=self.device,
                progress=self._on_progress,
            )
        finally:
            self.button.disabled = False
        self.runs += 1
        self.progress.bar_style = "success"
        self.draw()
        return self.results

    def draw(self) -> None:
        """Redraw both bar charts from ``self.results``."""
        measured = [r for r in self.results if r.measured]
        self.throughput_bars = {r.mode: float(r.throughput) for r in measured}
        self.memory_bars = {
            r.mode: r.peak_memory / 2**20 for r in measured if r.peak_memory is not None
        }
        batch = measured[0].batch_size if measured else self.batch.value
        ax = self.ax_speed
        ax.clear()
        speedups = {r.mode: r.speedup for r in measured}
        ax.bar(list(self.throughput_bars), list(self.throughput_bars.values()), color="tab:blue")
        for i, (mode, value) in enumerate(self.throughput_bars.items()):
            if speedups.get(mode) is not None:
                ax.annotate(f"{speedups[mode]:.2f}x", (i, value), ha="center", va="bottom")
        if self.throughput_bars:
            ax.set_ylim(0, 1.15 * max(self.throughput_bars.values()))
        ax.set_ylabel("samples / s")
        ax.set_title(f"throughput, batch {batch} (label: speed-up vs fp32)")
        ax = self.ax_memory
        ax.clear()
        if self.memory_bars:
            ax.bar(list(self.memory_bars), list(self.memory_bars.values()), color="tab:green")
            ax.set_ylabel("MiB")
            ax.set_title("peak memory (max_memory_allocated)")
        else:
            ax.text(
                0.5,
                0.5,
                f"peak memory is not measured on {self.device.type.upper()}:\n"
                "torch.cuda.max_memory_allocated\nexists for CUDA only",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title("peak memory")
        skipped = [f"{r.mode}: {r.note}" for r in self.results if not r.measured]
        self.status.value = (
            f"run {self.runs}: {len(measured)} modes measured on {self.device.type}"
            + "".join(f"<br><i>{s}</i>" for s in skipped)
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        display(self.widget)
