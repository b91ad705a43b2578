"""Gradient accumulation, clipping and checkpoints with a GradScaler (lesson 05).

Helpers for measuring what an accumulated step did, the lesson's widget, a reader of the
installed torch's source (:func:`torch_source_lines`, so the lesson quotes the release it runs
on) and the two-process FSDP2 measurement of where accumulated gradients are summed
(:func:`fsdp2_accumulation`). Nothing here performs an accumulated optimizer step or saves a
training state: the lesson asks students to write those (``accumulated_step``,
``save_training_state``, ``load_training_state``), and the widget runs the student's
``accumulated_step``.
"""

from __future__ import annotations

import contextlib
import copy
import html
import inspect
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

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


def saved_tensor_peak_bytes(fn: Callable[[], object]) -> tuple[int, int]:
    """Peak and final bytes of tensors saved for backward while ``fn()`` runs (lesson 05).

    Counted on every device with ``torch.autograd.graph.saved_tensors_hooks``: each saved tensor's
    storage counts once (however many graph nodes save it) from when it is saved until autograd
    releases it after its backward pass. These are the activations (and the autocast copies of the
    weights) that accumulation keeps small; the allocator's peak (:func:`peak_memory_bytes`) adds
    the parameters, gradients and temporaries. Returns ``(peak, still_held_at_the_end)``.
    """
    storages: dict[int, list[int]] = {}  # storage pointer -> [bytes, references]
    state = {"now": 0, "peak": 0}

    class _Held:
        __slots__ = ("key", "tensor")

        def __init__(self, tensor: torch.Tensor) -> None:
            self.tensor, self.key = tensor, tensor.untyped_storage().data_ptr()
            entry = storages.setdefault(self.key, [tensor.untyped_storage().nbytes(), 0])
            if entry[1] == 0:
                state["now"] += entry[0]
                state["peak"] = max(state["peak"], state["now"])
            entry[1] += 1

        def __del__(self) -> None:
            entry = storages[self.key]
            entry[1] -= 1
            if entry[1] == 0:
                state["now"] -= entry[0]
                del storages[self.key]

    with torch.autograd.graph.saved_tensors_hooks(_Held, lambda held: held.tensor):
        fn()
    return state["peak"], state["now"]


@dataclass(frozen=True)
class AccumulationResult:
    """What one call of an accumulated step did, as the widget measured it (lesson 05)."""

    count: int
    dtype: torch.dtype
    peak_bytes: int | None
    difference: float | None
    stepped: bool | None
    error: str | None = None
    #: Peak bytes saved for backward during the step (:func:`saved_tensor_peak_bytes`).
    saved_bytes: int | None = None


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class AccumulationExplorer:
    """Lesson 05's widget: micro-batch count against peak memory and gradient error.

    ``step_fn`` is the student's ``accumulated_step``. For each micro-batch count the widget
    splits one batch, runs ``step_fn`` once with a :class:`RecordingSGD` at ``lr=0`` (so the
    model never changes) and a fresh GradScaler (enabled for float16, disabled for bfloat16),
    and shows the gradients the optimizer received against the float32 full-batch gradients.
    Memory: the peak bytes saved for backward (:func:`saved_tensor_peak_bytes`) on every
    device, and on CUDA also the allocator's peak; on the CPU the widget says the latter is not
    measured.
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

        def step() -> None:
            box["stepped"] = self.step_fn(
                model, optimizer, scaler, micro, self.loss_fn, self.device.type, dtype
            )

        def run() -> None:
            box["saved"] = saved_tensor_peak_bytes(step)[0]

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
        saved = box.get("saved")
        if optimizer.seen is None:
            return AccumulationResult(count, dtype, peak, None, stepped, saved_bytes=saved)
        seen = [
            torch.zeros_like(r) if g is None else g
            for g, r in zip(optimizer.seen, self.reference, strict=True)
        ]
        return AccumulationResult(
            count,
            dtype,
            peak,
            relative_difference(seen, self.reference),
            stepped,
            saved_bytes=saved,
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
        saved = f"{r.saved_bytes / 2**10:.1f} KiB" if r.saved_bytes is not None else "?"
        saved = f"peak saved for backward: <b>{saved}</b>"
        if self.device.type == "cuda":
            mem = f"{r.peak_bytes / 2**20:.2f} MiB" if r.peak_bytes is not None else "?"
            mem = f"{saved} &nbsp;|&nbsp; CUDA peak allocated during the step: <b>{mem}</b>"
        else:
            mem = (
                f"{saved} &nbsp;|&nbsp; allocator peak: <b>not measured on the CPU</b> "
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
        saved = [curve[k].saved_bytes for k in ks]
        mem = [curve[k].peak_bytes for k in ks]
        drawn = False
        if all(m is not None for m in saved):
            self.ax_mem.plot(ks, [m / 2**20 for m in saved], "o-", label="saved for backward")
            if now.saved_bytes is not None:
                self.ax_mem.plot([now.count], [now.saved_bytes / 2**20], "o", ms=12, mfc="none")
            drawn = True
        if self.device.type == "cuda" and all(m is not None for m in mem):
            self.ax_mem.plot(ks, [m / 2**20 for m in mem], "s-", label="CUDA peak allocated")
            drawn = True
        if drawn:
            self.ax_mem.set_ylabel("peak MiB during the step")
            self.ax_mem.legend(fontsize="small")
        else:
            self.ax_mem.text(
                0.5,
                0.5,
                "nothing measured",
                ha="center",
                va="center",
                transform=self.ax_mem.transAxes,
            )
        self.ax_mem.set_xscale("log", base=2)
        self.ax_mem.set_xlabel("micro-batches per step")
        self.ax_mem.set_title(f"peak memory ({self.device.type})")
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


# --------------------------------------------------------------------------------------------
# Quoting the installed torch


def torch_source_lines(obj: object, *needles: str, context: int = 0) -> str:
    """The lines of ``obj``'s source that contain any of ``needles``, as ``file:line: text``
    (lesson 05).

    ``obj`` is a function, method or class of the installed torch (or any Python object with
    source). ``context`` lines before and after each match are included; runs of lines are
    separated by ``...``. The path is relative to the ``torch`` package, so the lesson shows
    which file of this release says what it quotes. Raises ValueError when no line matches.
    """
    obj = inspect.unwrap(obj)  # decorated functions: the decorated function's own file
    lines, first = inspect.getsourcelines(obj)
    path = Path(inspect.getsourcefile(obj) or "?").resolve()
    package = Path(torch.__file__).resolve().parent  # .../site-packages/torch
    shown = (
        "torch/" + path.relative_to(package).as_posix()
        if path.is_relative_to(package)
        else path.name
    )
    keep: set[int] = set()
    for i, line in enumerate(lines):
        if any(n in line for n in needles):
            keep.update(range(max(0, i - context), min(len(lines), i + context + 1)))
    if not keep:
        raise ValueError(f"none of {needles!r} occurs in the source of {obj!r}")
    out: list[str] = []
    previous = None
    for i in sorted(keep):
        if previous is not None and i != previous + 1:
            out.append("    ...")
        out.append(f"{shown}:{first + i}: {lines[i].rstrip()}")
        previous = i
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# Where FSDP2 sums the gradients of accumulated micro-batches (measured on real processes)

#: The FSDP2 settings :func:`fsdp2_accumulation` compares: ``(label, reduce_dtype, sync every
#: micro-batch)``, all with ``param_dtype=torch.bfloat16``. The last one is the reference.
FSDP2_SETTINGS: tuple[tuple[str, torch.dtype | None, bool], ...] = (
    ("no sync, reduce_dtype unset", None, False),
    ("no sync, reduce_dtype bfloat16", torch.bfloat16, False),
    ("no sync, reduce_dtype float32", torch.float32, False),
    ("sync every micro-batch, reduce_dtype unset", None, True),
    ("sync every micro-batch, reduce_dtype float32", torch.float32, True),
)


def _held_gradient_dtype(model: nn.Module) -> torch.dtype | None:
    """The dtype of the unsharded gradient FSDP2 keeps between backward passes, if any.

    Read from FSDP2's own bookkeeping (torch 2.13, ``_fsdp_param.py``): an upcast copy in
    ``FSDPParam.unsharded_accumulated_grad`` when ``reduce_dtype`` differs from ``param_dtype``,
    else the unsharded parameter's ``.grad``. ``None`` once the gradient has been reduced.
    """
    state = model._get_fsdp_state()  # type: ignore[operator]
    fsdp_param = state._fsdp_param_group.fsdp_params[0]
    grad = fsdp_param.unsharded_accumulated_grad
    if grad is None:
        grad = getattr(fsdp_param._unsharded_param, "grad", None)
    return None if grad is None else grad.dtype


def fsdp2_accumulation_worker(rank: int, world_size: int, micro_batches: int) -> dict:
    """Inside a rank: accumulate ``micro_batches`` backward passes under each of
    :data:`FSDP2_SETTINGS` (lesson 05).

    A small MLP, the same weights on every rank, is sharded with ``fully_shard`` under
    ``MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=...)``. Each rank runs its
    own micro-batches of 2 examples, each loss divided by the count; without sync,
    ``set_requires_gradient_sync(False)`` holds for all but the last. Returns, per setting,
    the dtype of the gradient FSDP2 holds after the first micro-batch, the dtype of the sharded
    ``.grad`` at the end and the full gradients (gathered, float32).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from course.sharded import full, rank_mesh

    gen = torch.Generator().manual_seed(0)
    xs = torch.randn(world_size, micro_batches, 2, 16, generator=gen)
    ys = torch.randint(0, 8, (world_size, micro_batches, 2), generator=gen)
    mesh = rank_mesh()
    results = {}
    for label, reduce_dtype, sync_each in FSDP2_SETTINGS:
        torch.manual_seed(0)
        model = mlp((16, 64, 8))
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce_dtype)
        fully_shard(model, mesh=mesh, mp_policy=policy)
        held = None
        for i in range(micro_batches):
            model.set_requires_gradient_sync(sync_each or i == micro_batches - 1)
            out = model(xs[rank, i])
            (nn.functional.cross_entropy(out.float(), ys[rank, i]) / micro_batches).backward()
            if i == 0:
                held = _held_gradient_dtype(model)
        params = list(model.parameters())
        results[label] = {
            "held": held,
            "sharded": params[0].grad.dtype,
            "grads": [full(p.grad).float() for p in params],
        }
    return results


def fsdp2_accumulation(micro_batches: int = 16, world_size: int = 2) -> dict[str, dict]:
    """Where FSDP2 sums accumulated gradients, measured on ``world_size`` processes (lesson 05).

    Runs :func:`fsdp2_accumulation_worker` with :func:`course.launch.launch` (gloo, CPU ranks)
    and returns rank 0's results, each with ``difference``: the relative difference of its
    gradients from those of the last setting of :data:`FSDP2_SETTINGS` (every micro-batch
    reduced in float32 and added into the float32 sharded gradient).
    """
    from course.launch import launch

    results = launch(fsdp2_accumulation_worker, world_size, args=(micro_batches,))[0]
    reference = results[FSDP2_SETTINGS[-1][0]]["grads"]
    for entry in results.values():
        entry["difference"] = relative_difference(entry["grads"], reference)
    return results


# -- CUDA generators simulated on a CPU --------------------------------------------------------
# A checkpoint must carry every CUDA generator's state; on a machine without a GPU these stand in
# for them (lesson 05's hidden test of the checkpoint functions, course.gpt_train's resume check).


def simulated_cuda_states(
    seed: int, case: int, count: int, later: bool = False
) -> list[torch.Tensor]:
    """``count`` made-up CUDA generator states (16 bytes each, like a real one), the same for
    the same arguments (lesson 05's hidden test: ``later`` gives the states the generators
    hold after the checkpoint, which loading must replace)."""
    gen = torch.Generator().manual_seed(seed * 64 + case * 2 + int(later))
    return [torch.randint(0, 256, (16,), dtype=torch.uint8, generator=gen) for _ in range(count)]


class _SimulatedGenerator:
    """One simulated GPU's default generator: what torch.cuda's random functions call on
    ``torch.cuda.default_generators[i]``. A state is 16 bytes, as a CUDA generator's is: the
    seed, then the offset, each 8 bytes little-endian."""

    def __init__(self, gpus: SimulatedCudaGenerators, index: int) -> None:
        self._gpus, self._index = gpus, index

    def get_state(self) -> torch.Tensor:
        state = self._gpus.states[self._index]
        return state.clone() if isinstance(state, torch.Tensor) else state  # type: ignore[return-value]

    def set_state(self, new_state: torch.Tensor) -> None:
        self._gpus.states[self._index] = (
            new_state.clone() if isinstance(new_state, torch.Tensor) else new_state
        )

    def manual_seed(self, seed: int) -> _SimulatedGenerator:
        seed = int(seed) % 2**64
        self.set_state(torch.tensor(list(seed.to_bytes(8, "little")) + [0] * 8, dtype=torch.uint8))
        return self

    def seed(self) -> int:
        seed = int(torch.randint(0, 2**62, ()))
        self.manual_seed(seed)
        return seed

    def initial_seed(self) -> int:
        state = self.get_state()
        return int.from_bytes(bytes(state[:8].tolist()), "little")


class SimulatedCudaGenerators(contextlib.AbstractContextManager):
    """CUDA generators on a machine without a GPU, so that a CPU test can see whether a
    checkpoint saves and restores them (lesson 05's hidden test of ``checkpoint_state``).

    Inside ``with``, torch behaves as on a machine with ``len(states)`` GPUs as far as their
    random states go: ``torch.cuda.is_available()``, ``is_initialized()`` and
    ``torch.accelerator.is_available()`` are True, ``device_count()`` is ``len(states)``, and
    ``torch.cuda.default_generators`` read and write :attr:`states`, one per simulated GPU. The
    pieces torch.cuda's own random functions are built from are replaced (``device_count``,
    ``current_device``, ``_lazy_init``, ``_lazy_call``, ``is_initialized`` in ``torch.cuda`` and
    ``torch.cuda.random``), not the functions themselves, so ``get_rng_state(_all)``,
    ``set_rng_state(_all)``, ``manual_seed(_all)``, ``seed(_all)`` and ``initial_seed`` work
    however they were imported. ``torch.cuda.device(i)``, ``torch.cuda.set_device(i)`` and
    ``torch.accelerator.set_device_index(i)`` change the current device (0 at the start). What
    is not simulated: tensors on a GPU, and ``torch.device(i)`` with a bare integer (it asks the
    compiled-in accelerator). Everything is put back on exit, also after an exception.
    """

    def __init__(self, states: Sequence[torch.Tensor]) -> None:
        self.states: list[object] = [s.clone() for s in states]
        self.current = 0
        self._saved: list[tuple[object, str, object]] = []

    def _index(self, index: int) -> int:
        if not 0 <= index < len(self.states):
            raise RuntimeError(
                f"CUDA error: invalid device ordinal {index} ({len(self.states)} GPUs)"
            )
        return index

    def _exchange_device(self, index: int) -> int:
        previous = self.current
        if index >= 0:
            self.current = self._index(index)
        return previous

    def _set_device(self, device: object) -> None:
        from torch.cuda._utils import _get_device_index

        index = _get_device_index(device)
        if index >= 0:
            self.current = self._index(index)

    def _set_device_index(self, device: object) -> None:
        from torch._utils import _get_device_index

        self._set_device(_get_device_index(device, optional=True))

    def __enter__(self) -> SimulatedCudaGenerators:
        import torch.accelerator
        import torch.cuda.random as cuda_random

        def current_device() -> int:
            return self.current

        def device_count() -> int:
            return len(self.states)

        def run_now(callable: Callable[[], object], **kwargs: object) -> None:
            callable()

        def current_accelerator(check_available: bool = False) -> torch.device:
            return torch.device("cuda")

        pieces = {
            "device_count": device_count,
            "current_device": current_device,
            "is_initialized": lambda: True,
            "_lazy_init": lambda: None,
            "_lazy_call": run_now,
        }
        patches: list[tuple[object, str, object]] = [
            (torch.cuda, "is_available", lambda: True),
            (torch.cuda, "_initialized", True),
            (
                torch.cuda,
                "default_generators",
                tuple(_SimulatedGenerator(self, i) for i in range(len(self.states))),
            ),
            (torch.cuda, "_exchange_device", self._exchange_device),
            (torch.cuda, "_maybe_exchange_device", self._exchange_device),
            (torch.cuda, "set_device", self._set_device),
            (torch.accelerator, "current_accelerator", current_accelerator),
            (torch.accelerator, "current_device_index", current_device),
            (torch.accelerator, "set_device_index", self._set_device_index),
        ]
        for module in (torch.cuda, cuda_random):
            patches += [(module, name, value) for name, value in pieces.items()]
        # What the real torch.cuda.current_device and set_device call, wherever they were
        # imported from; a build with CUDA has them, and they are left alone there.
        for name, value in (
            ("_cuda_getDevice", current_device),
            ("_cuda_setDevice", self._set_device),
        ):
            if not hasattr(torch._C, name):
                patches.append((torch._C, name, value))
        try:
            for module, name, value in patches:
                self._saved.append((module, name, getattr(module, name, _MISSING)))
                setattr(module, name, value)
        except BaseException:
            self._restore()
            raise
        return self

    def _restore(self) -> None:
        while self._saved:
            module, name, value = self._saved.pop()
            if value is _MISSING:
                delattr(module, name)
            else:
                setattr(module, name, value)

    def __exit__(self, *exc: object) -> None:
        self._restore()


#: What ``SimulatedCudaGenerators`` saves for an attribute it adds (and removes on exit).
_MISSING = object()
