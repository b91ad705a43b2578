"""Lesson 07's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's inputs with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them. The references
run here, in the grader's process: ``fsdp_amp_worker``'s FSDP2 run and ``shard_memory``'s
measurement start their own ranks with :func:`course.launch.launch`; nothing of them ever
reaches the student's ranks.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import replace
from typing import Any

import torch

from course.checks import (
    CheckFailed,
    check,
    check_close,
    check_dtype,
    check_float,
    check_shape,
    check_tensor_equal,
)
from course.launch import launch, rank_device
from course.sharded import (
    FSDPConfig,
    RunSpec,
    local,
    rank_mesh,
    record_backward_peaks,
    record_step_gradients,
    sharded_worker,
)
from grader.lessons.l07_sharded.inputs import (
    fsdp_configs,
    memory_candidates,
    sr_inputs,
    state_digest,
)
from grader.observations import Foreign, Observations


def _type_name(value: Any) -> str:
    """The type's name as the student's kernel saw it (a foreign value keeps its own)."""
    if isinstance(value, Foreign):
        return value.type
    return getattr(value, "observed_type", "") or type(value).__name__


# --------------------------------------------------------------------------------------------
# fsdp_amp_worker


def _reference_worker(rank: int, world_size: int, configs: list[FSDPConfig]) -> list[dict]:
    """On each of the grader's own ranks: the course's FSDP2 run of every config in turn, with
    the gradient each of its optimizer steps used."""
    runs = []
    for cfg in configs:
        with record_step_gradients() as stepped:
            run = sharded_worker(rank, world_size, RunSpec(cfg))
        runs.append({**run, "stepped": list(stepped)})
    return runs


#: How far the norm of the gradient an optimizer step used may be from the reference's
#: (relative). Both runs compute the same thing on the same split, so the norms agree far more
#: closely; a loss scaled by the world size (2 here) or summed over a chunk is off by 2x or more.
STEP_GRAD_RTOL = 1e-2


def _step_gradient_norms(ranks: list[dict], what: str, steps: int) -> list[float]:
    """The norm of the whole gradient at each optimizer step: the ranks' local squares added."""
    for rank, run in enumerate(ranks):
        stepped = run["stepped"]
        check(
            isinstance(stepped, list) and all(type(v) is float for v in stepped),
            "the hidden test's record of the optimizer steps is malformed",
        )
        check(
            len(stepped) == steps,
            f"{what}: rank {rank}'s optimizer stepped {len(stepped)} times in {steps} steps",
        )
    return [math.sqrt(sum(run["stepped"][s] for run in ranks)) for s in range(steps)]


def _check_fsdp_run(ranks: list[dict], cfg: FSDPConfig, what: str) -> None:
    """The visible tests' checks of one config's run on both ranks (same messages)."""
    model = cfg.make_model()
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    units = len(model.blocks) + 1
    for rank, run in enumerate(ranks):
        check(
            not run["refused"],
            f"{what}: rank {rank} called course.sharded."
            f"{', '.join(sorted(set(run['refused'])))}, "
            "the course's own FSDP2 run: write the worker with fully_shard yourself",
        )
        result = run["result"]
        check(
            type(result) is dict and sorted(result) == ["losses", "state_dict"],
            f"{what}: rank {rank} should return a dict with keys 'state_dict' and 'losses', got "
            f"{sorted(result) if isinstance(result, dict) else _type_name(result)}",
        )
        state = result["state_dict"]
        check(
            type(state) is dict and sorted(state) == sorted(shapes),
            f"{what}: the state_dict should have the model's keys {sorted(shapes)}, got "
            f"{sorted(state) if isinstance(state, dict) else _type_name(state)}",
        )
        for key, shape in shapes.items():
            check(
                type(state[key]) is torch.Tensor,
                f"{what}: rank {rank}'s {key} should be a plain torch.Tensor, got "
                f"{_type_name(state[key])} (gather a DTensor with .full_tensor())",
            )
            check(
                tuple(state[key].shape) == shape,
                f"{what}: rank {rank}'s {key} has shape {tuple(state[key].shape)}, the full "
                f"parameter has {shape}: is it this rank's shard (DTensor.to_local()) instead "
                "of the full tensor (.full_tensor())?",
            )
            check_dtype(state[key], torch.float32, f"{what}: rank {rank}'s {key}")
        losses = result["losses"]
        check(
            isinstance(losses, (list, tuple)) and len(losses) == cfg.steps,
            f"{what}: 'losses' should hold one loss per step ({cfg.steps}), got {losses!r}",
        )
        for value in losses:
            check_float(value, f"{what}: a loss")
        reductions = [dtype for name, dtype, _ in run["sent"] if name == "reduce_scatter_single"]
        check(
            len(reductions) == cfg.steps * units,
            f"{what}: rank {rank}'s model reduce-scattered gradients {len(reductions)} times in "
            f"{cfg.steps} steps; sharded per block ({units - 1}) and at the root there is one "
            f"reduce-scatter per unit per step ({cfg.steps * units}). Did you fully_shard "
            "every block and then the root model?",
        )
        wrong = sorted({str(d) for d in reductions if d != cfg.reduce_dtype})
        check(
            not wrong,
            f"{what}: rank {rank}'s gradients were reduce-scattered in {wrong}, the config asks "
            f"reduce_dtype={cfg.reduce_dtype} (MixedPrecisionPolicy's reduce_dtype defaults to "
            "the param_dtype)",
        )
        gathered = {str(d) for name, d, _ in run["sent"] if name == "all_gather_single"}
        want = cfg.param_dtype or torch.float32
        check(
            gathered == {str(want)},
            f"{what}: rank {rank}'s model all-gathered its parameters in {sorted(gathered)}, the "
            f"config asks param_dtype={cfg.param_dtype}: with MixedPrecisionPolicy's param_dtype "
            "each rank casts its shard before the all-gather (torch.autocast instead casts "
            "after a float32 all-gather, twice the bytes)",
        )
    for key in shapes:
        check(
            torch.equal(
                ranks[0]["result"]["state_dict"][key], ranks[1]["result"]["state_dict"][key]
            ),
            f"{what}: {key} differs between rank 0 and rank 1; with every unit sharded, each "
            "gathered parameter is the same on every rank",
        )


def fsdp_amp_worker(obs: Observations) -> None:
    """Three random configs on 2 ranks (float32 and bfloat16 reductions); every run's shape,
    reductions and agreement between ranks, then losses and weights against the course's FSDP2
    run of the same config on 2 ranks of the grader's own."""
    seed = obs.seed
    configs = fsdp_configs(seed)
    runs = [[obs.next("run") for _ in range(2)] for _ in configs]
    for run in (r for ranks in runs for r in ranks):
        check(
            type(run) is dict and sorted(run) == ["refused", "result", "sent", "stepped"],
            "the hidden test's record of a rank is malformed",
        )
    references: list[list[dict]] | None = None
    for i, (cfg, ranks) in enumerate(zip(configs, runs, strict=True)):
        what = f"hidden run {i} ({cfg}, seed {seed})"
        _check_fsdp_run(ranks, cfg, what)
        if references is None:  # only once every run has the right form
            references = launch(_reference_worker, 2, (configs,), timeout=150, show_output=False)
        got = _step_gradient_norms(ranks, what, cfg.steps)
        want = _step_gradient_norms([references[r][i] for r in range(2)], what, cfg.steps)
        for step, (g, w) in enumerate(zip(got, want, strict=True)):
            check(
                abs(g - w) <= STEP_GRAD_RTOL * w,
                f"{what}: optimizer step {step} used a gradient of norm {g:.6g}, the reference "
                f"{w:.6g} ({g / w:.3g}x): FSDP2's reduce-scatter already averages the ranks' "
                "gradients; back-propagate each rank's mean loss, neither multiplied nor divided "
                "by the world size",
            )
        for rank, run in enumerate(ranks):
            ref = references[rank][i]
            check_close(
                torch.tensor(run["result"]["losses"], dtype=torch.float64),
                torch.tensor(ref["losses"], dtype=torch.float64),
                f"{what}: rank {rank}'s losses against the reference",
                rtol=1e-5,
                atol=1e-6,
            )
            for key, want in ref["state_dict"].items():
                check_close(
                    run["result"]["state_dict"][key],
                    want,
                    f"{what}: {key} against the reference (same split, same reductions)",
                    rtol=1e-5,
                    atol=1e-6,
                )


# --------------------------------------------------------------------------------------------
# shard_memory


def _nbytes(t: torch.Tensor) -> int:
    t = local(t)
    return t.numel() * t.element_size()


def memory_worker(rank: int, world_size: int, config: FSDPConfig, optimizer: str) -> dict:
    """On each of the grader's ranks: shard ``config``'s model as section 1 does, train one
    step, and count this rank's bytes from the tensors themselves (each DTensor's local shard,
    which leaves out FSDP2's padding), as the lesson's own count does: the sharded parameters,
    their gradients, the optimizer state, the largest unit's gathered copy (its parameters
    while it runs its forward) and backward peak (:func:`course.sharded.record_backward_peaks`).
    """
    from torch import nn
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    device = rank_device()
    model = config.make_model().to(device)
    units = {"root": [n for n, _ in model.named_parameters() if not n.startswith("blocks.")]}
    for i, block in enumerate(model.blocks):
        units[f"blocks.{i}"] = [f"blocks.{i}.{n}" for n, _ in block.named_parameters()]
    policy = MixedPrecisionPolicy(param_dtype=config.param_dtype, reduce_dtype=config.reduce_dtype)
    mesh = rank_mesh()
    for block in model.blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    gathered: dict[str, int] = {}
    modules = {"root": model, **{f"blocks.{i}": b for i, b in enumerate(model.blocks)}}
    for unit, module in modules.items():
        module.register_forward_pre_hook(
            lambda m, args, unit=unit: gathered.update(
                {unit: sum(_nbytes(model.get_parameter(n)) for n in units[unit])}
            )
        )
    for module in model.modules():  # units stored in different dtypes compute in their own
        if isinstance(module, nn.Linear):
            module.register_forward_pre_hook(
                lambda m, args: tuple(a.to(m.weight.dtype) for a in args)
            )
    if optimizer == "adamw":
        opt = config.make_optimizer(model.parameters())
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=0.9)
    else:
        raise ValueError(f"optimizer must be 'adamw' or 'sgd', got {optimizer!r}")
    x, y = config.batch(0)
    x, y = x.chunk(world_size)[rank].to(device), y.chunk(world_size)[rank].to(device)
    with record_backward_peaks() as peaks:
        config.loss_fn(model(x), y).backward()
    params = list(model.parameters())
    counts = {"params": sum(map(_nbytes, params)), "grads": sum(_nbytes(p.grad) for p in params)}
    opt.step()
    counts["optimizer"] = sum(
        _nbytes(v) for state in opt.state.values() for v in state.values() if torch.is_tensor(v)
    )
    counts["gathered"] = max(gathered.values())
    counts["backward_peak"] = max(peaks)
    return {**counts, "units": gathered, "peaks": peaks}


def measure_memory(config: FSDPConfig, world_size: int, optimizer: str = "adamw") -> list[dict]:
    """Each rank's :func:`memory_worker` result on ``world_size`` gloo ranks of the grader's."""
    return launch(memory_worker, world_size, (config, optimizer), show_output=False)


MEMORY_KEYS = ["backward_peak", "gathered", "grads", "optimizer", "params"]
HINTS = {
    "params": "each parameter's first ceil(rows / world_size) rows, in its own dtype",
    "grads": "the same rows and dtype as the sharded parameters (FSDP2 casts the reduced "
    "gradient back to the parameter's dtype, whatever reduce_dtype is)",
    "optimizer": "AdamW: 2 tensors of the shard's size in the parameter's dtype + a 4-byte step "
    "per parameter; SGD with momentum: 1 tensor of the shard's size",
    "gathered": "the largest of the units' gathered copies (a unit: a block, or the root's "
    "parameters outside the blocks), each its full parameters in policy.param_dtype "
    "(the unit's own dtype when it is None)",
    "backward_peak": "the largest of the units' backward peaks, each unit's own: its unsharded "
    "gradients (full size, in its gathered copy's dtype) plus its reduce-scatter "
    "input (every parameter padded to ceil(rows / world_size) * world_size rows, "
    "in policy.reduce_dtype, the gradients' dtype when it is None); not "
    "necessarily the peak of the unit with the largest gathered copy",
}


def maxima_split(cfg: FSDPConfig, world_size: int, param_dtype: Any, reduce_dtype: Any) -> bool:
    """Whether the unit with the largest gathered copy and the unit with the largest backward
    peak differ, each maximum held by one unit only (the last case's property)."""
    sizes = _unit_bytes(cfg, world_size, param_dtype, reduce_dtype)
    tops = []
    for j in (0, 1):
        best = max(s[j] for s in sizes)
        holders = [i for i, s in enumerate(sizes) if s[j] == best]
        if len({sizes[i] for i in holders}) != 1:  # units of equal size (the blocks) are one
            return False
        tops.append(sizes[holders[0]])
    return tops[0] != tops[1]


def _unit_bytes(cfg: FSDPConfig, world_size: int, param_dtype: Any, reduce_dtype: Any) -> list:
    """(gathered, backward peak) per unit, root first: what a draw must separate."""
    model = cfg.make_model()
    units = [[p for n, p in model.named_parameters() if not n.startswith("blocks.")]]
    units += [list(block.parameters()) for block in model.blocks]
    sizes = []
    for unit in units:
        compute = (param_dtype or unit[0].dtype).itemsize
        padded = sum(
            math.ceil(p.shape[0] / world_size) * world_size * (p.numel() // p.shape[0])
            for p in unit
        )
        full = sum(p.numel() for p in unit)
        reduce = (reduce_dtype or param_dtype or unit[0].dtype).itemsize
        sizes.append((full * compute, full * compute + padded * reduce))
    return sizes


def telling(cfg: FSDPConfig, world_size: int, param_dtype: Any, reduce_dtype: Any) -> bool:
    """A draw that stores its units in both bfloat16 and float32 (so no per-element size is
    right for the whole model, and some unit's dtype differs from reduce_dtype) and whose root
    is larger than every block in gathered bytes and in backward peak (so the root cannot be
    left out, nor split into embed and head)."""
    sizes = _unit_bytes(cfg, world_size, param_dtype, reduce_dtype)
    return len(set(cfg.unit_dtypes)) == 2 and all(
        sizes[0][j] > max(s[j] for s in sizes[1:]) for j in (0, 1)
    )


def shard_memory(obs: Observations) -> None:
    """Four random models stored in both dtypes, with random policies (one without policy
    dtypes) and optimizers, on 2 and 3 ranks, and a fifth whose largest gathered copy and
    largest backward peak belong to different units; each case's counts against what real ranks
    of the grader's own hold."""
    seed = obs.seed
    for trial, drawn in enumerate(memory_candidates(seed)):
        seen = [(obs.next("refused"), obs.next("counts"), obs.next("model after")) for _ in drawn]
        if len(drawn) > 1:
            chosen = next((i for i, d in enumerate(drawn) if telling(*d[:4])), 0)
        else:  # the last case, built to split the maxima
            chosen = 0
            check(maxima_split(*drawn[0][:4]), f"internal: hidden case {trial} (seed {seed})")
        cfg, ws, pd, rd, opt = drawn[chosen]
        refused, got, after = seen[chosen]
        cfg = replace(cfg, param_dtype=pd, reduce_dtype=rd)
        what = f"hidden case {trial}: {cfg}, {ws} ranks, {opt} (seed {seed})"
        check(
            not refused,
            f"{what}: shard_memory called course.sharded."
            f"{', '.join(sorted(set(refused)))}, which measures real ranks: count the bytes "
            "yourself",
        )
        check(
            type(got) is dict and sorted(got) == MEMORY_KEYS,
            f"{what}: shard_memory should return a dict with keys {MEMORY_KEYS}, got "
            f"{sorted(got) if isinstance(got, dict) else _type_name(got)}",
        )
        check(after == state_digest(cfg.make_model()), f"{what}: shard_memory changed the model")
        measured = measure_memory(cfg, ws, opt)[0]
        for key in MEMORY_KEYS:
            check(
                type(got[key]) is int,
                f"{what}: {key!r} should be a Python int, got {_type_name(got[key])}",
            )
            check(
                got[key] == measured[key],
                f"{what}: {key!r} is {got[key]:,} bytes, rank 0 of {ws} real ranks holds "
                f"{measured[key]:,} ({HINTS[key]})",
            )


# --------------------------------------------------------------------------------------------
# stochastic_round_bf16


def bf16_bracket(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lo, hi, fraction): the bfloat16 neighbours nearer zero and away from it; where x lies."""
    bits = x.view(torch.int32)
    lo_bits = bits & -65536
    lo = lo_bits.view(torch.float32)
    hi = (lo_bits + 65536).view(torch.float32)
    return lo, hi, (bits & 65535).double() / 65536


def _check_rounding(x: torch.Tensor, got: Any, what: str, n_repeats: int) -> None:
    """The visible tests' value-by-value check, on a whole result (same messages)."""
    check_dtype(got, torch.bfloat16, f"{what}: the result")
    check_shape(got, x.shape, f"{what}: the result")
    got32 = got.float().reshape(-1, n_repeats)
    lo, hi, frac = (t.reshape(-1, n_repeats)[:, :1] for t in bf16_bracket(x))
    up, down = got32 == hi, got32 == lo
    bad = ~(up | down)
    if bool(bad.any()):
        row = int(bad.any(dim=1).nonzero()[0])
        check(
            False,
            f"{what}: rounding {x.reshape(-1, n_repeats)[row, 0].item()!r} gave "
            f"{got32[row][bad[row]][0].item()!r}, which is neither neighbour "
            f"({lo[row, 0].item()!r} or {hi[row, 0].item()!r})",
        )
    _check_shares(x.reshape(-1, n_repeats)[:, 0], up.sum(dim=1), frac[:, 0], what, n_repeats)


def _check_shares(
    values: torch.Tensor, ups: torch.Tensor, frac: torch.Tensor, what: str, n_repeats: int
) -> None:
    # Hoeffding: a fair sample of n_repeats strays from p by more than t with probability below
    # 2 exp(-2 n t^2) = 1e-12, so a correct function never fails this.
    t = math.sqrt(math.log(2e12) / (2 * n_repeats))
    share = ups.double() / n_repeats  # exact: n_repeats is a power of two
    off = (share - frac).abs()
    worst = int(off.argmax())
    lo, hi, _ = bf16_bracket(values[worst : worst + 1].contiguous())
    check(
        bool((off <= t).all()),
        f"{what}: {values[worst].item()!r} lies {frac[worst].item():.4f} of the way from "
        f"{lo[0].item()!r} "
        f"to {hi[0].item()!r}, so that share of its {n_repeats} roundings should go away "
        f"from zero (within {t:.3f}); {share[worst].item():.4f} did: biased rounding",
    )


def _tensor_description(what: str, description: Any, shape: tuple) -> None:
    """check_dtype and check_shape on a result the driver described: (a plain tensor?, its
    type's name, dtype, shape, the first 301 characters of its repr when not a tensor)."""
    plain, kind, dtype, got_shape, text = description
    if plain is not True:
        text = text if len(text) <= 300 else text[:297] + "..."
        raise CheckFailed(f"{what} should be a torch.Tensor, got {kind}: {text}")
    if dtype != torch.bfloat16:
        raise CheckFailed(f"{what} should have dtype {torch.bfloat16}, got {dtype}")
    if tuple(got_shape) != tuple(shape):
        raise CheckFailed(f"{what} should have shape {tuple(shape)}, got {tuple(got_shape)}")


def _check_histogram(
    x: torch.Tensor, rows: list, what: str, n_repeats: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_check_rounding` on the driver's summary of a ``(k * n_repeats,)`` result: per
    value (row), its first distinct bfloat16 bit patterns in order of first appearance, with
    their counts and first positions. At most three patterns can be right (lo, hi, and -0 where
    lo is +0 or the reverse), so the first wrong element of a row is always among the first
    four patterns kept. Returns each row's count of roundings away from zero and its fraction."""
    values = x.reshape(-1, n_repeats)[:, 0].contiguous()
    lo, hi, frac = bf16_bracket(values)
    check(
        type(rows) is list and len(rows) == len(values),
        f"{what}: the hidden test's summary of the result is malformed",
    )
    ups = []
    for r, entry in enumerate(rows):
        patterns, counts, firsts = entry
        got = patterns.view(torch.bfloat16).float()
        up, down = got == hi[r], got == lo[r]
        bad = ~(up | down)
        if bool(bad.any()):
            first = int(firsts[bad].argmin())
            check(
                False,
                f"{what}: rounding {values[r].item()!r} gave {got[bad][first].item()!r}, which "
                f"is neither neighbour ({lo[r].item()!r} or {hi[r].item()!r})",
            )
        check(int(counts.sum()) == n_repeats, f"{what}: the hidden test's summary is malformed")
        ups.append(int(counts[up].sum()))
    ups_t = torch.tensor(ups, dtype=torch.int64)
    _check_shares(values, ups_t, frac, what, n_repeats)
    return ups_t, frac


def stochastic_round_bf16(obs: Observations) -> None:
    """Random values and edges value by value and pooled, independence across elements, calls
    and generators, torch's global generator, exact values, inf and nan, a 2-d input."""
    seed = obs.seed
    inputs = sr_inputs(seed)
    n, k, x, half = inputs["n"], inputs["k"], inputs["x"], inputs["half"]
    what = f"hidden values (seed {seed})"
    described = obs.next("result")
    summary = obs.next("rows")
    after = obs.next("input after")
    check(
        after == hashlib.sha256(x.numpy().tobytes()).hexdigest(),
        f"stochastic_round_bf16 changed its input (seed {seed})",
    )
    # Each value on its own: every rounding must be one of its two bfloat16 neighbours (the
    # values just below a power of two included), and the share rounded away from zero must
    # match its fraction (false rejection below 1e-12 per value; with the column below, 73
    # values: below 1e-10).
    _tensor_description(f"{what}: the result", described, x.shape)
    ups, frac = _check_histogram(x, summary, what, n)
    # The bias pooled over all N = 70 * 8192 = 573,440 roundings: the mean of (went away from
    # zero - fraction) is a mean of N independent terms of range 1, so by Hoeffding a correct
    # function strays from 0 by t with probability below 2 exp(-2 N t^2). With that rate at
    # 2e-7, t = sqrt(ln(1e7) / (2 N)) = 0.00375. To reject a pooled bias of 1/128 (5 random bits
    # instead of 16 bias by up to 1/32 of a gap, 1/64 on average; a shifted probability by its
    # shift) the measured mean of such a function must exceed t, which needs t <= 1/256 (its
    # own sampling error is below t too): N >= ln(1e7) / (2 (1/256)^2) = 528,150. (The mean is
    # computed exactly here from the counts: every term is a multiple of 2^-16.)
    pooled = float((ups.double() - frac * n).sum() / x.numel())
    t = math.sqrt(math.log(1e7) / (2 * x.numel()))
    check(
        abs(pooled) <= t,
        f"hidden values (seed {seed}): over {x.numel():,} roundings of {k} values the share "
        f"rounded away from zero is off the fractions by {pooled:+.4f} on average (a correct "
        f"function stays within {t:.4f}): the rounding is biased. Does every one of the 16 "
        "low bits count (a uniform integer in [0, 2^16)), with probability exactly the fraction?",
    )
    # Independence. A value exactly half way between its neighbours rounds away from zero with
    # probability 1/2, so two independent roundings of it agree with probability 1/2. By
    # Hoeffding the share of m agreeing pairs strays from 1/2 by more than 0.05 with probability
    # below 2 exp(-2 m 0.05^2); for at most 1e-7 per check, m >= ln(2e7) / (2 * 0.05^2) = 3,362,
    # and each check below compares m = 4,096 or 8,192 pairs (2.6e-9 or less). Six such checks
    # and the pooled bias (2e-7) keep a correct function's false rejection below 1e-6 per seed;
    # a function whose roundings repeat (a fixed seed, a fixed pattern) agrees on every pair.
    half_hi = float(bf16_bracket(half[:1])[1])

    def away(got: Any) -> torch.Tensor:
        return (got.float() == half_hi).reshape(-1)

    def agreement(a: torch.Tensor, b: torch.Tensor, what: str) -> None:
        share = float((a == b).double().mean())
        check(
            abs(share - 0.5) <= 0.05,
            f"{what} (seed {seed}): {half[0].item()!r} lies half way between its bfloat16 "
            f"neighbours, so two independent roundings of it agree half the time; {share:.3f} of "
            f"{a.numel()} pairs agreed: the random numbers are not independent",
        )

    a = away(obs.next("half, seed + 2"))
    agreement(a[0::2], a[1::2], "neighbouring elements of one call")
    agreement(a[: n // 2], a[n // 2 :], "elements half the tensor apart in one call")
    b = away(obs.next("half, seed + 3"))
    agreement(a, b, "the same elements in calls with generators of different seeds")
    agreement(
        b,
        away(obs.next("half, seed + 3 again")),
        "two calls with the same generator one after the other (draw from it: its state moves on)",
    )
    # torch's global generator when generator is None: it reproduces from torch.manual_seed,
    # moves on between calls, and follows the seed.
    g1, g2, g3, g4 = (obs.next(label) for label in ("global 1", "global 2", "global 3", "global 4"))
    check(
        type(g1) is torch.Tensor and type(g3) is torch.Tensor and torch.equal(g1, g3),
        f"generator=None (seed {seed}): two calls after the same torch.manual_seed gave different "
        "results: without a generator, draw from torch's global generator",
    )
    agreement(away(g1), away(g2), "generator=None, two calls one after the other")
    agreement(
        away(g1),
        away(g4),
        "generator=None after torch.manual_seed with two seeds (draw from torch's global "
        "generator)",
    )
    # With the global generator, on a 2-d input of exact values and a column of one random value.
    exact = (inputs["bits"] & -65536).view(torch.float32)[:48].reshape(6, 8)
    check_tensor_equal(
        obs.next("exact"),
        exact.to(torch.bfloat16),
        f"hidden exact bfloat16 values (seed {seed})",
        inputs=exact,
    )
    special = torch.tensor([float("inf"), -float("inf"), float("nan")] * 4)
    got = obs.next("special").float()
    check(
        bool(
            torch.equal(got[~got.isnan()], special[~special.isnan()])
            and bool(got[2::3].isnan().all())
        ),
        f"inf, -inf and nan should come back as themselves, got {got[:3].tolist()} (seed {seed})",
    )
    nans = inputs["nans"]
    got = obs.next("nan payloads")
    _tensor_description(
        f"the result for {len(nans)} NaNs",
        (
            type(got) is torch.Tensor,
            _type_name(got),
            getattr(got, "dtype", None),
            tuple(getattr(got, "shape", ())),
            repr(got)[:301],
        ),
        nans.shape,
    )
    kept = got.isnan()
    first = int((~kept).nonzero()[0]) if not bool(kept.all()) else 0
    check(
        bool(kept.all()),
        f"every NaN should come back as a NaN: the NaN "
        f"{int(nans.view(torch.int32)[first]) & 0xFFFFFFFF:#010x} (its payload in the low 16 bits "
        f"only, whose top 16 bits are inf's) gave {got[first].item()!r}; "
        f"{int((~kept).sum())} of {len(nans)} such NaNs did not come back as NaNs (seed {seed})",
    )
    col = inputs["values"][:1].expand(n, 3).contiguous()
    _check_rounding(
        col.t().contiguous(),
        obs.next("column").t().contiguous(),
        f"hidden (8192, 3) input with the global generator (seed {seed})",
        n,
    )


JUDGES = {
    "fsdp_amp_worker_tests": ("fsdp_amp_worker", fsdp_amp_worker),
    "shard_memory_tests": ("shard_memory", shard_memory),
    "stochastic_round_bf16_tests": ("stochastic_round_bf16", stochastic_round_bf16),
}
