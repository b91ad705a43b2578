"""Data-parallel mixed precision training of the digits MLP: a worker and a script (lesson 06).

One training loop, :func:`train_worker`, serves the lesson's experiments (through
:func:`course.launch.launch`) and real jobs (through ``torchrun``). It trains with
``DistributedDataParallel``, autocast and a ``GradScaler``, accumulates micro-batches under
``no_sync()``, and counts what DDP communicates with a comm hook. Run it as

- ``python -m course.ddp_train --world-size 2``: starts its own ranks (``gloo`` on the CPU,
  ``nccl`` when there is a GPU per rank);
- ``torchrun --standalone --nproc-per-node 8 -m course.ddp_train``: one machine, torchrun starts
  the ranks (``--standalone`` picks a free port);
- ``torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500
  --rdzv-id JOB -m course.ddp_train``: the same command on each of two machines, with ``HOST``
  the address of the first. The c10d rendezvous assigns the machines' ranks (torchrun ignores
  ``--node-rank`` unless the rendezvous is ``static``); a failed rank ends the job unless
  ``--max-restarts`` (default 0) allows restarts.

Under torchrun the rank, world size and rendezvous come from the environment (``env://``);
the ranks use nccl when this machine has a GPU for each of its ranks, else gloo on the CPU.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
from dataclasses import asdict, dataclass, replace

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from course.launch import (
    DEFAULT_TIMEOUT,
    exit_script,
    init_torchrun,
    launch,
    pick_backend,
    rank_device,
    under_torchrun,
)


@dataclass(frozen=True)
class TrainSpec:
    """One data-parallel run of the digits MLP (lesson 06).

    ``global_batch`` samples per optimizer step over all ranks, split into ``accum_steps``
    micro-batches on each rank. ``amp_dtype`` is "float16", "bfloat16" or "float32" (autocast
    off); the GradScaler is on for float16 only. ``use_no_sync=False`` all-reduces after every
    micro-batch. ``fp16_compress`` communicates gradients with DDP's ``fp16_compress_hook``.
    ``poison`` lists ``(step, rank)`` pairs: that rank's first sample of that step becomes inf.
    ``batch_norm`` adds BatchNorm layers; ``sync_bn`` converts them to ``SyncBatchNorm`` (which
    refuses CPU tensors: CUDA, HPU, XPU or a PrivateUse1 device only).
    """

    steps: int = 20
    global_batch: int = 256
    accum_steps: int = 2
    sizes: tuple[int, ...] = (64, 128, 10)
    lr: float = 0.05
    momentum: float = 0.9
    amp_dtype: str = "float16"
    init_scale: float = 2.0**16
    growth_interval: int = 2000
    use_no_sync: bool = True
    fp16_compress: bool = False
    poison: tuple[tuple[int, int], ...] = ()
    batch_norm: bool = False
    sync_bn: bool = False
    seed: int = 0

    @property
    def dtype(self) -> torch.dtype:
        """``amp_dtype`` as a torch dtype."""
        dtype = getattr(torch, self.amp_dtype, None)
        if dtype not in (torch.float16, torch.bfloat16, torch.float32):
            raise ValueError(f"amp_dtype must be float16, bfloat16 or float32: {self.amp_dtype}")
        return dtype


class CommCounter:
    """State of :func:`counting_hook`: all-reduce calls, bytes sent, infs seen (lesson 06)."""

    def __init__(self, fp16_compress: bool = False) -> None:
        self.fp16_compress = fp16_compress
        self.reset()

    def reset(self) -> None:
        """Start counting a new optimizer step."""
        self.calls = 0
        self.bytes = 0
        self.local_nonfinite = False
        self.reduced_nonfinite = False


def counting_hook(state: CommCounter, bucket):  # DDP rejects string annotations on hooks
    """A DDP comm hook that all-reduces like DDP does, and records what it sent (lesson 06).

    Before the all-reduce it notes whether *this rank's* gradients hold inf/nan; afterwards,
    whether the averaged gradients do. With ``fp16_compress`` it uses ``fp16_compress_hook``,
    which casts the bucket to float16 and then divides by the world size.
    """
    buffer = bucket.buffer()
    state.calls += 1
    state.local_nonfinite |= not bool(torch.isfinite(buffer).all())
    if state.fp16_compress:
        state.bytes += buffer.numel() * 2
        future = default_hooks.fp16_compress_hook(None, bucket)
    else:
        state.bytes += buffer.numel() * buffer.element_size()
        future = default_hooks.allreduce_hook(None, bucket)

    def record(done: torch.futures.Future) -> torch.Tensor:
        reduced = done.value()
        state.reduced_nonfinite |= not bool(torch.isfinite(reduced).all())
        return reduced

    return future.then(record)


def digits_train(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The digits training split ``(x, y)`` the runs sample from (lesson 06)."""
    from course.data import digits

    x, y, _, _ = digits(device)
    return x, y


def step_batch(
    spec: TrainSpec, step: int, data: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of optimizer step ``step``: the same on every rank (lesson 06)."""
    x, y = data
    gen = torch.Generator().manual_seed(spec.seed * 7919 + step)
    index = torch.randperm(len(x), generator=gen)[: spec.global_batch].to(x.device)
    return x[index], y[index]


def make_model(spec: TrainSpec) -> nn.Module:
    """The MLP of ``spec``, with the same initial weights on every rank (lesson 06)."""
    from course.data import mlp

    torch.manual_seed(spec.seed)
    return mlp(spec.sizes, norm=spec.batch_norm)


def param_digest(model: nn.Module) -> str:
    """A short hash of the parameters' bytes: equal digests mean bit-identical weights."""
    digest = hashlib.sha256()
    for p in model.parameters():
        digest.update(p.detach().float().cpu().numpy().tobytes())
    return digest.hexdigest()[:16]


def train_worker(
    rank: int,
    world_size: int,
    spec: TrainSpec,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> dict:
    """Train ``spec`` as rank ``rank`` of ``world_size`` in an initialised process group.

    Returns per-step lists (this rank's loss, the scale after the step, whether the step was
    skipped, all-reduce calls and bytes, whether this rank's local gradients / the reduced
    gradients held inf or nan), the final parameters (flat, float32) and their digest, and the
    BatchNorm running statistics when there are any. Introduced in lesson 06.
    """
    if spec.global_batch % (world_size * spec.accum_steps):
        raise ValueError(
            f"global batch {spec.global_batch} does not split into {world_size} ranks x "
            f"{spec.accum_steps} micro-batches"
        )
    device = rank_device()
    dtype = spec.dtype
    data = digits_train() if data is None else data
    data = (data[0].to(device), data[1].to(device))
    model = make_model(spec)
    if spec.sync_bn:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    counter = CommCounter(spec.fp16_compress)
    ddp.register_comm_hook(counter, counting_hook)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=spec.lr, momentum=spec.momentum)
    scaler = torch.amp.GradScaler(
        device.type,
        init_scale=spec.init_scale,
        growth_interval=spec.growth_interval,
        enabled=dtype == torch.float16,
    )
    out: dict[str, list] = {k: [] for k in ("losses", "scales", "skipped", "calls", "bytes")}
    out.update(local_nonfinite=[], reduced_nonfinite=[])
    for step in range(spec.steps):
        x, y = step_batch(spec, step, data)
        x, y = x.chunk(world_size)[rank], y.chunk(world_size)[rank]
        if (step, rank) in spec.poison:
            x = x.clone()
            x[0] = float("inf")
        counter.reset()
        loss_sum = 0.0
        micro = list(zip(x.chunk(spec.accum_steps), y.chunk(spec.accum_steps), strict=True))
        for i, (xm, ym) in enumerate(micro):
            last = i == len(micro) - 1
            sync = contextlib.nullcontext() if last or not spec.use_no_sync else ddp.no_sync()
            with sync:
                with torch.amp.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                    loss = nn.functional.cross_entropy(ddp(xm), ym) / spec.accum_steps
                scaler.scale(loss).backward()
            loss_sum += loss.item()
        before = scaler.get_scale() if scaler.is_enabled() else 1.0
        scaler.step(optimizer)
        scaler.update()
        after = scaler.get_scale() if scaler.is_enabled() else 1.0
        optimizer.zero_grad(set_to_none=True)
        out["losses"].append(loss_sum)
        out["scales"].append(after)
        out["skipped"].append(after < before)
        out["calls"].append(counter.calls)
        out["bytes"].append(counter.bytes)
        out["local_nonfinite"].append(counter.local_nonfinite)
        out["reduced_nonfinite"].append(counter.reduced_nonfinite)
    out["params"] = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    out["digest"] = param_digest(model)
    out["bn_running_mean"] = [
        m.running_mean.detach().clone()
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    out.update(rank=rank, world_size=world_size, device=str(device), pid=os.getpid())
    return out


def train_single(
    spec: TrainSpec,
    data: tuple[torch.Tensor, torch.Tensor] | None = None,
    device: torch.device | str = "cpu",
) -> dict:
    """The same run in one process on each whole global batch, no DDP: the comparison point.

    Returns the per-step losses and scales, the final flat parameters and the BatchNorm
    running means (lesson 06).
    """
    device = torch.device(device)
    dtype = spec.dtype
    data = digits_train() if data is None else data
    data = (data[0].to(device), data[1].to(device))
    model = make_model(spec).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum)
    scaler = torch.amp.GradScaler(
        device.type,
        init_scale=spec.init_scale,
        growth_interval=spec.growth_interval,
        enabled=dtype == torch.float16,
    )
    losses, scales = [], []
    for step in range(spec.steps):
        x, y = step_batch(spec, step, data)
        with torch.amp.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        scales.append(scaler.get_scale() if scaler.is_enabled() else 1.0)
    params = torch.cat([p.detach().float().flatten() for p in model.parameters()])
    running = [
        m.running_mean.detach().cpu().clone()
        for m in model.modules()
        if isinstance(m, nn.modules.batchnorm._BatchNorm)
    ]
    return {"losses": losses, "scales": scales, "params": params.cpu(), "bn_running_mean": running}


def fp16_sum_worker(rank: int, world_size: int, value: float) -> dict:
    """All-reduce ``value`` (the same on every rank) in float16 two ways (lesson 06).

    ``naive``: cast, sum, then divide; ``divide_first``: divide by the world size, cast, sum.
    """
    device = rank_device()
    naive = torch.tensor([value], device=device).half()
    dist.all_reduce(naive)
    naive = naive.float() / world_size
    first = (torch.tensor([value], device=device) / world_size).half()
    dist.all_reduce(first)
    return {"naive": naive.item(), "divide_first": first.float().item()}


def sync_bn_cpu_probe(rank: int, world_size: int) -> dict:
    """What ``SyncBatchNorm`` does with CPU tensors in a process group (lesson 06).

    Returns the error its training-mode forward raises on a CPU input (``forward``), and the
    one ``DistributedDataParallel`` raises when asked to wrap a CPU model holding one (``ddp``);
    ``None`` where nothing was raised.
    """
    layer = nn.SyncBatchNorm(4)
    found: dict[str, str | None] = {}
    for what, call in (
        ("forward", lambda: layer(torch.randn(8, 4))),
        ("ddp", lambda: DDP(nn.Sequential(nn.Linear(4, 4), nn.SyncBatchNorm(4)))),
    ):
        try:
            call()
            found[what] = None
        except (ValueError, RuntimeError) as exc:
            found[what] = f"{type(exc).__name__}: {exc}"
    return found


def hello_worker(rank: int, world_size: int) -> dict:
    """Each rank says who it is and all-reduces its rank number (lesson 06)."""
    device = rank_device()
    total = torch.tensor([float(rank)], device=device)
    dist.all_reduce(total)
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": dist.get_backend(),
        "device": str(device),
        "pid": os.getpid(),
        "sum_of_ranks": total.item(),
    }


def report(results: list[dict]) -> str:
    """A per-step table of a run's per-rank losses and scales, and whether weights agree."""
    ranks = len(results)
    head = "step " + " ".join(f"loss r{r:<3}" for r in range(ranks)) + "   scale    skipped calls"
    lines = [head]
    for step in range(len(results[0]["losses"])):
        losses = " ".join(f"{res['losses'][step]:9.4f}" for res in results)
        r0 = results[0]
        lines.append(
            f"{step:4d} {losses} {r0['scales'][step]:9.0f} {r0['skipped'][step]!s:>8} "
            f"{r0['calls'][step]:5d}"
        )
    digests = {res["digest"] for res in results}
    same = "bit-identical on every rank" if len(digests) == 1 else "DIFFERENT across ranks"
    lines.append(f"final parameters: {same} (digest {results[0]['digest']})")
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m course.ddp_train",
        description="Data-parallel mixed precision training of the digits MLP (lesson 06).",
    )
    p.add_argument("--world-size", type=int, default=2, help="ranks to start (not under torchrun)")
    p.add_argument("--backend", choices=["auto", "gloo", "nccl"], default="auto")
    p.add_argument("--steps", type=int, default=TrainSpec.steps)
    p.add_argument("--global-batch", type=int, default=TrainSpec.global_batch)
    p.add_argument("--accum-steps", type=int, default=TrainSpec.accum_steps)
    p.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], default="float16")
    p.add_argument("--init-scale", type=float, default=TrainSpec.init_scale)
    p.add_argument("--growth-interval", type=int, default=TrainSpec.growth_interval)
    p.add_argument("--lr", type=float, default=TrainSpec.lr)
    p.add_argument(
        "--sync-every-micro-batch",
        action="store_true",
        help="all-reduce after every micro-batch instead of using no_sync()",
    )
    p.add_argument("--fp16-compress", action="store_true", help="use DDP's fp16_compress_hook")
    p.add_argument("--sync-bn", action="store_true", help="add BatchNorm, as SyncBatchNorm")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT)
    return p


def spec_from_args(args: argparse.Namespace) -> TrainSpec:
    """The :class:`TrainSpec` a command line asks for."""
    return replace(
        TrainSpec(),
        steps=args.steps,
        global_batch=args.global_batch,
        accum_steps=args.accum_steps,
        amp_dtype=args.dtype,
        init_scale=args.init_scale,
        growth_interval=args.growth_interval,
        lr=args.lr,
        use_no_sync=not args.sync_every_micro_batch,
        fp16_compress=args.fp16_compress,
        batch_norm=args.sync_bn,
        sync_bn=args.sync_bn,
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m course.ddp_train`` and ``torchrun -m course.ddp_train``."""
    args = _parser().parse_args(argv)
    spec = spec_from_args(args)
    if under_torchrun():
        init_torchrun(args.backend)  # nccl with a GPU per local rank, else gloo on the CPU
        try:
            result = train_worker(dist.get_rank(), dist.get_world_size(), spec)
            result.pop("params")
            gathered: list = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, result)
            if dist.get_rank() == 0:
                print(f"torchrun: {dist.get_world_size()} ranks, backend {dist.get_backend()}")
                print(f"spec: {asdict(spec)}")
                print(report(gathered))
        finally:
            dist.destroy_process_group()
        return 0
    backend = pick_backend(args.world_size, None if args.backend == "auto" else args.backend)
    results = launch(
        train_worker, args.world_size, (spec,), backend=backend.name, timeout=args.timeout
    )
    print(f"{args.world_size} ranks started by course.launch.launch, backend {backend.name}")
    print(f"spec: {asdict(spec)}")
    print(report(results))
    return 0


if __name__ == "__main__":
    # Run the importable copy of this module, so spawned ranks import train_worker by name.
    from course.ddp_train import main as _main

    exit_script(_main())
