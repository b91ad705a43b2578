"""Lesson 06's judges: the references of its hidden tests and the comparisons.

Each exercise runs on CPU ranks (``inputs.py``: the drivers record what each rank returned, rank
0 first). Each judge builds the same inputs with the same functions from the seed the
observations carry, runs the reference here, in the grader's process, and checks what each rank
returned.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch

from course.checks import (
    check,
    check_close,
    check_dtype,
    check_equal,
    check_float,
    check_shape,
    check_tensor_equal,
)
from course.multigpu import AmpDDPConfig
from grader.lessons.l06_multi_gpu.inputs import FOUR, bn_cases, ddp_configs, fp16_cases
from grader.observations import Observations

WORLD_SIZE = 2


def _ranks(obs: Observations) -> list[Any]:
    """What each of the driver's 2 ranks returned, rank 0 first."""
    return [obs.next("rank") for _ in range(WORLD_SIZE)]


# --------------------------------------------------------------------------------------------
# ddp_amp_worker


@contextlib.contextmanager
def _as_in_a_rank() -> Iterator[None]:
    """One torch thread, as the driver's ranks compute (``launch(..., threads=1)``), so the
    reference rounds exactly as they do; the global RNG that ``make_model`` seeds is restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.random.fork_rng(devices=[]):
            yield
    finally:
        torch.set_num_threads(threads)


def _ref_ranks(cfg: AmpDDPConfig, world_size: int) -> tuple[dict[str, torch.Tensor], list]:
    """One process reproducing the ranks' computation, not one process on the whole batch.

    Each rank's share in micro-batches, each loss / accum_steps under autocast and scaled, the
    backward passes accumulated in float32 ``.grad`` on that rank's replica; then DDP's averaged
    all-reduce (each rank's gradient divided by the world size, summed in rank order; with 2
    ranks the sum is the same in either order); then one scaler step on that average, which is
    what every rank's scaler sees. Same operations on the same numbers: a correct worker matches
    this to the last bit, in every dtype.
    """
    model = cfg.make_model()
    opt = cfg.make_optimizer(model.parameters())
    scaler = torch.amp.GradScaler(
        cfg.device_type, init_scale=cfg.init_scale, growth_interval=cfg.growth_interval
    )
    scales = []
    for step in range(cfg.steps):
        x, y = cfg.batch(step)
        grads = []
        for r in range(world_size):
            replica = copy.deepcopy(model)
            for xm, ym in zip(
                x.chunk(world_size)[r].chunk(cfg.accum_steps),
                y.chunk(world_size)[r].chunk(cfg.accum_steps),
                strict=True,
            ):
                with torch.amp.autocast(
                    cfg.device_type, dtype=cfg.amp_dtype, enabled=cfg.amp_enabled
                ):
                    loss = cfg.loss_fn(replica(xm), ym) / cfg.accum_steps
                scaler.scale(loss).backward()
            grads.append([p.grad for p in replica.parameters()])
        for p, per_rank in zip(model.parameters(), zip(*grads, strict=True), strict=True):
            total = per_rank[0] / world_size
            for g in per_rank[1:]:
                total = total + g / world_size
            p.grad = total
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        scales.append(scaler.get_scale())
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, scales


def _check_shares(run: dict, rank: int, world_size: int, cfg: AmpDDPConfig, what: str) -> None:
    """The rows this rank fed its DDP model must be its own share of each global batch, in
    ``config.accum_steps`` micro-batches: rank r of W trains on ``x.chunk(W)[r]`` only."""
    fed = run["inputs"]
    want = [
        m
        for step in range(cfg.steps)
        for m in cfg.batch(step)[0].chunk(world_size)[rank].chunk(cfg.accum_steps)
    ]
    share = cfg.global_batch // world_size
    check(
        len(fed) == len(want),
        f"{what}: rank {rank} called its DDP model {len(fed)} times in {cfg.steps} steps; "
        f"expected {len(want)}, once per micro-batch ({cfg.accum_steps} per step)",
    )
    rows = [int(t.shape[0]) if t.dim() else 0 for t in fed[: cfg.accum_steps]]
    check(
        rows == [int(t.shape[0]) for t in want[: cfg.accum_steps]],
        f"{what}: rank {rank} fed its model micro-batches of {rows} rows in step 0; its share "
        f"of the global batch of {cfg.global_batch} is {share} rows (x.chunk(world_size)[rank])"
        f", split into {cfg.accum_steps} micro-batches of {share // cfg.accum_steps}. Every "
        f"rank training on the whole batch gets the same numbers, {world_size} times the work",
    )
    for i, (got, exp) in enumerate(zip(fed, want, strict=True)):
        check_tensor_equal(
            got,
            exp,
            f"{what}: the rows rank {rank} fed its model in micro-batch "
            f"{i % cfg.accum_steps} of step {i // cfg.accum_steps} (rank r takes "
            "x.chunk(world_size)[r] of config.batch(step), then .chunk(config.accum_steps))",
        )


def _check_ddp_run(ranks: list[dict], cfg: AmpDDPConfig, what: str) -> None:
    """The visible test's checks of one run: the result's form, one all-reduce per step, no
    backward under autocast, each rank's own share, identical replicas and scales."""
    with torch.random.fork_rng(devices=[]):
        keys = sorted(cfg.make_model().state_dict())
    for rank, run in enumerate(ranks):
        result = run["result"]
        check(
            type(result) is dict and sorted(result) == ["scales", "state_dict"],
            f"{what}: rank {rank} should return a dict with keys 'state_dict' and 'scales', got "
            f"{sorted(result) if isinstance(result, dict) else type(result).__name__}",
        )
        state = result["state_dict"]
        check(
            isinstance(state, dict) and sorted(state) == keys,
            f"{what}: the state_dict should have the model's keys {keys}, got "
            f"{sorted(state) if isinstance(state, dict) else type(state).__name__} (return "
            "model.state_dict(), not the DDP wrapper's, whose keys start with 'module.')",
        )
        for key in keys:
            check_dtype(state[key], torch.float32, f"{what}: rank {rank}'s {key} (master weights)")
        check(run["models"] >= 1, f"{what}: rank {rank} did not build a DistributedDataParallel")
        check(
            not any(run["backward_under_autocast"]),
            f"{what}: rank {rank} called backward() with autocast on; autocast covers the "
            "forward pass and the loss: call scaler.scale(loss).backward() after the with block",
        )
        check(
            run["allreduces"] == cfg.steps,
            f"{what}: rank {rank} all-reduced gradients {run['allreduces']} times in "
            f"{cfg.steps} optimizer steps of {cfg.accum_steps} micro-batches; with no_sync() "
            "on all micro-batches but the last there is exactly one all-reduce per step",
        )
        scales = result["scales"]
        check(
            isinstance(scales, (list, tuple)) and len(scales) == cfg.steps,
            f"{what}: 'scales' should hold one scale per optimizer step ({cfg.steps}), got "
            f"{scales!r}",
        )
        for s in scales:
            check_float(s, f"{what}: a scale")
        _check_shares(run, rank, len(ranks), cfg, what)
    for key in keys:
        check(
            torch.equal(
                ranks[0]["result"]["state_dict"][key], ranks[1]["result"]["state_dict"][key]
            ),
            f"{what}: {key} differs between rank 0 and rank 1; DDP keeps the replicas identical",
        )
    check_equal(
        [float(s) for s in ranks[0]["result"]["scales"]],
        [float(s) for s in ranks[1]["result"]["scales"]],
        f"{what}: the scales of rank 0 and rank 1",
    )


def ddp_amp_worker(obs: Observations) -> None:
    """Four runs on 2 ranks (float16 with 2 and 4 micro-batches, bfloat16, float32), random
    sizes, rates, scales and an inf or none, against each rank's share computed here and
    averaged as DDP does."""
    seed = obs.seed
    configs = ddp_configs(seed)
    runs = _ranks(obs)
    check(
        all(isinstance(r, list) and len(r) == len(configs) for r in runs),
        "internal: the driver's runs are missing",
    )
    for i, cfg in enumerate(configs):
        what = (
            f"hidden run {i} ({cfg.amp_dtype}, {cfg.accum_steps} micro-batches, "
            f"poison {cfg.poison}, seed {seed})"
        )
        ranks = [runs[0][i], runs[1][i]]
        _check_ddp_run(ranks, cfg, what)
        with _as_in_a_rank():
            ref_state, ref_scales = _ref_ranks(cfg, WORLD_SIZE)
        check_equal(
            [float(s) for s in ranks[0]["result"]["scales"]],
            ref_scales,
            f"{what}: the scales, against each rank's share computed in one process and "
            "averaged as DDP does",
        )
        for key, want in ref_state.items():
            check_close(
                ranks[0]["result"]["state_dict"][key],
                want,
                f"{what}: {key} against each rank's share computed in one process and "
                "averaged as DDP does (the same arithmetic: only the last bit may differ)",
                rtol=2 * torch.finfo(torch.float32).eps,
                atol=1e-7,
            )


# --------------------------------------------------------------------------------------------
# fp16_allreduce_mean


def _check_fp16_mean(
    ranks: list[dict],
    case: list[torch.Tensor],
    expected: torch.Tensor,
    what: str,
    exact: bool,
    bound: torch.Tensor | None = None,
) -> None:
    """The visible test's checks of one case on every rank (``bound``: instead of one float16
    rounding of ``expected``, the largest error allowed at each element)."""
    for rank, run in enumerate(ranks):
        got = run["got"]
        check_dtype(got, torch.float32, f"{what}: rank {rank}'s result")
        check_shape(got, case[rank].shape, f"{what}: rank {rank}'s result")
        check(run["unchanged"], f"{what}: fp16_allreduce_mean changed its input on rank {rank}")
        check(
            len(run["sent"]) > 0,
            f"{what}: no collective seen on rank {rank}: communicate with dist.all_reduce(...)",
        )
        names = sorted({name for name, _ in run["sent"]})
        check(
            names == ["all_reduce"],
            f"{what}: rank {rank} called {names}; the mean is one dist.all_reduce of the float16 "
            "shares (an all_gather brings world_size tensors to every rank)",
        )
        wide = [(name, str(dt)) for name, dt in run["sent"] if dt != torch.float16]
        check(not wide, f"{what}: rank {rank} sent {wide}; the communication must be in float16")
        big = float(case[rank].abs().max()) if case[rank].numel() else 0.0
        check(
            bool(torch.isfinite(got).all()),
            f"{what}: rank {rank} got {got.tolist()} (inf: "
            + (
                f"this rank holds {big:g}, beyond float16's 65504, so casting it to float16 "
                "gives inf before anything is divided; divide by the world size in float32 "
                "first, then cast"
                if big > 65504
                else "the sum overflowed; divide by the world size (the group's size, not a fixed "
                "number) before the float16 all-reduce"
            )
            + ")",
        )
        if bound is not None:
            error = (got.double() - expected.double()).abs()
            check(
                bool((error <= bound).all()),
                f"{what}: rank {rank}'s mean is {got.tolist()}, the mean is "
                f"{expected.tolist()}; its error is up to {float((error / bound).max()):.3g} "
                "times what float16 rounding allows (each rank's value / world size rounded "
                "to float16, summed in float16)",
            )
        elif exact:
            check_close(
                got, expected, f"{what}: rank {rank}'s mean (exact in float16)", rtol=0, atol=0
            )
        else:
            # The reference does the same arithmetic (each share rounded to float16, the float16
            # sum); allow one float16 rounding of the result (2^-10 relative, 2^-24 absolute).
            check_close(
                got,
                expected,
                f"{what}: rank {rank}'s mean, against each rank's "
                "value / world size rounded to float16 and summed in float16",
                rtol=2.0**-10,
                atol=2.0**-24,
            )
    for rank, run in enumerate(ranks[1:], start=1):
        check(
            torch.equal(ranks[0]["got"], run["got"]),
            f"{what}: rank {rank} got another mean than rank 0",
        )


def _split(obs: Observations, cases: list) -> tuple[list[list], list]:
    """Each rank's ``(probe's runs, result in its own group)``, as ``probe_then_alone`` returned
    them: the runs per case (both ranks) and the results in the one-rank groups."""
    ranks = _ranks(obs)
    check(
        all(
            isinstance(r, tuple)
            and len(r) == 2
            and isinstance(r[0], list)
            and len(r[0]) == len(cases)
            for r in ranks
        ),
        "internal: the driver's runs are missing",
    )
    per_case = [[ranks[0][0][i], ranks[1][0][i]] for i in range(len(cases))]
    return per_case, [r[1] for r in ranks]


def fp16_allreduce_mean(obs: Observations) -> None:
    """Integers (exact), random magnitudes, sums that overflow float16, values beyond float16 on
    a rank, 0-d tensors, and each rank alone in a group of its own; then on four ranks, values
    whose halves summed overflow, and random magnitudes."""
    seed = obs.seed
    cases, kinds, alone, four = fp16_cases(seed)
    per_case, own = _split(obs, cases)
    for case, (kind, exact), ranks in zip(cases, kinds, per_case, strict=True):
        # What the communication computes: each share rounded to float16, summed in float16.
        want = ((case[0] / 2).half() + (case[1] / 2).half()).float()
        _check_fp16_mean(ranks, case, want, f"hidden case {kind} (seed {seed})", exact=exact)
    for rank, got in enumerate(own):
        what = (
            f"hidden case: group=dist.new_group([{rank}]) on rank {rank}, a group of that rank "
            f"alone (seed {seed})"
        )
        check_dtype(got, torch.float32, what)
        check_close(
            got,
            alone[rank].half().float(),
            f"{what}: the mean over that group is the rank's own value, rounded to float16; "
            "use dist.get_world_size(group) and pass group=group to dist.all_reduce",
            rtol=0,
            atol=0,
        )
    of_four = [obs.next("rank of four") for _ in range(FOUR)]
    check(
        all(isinstance(r, list) and len(r) == len(four) for r in of_four),
        "internal: the driver's runs on four ranks are missing",
    )
    for i, (case, kind, exact) in enumerate(four):
        # The ranks may sum the float16 shares in any order: each share rounds once (2^-11
        # relative) and each of the 3 additions once, by at most 2^-11 of the sum of the
        # shares' sizes (a hair more, counting earlier roundings): 5 * 2^-11 of it covers
        # the four roundings, 2^-22 the float16 subnormals.
        shares = torch.stack([t.double() / FOUR for t in case])
        _check_fp16_mean(
            [r[i] for r in of_four],
            case,
            shares.sum(0),
            f"hidden case: {kind} (seed {seed})",
            exact=False,
            # Exact: every share and every sum of shares is a float16 number, in any order.
            bound=torch.zeros_like(shares[0])
            if exact
            else 5 * 2.0**-11 * shares.abs().sum(0) + 2.0**-22,
        )


# --------------------------------------------------------------------------------------------
# sync_bn_stats


def _check_bn(
    ranks: list[dict],
    case: list[torch.Tensor],
    mean: torch.Tensor,
    var: torch.Tensor,
    what: str,
    rtol: float = 1e-5,
    atol: float = 1e-6,
) -> None:
    """The visible test's checks of one case on both ranks."""
    channels = case[0].shape[1]
    for rank, run in enumerate(ranks):
        got = run["got"]
        check(
            isinstance(got, tuple) and len(got) == 2,
            f"{what}: sync_bn_stats should return a tuple (mean, var), got {type(got).__name__}",
        )
        count = sum(t.numel() // channels for t in case)
        for name, value, want in (("mean", got[0], mean), ("var", got[1], var)):
            check_dtype(value, torch.float32, f"{what}: rank {rank}'s {name}")
            check_shape(value, (channels,), f"{what}: rank {rank}'s {name}")
            close = torch.isclose(value.double(), want.double(), rtol=rtol, atol=atol)
            if name == "var" and count > 1 and not bool(close.all()):
                unbiased = want.double() * count / (count - 1)
                check(
                    not bool(torch.allclose(value.double(), unbiased, rtol=rtol, atol=atol)),
                    f"{what}: rank {rank}'s var is the unbiased variance (divided by the count "
                    f"{count} minus 1); BatchNorm normalizes with the biased one: divide by "
                    "the count",
                )
            check_close(value, want, f"{what}: rank {rank}'s {name}", rtol=rtol, atol=atol)
        check(run["unchanged"], f"{what}: sync_bn_stats changed its input on rank {rank}")
    for i in range(2):
        check(
            torch.equal(ranks[0]["got"][i], ranks[1]["got"][i]),
            f"{what}: the ranks returned different statistics",
        )


def sync_bn_stats(obs: Observations) -> None:
    """Five shapes and dtypes with different batch sizes per rank, values near 500 with a
    spread near 1, and each rank alone in a group of its own."""
    seed = obs.seed
    cases, names, alone = bn_cases(seed)
    per_case, own = _split(obs, cases)
    for rank, got in enumerate(own):
        what = (
            f"hidden case: group=dist.new_group([{rank}]) on rank {rank}, a group of that rank "
            f"alone (seed {seed})"
        )
        check(isinstance(got, tuple) and len(got) == 2, f"{what}: return a tuple (mean, var)")
        x = alone[rank].double()
        m = x.mean(dim=(0, 2))
        v = ((x - m.view(1, -1, 1)) ** 2).mean(dim=(0, 2))
        for name, value, want in (("mean", got[0], m), ("var", got[1], v)):
            check_dtype(value, torch.float32, f"{what}: {name}")
            check_close(
                value,
                want.float(),
                f"{what}: the {name} over that group is over this rank's samples only; pass "
                "group=group to every dist.all_reduce",
                rtol=1e-4,
                atol=1e-5,
            )
    for case, name, ranks in zip(cases, names, per_case, strict=True):
        every = torch.cat([t.double() for t in case])
        dims = [d for d in range(every.dim()) if d != 1]
        mean = every.mean(dim=dims)
        var = ((every - mean.view(1, -1, *([1] * (every.dim() - 2)))) ** 2).mean(dim=dims)
        _check_bn(ranks, case, mean.float(), var.float(), name, rtol=1e-4, atol=1e-5)


JUDGES = {
    "ddp_amp_worker_tests": ("ddp_amp_worker", ddp_amp_worker),
    "fp16_allreduce_mean_tests": ("fp16_allreduce_mean", fp16_allreduce_mean),
    "sync_bn_stats_tests": ("sync_bn_stats", sync_bn_stats),
}
