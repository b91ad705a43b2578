"""Lesson 07's hidden tests: the configurations and values built from a seed, and the drivers that
feed them to the student's worker, memory count and rounding.

The judges (``judge.py``) build the same inputs with the same functions and run the references
in the grader's process (their own ranks, never the student's). See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

import hashlib
import math
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from course.launch import launch
from course.sharded import FSDPConfig, without_course_runs
from grader.lessons.drive import observer


def _pick(gen: torch.Generator, options: list) -> Any:
    return options[int(torch.randint(0, len(options), (), generator=gen))]


#: The options each hidden config draws from, in the order the driver draws them.
FSDP_OPTIONS = {
    "n_in": [8, 12, 16],
    "width": [16, 24, 32],
    "hidden": [24, 48],
    "depth": [1, 2, 3],
    "n_out": [3, 5, 7],
    "steps": [3, 4],
    "global_batch": [8, 12, 16],
    "lr": [3e-3, 1e-2, 3e-2],
    # Never AdamW's default (0.01) nor 0: an AdamW built by hand without weight_decay, or an
    # optimizer without decay, loses on every draw (decoupled decay scales the weights by
    # 1 - lr * wd per step: 3 steps at the smallest lr with 0.03 instead of 0.01 differ by
    # 1.8e-4 of each weight, far beyond the comparison's rtol of 1e-5).
    "weight_decay": [0.03, 0.1],
}


def fsdp_configs(seed: int) -> list[FSDPConfig]:
    """The driver's three configs: both reduce dtypes in every draw (and a bfloat16 reduction
    of bfloat16 compute), so neither can be hard-coded; weight decays that are not AdamW's
    default."""
    gen = torch.Generator().manual_seed(seed)
    dtypes = [
        (torch.bfloat16, torch.float32),
        (torch.bfloat16, torch.bfloat16),
        (torch.float32, _pick(gen, [torch.float32, torch.bfloat16])),
    ]
    configs = []
    for param_dtype, reduce_dtype in dtypes:
        drawn = {name: _pick(gen, options) for name, options in FSDP_OPTIONS.items()}
        configs.append(
            FSDPConfig(
                **drawn,
                param_dtype=param_dtype,
                reduce_dtype=reduce_dtype,
                seed=int(torch.randint(0, 10**6, (), generator=gen)),
            )
        )
    return configs


#: Candidate draws the driver asks shard_memory about per case. The judge checks the first one
#: that separates the accountings (see :func:`telling`), as the old test's loop drew until one
#: did; about 59% of draws do, so 24 hold one but with odds below 1e-9 (then the first is
#: checked, which a correct function passes as well).
MEMORY_CANDIDATES = 24
#: One case per world size; the last has no policy dtypes (param_dtype and reduce_dtype None:
#: each unit gathers and reduces in its own dtype), a bfloat16 root and a float32 block, so a
#: count that takes float32 for a None is wrong there. A fifth case follows them (see
#: :func:`split_hiddens`).
MEMORY_WORLD_SIZES = (2, 2, 3, 2)


#: The block widths the last case chooses among: those of 1 to this that split the maxima.
SPLIT_HIDDEN_MAX = 256


def split_hiddens(
    n_in: int,
    width: int,
    n_out: int,
    root_dtype: torch.dtype,
    block_dtype: torch.dtype,
    reduce_dtype: torch.dtype,
    world_size: int,
) -> list[int]:
    """The block widths (``hidden``, 1 to :data:`SPLIT_HIDDEN_MAX`) for which, with
    ``param_dtype=None`` and ``reduce_dtype``, one unit has the largest gathered copy and another
    the largest backward peak, both strictly. Then the unit with the most parameters has one of
    them and not the other: reading "the largest unit" as either unit, or as the one with the
    most parameters, gets a count wrong. Lesson 07's hidden ``shard_memory`` test builds one of
    its cases from these widths (an input, nothing of the expected answer)."""

    def sizes(shapes: list[tuple[int, ...]], dtype: torch.dtype) -> tuple[int, int]:
        full = sum(math.prod(s) for s in shapes)
        padded = sum(-(-s[0] // world_size) * world_size * math.prod(s[1:]) for s in shapes)
        return full * dtype.itemsize, full * dtype.itemsize + padded * reduce_dtype.itemsize

    root = sizes([(width, n_in), (width,), (n_out, width), (n_out,)], root_dtype)
    found = []
    for hidden in range(1, SPLIT_HIDDEN_MAX + 1):
        block = sizes([(hidden, width), (hidden,), (width, hidden), (width,)], block_dtype)
        if (root[0] - block[0]) * (root[1] - block[1]) < 0:
            found.append(hidden)
    return found


def memory_candidates(seed: int) -> list[list[tuple[FSDPConfig, int, Any, Any, str]]]:
    """Per case, the driver's candidate draws ``(config, world_size, param_dtype,
    reduce_dtype, optimizer)`` (the config with the default policy dtypes, as drawn): 24 for
    each of :data:`MEMORY_WORLD_SIZES`, then the one of the case that splits the maxima."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for trial, ws in enumerate(MEMORY_WORLD_SIZES):
        drawn = []
        for _ in range(MEMORY_CANDIDATES):
            depth = _pick(gen, [1, 2, 3])
            dtypes = tuple(_pick(gen, [torch.bfloat16, torch.float32]) for _ in range(1 + depth))
            cfg = FSDPConfig(
                n_in=_pick(gen, [40, 64, 96]),
                width=_pick(gen, [9, 16, 24]),
                hidden=_pick(gen, [7, 16, 24]),
                depth=depth,
                n_out=_pick(gen, [3, 5, 7]),
                seed=int(torch.randint(0, 10**6, (), generator=gen)),
                unit_dtypes=dtypes,
            )
            pd = _pick(gen, [torch.bfloat16, torch.float32, None])
            rd = _pick(gen, [torch.bfloat16, torch.float32])
            if trial == 0:
                rd = torch.float32 if (pd or dtypes[0]) == torch.bfloat16 else torch.bfloat16
            if trial == 3:
                cfg = replace(cfg, unit_dtypes=(torch.bfloat16, torch.float32, *dtypes[2:]))
                pd = rd = None
            opt = _pick(gen, ["adamw", "sgd"]) if trial else "adamw"
            drawn.append((cfg, ws, pd, rd, opt))
        cases.append(drawn)
    # The last case, one model: no param_dtype, the root in one dtype and the blocks in the
    # other, a reduce_dtype, and a block width among those that split the two maxima.
    depth = _pick(gen, [1, 2])
    n_in, width, n_out = (_pick(gen, options) for options in SPLIT_SIZES)
    root, block = _pick(gen, [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
    rd = _pick(gen, [torch.bfloat16, torch.float32])
    ws = _pick(gen, [2, 3])
    hidden = _pick(gen, split_hiddens(n_in, width, n_out, root, block, rd, ws))
    cfg = FSDPConfig(
        n_in=n_in,
        width=width,
        hidden=hidden,
        depth=depth,
        n_out=n_out,
        seed=int(torch.randint(0, 10**6, (), generator=gen)),
        unit_dtypes=(root, *[block] * depth),
    )
    cases.append([(cfg, ws, None, rd, _pick(gen, ["adamw", "sgd"]))])
    return cases


#: The last case's sizes (``n_in``, ``width``, ``n_out``), drawn before its block width.
SPLIT_SIZES = ([40, 64, 96], [9, 16, 24], [3, 5, 7])


def state_digest(model: torch.nn.Module) -> str:
    """SHA-256 of a model's state dict: names, dtypes, shapes and bytes (what the driver
    records after shard_memory ran, to see it left the model as it was)."""
    digest = hashlib.sha256()
    for key, value in model.state_dict().items():
        value = value.detach().cpu().contiguous()
        digest.update(f"{key}|{value.dtype}|{tuple(value.shape)}|".encode())
        digest.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def below_power_bits(gen: torch.Generator) -> torch.Tensor:
    """Four values just below a power of two, two of each sign (the driver's draw): the largest
    mantissa (127) of a random binade, past the middle of its gap, so each rounds to nearest up
    to the power of two, whose gap above is twice the value's own. A function that takes the
    gap from that power of two picks a value two steps below the upper neighbour."""
    return (
        (torch.tensor([0, 0, 1, 1], dtype=torch.int32) << 31)
        | (torch.randint(1, 254, (4,), generator=gen, dtype=torch.int32) << 23)
        | (127 << 16)
        | torch.randint(32768, 62260, (4,), generator=gen, dtype=torch.int32)
    )


def sr_inputs(seed: int) -> dict[str, Any]:
    """The driver's inputs, drawn in its order."""
    gen = torch.Generator().manual_seed(seed)
    k, n = 56, 8192
    exp = torch.randint(0, 254, (k,), generator=gen, dtype=torch.int32)
    mant = torch.randint(0, 128, (k,), generator=gen, dtype=torch.int32)
    sign = torch.randint(0, 2, (k,), generator=gen, dtype=torch.int32)
    low = torch.randint(3277, 62260, (k,), generator=gen, dtype=torch.int32)
    bits = (sign << 31) | (exp << 23) | (mant << 16) | low
    below = below_power_bits(gen)
    edge = torch.tensor(
        [0x3F802000, 0x0D802000, 0x7F7E8000, 0x7F7EF000, 0x00004000], dtype=torch.int32
    )
    bits = torch.cat([bits, edge, edge | (1 << 31), below])
    values = bits.view(torch.float32)
    half_bits = (
        (torch.randint(0, 2, (), generator=gen, dtype=torch.int32) << 31)
        | (torch.randint(1, 254, (), generator=gen, dtype=torch.int32) << 23)
        | (torch.randint(0, 128, (), generator=gen, dtype=torch.int32) << 16)
        | 0x8000
    )
    # NaNs of both signs whose payload lies only in the low 16 bits (below 2^12): the bit trick
    # alone turns each into an infinity unless its noise carries, with probability 1/16 or less.
    nan_bits = (
        (torch.randint(0, 2, (16,), generator=gen, dtype=torch.int32) << 31)
        | 0x7F800000
        | torch.randint(1, 1 << 12, (16,), generator=gen, dtype=torch.int32)
    )
    return {
        "n": n,
        "k": len(bits),
        "bits": bits,
        "values": values,
        "x": values.repeat_interleave(n),
        "half": half_bits.view(torch.float32).expand(n).contiguous(),
        "nans": nan_bits.view(torch.float32),
    }


def drive_fsdp_amp_worker(namespace: dict[str, Any], probe: Callable) -> None:
    """``probe`` runs the student's worker on 2 ranks for every config (a worker that destroys
    its process group gets a new one between configs)."""
    obs, seed = observer("fsdp_amp_worker", namespace)
    configs = fsdp_configs(seed)
    with tempfile.TemporaryDirectory() as store:
        runs = launch(probe, 2, (configs, False, Path(store)), timeout=150)
    for i in range(len(configs)):
        for rank in range(2):
            kept = ("result", "sent", "stepped", "refused")
            obs.record("run", {key: runs[rank][i][key] for key in kept})
    obs.done()


def drive_shard_memory(namespace: dict[str, Any], shard_memory: Callable) -> None:
    """For every candidate: what was refused (the course's own runs), the counts, and a digest
    of the model after the call (it must not change)."""
    obs, seed = observer("shard_memory", namespace)
    for drawn in memory_candidates(seed):
        for cfg, ws, pd, rd, opt in drawn:
            model = replace(cfg, param_dtype=pd, reduce_dtype=rd).make_model()
            refused: list[str] = []
            policy = MixedPrecisionPolicy(param_dtype=pd, reduce_dtype=rd)
            with without_course_runs("shard_memory", refused):
                got = shard_memory(model, ws, policy, opt)
            obs.record("refused", list(refused))
            obs.record("counts", got)
            obs.record("model after", state_digest(model))
    obs.done()


def rounding_summary(got: torch.Tensor, k: int, n: int) -> list[tuple[torch.Tensor, ...]]:
    """``k`` values rounded ``n`` times each (a megabyte) as what the judge checks, value by value
    and pooled: per value, the distinct bfloat16 bit patterns of its roundings in the order they
    first appear (the first 8), with how many roundings gave each and where it first appears."""
    rows = []
    for row in got.detach().cpu().view(torch.int16).reshape(k, n):
        patterns, where, counts = torch.unique(row, return_inverse=True, return_counts=True)
        first = torch.full((len(patterns),), n, dtype=torch.long).scatter_reduce(
            0, where, torch.arange(n), "amin"
        )
        order = first.argsort()[:8]
        rows.append((patterns[order], counts[order], first[order]))
    return rows


def drive_stochastic_round_bf16(namespace: dict[str, Any], stochastic_round_bf16: Callable) -> None:
    """The values rounded many times each (a summary travels), independence across calls and
    generators (torch's global one after torch.manual_seed included), exact values, inf and nan,
    NaN payloads in the low bits, a 2-d column."""
    obs, seed = observer("stochastic_round_bf16", namespace)
    inputs = sr_inputs(seed)
    n, k, x, half = inputs["n"], inputs["k"], inputs["x"], inputs["half"]
    got = stochastic_round_bf16(x, torch.Generator().manual_seed(seed + 1))
    plain = type(got) is torch.Tensor
    described = (
        plain,
        type(got).__name__,
        got.dtype if plain else None,
        tuple(got.shape) if plain else None,
        "" if plain else repr(got)[:301],
    )
    obs.record("result", described)
    rows = None
    if plain and got.dtype == torch.bfloat16 and tuple(got.shape) == tuple(x.shape):
        rows = rounding_summary(got, k, n)
    obs.record("rows", rows)
    digest = hashlib.sha256(x.detach().cpu().contiguous().numpy().tobytes()).hexdigest()
    obs.record("input after", digest)
    obs.call("half, seed + 2", stochastic_round_bf16, half, torch.Generator().manual_seed(seed + 2))
    other = torch.Generator().manual_seed(seed + 3)
    obs.call("half, seed + 3", stochastic_round_bf16, half, other)
    obs.call("half, seed + 3 again", stochastic_round_bf16, half, other)
    saved = torch.get_rng_state()
    torch.manual_seed(seed + 4)
    obs.call("global 1", stochastic_round_bf16, half)
    obs.call("global 2", stochastic_round_bf16, half)
    torch.manual_seed(seed + 4)
    obs.call("global 3", stochastic_round_bf16, half)
    torch.manual_seed(seed + 5)
    obs.call("global 4", stochastic_round_bf16, half)
    torch.set_rng_state(saved)
    exact = (inputs["bits"] & -65536).view(torch.float32)[:48].reshape(6, 8)
    obs.call("exact", stochastic_round_bf16, exact)
    special = torch.tensor([float("inf"), -float("inf"), float("nan")] * 4)
    obs.call("special", stochastic_round_bf16, special)
    obs.call("nan payloads", stochastic_round_bf16, inputs["nans"])
    obs.call("column", stochastic_round_bf16, inputs["values"][:1].expand(n, 3).contiguous())
    obs.done()
