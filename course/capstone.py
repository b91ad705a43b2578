"""The capstone's helpers: memory breakdown, parity plot and benchmark dashboard (lesson 09).

The graded exercises (``train_compare`` and ``transformer_flops``) are left to the student; the
helpers here measure and draw what the lesson's GPT (:mod:`course.gpt`) does in each precision.
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Callable, Sequence

import ipywidgets as W
import torch
from IPython.display import display
from matplotlib.axes import Axes
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from course.benchmark import (
    BASE_MODES,
    COMPILED,
    Result,
    math_mode,
    mfu_warnings,
    parse_mode,
    run_benchmark,
)
from course.benchmark import unsupported_reason as _unsupported
from course.gpt import GPT, GPTConfig, lm_loss
from course.plotting import new_figure

#: The parts of a training step's memory, bottom to top in the stacked bar chart.
MEMORY_PARTS: tuple[str, ...] = (
    "weights",
    "gradients",
    "optimizer state",
    "16-bit weight copies",
    "activations",
)
_HALF = (torch.float16, torch.bfloat16)


class AutocastProbeGPT(GPT):
    """The lesson's GPT, recording its initial weights, on every forward pass whether gradients
    and autocast were on (and autocast's dtype) and its input, and, when backward reaches the
    logits, whether autocast was on then and the gradient's norm (lesson 09's tests of
    ``train_compare``: the recipe runs ``backward()`` outside autocast, and a GradScaler scales
    the float16 run's gradients). Each forward pass also notes, before it computes, where its
    input and its weights are (:meth:`placement`)."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__(config)
        self.initial = {k: v.detach().clone() for k, v in self.state_dict().items()}
        self.calls: list[tuple[bool, bool, torch.Tensor]] = []
        self.dtypes: list[str | None] = []
        self.backward_autocast: list[bool] = []
        self.grad_norms: list[float] = []
        self.step_grad_norms: list[float] = []
        self.devices: list[tuple[str, str]] = []
        _watch_optimizer_steps(self)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        # meta tensors (a GPU's stand-in) have no autocast of their own: the CPU's stands in
        kind = "cpu" if idx.device.type == "meta" else idx.device.type
        self.devices.append((str(idx.device), str(self.tok_emb.weight.device)))
        on = torch.is_autocast_enabled(kind)
        self.calls.append((torch.is_grad_enabled(), on, idx.clone()))
        self.dtypes.append(str(torch.get_autocast_dtype(kind)) if on else None)
        logits = super().forward(idx)
        if logits.requires_grad:
            logits.register_hook(self._on_backward)
        return logits

    def _on_backward(self, grad: torch.Tensor) -> None:
        if grad.device.type == "meta":  # no values, and no autocast of its own
            self.backward_autocast.append(torch.is_autocast_enabled("cpu"))
            self.grad_norms.append(float("nan"))
            return
        self.backward_autocast.append(torch.is_autocast_enabled(grad.device.type))
        self.grad_norms.append(grad.detach().double().norm().item())

    def flags(self) -> dict:
        """What the probe saw, as plain data: per forward pass (grad enabled, autocast enabled,
        autocast's dtype, the input), at each backward pass autocast's state and the norm of
        the gradient reaching the logits, at each optimizer step the norm of the gradients it
        stepped with, and the initial weights."""
        return {
            "grad": [c[0] for c in self.calls],
            "autocast": [c[1] for c in self.calls],
            "dtype": list(self.dtypes),
            "inputs": [c[2].cpu() for c in self.calls],
            "backward_autocast": list(self.backward_autocast),
            "grad_norm": list(self.grad_norms),
            "step_grad_norm": list(self.step_grad_norms),
            "initial": {k: v.cpu() for k, v in self.initial.items()},
        }

    def placement(self) -> dict:
        """Per forward pass, where its input and its token embedding (the first weight it
        uses) were, as device names: no tensor, so it can be read when they are on the meta
        device."""
        return {
            "inputs": [i for i, _ in self.devices],
            "weights": [w for _, w in self.devices],
        }


#: The optimizer hooks of the probes built so far, each with its model (weakly held).
_STEP_WATCHES: list[tuple[weakref.ref, object]] = []


def _watch_optimizer_steps(model: AutocastProbeGPT) -> None:
    """Before any optimizer steps ``model``'s parameters, note the norm of their gradients (a
    GradScaler's ``step`` unscales them first; a bare ``optimizer.step()`` after
    ``scaler.scale(loss).backward()`` steps with them scaled). The hook is common to all
    optimizers; those of probes no longer alive are removed when the next probe is built (not
    from inside a hook: torch is iterating over them then)."""
    for gone, handle in [w for w in _STEP_WATCHES if w[0]() is None]:
        handle.remove()
        _STEP_WATCHES.remove((gone, handle))
    ref = weakref.ref(model)

    def before_step(optimizer, args, kwargs) -> None:
        me = ref()
        if me is None:
            return
        mine = {id(p) for p in me.parameters()}
        grads = [
            p.grad
            for group in optimizer.param_groups
            for p in group["params"]
            if id(p) in mine and p.grad is not None
        ]
        if grads:
            me.step_grad_norms.append(
                math.sqrt(sum(g.detach().double().pow(2).sum().item() for g in grads))
            )

    _STEP_WATCHES.append((ref, register_optimizer_step_pre_hook(before_step)))


def probed_gpt(config: GPTConfig, built: list) -> AutocastProbeGPT:
    """A new :class:`AutocastProbeGPT`, appended to ``built`` (a ``model_fn`` for
    ``functools.partial``: the caller keeps every model the function under test built)."""
    model = AutocastProbeGPT(config)
    built.append(model)
    return model


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_breakdown(
    model_fn: Callable[[], nn.Module],
    mode: str,
    x: torch.Tensor,
    y: torch.Tensor,
    lr: float = 1e-4,
    seed: int = 0,
) -> dict[str, int]:
    """Bytes of each part of :data:`MEMORY_PARTS` in one AdamW training step of ``model_fn()``
    in ``mode`` (``fp32``, ``tf32``, ``fp16-amp``, ``bf16-amp``) on the batch ``(x, y)``
    (lesson 09).

    Weights, gradients and optimizer state are summed from the tensors themselves. What the
    forward pass saves for backward is counted with ``torch.autograd.graph.saved_tensors_hooks``,
    each storage once and the parameters themselves not at all: a saved 16-bit tensor equal to a
    weight (or its transpose) cast to 16 bits is autocast's copy of that weight, everything else
    an activation. ``"float32 activations"`` is the part of the activations saved in float32 (not
    a further part: it is inside ``"activations"``). On CUDA the dict also has
    ``"allocator peak"``: ``torch.cuda.max_memory_allocated`` during the step, above what was
    allocated before the model was built.
    """
    m = parse_mode(mode)
    device = x.device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        baseline = torch.cuda.memory_allocated(device)
    torch.manual_seed(seed)
    model = model_fn().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    scaler = torch.amp.GradScaler(device.type, enabled=m.uses_scaler)
    params = list(model.parameters())
    param_storages = {p.untyped_storage().data_ptr() for p in params}
    two_d = [p for p in params if p.dim() == 2]
    saved: dict[int, tuple[str, int]] = {}

    def is_weight_copy(t: torch.Tensor) -> bool:
        # autocast's cast of a weight, or its transpose (what a linear layer saves for backward)
        if m.amp_dtype is None or t.dtype not in _HALF or t.dim() != 2:
            return False
        with torch.no_grad():
            for p in two_d:
                for view in (p, p.t()):
                    if view.shape == t.shape and torch.equal(view.to(t.dtype), t):
                        return True
        return False

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in param_storages and ptr not in saved:
            kind = "16-bit weight copies" if is_weight_copy(t) else "activations"
            if kind == "activations" and t.dtype == torch.float32:
                kind = "float32 activations"
            saved[ptr] = (kind, storage.nbytes())
        return t

    def step(record: bool) -> None:
        hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        with math_mode(m.tf32):
            if record:
                hooks.__enter__()
            try:
                with torch.autocast(
                    device.type,
                    dtype=m.amp_dtype or torch.bfloat16,
                    enabled=m.amp_dtype is not None,
                ):
                    loss = lm_loss(model(x), y)
            finally:
                if record:
                    hooks.__exit__(None, None, None)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()

    step(False)  # the first step creates AdamW's state
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    step(True)
    out = {
        "weights": _nbytes(params),
        "gradients": _nbytes(p.grad for p in params if p.grad is not None),
        "optimizer state": _nbytes(
            v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)
        ),
        "16-bit weight copies": sum(n for k, n in saved.values() if k == "16-bit weight copies"),
        "activations": sum(n for k, n in saved.values() if k.endswith("activations")),
        "float32 activations": sum(n for k, n in saved.values() if k == "float32 activations"),
    }
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        out["allocator peak"] = torch.cuda.max_memory_allocated(device) - baseline
    return out


def plot_memory_breakdown(ax: Axes, breakdowns: dict[str, dict[str, int]], title: str) -> None:
    """One stacked bar per mode of :func:`memory_breakdown` results, in MiB (lesson 09); a black
    tick marks the CUDA allocator's peak where it was measured."""
    modes = list(breakdowns)
    bottom = [0.0] * len(modes)
    colors = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for part, color in zip(MEMORY_PARTS, colors, strict=True):
        heights = [breakdowns[m][part] / 2**20 for m in modes]
        ax.bar(modes, heights, bottom=bottom, label=part, color=color)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    peaks = [
        (i, breakdowns[m]["allocator peak"] / 2**20)
        for i, m in enumerate(modes)
        if "allocator peak" in breakdowns[m]
    ]
    if peaks:
        ax.scatter([i for i, _ in peaks], [v for _, v in peaks], marker="_", s=900, color="black",
                   label="CUDA allocator peak", zorder=3)  # fmt: skip
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend(fontsize=8)


def plot_parity(ax: Axes, results: dict[str, dict], window: int = 10) -> None:
    """Training-loss curves of ``train_compare`` results on one axes (lesson 09).

    ``results`` maps a label (e.g. ``"bf16"``) to a result; each contributes its AMP curve, and
    the first also its fp32 curve. Curves are running means over ``window`` steps; the legend
    carries each run's validation loss (and, for a comparison shorter than the first, its own
    fp32 validation loss).
    """

    def smooth(values: Sequence[float]) -> list[float]:
        out, total = [], 0.0
        for i, v in enumerate(values):
            total += v
            if i >= window:
                total -= values[i - window]
            out.append(total / min(i + 1, window))
        return out

    first = next(iter(results.values()))
    n = len(first["fp32_losses"])
    curves = [("fp32", first["fp32_losses"], f"validation loss {first['fp32_val_loss']:.5f}", "-")]
    for k, r in results.items():
        val = f"validation loss {r['amp_val_loss']:.5f}"
        if len(r["amp_losses"]) != n:  # a shorter comparison has its own fp32 reference
            val += f", fp32 {r['fp32_val_loss']:.5f} after the same {len(r['amp_losses'])} steps"
        curves.append((f"{k} AMP", r["amp_losses"], val, "--"))
    for label, losses, val, style in curves:
        ax.plot(range(1, len(losses) + 1), smooth(losses), style, label=f"{label} ({val})")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss, nats per byte (mean of {window} steps)")
    ax.legend()


class BenchmarkDashboard:
    """Lesson 09's widget: pick modes, compile on/off and a batch size, press run, see tokens/s,
    MFU and peak memory of the GPT on this device.

    It measures with :func:`course.benchmark.run_benchmark` (``model="gpt"``), shows an
    ``IntProgress`` bar while it runs, then draws three bar charts. MFU's FLOPs per step are
    ``flops_fn(config, tokens)`` (the lesson passes the learner's ``transformer_flops``), or
    torch's ``FlopCounterMode`` count on the meta device where ``flops_fn`` is None. Modes the
    device cannot run are shown disabled, with the reason. ``run()`` is what the button calls, so
    a test can drive it; the last results and bar heights stay on the object.
    """

    def __init__(
        self,
        device: torch.device | str,
        config: GPTConfig | str = "cpu",
        batch_sizes: Sequence[int] = (2, 4, 8, 16, 32),
        batch_size: int = 8,
        modes: Sequence[str] = BASE_MODES,
        min_run_time: float = 0.05,
        repeats: int = 1,
        warmup: int = 1,
        runner: Callable[..., list[Result]] = run_benchmark,
        flops_fn: Callable[[GPTConfig, int], int] | None = None,
    ) -> None:
        if batch_size not in batch_sizes:
            raise ValueError(f"batch_size {batch_size} is not among {tuple(batch_sizes)}")
        self.device = torch.device(device)
        self.config = config
        self.min_run_time = min_run_time
        self.repeats = repeats
        self.warmup = warmup
        self.runner = runner
        self.flops_fn = flops_fn
        self.reasons = {m: _unsupported(m, self.device, "gpt") for m in modes}
        self.checkboxes = {
            m: W.Checkbox(
                value=not self.reasons[m] and m in ("fp32", "bf16-amp"),
                description=m,
                disabled=bool(self.reasons[m]),
                indent=False,
                tooltip=self.reasons[m] or f"measure {m}",
                layout=W.Layout(width="auto"),
            )
            for m in modes
        }
        self.compile = W.Checkbox(value=False, description="torch.compile", indent=False)
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
        self.figure, (self.ax_speed, self.ax_mfu, self.ax_memory) = new_figure(12, 3.4, ncols=3)
        #: Results of the last run, and the bar heights now drawn (``{mode: value}``).
        self.results: list[Result] = []
        self.throughput_bars: dict[str, float] = {}
        self.mfu_bars: dict[str, float] = {}
        self.memory_bars: dict[str, float] = {}
        self.runs = 0
        self.button.on_click(lambda _button: self.run())
        self.widget = W.VBox(
            [
                W.HBox([*self.checkboxes.values(), self.compile]),
                W.HBox([self.batch, self.button]),
                self.progress,
                self.status,
                self.output,
            ]
        )

    def selected_modes(self) -> list[str]:
        """The modes whose boxes are ticked (and enabled), with ``+compile`` if compile is on."""
        suffix = COMPILED if self.compile.value else ""
        return [m + suffix for m, box in self.checkboxes.items() if box.value and not box.disabled]

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
                model="gpt",
                config=self.config,
                batch_size=int(self.batch.value),
                repeats=self.repeats,
                min_run_time=self.min_run_time,
                warmup=self.warmup,
                device=self.device,
                progress=self._on_progress,
                flops_fn=self.flops_fn,
            )
        finally:
            self.button.disabled = False
        self.runs += 1
        self.progress.bar_style = "success"
        self.draw()
        return self.results

    def _bars(self, ax: Axes, bars: dict[str, float], color: str, ylabel: str, title: str) -> None:
        ax.clear()
        ax.bar(list(bars), list(bars.values()), color=color)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.tick_params(axis="x", labelrotation=20)

    def _empty(self, ax: Axes, text: str, title: str) -> None:
        ax.clear()
        ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.set_title(title)

    def draw(self) -> None:
        """Redraw the three bar charts from ``self.results``."""
        measured = [r for r in self.results if r.measured]
        self.throughput_bars = {r.mode: float(r.throughput) for r in measured}
        self.mfu_bars = {}
        sheet = any(r.mfu_datasheet is not None for r in measured)
        for r in measured:
            value = r.mfu_datasheet if sheet else r.mfu_measured
            if value is not None:
                self.mfu_bars[r.mode] = 100 * value
        self.memory_bars = {
            r.mode: r.peak_memory / 2**20 for r in measured if r.peak_memory is not None
        }
        batch = measured[0].batch_size if measured else self.batch.value
        self._bars(self.ax_speed, self.throughput_bars, "tab:blue", "tokens / s",
                   f"throughput, batch {batch}")  # fmt: skip
        for i, r in enumerate(measured):
            if r.speedup is not None:
                self.ax_speed.annotate(f"{r.speedup:.2f}x", (i, float(r.throughput)),
                                       ha="center", va="bottom")  # fmt: skip
        if self.throughput_bars:
            self.ax_speed.set_ylim(0, 1.15 * max(self.throughput_bars.values()))
        peak = "datasheet" if sheet else "measured matmul"
        count = "your FLOP count" if self.flops_fn is not None else "FlopCounterMode's count"
        above = [m for m, v in self.mfu_bars.items() if v > 100]
        title = f"MFU vs {peak} peak\n({count})"
        if above:
            title += f"\n{', '.join(above)} above 100%: the peak is wrong (see the warning)"
        self._bars(self.ax_mfu, self.mfu_bars, "tab:orange", "MFU (%)", title)
        if self.memory_bars:
            self._bars(self.ax_memory, self.memory_bars, "tab:green", "MiB",
                       "peak memory (max_memory_allocated)")  # fmt: skip
        else:
            self._empty(
                self.ax_memory,
                f"peak memory is not measured on {self.device.type.upper()}:\n"
                "torch.cuda.max_memory_allocated\nexists for CUDA only",
                "peak memory",
            )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # tight_layout on a widget figure
            self.figure.tight_layout()
        skipped = [f"{r.mode}: {r.note}" for r in self.results if not r.measured]
        self.status.value = (
            f"run {self.runs}: {len(measured)} modes measured on {self.device.type}"
            + "".join(f"<br><i>{s}</i>" for s in skipped)
            + "".join(f"<br><b>warning: {w}.</b>" for w in mfu_warnings(measured))
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        display(self.widget)
