"""Lesson 07's content: sharded data parallel (FSDP2) in mixed precision, and bfloat16 weights.

What the graded worker trains (:class:`FSDPConfig`), the run the experiments and the graders
measure (:func:`sharded_worker`: FSDP2 with ``fully_shard`` on 2 or more real processes, started
by :func:`course.launch.launch`), instruments used inside a rank (the collectives FSDP2 calls,
:func:`record_fsdp_collectives`; the bytes held at each unit's gradient reduction,
:func:`record_backward_peaks`; DTensor's reductions of GradScaler's inf flag,
:func:`count_dtensor_inf_reductions`), the plots, the lesson's widget (:class:`ShardExplorer`),
and :func:`without_course_runs`, with which the graders make the course's own runs refuse to
stand in for an exercise. The training step with ``torch.amp`` and the byte counting are the
lesson's own code, in its notebook. Introduced in lesson 07.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch import nn

from course.device import one_cpu_thread
from course.launch import (
    LaunchError,
    describe_backend,
    launch,
    pick_backend,
    rank_device,
    spy_on_collectives,
)

#: Names of torch dtypes the configs accept as strings too (widgets, command lines).
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def as_dtype(value: torch.dtype | str | None) -> torch.dtype | None:
    """``value`` as a torch dtype ("bfloat16" -> ``torch.bfloat16``; None stays None)."""
    if value is None or isinstance(value, torch.dtype):
        return value
    return DTYPES[value]


# --------------------------------------------------------------------------------------------
# The model: parameters at the root besides the blocks


class Block(nn.Module):
    """A residual MLP block ``x + W2 gelu(W1 x)``: the unit ``fully_shard`` wraps (lesson 07)."""

    def __init__(self, width: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.fc2 = nn.Linear(hidden, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The block's output, same shape as ``x``."""
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


class ShardedNet(nn.Module):
    """Input projection ``embed``, ``blocks`` (a ModuleList of :class:`Block`), ``head``.

    ``embed`` and ``head`` belong to no block: sharded per block and at the root, they are the
    root unit's parameters, so a root left unwrapped is visible (lesson 07).
    """

    def __init__(self, n_in: int, width: int, hidden: int, depth: int, n_out: int) -> None:
        super().__init__()
        self.embed = nn.Linear(n_in, width)
        self.blocks = nn.ModuleList(Block(width, hidden) for _ in range(depth))
        self.head = nn.Linear(width, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, n_out)``."""
        h = self.embed(x)
        for block in self.blocks:
            h = block(h)
        return self.head(h)


@dataclass(frozen=True)
class FSDPConfig:
    """What ``fsdp_amp_worker`` trains: model, data, optimizer and precision (lesson 07).

    Every rank builds the same model from ``seed`` with :meth:`make_model` and draws the same
    *global* batch of a step with :meth:`batch`; rank ``r`` of ``W`` trains on
    ``x.chunk(W)[r]``. FSDP2's policy is ``MixedPrecisionPolicy(param_dtype=param_dtype,
    reduce_dtype=reduce_dtype)``; the optimizer is AdamW over the sharded parameters.
    ``unit_dtypes`` (root first, then each block) stores the units in other dtypes than
    float32 (the lesson measures the memory of such models).
    """

    n_in: int = 16
    width: int = 32
    hidden: int = 64
    depth: int = 2
    n_out: int = 5
    steps: int = 4
    global_batch: int = 16
    lr: float = 1e-2
    weight_decay: float = 0.01
    param_dtype: torch.dtype = torch.bfloat16
    reduce_dtype: torch.dtype = torch.float32
    seed: int = 0
    unit_dtypes: tuple[torch.dtype, ...] = ()

    def make_model(self) -> ShardedNet:
        """The model on the CPU, the same weights on every call: float32, or with
        ``unit_dtypes`` the root's parameters (``embed``, ``head``) in its first dtype and block
        ``i``'s in dtype ``i + 1`` (one dtype per unit, as FSDP2 asks)."""
        torch.manual_seed(self.seed)
        model = ShardedNet(self.n_in, self.width, self.hidden, self.depth, self.n_out)
        if self.unit_dtypes:
            if len(self.unit_dtypes) != 1 + self.depth:
                raise ValueError(f"unit_dtypes needs {1 + self.depth} dtypes (root, blocks)")
            model.embed.to(self.unit_dtypes[0])
            model.head.to(self.unit_dtypes[0])
            for block, dtype in zip(model.blocks, self.unit_dtypes[1:], strict=True):
                block.to(dtype)
        return model

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """AdamW over ``params`` (its state lives on the shards it is given)."""
        return torch.optim.AdamW(params, lr=self.lr, weight_decay=self.weight_decay)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch ``(x, y)`` of step ``step``: labels from a fixed random teacher."""
        gen = torch.Generator().manual_seed(self.seed * 100_003 + 17)
        teacher = torch.randn(self.n_in, self.n_out, generator=gen)
        gen.manual_seed(self.seed * 100_003 + 1000 + step)
        x = torch.randn(self.global_batch, self.n_in, generator=gen)
        return x, (x @ teacher).argmax(dim=1)

    @staticmethod
    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy, computed in float32 whatever the logits' dtype."""
        return nn.functional.cross_entropy(logits.float(), target)


# --------------------------------------------------------------------------------------------
# Instruments used inside a rank

#: The ``torch.distributed`` functions FSDP2 (torch 2.13) communicates with; see
#: ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``. Older releases (torch 2.11)
#: call them by their former names, recorded under the new ones (:data:`FORMER_NAMES`).
FSDP_COLLECTIVES = ("all_gather_single", "reduce_scatter_single", "all_reduce")
#: Former names of :data:`FSDP_COLLECTIVES` (deprecated in torch 2.13, which keeps them).
FORMER_NAMES = {
    "all_gather_into_tensor": "all_gather_single",
    "reduce_scatter_tensor": "reduce_scatter_single",
}


@contextlib.contextmanager
def record_fsdp_collectives() -> Iterator[list[tuple[str, torch.dtype, int]]]:
    """Inside a rank: record ``(collective, dtype, elements)`` for every call FSDP2 makes.

    Wraps :data:`FSDP_COLLECTIVES` as attributes of ``torch.distributed``, which is where
    FSDP2 looks them up at each call: the all-gather of parameters (its *input*, this rank's
    shard) and the reduce-scatter of gradients (its input, this rank's full gradients) are
    recorded in the dtype they were sent in. Introduced in lesson 07.
    """
    records: list[tuple[str, torch.dtype, int]] = []

    def record(name: str, args: tuple, kwargs: dict) -> None:
        sent = kwargs.get("input", kwargs.get("input_tensor"))
        if sent is None:
            sent = args[1] if name != "all_reduce" and len(args) > 1 else args[0]
        records.append((FORMER_NAMES.get(name, name), sent.dtype, sent.numel()))

    with spy_on_collectives((*FSDP_COLLECTIVES, *FORMER_NAMES), record):
        yield records


@contextlib.contextmanager
def record_step_gradients() -> Iterator[list[float]]:
    """Inside a rank: for each optimizer step taken, the sum of squares of this rank's gradients.

    A global optimizer step pre-hook (any optimizer, however it was built) adds up, in float64,
    the squares of the local part of every gradient the step is about to use; summed over the
    ranks it is the squared norm of the whole gradient. Graders compare it with a reference:
    AdamW's update hardly changes when every gradient is scaled by the same factor (a loss
    multiplied by the world size, or summed instead of averaged), the gradient itself does.
    Introduced in lesson 07.
    """
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    sums: list[float] = []

    def before_step(optimizer: torch.optim.Optimizer, args: tuple, kwargs: dict) -> None:
        sums.append(
            sum(
                float(local(p.grad).detach().double().square().sum())
                for group in optimizer.param_groups
                for p in group["params"]
                if p.grad is not None
            )
        )

    handle = register_optimizer_step_pre_hook(before_step)
    try:
        yield sums
    finally:
        handle.remove()


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the local shard of a DTensor, ``t`` itself otherwise."""
    return t.to_local() if hasattr(t, "to_local") else t


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole of ``t`` on this rank: a DTensor gathered (a collective), else ``t``."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def rank_mesh():
    """Inside a rank: the 1-D device mesh of all ranks, on this rank's device (lesson 07).

    ``fully_shard`` without a mesh builds one on the machine's accelerator whenever torch sees
    one, even for a gloo group of CPU ranks; an explicit mesh keeps gloo ranks on the CPU and
    nccl ranks on their GPUs.
    """
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(rank_device().type, (dist.get_world_size(),))


def shard_model(
    model: nn.Module,
    param_dtype: torch.dtype | None,
    reduce_dtype: torch.dtype | None,
    wrap_root: bool = True,
) -> nn.Module:
    """``fully_shard`` each block of ``model.blocks``, then the root (unless ``wrap_root`` is
    False), on :func:`rank_mesh`, under ``MixedPrecisionPolicy(param_dtype, reduce_dtype)``
    (lesson 07)."""
    _refuse_while_grading("shard_model")
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    mesh = rank_mesh()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    if wrap_root:
        fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


@dataclass(frozen=True)
class RunSpec:
    """One run of :func:`sharded_worker`: the config, and what the experiments vary (lesson 07).

    ``wrap_root=False`` shards the blocks only; ``grad_steps`` lists the steps whose full
    gradients are returned.
    """

    config: FSDPConfig = field(default_factory=FSDPConfig)
    wrap_root: bool = True
    grad_steps: tuple[int, ...] = ()


def sharded_worker(rank: int, world_size: int, spec: RunSpec) -> dict:
    """Train ``spec.config`` with FSDP2 on this rank; what the lesson and its graders measure.

    The model is sharded per block and at the root (see :func:`shard_model`), trained on this
    rank's chunk of each global batch with AdamW. Returns ``state_dict`` (the full float32
    tensors, gathered), ``losses`` (this rank's loss per step), ``collectives`` (what
    :func:`record_fsdp_collectives` saw), ``grads`` (full gradients of ``spec.grad_steps``) and
    the local shapes and dtypes of parameters and gradients. Introduced in lesson 07.
    """
    _refuse_while_grading("sharded_worker")
    cfg = spec.config
    device = rank_device()
    model = shard_model(
        cfg.make_model().to(device), cfg.param_dtype, cfg.reduce_dtype, spec.wrap_root
    )
    optimizer = cfg.make_optimizer(model.parameters())
    losses, grads = [], {}
    with record_fsdp_collectives() as records:
        for step in range(cfg.steps):
            x, y = cfg.batch(step)
            x, y = x.chunk(world_size)[rank].to(device), y.chunk(world_size)[rank].to(device)
            loss = cfg.loss_fn(model(x), y)
            loss.backward()
            if step in spec.grad_steps:
                sent = len(records)
                grads[step] = {n: full(p.grad).clone() for n, p in model.named_parameters()}
                del records[sent:]  # the gathering is the lesson's traffic, not training's
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    shapes = {
        n: (type(p).__name__, tuple(p.shape), tuple(local(p).shape), p.dtype)
        for n, p in model.named_parameters()
    }
    state = {k: full(v).float() for k, v in model.state_dict().items()}
    return {
        "rank": rank,
        "state_dict": state,
        "losses": losses,
        "collectives": records,
        "grads": grads,
        "shapes": shapes,
    }


def single_process_run(config: FSDPConfig, grad_steps: tuple[int, ...] = ()) -> dict:
    """The float32 reference: one process, the whole global batch, no sharding (lesson 07).

    Returns ``state_dict``, ``losses`` and ``grads`` like :func:`sharded_worker`. Runs on one
    CPU thread (tiny ops: more threads only wait for each other).
    """
    with one_cpu_thread():
        return _single_process_run(config, grad_steps)


def _single_process_run(config: FSDPConfig, grad_steps: tuple[int, ...]) -> dict:
    model = config.make_model()
    optimizer = config.make_optimizer(model.parameters())
    losses, grads = [], {}
    for step in range(config.steps):
        x, y = config.batch(step)
        loss = config.loss_fn(model(x), y)
        loss.backward()
        if step in grad_steps:
            grads[step] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return {"state_dict": state, "losses": losses, "grads": grads}


def relative_error(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> float:
    """``||got - want|| / ||want||`` over all tensors of two state dicts (lesson 07)."""
    num = sum(float((got[k].double() - want[k].double()).pow(2).sum()) for k in want)
    den = sum(float(want[k].double().pow(2).sum()) for k in want)
    return math.sqrt(num / den)


# --------------------------------------------------------------------------------------------
# Memory per rank, measured from the real sharded tensors


def record_backward_peaks() -> contextlib.AbstractContextManager[list[int]]:
    """Inside a rank: per gradient reduction, the bytes FSDP2 holds at once (lesson 07).

    FSDP2 (torch 2.13, ``foreach_reduce`` in
    ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``) allocates the reduce-scatter
    input (every gradient padded to a multiple of the world size in rows, in ``reduce_dtype``),
    copies the unit's unsharded gradients (in ``param_dtype``) into it with
    ``foreach_reduce_scatter_copy_in``, and only then frees them. This wraps that function and
    appends, per call, the bytes of both: the unit's backward peak beyond what stays resident.
    Refused while an exercise is graded (:func:`without_course_runs`): it is the lesson's
    measurement, not a way to count.
    """
    _refuse_while_grading("record_backward_peaks")
    return _backward_peaks()


@contextlib.contextmanager
def _backward_peaks() -> Iterator[list[int]]:
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as collectives

    original = collectives.foreach_reduce_scatter_copy_in
    peaks: list[int] = []

    def counted(unsharded_grads, reduce_scatter_input, world_size):
        held = sum(g.numel() * g.element_size() for g in unsharded_grads)
        held += reduce_scatter_input.numel() * reduce_scatter_input.element_size()
        peaks.append(held)
        return original(unsharded_grads, reduce_scatter_input, world_size)

    collectives.foreach_reduce_scatter_copy_in = counted
    try:
        yield peaks
    finally:
        collectives.foreach_reduce_scatter_copy_in = original


# --------------------------------------------------------------------------------------------
# Plots


def plot_losses(ax, curves: dict[str, list[float]], title: str, smooth: int = 10) -> None:
    """Loss curves on one axis, each a running mean over ``smooth`` steps (lesson 07)."""
    for label, losses in curves.items():
        t = torch.tensor(losses, dtype=torch.float64)
        k = max(1, min(smooth, len(t)))
        mean = t.unfold(0, k, 1).mean(dim=1) if len(t) >= k else t
        ax.plot(range(k - 1, k - 1 + len(mean)), mean.tolist(), label=label)
    ax.set(xlabel="step", ylabel=f"loss (running mean of {smooth})", title=title)
    ax.legend(fontsize="small")


MEMORY_PARTS = ("params", "grads", "optimizer", "gathered")


def plot_memory(ax, per_rank: list[dict], title: str) -> None:
    """Stacked bars of each rank's measured bytes (:data:`MEMORY_PARTS`) (lesson 07)."""
    bottom = [0.0] * len(per_rank)
    for part in MEMORY_PARTS:
        values = [r[part] / 1024 for r in per_rank]
        ax.bar(range(len(per_rank)), values, bottom=bottom, label=part)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.set_xticks(range(len(per_rank)), [f"rank {r}" for r in range(len(per_rank))])
    ax.set(ylabel="KiB", title=title, ylim=(0, 1.35 * max(bottom)))
    ax.legend(fontsize="small", ncols=4, loc="upper center")


# --------------------------------------------------------------------------------------------
# The lesson's widget


class ShardExplorer:
    """Lesson 07's widget: world size and policy controls over measured memory and error.

    Every change launches real ranks twice: ``memory_worker`` (the lesson's own byte count,
    ``memory_worker(rank, world_size, config, optimizer)`` returning a dict with the keys of
    :data:`MEMORY_PARTS`) and :func:`sharded_worker` (a short training run, whose final weights
    are compared with :func:`single_process_run` in float32). ``results`` keeps the last
    measurements, so tests can drive the controls.
    """

    def __init__(
        self,
        memory_worker: Callable[..., dict],
        config: FSDPConfig | None = None,
        world_size: int = 2,
        param_dtype: str = "bfloat16",
        reduce_dtype: str = "float32",
        backend: str | None = None,
    ) -> None:
        import ipywidgets as W

        from course.plotting import new_figure

        self.config = config or FSDPConfig(width=64, hidden=128, depth=3, steps=8, global_batch=48)
        self.backend = backend
        self.memory_worker = memory_worker
        self.results: dict = {}
        self.reference = single_process_run(replace(self.config, param_dtype=None))
        self.world_size = W.IntSlider(
            value=world_size, min=1, max=4, description="world size", continuous_update=False
        )
        self.param_dtype = W.Dropdown(
            options=["float32", "bfloat16"], value=param_dtype, description="param_dtype"
        )
        self.reduce_dtype = W.Dropdown(
            options=["float32", "bfloat16"], value=reduce_dtype, description="reduce_dtype"
        )
        self.optimizer = W.Dropdown(options=["adamw", "sgd"], value="adamw", description="optim")
        self.stats = W.HTML()
        self.output = W.Output()
        self.figure, (self.ax,) = new_figure(6.5, 3.2)
        controls = (self.world_size, self.param_dtype, self.reduce_dtype, self.optimizer)
        for control in controls:
            control.observe(lambda change: self.update(), names="value")
        self.widget = W.VBox(
            [W.HBox(list(controls[:2])), W.HBox(list(controls[2:])), self.stats, self.output]
        )
        self.update()

    def update(self) -> None:
        """Run the ranks with the current controls, measure, and redraw."""
        from IPython.display import display

        ws = self.world_size.value
        cfg = replace(
            self.config,
            param_dtype=as_dtype(self.param_dtype.value),
            reduce_dtype=as_dtype(self.reduce_dtype.value),
        )
        if self.config.global_batch % ws:
            raise ValueError(f"global batch {self.config.global_batch} does not split over {ws}")
        backend = pick_backend(ws, self.backend)
        try:
            memory = launch(
                self.memory_worker,
                ws,
                (cfg, self.optimizer.value),
                backend=backend.name,
                show_output=False,
            )
            run = launch(
                sharded_worker, ws, (RunSpec(cfg),), backend=backend.name, show_output=False
            )
        except LaunchError as exc:
            self.results = {}
            self.stats.value = f"<pre>the launch failed: {exc}</pre>"
            return
        error = relative_error(run[0]["state_dict"], self.reference["state_dict"])
        reduced = sorted(
            {
                str(d).replace("torch.", "")
                for n, d, _ in run[0]["collectives"]
                if n == "reduce_scatter_single"
            }
        )
        self.results = {"memory": memory, "error": error, "reduced_in": reduced}
        self.ax.clear()
        plot_memory(self.ax, memory, f"measured bytes per rank, {ws} rank(s)")
        unsharded = sum(p.numel() for p in self.config.make_model().parameters()) * 4
        self.stats.value = (
            f"{describe_backend(backend, ws)}<br>rank 0 holds <b>{memory[0]['params']:,}</b> "
            f"bytes of parameters (unsharded float32: {unsharded:,}); largest gathered unit "
            f"{memory[0]['gathered']:,} bytes; gradients reduce-scattered in "
            f"<b>{', '.join(reduced) or 'nothing (one rank)'}</b>; weights after "
            f"{cfg.steps} steps vs one float32 process: relative error <b>{error:.2e}</b>"
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


# --------------------------------------------------------------------------------------------
# The inf check: what DTensor does for GradScaler


@contextlib.contextmanager
def count_dtensor_inf_reductions() -> Iterator[list[str]]:
    """Inside a rank: record each time DTensor reduces GradScaler's inf flag across ranks.

    DTensor (torch 2.13) routes ``_amp_foreach_non_finite_check_and_unscale_`` on DTensor
    gradients to ``found_inf_reduce_handler`` (``torch/distributed/tensor/_dispatch.py``), which
    all-reduces the flag's maximum over the mesh; this wraps that handler in DTensor's table of
    custom op handlers and appends the op's name per call. Introduced in lesson 07.
    """
    from torch.distributed.tensor import DTensor

    handlers = DTensor._op_dispatcher._custom_op_handlers
    op = torch.ops.aten._amp_foreach_non_finite_check_and_unscale_.default
    original = handlers[op]
    calls: list[str] = []

    def counted(*args, **kwargs):
        calls.append(str(op))
        return original(*args, **kwargs)

    handlers[op] = counted
    try:
        yield calls
    finally:
        handlers[op] = original


# --------------------------------------------------------------------------------------------
# Grading: the course's own FSDP2 runs are not an answer

#: The functions of this module that shard and train, or measure, a model themselves: an
#: exercise that called them would hand in the course's run instead of its own.
COURSE_RUNS = ("sharded_worker", "shard_model", "record_backward_peaks")


#: While :func:`without_course_runs` is active: ``(exercise, calls)``, innermost last.
_REFUSING: list[tuple[str, list[str]]] = []


def _refuse_while_grading(name: str) -> None:
    """Raise :class:`course.checks.CheckFailed` if an exercise is being graded (lesson 07)."""
    if _REFUSING:
        from course.checks import CheckFailed

        exercise, calls = _REFUSING[-1]
        calls.append(name)
        raise CheckFailed(
            f"{exercise} called course.sharded.{name}, the course's own FSDP2 run or "
            "measurement: write it with fully_shard (or, for shard_memory, count) yourself"
        )


@contextlib.contextmanager
def without_course_runs(exercise: str, calls: list[str]) -> Iterator[None]:
    """Make :data:`COURSE_RUNS` refuse to run, in this process, for the block's time.

    Lesson 07's graders run a student's exercise inside this block (in the kernel, or inside a
    rank). Each of those functions checks at its start whether a block is active, so the
    refusal holds whatever name the student imported it under, in forked ranks and in spawned
    ones (cloudpickle sends this module's functions by reference). A refused call is appended to
    ``calls`` and raises :class:`course.checks.CheckFailed` with a message that teaches.
    Introduced in lesson 07.
    """
    _REFUSING.append((exercise, calls))
    try:
        yield
    finally:
        _REFUSING.pop()
