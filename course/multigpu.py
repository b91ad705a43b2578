"""Lesson 06's content: the graded worker's configuration, its tolerances, the widget, and the
``torchrun`` script written around the student's worker.

Processes are started by :func:`course.launch.launch`; the training worker the widget runs is
:func:`course.ddp_train.train_worker`.
"""

from __future__ import annotations

import builtins
import hashlib
import inspect
import re
import time
import types
from dataclasses import dataclass

import torch
from torch import nn

from course.launch import LaunchError, describe_backend, launch, pick_backend

# --------------------------------------------------------------------------------------------
# What the graded worker trains


@dataclass(frozen=True)
class AmpDDPConfig:
    """What ``ddp_amp_worker`` trains: model, data, optimizer and scaler settings (lesson 06).

    Every rank builds the same model from ``seed`` and draws the same *global* batch for a step
    with :meth:`batch`; rank ``r`` of ``W`` trains on the ``r``-th of ``W`` equal contiguous
    chunks of it, split into ``accum_steps`` equal micro-batches. ``amp_dtype`` float32 means
    autocast is off (``amp_enabled`` is False). ``poison`` lists ``(step, index)`` pairs: that
    row of that step's global batch is set to inf, so whichever rank holds it overflows.
    ``device_type`` is where the model and the batches are put: "cpu" (the graded runs), or
    "cuda" (the current CUDA device, which a script under ``torchrun`` sets per rank).
    """

    sizes: tuple[int, ...] = (16, 32, 4)
    steps: int = 4
    global_batch: int = 32
    accum_steps: int = 2
    lr: float = 0.1
    momentum: float = 0.9
    amp_dtype: torch.dtype = torch.float16
    device_type: str = "cpu"
    init_scale: float = 2.0**10
    growth_interval: int = 2
    seed: int = 0
    poison: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if self.global_batch % self.accum_steps:
            raise ValueError(
                f"global_batch {self.global_batch} is not a multiple of accum_steps "
                f"{self.accum_steps}"
            )

    @property
    def amp_enabled(self) -> bool:
        """Whether autocast is on (False when ``amp_dtype`` is float32)."""
        return self.amp_dtype != torch.float32

    def micro_batch_size(self, world_size: int) -> int:
        """Rows per micro-batch on each rank; ValueError if the batch does not split evenly."""
        if self.global_batch % (world_size * self.accum_steps):
            raise ValueError(
                f"a global batch of {self.global_batch} does not split into {world_size} ranks "
                f"x {self.accum_steps} micro-batches"
            )
        return self.global_batch // (world_size * self.accum_steps)

    def make_model(self) -> nn.Module:
        """The model, in float32 on ``device_type``; the same weights on every call."""
        torch.manual_seed(self.seed)
        layers: list[nn.Module] = []
        for i, (n_in, n_out) in enumerate(zip(self.sizes[:-1], self.sizes[1:], strict=True)):
            layers.append(nn.Linear(n_in, n_out))
            if i < len(self.sizes) - 2:
                layers.append(nn.ReLU())
        return nn.Sequential(*layers).to(self.device_type)

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """SGD with momentum over ``params``."""
        return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum)

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The global batch ``(x, y)`` of step ``step`` (float32 and long, on ``device_type``)."""
        gen = torch.Generator().manual_seed(self.seed * 100_003 + step)
        x = torch.randn(self.global_batch, self.sizes[0], generator=gen)
        y = torch.randint(0, self.sizes[-1], (self.global_batch,), generator=gen)
        for poison_step, index in self.poison:
            if poison_step == step:
                x[index] = float("inf")
        return x.to(self.device_type), y.to(self.device_type)

    @staticmethod
    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        """Mean cross-entropy over the rows given."""
        return nn.functional.cross_entropy(logits, target)


def amp_tolerance(dtype: torch.dtype) -> tuple[float, float]:
    """``(rtol, atol)`` for comparing a distributed run with a one-process run (lesson 06).

    Splitting a batch over ranks and micro-batches changes the order of roundings; in float32
    that costs a few ulps, under bfloat16 or float16 autocast more. The graders use these.
    """
    if dtype == torch.float32:
        return 1e-4, 1e-5
    if dtype == torch.bfloat16:
        return 2e-2, 2e-3
    return 5e-3, 5e-4


# --------------------------------------------------------------------------------------------
# The lesson's widget


class DDPExplorer:
    """Lesson 06's widget: world size and accumulation controls over a live data-parallel run.

    Every change launches a short run of :func:`course.ddp_train.train_worker` (real processes)
    and redraws each rank's loss and loss scale, with the all-reduce calls and bytes per step
    and the seconds the launch took. The backend is chosen once, for the largest world size
    (``backend`` forces one). The results of the last run are kept in ``results`` so tests can
    drive the controls and see what changed.
    """

    GLOBAL_BATCH = 192  # splits evenly into 1-4 ranks x 1, 2, 4 or 8 micro-batches
    POISON_STEP = 5

    def __init__(
        self,
        data: tuple[torch.Tensor, torch.Tensor] | None = None,
        world_size: int = 2,
        accum_steps: int = 2,
        poison: bool = False,
        steps: int = 12,
        backend: str | None = None,
    ) -> None:
        import ipywidgets as W

        from course.ddp_train import digits_train
        from course.plotting import new_figure

        self.data = digits_train() if data is None else data
        self.steps = steps
        self.results: list[dict] = []
        #: Seconds the last launch took (start, train, gather), measured around ``launch``.
        self.seconds = float("nan")
        self.world_size = W.IntSlider(
            value=world_size, min=1, max=4, description="world size", continuous_update=False
        )
        # One backend for every world size the slider offers, so the controls never move the
        # ranks between devices: nccl only with a GPU per rank at the largest world size.
        self.backend = pick_backend(self.world_size.max, backend)
        self.accum_steps = W.Dropdown(
            options=[1, 2, 4, 8], value=accum_steps, description="micro-batches"
        )
        self.poison = W.Checkbox(
            value=poison, description=f"inf on the last rank at step {self.POISON_STEP}"
        )
        self.stats = W.HTML()
        self.output = W.Output()
        self.figure, (self.ax_loss, self.ax_scale) = new_figure(9.5, 3.4, ncols=2)
        for control in (self.world_size, self.accum_steps, self.poison):
            control.observe(lambda change: self.update(), names="value")
        self.widget = W.VBox(
            [W.HBox([self.world_size, self.accum_steps, self.poison]), self.stats, self.output]
        )
        self.update()

    def spec(self):
        """The :class:`course.ddp_train.TrainSpec` the controls describe."""
        from course.ddp_train import TrainSpec

        ws = self.world_size.value
        poison = ((self.POISON_STEP, ws - 1),) if self.poison.value else ()
        return TrainSpec(
            steps=self.steps,
            global_batch=self.GLOBAL_BATCH,
            accum_steps=self.accum_steps.value,
            init_scale=2.0**16,
            growth_interval=4,
            poison=poison,
        )

    def update(self) -> None:
        """Run the ranks with the current controls and redraw."""
        from IPython.display import display

        from course.ddp_train import train_worker

        ws = self.world_size.value
        backend = self.backend
        spec = self.spec()
        start = time.perf_counter()
        try:
            self.results = launch(
                train_worker,
                ws,
                (spec, self.data),
                backend=backend.name,
                timeout=120,
                show_output=False,
            )
            self.seconds = time.perf_counter() - start
        except LaunchError as exc:
            self.results = []
            self.stats.value = f"<pre>the launch failed: {exc}</pre>"
            return
        steps = range(spec.steps)
        self.ax_loss.clear()
        self.ax_scale.clear()
        for res in self.results:
            self.ax_loss.plot(steps, res["losses"], marker=".", label=f"rank {res['rank']}")
            self.ax_scale.step(
                steps,
                res["scales"],
                where="post",
                label=f"rank {res['rank']}",
                linewidth=2 + 2 * (ws - 1 - res["rank"]),
                alpha=0.7,
            )
        self.ax_loss.set(xlabel="optimizer step", ylabel="local loss", title="each rank's loss")
        self.ax_scale.set(
            xlabel="optimizer step",
            ylabel="scale after the step",
            yscale="log",
            title="each rank's loss scale",
        )
        self.ax_loss.legend(fontsize="small")
        self.ax_scale.legend(fontsize="small")
        r0 = self.results[0]
        skipped = [s for s, flag in enumerate(r0["skipped"]) if flag]
        same = len({res["digest"] for res in self.results}) == 1
        micro = spec.global_batch // (ws * spec.accum_steps)
        self.stats.value = (
            f"{describe_backend(backend, ws)}: this launch took {self.seconds:.1f} s<br>"
            f"{spec.global_batch} samples per step = {ws} rank(s) x {spec.accum_steps} "
            f"micro-batch(es) of {micro}; all-reduce calls per step: <b>{r0['calls'][-1]}</b> "
            f"({r0['bytes'][-1] / 1024:.0f} KiB); skipped steps: <b>{skipped or 'none'}</b>; "
            f"final weights {'<b>identical</b>' if same else '<b>DIFFERENT</b>'} on every rank"
        )
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget)


# --------------------------------------------------------------------------------------------
# A torchrun script around the student's worker

_SCRIPT_HEAD = '''\
r"""{worker} under torchrun: data-parallel mixed precision training (written by lesson 06).

This machine, 2 ranks:
    torchrun --standalone --nproc-per-node 2 {filename}
Two machines with 8 GPUs each; the same command on both, HOST the first one's address (the
c10d rendezvous numbers the machines itself, so no --node-rank):
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
             --rdzv-endpoint HOST:29500 --rdzv-id my-job {filename}
With a GPU per rank (and NCCL) the ranks use nccl on their own GPU; otherwise gloo on the CPU.
Needs only torch. The global batch must split into world size x accum_steps micro-batches.
"""

from __future__ import annotations

import hashlib
import os
import sys
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import nn
'''

_SCRIPT_MAIN = '''

CONFIG = {config!r}


def main() -> None:
    """Join the job torchrun started, train with {worker} on this rank, report on rank 0."""
    local_rank = int(os.environ["LOCAL_RANK"])
    gpus = torch.cuda.device_count() if dist.is_nccl_available() else 0  # no NCCL on Windows
    if gpus >= int(os.environ["LOCAL_WORLD_SIZE"]):
        device = torch.device("cuda", local_rank)  # one GPU per rank: nccl
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        config = replace(CONFIG, device_type="cuda")
    else:  # fewer GPUs than ranks (or no NCCL) here: gloo, everything on the CPU
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        config = replace(CONFIG, device_type="cpu")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    config.micro_batch_size(world_size)  # a clear error if the batch does not split
    result = {worker}(rank, world_size, config)
    weights = state_digest(result["state_dict"])
    mine = (rank, os.uname().nodename, str(device), weights, result["scales"])
    every: list = [None] * world_size
    dist.all_gather_object(every, mine)
    if rank == 0:
        print(f"{{world_size}} ranks, backend {{dist.get_backend()}}, torch {{torch.__version__}}")
        for r, host, where, weights, _ in every:
            print(f"rank {{r}} on {{host}} ({{where}}): final weights {{weights}}")
        print(f"scale after each step: {{every[0][4]}}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # Gloo's threads can abort the interpreter's teardown after the group is destroyed; the
    # output is flushed and the group is gone, so leave without finalising.
    sys.stdout.flush()
    os._exit(0)
'''


def state_digest(state_dict: dict) -> str:
    """A short hash of a state dict's names and float32 bytes: equal means bit-identical."""
    digest = hashlib.sha256()
    for key, value in sorted(state_dict.items()):
        digest.update(key.encode() + value.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


#: Names the script's header already defines, with the objects they stand for.
_HEAD_NAMES = {
    "hashlib": hashlib,
    "os": __import__("os"),
    "sys": __import__("sys"),
    "torch": torch,
    "dist": torch.distributed,
    "nn": nn,
}


def _names_used(code: types.CodeType) -> set[str]:
    """Global (and attribute) names a code object and the functions nested in it use."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names_used(const)
    return names


def _definitions(fn: types.FunctionType, done: set[str]) -> list[str]:
    """Import lines and source blocks for what ``fn`` uses from its module's globals."""
    module_name = fn.__globals__.get("__name__")
    lines: list[str] = []
    for name in sorted(_names_used(fn.__code__)):
        if name in done or name not in fn.__globals__ or hasattr(builtins, name):
            continue
        done.add(name)
        value = fn.__globals__[name]
        if _HEAD_NAMES.get(name) is value or value is AmpDDPConfig:
            continue
        if isinstance(value, types.ModuleType):
            short = value.__name__.rsplit(".", 1)[-1]
            if value.__name__ == name:
                lines.append(f"import {name}")
            elif "." in value.__name__ and short == name:
                lines.append(f"from {value.__name__.rsplit('.', 1)[0]} import {name}")
            else:
                lines.append(f"import {value.__name__} as {name}")
        elif getattr(value, "__module__", None) == module_name and inspect.isfunction(value):
            lines.extend(_definitions(value, done))
            lines.append("\n\n" + inspect.getsource(value).rstrip())
        elif inspect.isclass(value) or inspect.isfunction(value) or inspect.isbuiltin(value):
            if getattr(value, "__module__", None) == module_name:
                lines.append("\n\n" + inspect.getsource(value).rstrip())
            else:
                what = value.__qualname__
                alias = "" if what == name else f" as {name}"
                lines.append(f"from {value.__module__} import {what}{alias}")
        elif isinstance(value, (bool, int, float, str, bytes, tuple, type(None))):
            lines.append(f"{name} = {value!r}")
        else:
            raise ValueError(
                f"{fn.__name__} uses the global {name!r} ({type(value).__name__}), which cannot "
                "be written into a script: define it inside the function"
            )
    return lines


def worker_script(worker: types.FunctionType, config: AmpDDPConfig, filename: str) -> str:
    """The text of a ``torchrun`` script that trains ``config`` with ``worker`` (lesson 06).

    ``worker`` is a function with ``ddp_amp_worker``'s signature, defined in a notebook cell or
    a module: its source (``inspect.getsource``) is copied into the script, with the imports
    and notebook functions it uses and :class:`AmpDDPConfig`'s source, so that the file needs
    only torch. The script joins torchrun's process group (nccl with a GPU per rank, else gloo
    on the CPU), runs the worker, and prints each rank's final-weight digest and the scales.
    ``filename`` is the name its docstring uses in the commands that run it.
    """
    name = worker.__name__
    imports, blocks = [], []
    for line in _definitions(worker, set()):
        (blocks if line.startswith("\n") else imports).append(line)
    head = _SCRIPT_HEAD.format(worker=name, filename=filename)
    if imports:
        head += f"\n# what {name} uses\n" + "".join(line + "\n" for line in imports)
    parts = [head]
    for source in (inspect.getsource(AmpDDPConfig), inspect.getsource(state_digest)):
        parts.append("\n\n" + source.rstrip() + "\n")
    parts.extend(block + "\n" for block in blocks)
    body = [
        line
        for line in inspect.getsource(worker).rstrip().splitlines()
        # The notebook's solution markers (spelled as a pattern: the student kit refuses files
        # that contain the markers themselves).
        if not re.fullmatch(r"### (BEGIN|END) SOLUTION", line.strip())
    ]
    parts.append("\n\n" + "\n".join(body) + "\n")
    parts.append(_SCRIPT_MAIN.format(worker=name, config=config))
    return "".join(parts)
