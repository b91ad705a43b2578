"""Lesson 05's hidden tests: the problems built from a seed, and the drivers that feed them to the
student's functions.

The judges (``judge.py``) build the same problems with the same functions and read the drivers'
observations in the order the drivers made them. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course.accumulation import (
    MicroBatches,
    RecordingSGD,
    SimulatedCudaGenerators,
    dropout_mlp,
    full_batch_grads,
    simulated_cuda_states,
    split_batch,
)
from grader.lessons.drive import observer

def draw_int(gen: torch.Generator, lo: int, hi: int) -> int:
    """A random integer in ``[lo, hi]`` (both included) from ``gen``."""
    return int(torch.randint(lo, hi + 1, (), generator=gen))


#: The loss every hidden test trains with (the lesson's ``loss_fn``).
loss_fn = nn.functional.cross_entropy


def random_problem(
    gen: torch.Generator, count: int, per: int | None = None
) -> tuple[nn.Sequential, MicroBatches]:
    """A random two-layer classifier and ``count`` micro-batches of ``per`` examples for it
    (``per`` drawn from 3 to 8 when None), all from ``gen`` (lesson 05's hidden tests).

    The weights come from torch's global generator, seeded from ``gen``.
    """
    d, h, c = draw_int(gen, 6, 20), draw_int(gen, 12, 40), draw_int(gen, 3, 6)
    per = per or draw_int(gen, 3, 8)
    torch.manual_seed(draw_int(gen, 0, 2**30))
    net = nn.Sequential(nn.Linear(d, h), nn.ReLU(), nn.Linear(h, c))
    xs = torch.randn(count * per, d, generator=gen)
    ys = torch.randint(0, c, (count * per,), generator=gen)
    return net, split_batch(xs, ys, count)


class output_dtypes(contextlib.AbstractContextManager):  # noqa: N801 - used as a function
    """``with output_dtypes(module) as seen:`` collects the dtype of each output ``module``
    gives inside the block (lesson 05: under autocast, a Linear's output is float16)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.seen: list[torch.dtype] = []
        self.handle = None

    def __enter__(self) -> list[torch.dtype]:
        self.handle = self.module.register_forward_hook(self._note)
        return self.seen

    def _note(self, module: nn.Module, args: tuple, output: torch.Tensor) -> None:
        self.seen.append(output.dtype)

    def __exit__(self, *exc_info: object) -> None:
        self.handle.remove()


class FiniteLosses:
    """A loss function that notes, in ``finite``, whether each loss it returned was finite
    (lesson 05: a scale can overflow the backward pass while every loss is finite)."""

    def __init__(self, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        self.loss_fn = loss_fn
        self.finite: list[bool] = []

    def __call__(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self.loss_fn(logits, target)
        self.finite.append(bool(torch.isfinite(loss)))
        return loss


@dataclass
class Problem:
    """One accumulated_step problem: a fresh model, its micro-batches, and the case's settings."""

    net: nn.Sequential
    mbs: MicroBatches
    dtype: torch.dtype = torch.float16
    enabled: bool = True  # whether the GradScaler is enabled
    scale: float = 2.0**16  # the scaler's init_scale
    interval: int = 2000  # its growth_interval
    factor: float = 0.0  # max_grad_norm over the batch's float32 gradient norm
    max_norm: float | None = None
    bad: int = -1  # the micro-batch that holds an inf

    @property
    def k(self) -> int:
        return len(self.mbs)

    def scaler(self) -> torch.amp.GradScaler:
        return torch.amp.GradScaler(
            "cpu", init_scale=self.scale, growth_interval=self.interval, enabled=self.enabled
        )


def _clipping(gen: torch.Generator, factor: float) -> Problem:
    net, mbs = random_problem(gen, draw_int(gen, 2, 5))
    scale = 2.0 ** draw_int(gen, 12, 16)
    x, y = torch.cat([x for x, _ in mbs]), torch.cat([y for _, y in mbs])
    norm = torch.cat([g.flatten() for g in full_batch_grads(net, x, y, loss_fn)]).norm().item()
    return Problem(net, mbs, scale=scale, factor=factor, max_norm=factor * norm)


def _with_inf(gen: torch.Generator, clip: float | None) -> Problem:
    k = draw_int(gen, 2, 6)
    net, mbs = random_problem(gen, k)
    bad = draw_int(gen, 0, k - 1)
    xb = mbs[bad][0].clone()
    xb[draw_int(gen, 0, len(xb) - 1), draw_int(gen, 0, xb.shape[1] - 1)] = float("inf")
    mbs[bad] = (xb, mbs[bad][1])
    return Problem(net, mbs, scale=2.0 ** draw_int(gen, 13, 16), max_norm=clip, bad=bad)


def clean(mbs: MicroBatches) -> MicroBatches:
    """The micro-batches with their inf replaced by 0: the clean step after a skipped one."""
    return [(x.nan_to_num(posinf=0.0), y) for x, y in mbs]


def accumulation_problems(seed: int) -> dict[str, list[Problem]]:
    """accumulated_step's problems for a seed, by section: ``mean``, k micro-batches in float16
    with a scaler and in bfloat16 with a disabled one; ``single``, one micro-batch; ``growth``,
    several steps with a small growth interval; ``clipping``, max_grad_norm below and far above
    the batch's gradient norm; ``inf``, an inf in one micro-batch (without and with clipping);
    ``overflow``, clean data at a scale too large for the backward pass; ``in_a_row``, three
    steps in a row. Torch's global generator is left as it was."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        mean = []
        for dtype, enabled in [
            (torch.float16, True),
            (torch.bfloat16, False),
            (torch.float16, True),
        ]:
            net, mbs = random_problem(gen, draw_int(gen, 2, 6))
            mean.append(Problem(net, mbs, dtype=dtype, enabled=enabled))
        single = Problem(*random_problem(gen, 1, per=draw_int(gen, 8, 24)))
        interval = draw_int(gen, 3, 5)
        growth = Problem(
            *random_problem(gen, draw_int(gen, 2, 5)), scale=2.0**10, interval=interval
        )
        factors = (0.2 + 0.6 * float(torch.rand((), generator=gen)), 10.0)
        clipping = [_clipping(gen, factor) for factor in factors]
        inf = [_with_inf(gen, clip) for clip in (None, 1.0)]
        net, mbs = random_problem(gen, draw_int(gen, 2, 5))
        overflow = Problem(net, mbs, scale=2.0 ** draw_int(gen, 40, 60))
        in_a_row = Problem(*random_problem(gen, draw_int(gen, 2, 4)))
    return {
        "mean": mean,
        "single": [single],
        "growth": [growth],
        "clipping": clipping,
        "inf": inf,
        "overflow": [overflow],
        "in_a_row": [in_a_row],
    }


def drive_accumulated_step(
    namespace: dict[str, Any], accumulated_step: Callable, recording_loss: Callable
) -> None:
    """Records what each call returns, the forward dtypes and the order of losses and backward
    passes (``recording_loss(events)``, the visible tests' loss), what the optimizer stepped with
    (``RecordingSGD``), the scaler's state and the gradients left after the step."""
    obs, seed = observer("accumulated_step", namespace)
    problems = accumulation_problems(seed)

    def step(p: Problem, opt: Any, scaler: Any, loss: Callable = loss_fn, **clip: Any) -> None:
        obs.call(
            "returned", accumulated_step, p.net, opt, scaler, p.mbs, loss, "cpu", p.dtype, **clip
        )

    def grads_after(p: Problem) -> None:
        obs.record("grads after", [q.grad for q in p.net.parameters()])

    for p in problems["mean"]:
        opt, events = RecordingSGD(p.net.parameters(), lr=0.0), []
        with output_dtypes(p.net[0]) as seen_dtypes:
            step(p, opt, p.scaler(), recording_loss(events))
        obs.record("forward dtypes", seen_dtypes)
        obs.record("events", events)
        obs.record("steps", opt.steps)
        obs.record("stepped with", opt.seen)
        grads_after(p)
    for p in problems["single"]:
        opt = RecordingSGD(p.net.parameters(), lr=0.0)
        step(p, opt, p.scaler())
        obs.record("stepped with", opt.seen)
    for p in problems["growth"]:
        opt, scaler = RecordingSGD(p.net.parameters(), lr=0.0), p.scaler()
        for _ in range(1, p.interval):
            step(p, opt, scaler)
            obs.record(
                "scale and tracker", [scaler.get_scale(), scaler.state_dict()["_growth_tracker"]]
            )
        step(p, opt, scaler)
        obs.record("scale", scaler.get_scale())
        obs.record("steps", opt.steps)
    for p in problems["clipping"]:
        opt = RecordingSGD(p.net.parameters(), lr=0.0)
        obs.record("max_grad_norm", p.max_norm)
        step(p, opt, p.scaler(), max_grad_norm=p.max_norm)
        obs.record("stepped with", opt.seen)
        grads_after(p)
    for p in problems["inf"]:
        opt, scaler = RecordingSGD(p.net.parameters(), lr=0.1, momentum=0.9), p.scaler()
        step(p, opt, scaler, max_grad_norm=p.max_norm)
        obs.record("steps", opt.steps)
        obs.record("optimizer states", len(opt.state))
        obs.record("parameters", [q.detach() for q in p.net.parameters()])
        obs.record("scale", scaler.get_scale())
        grads_after(p)
        p.mbs = clean(p.mbs)
        step(p, opt, scaler, max_grad_norm=p.max_norm)
        obs.record("stepped with", opt.seen)
    for p in problems["overflow"]:
        opt, losses = RecordingSGD(p.net.parameters(), lr=0.1), FiniteLosses(loss_fn)
        scaler = p.scaler()
        step(p, opt, scaler, losses)
        obs.record("finite losses", losses.finite)
        obs.record("steps", opt.steps)
        obs.record("scale", scaler.get_scale())
        grads_after(p)
    for p in problems["in_a_row"]:
        opt, scaler = torch.optim.SGD(p.net.parameters(), lr=0.05), p.scaler()
        for _ in range(3):
            obs.record("scale", scaler.get_scale())
            step(p, opt, scaler)
        obs.record("parameters", [q.detach() for q in p.net.parameters()])
    obs.done()


def checkpoint_run(
    seed: int,
    kind: str,
    dtype: torch.dtype,
    init_scale: float,
    growth_interval: int,
    sizes: Sequence[int],
) -> tuple[nn.Sequential, torch.optim.Optimizer, torch.amp.GradScaler]:
    """A fresh training run on the CPU: a dropout MLP of ``sizes`` seeded with ``seed``, AdamW
    (``kind="adamw"``) or SGD with momentum, and a GradScaler enabled for float16 only
    (lesson 05's hidden test of the checkpoint functions)."""
    torch.manual_seed(seed)
    net = dropout_mlp(sizes, p=0.3)
    if kind == "adamw":
        opt: torch.optim.Optimizer = torch.optim.AdamW(net.parameters(), lr=3e-3)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler(
        "cpu",
        init_scale=init_scale,
        growth_interval=growth_interval,
        enabled=dtype == torch.float16,
    )
    return net, opt, scaler


def amp_train_steps(
    net: nn.Module,
    opt: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    steps: int,
    dtype: torch.dtype,
    x: torch.Tensor,
    y: torch.Tensor,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> None:
    """``steps`` ordinary mixed precision steps on the CPU, each on 16 examples of ``(x, y)``
    drawn with torch's global generator (lesson 05: what a checkpoint must resume exactly)."""
    net.train()
    for _ in range(steps):
        idx = torch.randint(0, len(x), (16,))
        with torch.amp.autocast("cpu", dtype=dtype):
            loss = loss_fn(net(x[idx]), y[idx])
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)


@dataclass(frozen=True)
class Run:
    """One checkpoint case: run A trains ``n1`` steps, is saved, trains ``n2`` more and is saved
    again in another file; run B loads the first file and trains ``n2`` steps. ``gpus`` is how
    many GPUs the test simulates (0: none)."""

    kind: str
    dtype: torch.dtype
    backoff: bool
    gpus: int
    init: float
    interval: int
    n1: int
    n2: int
    seed_a: int  # run A's weights
    rng_a: int  # torch's generator for A's first steps
    seed_b: int
    rng_b: int  # the random state B starts from before loading
    draws_b: int  # and how many values it draws before loading


#: The checkpoint cases: AdamW and SGD with momentum in float16 with a scale that backs off
#: before the checkpoint (2 and 3 simulated GPUs), AdamW in bfloat16, and SGD in float16 with a
#: steady scale (a growth tracker far from 0 at the checkpoint).
CHECKPOINT_CASES = [
    ("adamw", torch.float16, True, 2),
    ("sgd", torch.float16, True, 3),
    ("adamw", torch.bfloat16, True, 0),
    ("sgd", torch.float16, False, 0),
]


def checkpoint_problems(seed: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, ...], list[Run]]:
    """checkpoint_state's data ``(x, y)``, the model's layer sizes and the runs, for a seed."""
    gen = torch.Generator().manual_seed(seed)
    d, c = draw_int(gen, 6, 16), draw_int(gen, 3, 6)
    data_x = torch.randn(200, d, generator=gen)
    data_y = torch.randint(0, c, (200,), generator=gen)
    runs = []
    for kind, dtype, backoff, gpus in CHECKPOINT_CASES:
        # A scale far too large at the start: the first steps overflow and back off. The last
        # run keeps a steady scale instead: its growth tracker counts every step.
        init, interval = 2.0 ** draw_int(gen, 24, 30), draw_int(gen, 2, 4)
        if not backoff:
            init, interval = 2.0**10, 1000
        n1, n2 = draw_int(gen, 8, 14), draw_int(gen, 6, 12)
        seed_a, rng_a = draw_int(gen, 0, 2**30), draw_int(gen, 0, 2**30)
        seed_b, rng_b, draws_b = (
            draw_int(gen, 0, 2**30),
            draw_int(gen, 0, 2**30),
            draw_int(gen, 1, 50),
        )
        runs.append(
            Run(
                kind,
                dtype,
                backoff,
                gpus,
                init,
                interval,
                n1,
                n2,
                seed_a,
                rng_a,
                seed_b,
                rng_b,
                draws_b,
            )
        )
    return data_x, data_y, (d, 24, 24, c), runs


def new_run(run: Run, which: str, sizes: tuple[int, ...]) -> tuple[nn.Module, Any, Any]:
    """Run A's or B's model, optimizer and scaler, fresh (``checkpoint_run``)."""
    seed = run.seed_a if which == "a" else run.seed_b
    return checkpoint_run(seed, run.kind, run.dtype, run.init, run.interval, sizes)


def drive_checkpoint_state(
    namespace: dict[str, Any], save_training_state: Callable, load_training_state: Callable
) -> None:
    """Run A trains, is saved with save_training_state, and goes on to a later checkpoint in
    another file (trained on another random stream than the one the resumed run must take): loading
    the first file must still give the first state. Run B loads the first file with
    load_training_state and resumes. Records what B holds after loading and after resuming. In
    the first two runs torch.cuda reports 2 and 3 simulated GPUs whose generators hold made-up
    states: loading must give them back the states they held when the file was saved."""
    obs, seed = observer("checkpoint_state", namespace)
    x, y, sizes, runs = checkpoint_problems(seed)
    for case, run in enumerate(runs):
        gpus = SimulatedCudaGenerators(simulated_cuda_states(seed, case, run.gpus))
        with_gpus = gpus if run.gpus else contextlib.nullcontext()
        with tempfile.TemporaryDirectory() as tmp:
            path = (
                pathlib.Path(tmp) / "ckpt.bin" if run.kind == "sgd" else os.path.join(tmp, "c.pt")
            )
            a = new_run(run, "a", sizes)
            torch.manual_seed(run.rng_a)
            amp_train_steps(*a, run.n1, run.dtype, x, y, loss_fn)
            with with_gpus:
                save_training_state(path, *a)
            obs.record("file written", [str(path), os.path.isfile(path)])
            torch.rand(1)
            amp_train_steps(*a, run.n2, run.dtype, x, y, loss_fn)
            gpus.states = simulated_cuda_states(seed, case, run.gpus, later=True)
            with with_gpus:
                save_training_state(os.path.join(tmp, "later.pt"), *a)
            b = new_run(run, "b", sizes)
            torch.manual_seed(run.rng_b)
            torch.rand(run.draws_b)
            with with_gpus:
                load_training_state(path, *b)
            if run.gpus:
                obs.record("GPU generator states after loading", gpus.states)
            obs.record("scaler after loading", b[2].state_dict())
            obs.record("optimizer state after loading", b[1].state_dict()["state"])
            amp_train_steps(*b, run.n2, run.dtype, x, y, loss_fn)
            obs.record("parameters", [[n, p.detach()] for n, p in b[0].named_parameters()])
            obs.record("final scaler", b[2].state_dict())
    obs.done()
