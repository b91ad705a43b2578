"""The lesson's GPT training as a script: DDP, mixed precision, accumulation, resume (lesson 09).

The loop is plumbing; the step and the checkpoint are the learner's (lesson 09's exercise
``distributed_step``): the script imports ``distributed_step``, ``save_checkpoint`` and
``load_checkpoint`` from the Python file given with ``--functions``. Run it with ``torchrun``,
one process per GPU (``nccl``) or several CPU processes (``gloo``)::

    torchrun --standalone --nproc-per-node 2 -m course.gpt_train --functions step.py --steps 20
    torchrun --standalone --nproc-per-node 8 -m course.gpt_train --functions step.py \\
        --size gpu --steps 2000 --checkpoint run.pt --save-every 100   # again with --resume
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 --rdzv-id JOB -m course.gpt_train --functions step.py ...

(the same command on every machine: the c10d rendezvous numbers the machines itself, so it takes
no ``--node-rank``).

(``python -m course.gpt_train`` alone trains in one process.) Each optimizer step hands
``--accum`` micro-batches of ``--batch-size`` windows per rank to ``distributed_step``. The windows
are pieces of documents of different lengths: the targets past each one's end are
:data:`course.gpt.IGNORE`, so the ranks count different numbers of tokens. The learning rate
warms up for ``--warmup`` steps, then decays linearly to a tenth (:func:`lr_schedule`).

Each rank keeps its own checkpoint file (``PATH.rank0``, ``PATH.rank1``, ...), written by the
learner's ``save_checkpoint`` with the data position (how many micro-batches the rank has
consumed); each micro-batch is drawn from a generator seeded by (seed, rank, position), so a
resumed run reads exactly the batches the uninterrupted run would have read.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import json
import math
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course.gpt import CONFIGS, GPT, IGNORE, GPTConfig, lm_loss, stdlib_corpus, val_batch
from course.launch import count_ddp_allreduces, exit_script, init_torchrun, under_torchrun

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

#: The imports the file given with ``--functions`` starts with when lesson 09's notebook writes
#: the learner's three functions into it (their source follows).
FUNCTIONS_HEADER = """import contextlib
import math

import torch
import torch.distributed as dist
from torch.nn import functional as F

from course.gpt import IGNORE, lm_loss
"""

#: The learner's functions, in this order: ``distributed_step``, ``save_checkpoint``,
#: ``load_checkpoint`` (lesson 09's exercise).
Functions = tuple[Callable, Callable, Callable]


@dataclass(frozen=True)
class RunSpec:
    """One training run of :func:`train` (lesson 09). ``batch_size`` is per rank and
    micro-batch; a checkpoint is saved every ``save_every`` steps and after each step in
    ``save_at``; ``stop_after`` ends the run early after that step (an interruption, for
    testing resume); ``corpus_bytes`` is how much of the standard library it reads;
    ``init_scale`` is the GradScaler's first scale (a large one makes the first float16 steps
    overflow and be skipped) and ``growth_interval`` how many steps in a row it must take
    before it doubles the scale (torch's default, 2000; 1 doubles it after every step taken);
    ``text`` is ``"stdlib"`` (the standard library's source) or
    ``"random"`` (``corpus_bytes`` uniform random bytes, quick to make: the grader's choice);
    ``evaluate`` measures the validation loss at the end; ``keep_state`` returns the final
    weights."""

    config: GPTConfig = CONFIGS["cpu"]
    steps: int = 20
    batch_size: int = 8
    accum: int = 2
    dtype: str = "bf16"
    lr: float = 1e-3
    warmup: int = 2
    max_grad_norm: float = 1.0
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    seed: int = 0
    checkpoint: str = ""
    save_every: int = 0
    save_at: tuple[int, ...] = ()
    resume: bool = False
    stop_after: int = 0
    corpus_bytes: int = 1_000_000
    text: str = "stdlib"
    evaluate: bool = True
    keep_state: bool = False


def micro_batch(
    tokens: torch.Tensor, spec: RunSpec, rank: int, position: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch number ``position``: random windows of ``tokens`` from a
    generator seeded by (seed, rank, position), so any position can be read again; each window
    is a document of random length (a quarter of the block to all of it), its targets past the
    end :data:`~course.gpt.IGNORE` (lesson 09)."""
    block = spec.config.block_size
    gen = torch.Generator().manual_seed((spec.seed * 1_000_003 + position) * 1_009 + rank)
    starts = torch.randint(0, len(tokens) - block, (spec.batch_size,), generator=gen)
    lengths = torch.randint(max(1, block // 4), block + 1, (spec.batch_size, 1), generator=gen)
    windows = tokens[starts[:, None] + torch.arange(block + 1)].long()
    targets = windows[:, 1:].masked_fill(torch.arange(block) >= lengths, IGNORE)
    return windows[:, :-1].to(device), targets.to(device)


class WarmupDecay:
    """The LR factor at scheduler step ``s``: linear warm-up over ``warmup`` steps, then linear
    decay to a tenth at ``total`` (a class, not a lambda, so that it pickles)."""

    def __init__(self, warmup: int, total: int) -> None:
        self.warmup, self.total = warmup, total

    def __call__(self, s: int) -> float:
        if s < self.warmup:
            return (s + 1) / self.warmup
        done = (s - self.warmup) / max(1, self.total - self.warmup)
        return max(0.1, 1.0 - 0.9 * done)


def lr_schedule(
    optimizer: torch.optim.Optimizer, warmup: int, total: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """The run's LR schedule: :class:`WarmupDecay` as a ``LambdaLR`` (lesson 09)."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupDecay(warmup, total))


def checkpoint_path(checkpoint: str, rank: int) -> Path:
    """Rank ``rank``'s checkpoint file for the run's ``--checkpoint`` (``PATH.rank<r>``)."""
    return Path(f"{checkpoint}.rank{rank}")


def digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes, in order: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def corpus(spec: RunSpec) -> tuple[torch.Tensor, torch.Tensor]:
    """The run's train and validation text: the standard library (its files shuffled with seed
    0), or random bytes (a generator seeded with 0; a tenth of them for validation)."""
    if spec.text == "random":
        gen = torch.Generator().manual_seed(0)
        data = torch.randint(0, 256, (spec.corpus_bytes,), generator=gen, dtype=torch.uint8)
        cut = spec.corpus_bytes // 10
        return data[cut:], data[:cut]
    if spec.text != "stdlib":
        raise ValueError(f"text must be 'stdlib' or 'random', got {spec.text!r}")
    return stdlib_corpus(max_bytes=spec.corpus_bytes, seed=0)


def graded_spec(seed: int, checkpoint: str = "") -> RunSpec:
    """The run lesson 09's hidden test of ``distributed_step`` launches on 2 gloo ranks, from
    its seed (the grader rebuilds it from the same seed): float16 with a first scale (2^17) that
    lets the first step through, so the checkpoint (after step 3) always follows a step taken and
    holds a schedule that has moved, and a scale that doubles after every step taken (so a step
    taken can end with a larger scale than it began with, and the scale soon overflows: every
    draw skips a step),
    dropout (so the RNG state matters), documents of different lengths (so the ranks count
    different tokens)."""
    gen = torch.Generator().manual_seed(seed)
    v = torch.randint(0, 10**6, (5,), generator=gen).tolist()
    heads = 1 + v[0] % 2
    cfg = GPTConfig(
        vocab_size=256,
        block_size=8 + v[1] % 9,
        n_layer=1,
        n_head=heads,
        d_model=heads * (8 + v[2] % 9),
        d_ff=32,
        dropout=0.1,
    )
    return RunSpec(
        config=cfg,
        steps=6,
        batch_size=2,
        accum=2 + v[3] % 2,
        dtype="fp16",
        lr=3e-3,
        warmup=3,
        max_grad_norm=0.2,
        init_scale=2.0**17,
        growth_interval=1,
        seed=v[4],
        checkpoint=checkpoint,
        save_at=(3,),
        corpus_bytes=20_000,
        text="random",
        evaluate=False,
        keep_state=True,
    )


def training_state(
    spec: RunSpec, model: torch.nn.Module, device: torch.device
) -> tuple[torch.optim.AdamW, torch.amp.GradScaler, torch.optim.lr_scheduler.LambdaLR]:
    """The run's AdamW optimizer over ``model``, its ``GradScaler`` (on for float16 only) and its
    LR schedule (lesson 09)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    scaler = torch.amp.GradScaler(
        device.type,
        init_scale=spec.init_scale,
        growth_interval=spec.growth_interval,
        enabled=DTYPES[spec.dtype] == torch.float16,
    )
    return optimizer, scaler, lr_schedule(optimizer, spec.warmup, spec.steps)


def gradient_norm(model: torch.nn.Module) -> float:
    """The norm of all of ``model``'s gradients together, summed in float64 (inf or nan where a
    gradient is; nan when there are none)."""
    squares = [
        p.grad.detach().double().square().sum() for p in model.parameters() if p.grad is not None
    ]
    return math.sqrt(float(sum(squares))) if squares else float("nan")


def record_unscaled_norms(scaler: torch.amp.GradScaler, model: torch.nn.Module) -> list[float]:
    """From now on, each time ``scaler`` unscales the gradients (``scaler.unscale_(optimizer)``,
    or ``scaler.step`` doing it when nobody did), append :func:`gradient_norm` of ``model`` right
    after: the norm of the gradient of the step's loss, before any clipping (lesson 09's tests:
    clipping and AdamW hide a gradient that is too large or too small by a constant factor, the
    norm does not). Returns the list the norms are appended to."""
    norms: list[float] = []
    unscale = scaler.unscale_

    def unscale_and_record(optimizer: torch.optim.Optimizer) -> None:
        unscale(optimizer)
        norms.append(gradient_norm(model))

    scaler.unscale_ = unscale_and_record  # type: ignore[method-assign]
    return norms


def cuda_generators_round_trip(spec: RunSpec, functions: Functions, path: str) -> dict:
    """The learner's ``save_checkpoint`` then ``load_checkpoint`` (``functions``) on a model of
    ``spec`` on the CPU, as if the machine had a GPU (lesson 09's tests): the CUDA generators are
    lesson 05's :class:`course.accumulation.SimulatedCudaGenerators` (``torch.cuda`` and
    ``torch.accelerator`` say a GPU is there, however their functions were imported). Between
    the save and the load they move on (as dropout moves them on a GPU); the load must put back
    the state they had at the save, a CPU ``ByteTensor``. Returns ``error`` (the exception as
    text, or None), the generator states at the save (``saved``) and after the load
    (``restored``); the CPU generator's state is kept for the caller."""
    # not needed by the ranks
    from course.accumulation import SimulatedCudaGenerators, simulated_cuda_states

    _, save_fn, load_fn = functions
    saved = simulated_cuda_states(spec.seed, 0, 1)
    cuda = SimulatedCudaGenerators(saved)
    error, restored = None, []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = GPT(spec.config)
        optimizer, scaler, scheduler = training_state(spec, model, torch.device("cpu"))
        try:
            with cuda:
                save_fn(path, model, optimizer, scaler, scheduler, spec.accum)
                cuda.states = simulated_cuda_states(spec.seed, 0, 1, later=True)  # moved on
                load_fn(path, model, optimizer, scaler, scheduler)
        except Exception as exc:  # noqa: BLE001 - reported to the learner
            error = f"{type(exc).__name__}: {exc}"
    for state in cuda.states:
        if not (
            isinstance(state, torch.Tensor)
            and state.device.type == "cpu"
            and state.dtype == torch.uint8
            and state.shape == (16,)
        ):
            error = error or (
                "a CUDA generator's state must be the CPU ByteTensor torch.cuda.get_rng_state "
                f"gave, got {state!r:.80}"
            )
            state = torch.zeros(16, dtype=torch.uint8)
        restored.append(state.clone())
    return {"error": error, "saved": saved, "restored": restored}


def load_off_cpu(spec: RunSpec, functions: Functions, rank: int = 0) -> dict:
    """Rank ``rank``'s checkpoint of ``spec``, loaded by the learner's ``load_checkpoint`` twice
    (lesson 09's tests): into a run on the CPU, and into a run on the ``meta`` device, which
    stands in for a GPU. Meta tensors hold no data: whatever ``load_checkpoint`` maps to the
    model's device is lost there, and ``torch.set_rng_state`` refuses it (a generator state must
    be a CPU ``ByteTensor``, as it must on a GPU machine); what it loads onto the CPU, as it
    should, restores the generator and is copied into the model by ``load_state_dict``.

    Before each load the generator is moved away from the saved state; the caller's generator
    state is restored afterwards. Returns, for ``"cpu"`` and ``"meta"``: ``error`` (the exception
    as text, or None), the returned ``position``, the generator state after the load (``rng``),
    the scaler's scale, the learning rate and the scheduler's ``last_epoch``.
    """
    load_fn = functions[2]
    path = checkpoint_path(spec.checkpoint, rank)
    out = {}
    with torch.random.fork_rng(devices=[]):
        for where in ("cpu", "meta"):
            device = torch.device(where)
            with device:  # built there: moving a model to meta would untie its head
                model = GPT(spec.config)
            optimizer, scaler, scheduler = training_state(spec, model, device)
            torch.manual_seed(spec.seed + 1)  # not the saved generator state
            error, position = None, None
            with warnings.catch_warnings():
                # load_state_dict into meta parameters copies nothing, and says so
                warnings.filterwarnings("ignore", message=".*meta parameter", category=UserWarning)
                try:
                    position = load_fn(path, model, optimizer, scaler, scheduler)
                except Exception as exc:  # noqa: BLE001 - reported to the learner
                    error = f"{type(exc).__name__}: {exc}"
            out[where] = {
                "error": error,
                "position": position if type(position) is int else repr(position),
                "rng": torch.get_rng_state(),
                "scale": scaler.get_scale() if scaler.is_enabled() else None,
                "lr": optimizer.param_groups[0]["lr"],
                "last_epoch": scheduler.last_epoch,
            }
    return out


def train(spec: RunSpec, device: torch.device, functions: Functions) -> dict:
    """Train as this rank of the default process group (or alone, if there is none), with the
    learner's ``distributed_step`` and checkpoint functions (lesson 09).

    Returns, for the steps this call ran: the step it started from, per step the training loss
    ``distributed_step`` returned, whether the optimizer stepped, the learning rate and the
    loss scale in effect, the DDP gradient all-reduces made and the gradient's norm when the
    scaler unscaled it (:func:`record_unscaled_norms`; nan for a step that did not); then the
    validation loss at the end, the weights' :func:`digest` (and the weights with
    ``keep_state``) and timing.
    """
    step_fn, save_fn, load_fn = functions
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    amp_dtype = DTYPES[spec.dtype]
    train_tokens, val_tokens = corpus(spec)
    torch.manual_seed(spec.seed)  # the same initial weights on every rank
    model = GPT(spec.config).to(device)
    with count_ddp_allreduces() if distributed else contextlib.nullcontext() as count:
        net: torch.nn.Module = model
        if distributed:
            net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        optimizer, scaler, scheduler = training_state(spec, model, device)
        position = 0
        ckpt = checkpoint_path(spec.checkpoint, rank) if spec.checkpoint else None
        if spec.resume and ckpt is not None and ckpt.exists():
            position = load_fn(ckpt, model, optimizer, scaler, scheduler)
        start = position // spec.accum
        record: dict[str, list] = {k: [] for k in ("losses", "stepped", "lrs", "scales")}
        record["allreduces"], record["grad_norms"] = [], []
        norms = record_unscaled_norms(scaler, model)
        begin = time.perf_counter()
        for step in range(start, spec.steps):
            micro = [
                micro_batch(train_tokens, spec, rank, position + i, device)
                for i in range(spec.accum)
            ]
            record["lrs"].append(optimizer.param_groups[0]["lr"])
            record["scales"].append(scaler.get_scale() if scaler.is_enabled() else 1.0)
            calls = count.calls if count is not None else 0
            unscaled = len(norms)
            loss, stepped = step_fn(
                net, optimizer, scaler, scheduler, micro, amp_dtype, spec.max_grad_norm
            )
            record["allreduces"].append((count.calls if count is not None else 0) - calls)
            # the gradient's norm when the step unscaled it (before clipping); nan if it did not
            record["grad_norms"].append(norms[unscaled] if len(norms) > unscaled else math.nan)
            record["losses"].append(float(loss))
            record["stepped"].append(bool(stepped))
            position += spec.accum
            done = step + 1
            periodic = spec.save_every and done % spec.save_every == 0
            if ckpt is not None and (periodic or done in spec.save_at):
                save_fn(ckpt, model, optimizer, scaler, scheduler, position)
            if spec.stop_after and done >= spec.stop_after:
                break
        seconds = time.perf_counter() - begin
    val_loss = float("nan")
    if spec.evaluate:
        model.eval()
        with torch.no_grad(), torch.autocast(device.type, dtype=amp_dtype):
            xv, yv = val_batch(val_tokens, spec.config.block_size, device=device)
            val_loss = lm_loss(model(xv), yv).item()
        model.train()
    steps_run = len(record["losses"])
    tokens = steps_run * spec.accum * spec.batch_size * spec.config.block_size * world
    out = {
        "rank": rank,
        "world_size": world,
        "start_step": start,
        **record,
        "val_loss": val_loss,
        "digest": digest(model),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "scale": scaler.get_scale() if scaler.is_enabled() else None,
    }
    if spec.keep_state:
        out["state"] = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        # The schedule's count shows only in the lr of the step after it: kept here, so a resumed
        # run that lost it differs from the unbroken one even when its last step was the one taken.
        out["state"]["scheduler.last_epoch"] = torch.tensor(scheduler.last_epoch)
        out["state"]["optimizer.lr"] = torch.tensor(optimizer.param_groups[0]["lr"])
    return out


def train_rank(rank: int, world_size: int, spec: RunSpec, functions: Functions) -> dict:
    """:func:`train` on the CPU as one rank of :func:`course.launch.launch` (lesson 09's
    grader and notebook run the learner's functions on 2 gloo ranks with it)."""
    return train(spec, torch.device("cpu"), functions)


def load_functions(path: str | Path) -> Functions:
    """``distributed_step``, ``save_checkpoint`` and ``load_checkpoint`` from the Python file
    ``path`` (the learner's, written out by lesson 09's notebook)."""
    where = Path(path)
    module_spec = importlib.util.spec_from_file_location(f"_steps_{where.stem}", where)
    if module_spec is None or module_spec.loader is None:
        raise ValueError(f"cannot import {where}")
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    names = ("distributed_step", "save_checkpoint", "load_checkpoint")
    missing = [n for n in names if not hasattr(module, n)]
    if missing:
        raise ValueError(f"{where} does not define {', '.join(missing)}")
    return tuple(getattr(module, n) for n in names)  # type: ignore[return-value]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m course.gpt_train", description=__doc__.split("\n")[0]
    )
    p.add_argument("--size", choices=sorted(CONFIGS), default="cpu", help="model size (cpu)")
    p.add_argument("--d-model", type=int, default=None, help="override the size's width")
    p.add_argument("--n-layer", type=int, default=None, help="override the number of blocks")
    p.add_argument("--block-size", type=int, default=None, help="override the context length")
    p.add_argument("--steps", type=int, default=20, help="optimizer steps (20)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per rank per micro-batch")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step (2)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16", help="autocast dtype")
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW peak learning rate (1e-3)")
    p.add_argument("--warmup", type=int, default=2, help="LR warm-up steps (2)")
    p.add_argument("--max-grad-norm", type=float, default=1.0, help="clip to this norm (1.0)")
    p.add_argument("--dropout", type=float, default=0.0, help="dropout probability (0)")
    p.add_argument(
        "--functions",
        required=True,
        help="Python file defining distributed_step, save_checkpoint and load_checkpoint",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="", help="checkpoint file to save to / resume from")
    p.add_argument("--save-every", type=int, default=0, help="save every N steps (0: never)")
    p.add_argument("--save-at", type=int, nargs="*", default=[], help="save after these steps")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint if present")
    p.add_argument("--stop-after", type=int, default=0, help="stop after step N (interruption)")
    p.add_argument("--corpus-bytes", type=int, default=1_000_000, help="text to read (1 MB)")
    p.add_argument("--out", default="", help="write rank 0's result as JSON here")
    p.add_argument("--backend", choices=("auto", "gloo", "nccl"), default="auto")
    return p


def spec_from_args(args: argparse.Namespace) -> RunSpec:
    """The :class:`RunSpec` a command line asks for."""
    config = CONFIGS[args.size]
    overrides = {
        k: v
        for k, v in (
            ("d_model", args.d_model),
            ("n_layer", args.n_layer),
            ("block_size", args.block_size),
        )
        if v is not None
    }
    if "d_model" in overrides:
        overrides["d_ff"] = 4 * overrides["d_model"]
    if args.dropout:
        overrides["dropout"] = args.dropout
    return RunSpec(
        config=replace(config, **overrides),
        steps=args.steps,
        batch_size=args.batch_size,
        accum=args.accum,
        dtype=args.dtype,
        lr=args.lr,
        warmup=args.warmup,
        max_grad_norm=args.max_grad_norm,
        seed=args.seed,
        checkpoint=args.checkpoint,
        save_every=args.save_every,
        save_at=tuple(args.save_at),
        resume=args.resume,
        stop_after=args.stop_after,
        corpus_bytes=args.corpus_bytes,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``torchrun -m course.gpt_train`` and ``python -m course.gpt_train``."""
    args = _parser().parse_args(argv)
    spec = spec_from_args(args)
    distributed = under_torchrun()
    if distributed:  # nccl with a GPU per local rank, else gloo on the CPU
        device = init_torchrun(args.backend)
    elif args.backend != "gloo" and torch.cuda.is_available():
        device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    try:
        result = train(spec, device, load_functions(args.functions))
        if result["rank"] == 0:
            backend = dist.get_backend() if distributed else "none"
            print(
                f"{result['world_size']} rank(s), backend {backend}, device {device.type}, "
                f"dtype {spec.dtype}, steps {result['start_step']}..{spec.steps} "
                f"(stopped after {result['start_step'] + len(result['losses'])})"
            )
            print(f"config: {asdict(spec.config)}")
            shown = ", ".join(f"{v:.4f}" for v in result["losses"])
            print(f"training loss per step: {shown}")
            skipped = result["stepped"].count(False)
            print(f"steps skipped by the scaler: {skipped}; last lr {result['lrs'][-1]:.2e}")
            print(
                f"validation loss {result['val_loss']:.4f}; {result['tokens_per_s']:,.0f} tokens/s"
                f"; weights sha256 {result['digest'][:16]}"
            )
            if args.out:
                Path(args.out).write_text(json.dumps(result))
    finally:
        if distributed:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    # Run the importable copy of this module (as course.ddp_train does).
    from course.gpt_train import main as _main

    exit_script(_main())
