"""The lesson's GPT training as a script: DDP, mixed precision, accumulation, resume (lesson 09).

Run it with ``torchrun``, one process per GPU (``nccl``) or several CPU processes (``gloo``)::

    torchrun --standalone --nproc-per-node 2 -m course.gpt_train --steps 20 --dtype bf16
    torchrun --standalone --nproc-per-node 8 -m course.gpt_train --size gpu --steps 2000 \\
        --checkpoint run.pt --save-every 100            # and again with --resume after a crash
    torchrun --nnodes 2 --node-rank R --nproc-per-node 8 --rdzv-backend c10d \\
        --rdzv-endpoint HOST:29500 --rdzv-id JOB -m course.gpt_train --size gpu ...

(``python -m course.gpt_train`` alone trains in one process.) Each optimizer step accumulates
``--accum`` micro-batches of ``--batch-size`` sequences per rank, all-reducing the gradients only
after the last (``no_sync()`` before). ``--dtype fp16`` uses a ``GradScaler``, ``bf16`` none.

A checkpoint holds everything a run needs to continue exactly where it stopped: the model, the
optimizer and the scaler, every rank's RNG state, the step and the data position (how many
micro-batches each rank has consumed). Each micro-batch is drawn from a generator seeded by
(seed, rank, position), so a resumed run reads exactly the batches the uninterrupted run would
have read, and ends bit-identical to it.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from course.gpt import CONFIGS, GPT, GPTConfig, lm_loss, stdlib_corpus, val_batch
from course.launch import exit_script, init_torchrun, under_torchrun

DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class RunSpec:
    """One training run of :func:`train` (lesson 09). ``batch_size`` is per rank and
    micro-batch; a checkpoint is saved every ``save_every`` steps and after each step in
    ``save_at``; ``stop_after`` ends the run early after that step (an interruption, for
    testing resume); ``corpus_bytes`` is how much of the standard library it reads."""

    config: GPTConfig = CONFIGS["cpu"]
    steps: int = 20
    batch_size: int = 8
    accum: int = 2
    dtype: str = "bf16"
    lr: float = 1e-3
    seed: int = 0
    checkpoint: str = ""
    save_every: int = 0
    save_at: tuple[int, ...] = ()
    resume: bool = False
    stop_after: int = 0
    corpus_bytes: int = 1_000_000


def micro_batch(
    tokens: torch.Tensor, spec: RunSpec, rank: int, position: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s micro-batch number ``position``: random windows of ``tokens`` from a
    generator seeded by (seed, rank, position), so any position can be read again (lesson 09)."""
    block = spec.config.block_size
    gen = torch.Generator().manual_seed((spec.seed * 1_000_003 + position) * 1_009 + rank)
    starts = torch.randint(0, len(tokens) - block, (spec.batch_size,), generator=gen)
    windows = tokens[starts[:, None] + torch.arange(block + 1)].long()
    return windows[:, :-1].to(device), windows[:, 1:].to(device)


def _rng_state(device: torch.device) -> dict:
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def digest(model: torch.nn.Module) -> str:
    """SHA-256 of every parameter's bytes, in order: equal digests mean bit-identical weights."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def train(spec: RunSpec, device: torch.device) -> dict:
    """Train as this rank of the default process group (or alone, if there is none) (lesson 09).

    Returns the per-step training losses (mean over ranks) of the steps this call ran, the step
    it started from, the validation loss at the end, the weights' :func:`digest` and timing.
    """
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    amp_dtype = DTYPES[spec.dtype]
    train_tokens, val_tokens = stdlib_corpus(max_bytes=spec.corpus_bytes, seed=spec.seed)
    torch.manual_seed(spec.seed)  # the same initial weights on every rank
    model = GPT(spec.config).to(device)
    net: torch.nn.Module = model
    if distributed:
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.lr)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    start, position = 0, 0
    ckpt = Path(spec.checkpoint) if spec.checkpoint else None
    if spec.resume and ckpt is not None and ckpt.exists():
        start, position = resume_checkpoint(ckpt, model, optimizer, scaler, rank, device)
    losses: list[float] = []
    begin = time.perf_counter()
    for step in range(start, spec.steps):
        total = torch.zeros((), device=device)
        for micro in range(spec.accum):
            x, y = micro_batch(train_tokens, spec, rank, position, device)
            position += 1
            last = micro == spec.accum - 1
            sync = contextlib.nullcontext() if last or not distributed else net.no_sync()
            with sync:
                with torch.autocast(
                    device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None
                ):
                    loss = lm_loss(net(x), y) / spec.accum
                scaler.scale(loss).backward()
            total += loss.detach().float()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if distributed:
            dist.all_reduce(total)
        losses.append(total.item() / world)
        done = step + 1
        periodic = spec.save_every and done % spec.save_every == 0
        if ckpt is not None and (periodic or done in spec.save_at):
            save_checkpoint(ckpt, model, optimizer, scaler, done, position, device, distributed)
        if spec.stop_after and done >= spec.stop_after:
            break
    seconds = time.perf_counter() - begin
    model.eval()
    with (
        torch.no_grad(),
        torch.autocast(
            device.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None
        ),
    ):
        xv, yv = val_batch(val_tokens, spec.config.block_size, device=device)
        val_loss = lm_loss(model(xv), yv).item()
    tokens = len(losses) * spec.accum * spec.batch_size * spec.config.block_size * world
    return {
        "rank": rank,
        "world_size": world,
        "start_step": start,
        "losses": losses,
        "val_loss": val_loss,
        "digest": digest(model),
        "seconds": seconds,
        "tokens_per_s": tokens / seconds if seconds > 0 else 0.0,
        "scale": scaler.get_scale() if scaler.is_enabled() else None,
    }


def resume_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    rank: int,
    device: torch.device,
) -> tuple[int, int]:
    """Restore what :func:`save_checkpoint` wrote; returns (step, data position) (lesson 09).

    The file is loaded onto the CPU, never onto ``device``: every generator state, CUDA's
    included, must be a CPU ByteTensor (``torch.set_rng_state`` and ``torch.cuda.set_rng_state``
    refuse one on a GPU). ``load_state_dict`` then copies weights and optimizer state to the
    device the model lives on.
    """
    state = torch.load(path, map_location="cpu", weights_only=False)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    _set_rng_state(state["rng"][rank], device)
    return state["step"], state["data_position"]


def save_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scaler: torch.amp.GradScaler,
    step: int,
    position: int,
    device: torch.device,
    distributed: bool,
) -> None:
    """Write the run's state to ``path`` from rank 0, every rank's RNG state included; written
    to a temporary file and renamed, so a crash mid-write never leaves a torn checkpoint."""
    rngs = [_rng_state(device)]
    if distributed:
        rngs = [None] * dist.get_world_size()
        dist.all_gather_object(rngs, _rng_state(device))
    if not distributed or dist.get_rank() == 0:
        state = {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": rngs,
            "step": step,
            "data_position": position,
        }
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)
    if distributed:
        dist.barrier()


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
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate (1e-3)")
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
    return RunSpec(
        config=replace(config, **overrides),
        steps=args.steps,
        batch_size=args.batch_size,
        accum=args.accum,
        dtype=args.dtype,
        lr=args.lr,
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
        result = train(spec, device)
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
