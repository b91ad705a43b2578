"""Lesson 06's judges: the references of its hidden tests and the comparisons.

Each exercise runs on 2 CPU ranks. The driver (the hidden part of the test cell in
``solutions/06-multi-gpu``) builds the inputs from the seed, starts the ranks with
``course.launch.launch`` around the visible test's probe (which calls the student's function in
each rank) and records what each rank returned, rank 0 first. Each judge rebuilds the same
inputs from the same seed, in the same order, runs the reference here, in the grader's process,
and makes the old hidden test's checks on what each rank returned.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import replace
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


#: The settings the visible tests leave at their defaults, with the options the driver draws.
VARIED = (
    ("lr", [0.05, 0.1, 0.2]),
    ("momentum", [0.0, 0.9]),
    ("init_scale", [2.0**8, 2.0**9, 2.0**10]),
    ("growth_interval", [2, 3]),
)


def ddp_configs(seed: int) -> list[AmpDDPConfig]:
    """The four hidden configurations of ``ddp_amp_worker``, drawn from ``seed`` as the driver
    draws them (each choice one ``torch.randint`` over its options, in the driver's order; a
    setting drawn the same in all four takes its next option in the last)."""
    gen = torch.Generator().manual_seed(seed)

    def pick(options: list) -> Any:
        return options[int(torch.randint(0, len(options), (), generator=gen))]

    configs = []
    for dtype, accum in [
        (torch.float16, 2),
        (torch.float16, 4),
        (torch.bfloat16, 2),
        (torch.float32, 4),
    ]:
        steps = pick([4, 5])
        batch = 2 * accum * pick([2, 3, 4])
        poison = ((pick(list(range(steps))), pick(list(range(batch)))),) if pick([0, 1]) else ()
        configs.append(
            AmpDDPConfig(
                sizes=(pick([8, 12, 20]), pick([16, 24, 40]), pick([3, 5])),
                steps=steps,
                global_batch=batch,
                accum_steps=accum,
                lr=pick([0.05, 0.1, 0.2]),
                momentum=pick([0.0, 0.9]),
                amp_dtype=dtype,
                init_scale=2.0 ** pick([8, 9, 10]),
                growth_interval=pick([2, 3]),
                seed=int(torch.randint(0, 10**6, (), generator=gen)),
                poison=poison,
            )
        )
    # Each setting takes at least two values over the four runs, so a worker that ignores one
    # (an optimizer or a scaler of its own, with fixed settings) cannot match all four.
    for field, options in VARIED:
        values = [getattr(c, field) for c in configs]
        if len(set(values)) == 1:
            other = options[(options.index(values[0]) + 1) % len(options)]
            configs[-1] = replace(configs[-1], **{field: other})
    return configs


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


#: The world size of the driver's second launch of ``fp16_allreduce_mean``.
FOUR = 4


def subnormal_shares(
    gen: torch.Generator, shape: tuple[int, ...], ranks: int
) -> list[torch.Tensor]:
    """One value per rank whose share (value / ``ranks``) is k * 2^-24, k = 1 + 32 j (j from 0
    to 15, so odd), one sign per element on every rank: each share is a float16 subnormal, and
    every sum of them a multiple of 2^-24 below 2^-13 (at most 4 * 481 * 2^-24), where float16's
    spacing is 2^-24, so the mean is exact in float16 in any order of the sum. Dividing by a fixed
    c > ``ranks`` instead rounds k / (c / ranks) units of 2^-24 down in size (the tie k / 2 goes
    to the even (k - 1) / 2), which after the multiplication by c / ranks leaves each rank's share
    2^-24 short."""
    signs = torch.randint(0, 2, shape, generator=gen).float() * 2 - 1
    return [
        signs * (1 + 32 * torch.randint(0, 16, shape, generator=gen)).float() * (ranks * 2.0**-24)
        for _ in range(ranks)
    ]


def fp16_cases(
    seed: int,
) -> tuple[
    list[list[torch.Tensor]],
    list[tuple[str, bool]],
    list[torch.Tensor],
    list[tuple[list[torch.Tensor], str, bool]],
]:
    """The hidden cases of ``fp16_allreduce_mean`` (one tensor per rank each), their kinds
    (name, exact), each rank's tensor for its own one-rank group, and the cases of the
    second launch on ``FOUR`` ranks with their names and whether the mean is exact, drawn as
    the driver draws them."""
    gen = torch.Generator().manual_seed(seed)
    cases, kinds = [], []
    shape = (
        int(torch.randint(1, 6, (), generator=gen)),
        int(torch.randint(1, 9, (), generator=gen)),
    )
    # Exact: integers, whose halves and their sum are float16 numbers.
    cases.append([torch.randint(-1000, 1001, shape, generator=gen).float() for _ in range(2)])
    kinds.append(("integers", True))
    # Random magnitudes from 1e-3 to 1e3.
    cases.append(
        [
            torch.randn(shape, generator=gen) * 10.0 ** (torch.rand(shape, generator=gen) * 6 - 3)
            for _ in range(2)
        ]
    )
    kinds.append(("random magnitudes", False))
    # Large: the float16 sum overflows on every element, the mean does not.
    for sign in (1.0, -1.0):
        cases.append([sign * (30000 + 30000 * torch.rand(shape, generator=gen)) for _ in range(2)])
        kinds.append((f"values near {sign * 45000:g}", False))
    cases.append(
        [
            torch.tensor(50000.0 + float(torch.rand((), generator=gen)) * 1000),
            torch.tensor(-60000.0),
        ]
    )
    kinds.append(("0-d tensors of opposite signs", False))
    # Beyond float16 on a rank: 66000 to 130000 (its half fits), against small values or the
    # opposite sign; every share and the mean fit, the values themselves do not.
    huge = 66000 + 64000 * torch.rand(shape, generator=gen)
    cases.append([huge, 100 * torch.randn(shape, generator=gen)])
    kinds.append(("rank 0 above 65504, rank 1 small", False))
    first = 66000 + 64000 * torch.rand(shape, generator=gen)
    cases.append([-first, 66000 + 64000 * torch.rand(shape, generator=gen)])
    kinds.append(("both ranks beyond float16, opposite signs", False))
    # Exact, in float16's subnormals: each share (value / 2) an odd multiple of 2^-24, 1 more
    # than a multiple of 32, one sign per element: a fixed divisor c larger than the world size
    # rounds every share the same way (k * 2^-24 * 2 / c with k = 1 mod 32: down, ties to even
    # included) and misses the mean by 2^-24 per rank.
    cases.append(subnormal_shares(gen, shape, 2))
    kinds.append(("shares that are odd multiples of 2^-24 (float16 subnormals)", True))
    alone = [100 * torch.randn(shape, generator=gen) for _ in range(2)]
    # Four ranks, each value 33000 to 60000 in size, one sign per element on every rank: each
    # share (a quarter) and the mean fit in float16, but half of each value summed over the four
    # ranks (twice the mean, above 65520) is inf: a prescale of 1/2 suits two ranks only.
    signs = torch.randint(0, 2, shape, generator=gen).float() * 2 - 1
    four = [
        (
            [signs * (33000 + 27000 * torch.rand(shape, generator=gen)) for _ in range(FOUR)],
            f"{FOUR} ranks holding 33000 to 60000 (one sign per element)",
            False,
        )
    ]
    # Four ranks, random magnitudes from 1e-2 to 1e2 and both signs.
    four.append(
        (
            [
                torch.randn(shape, generator=gen)
                * 10.0 ** (torch.rand(shape, generator=gen) * 4 - 2)
                for _ in range(FOUR)
            ],
            f"{FOUR} ranks, random magnitudes",
            False,
        )
    )
    # Exact, in float16's subnormals, as on 2 ranks: each share (value / 4) k * 2^-24.
    four.append(
        (
            subnormal_shares(gen, shape, FOUR),
            f"{FOUR} ranks, shares that are odd multiples of 2^-24 (float16 subnormals)",
            True,
        )
    )
    return cases, kinds, alone, four


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


def bn_cases(seed: int) -> tuple[list[list[torch.Tensor]], list[str], list[torch.Tensor]]:
    """The hidden cases of ``sync_bn_stats`` (one batch per rank each), their descriptions and
    each rank's batch for its own one-rank group, drawn as the driver draws them."""
    gen = torch.Generator().manual_seed(seed)
    cases, names = [], []
    for trial, (spatial, dtype) in enumerate(
        [
            ((), torch.float32),
            ((7,), torch.float32),
            ((5, 6), torch.float32),
            ((64, 64), torch.float16),
            ((3,), torch.float16),
        ]
    ):
        c = int(torch.randint(1, 6, (), generator=gen))
        ns = [int(torch.randint(1, 9, (), generator=gen)) for _ in range(2)]
        while ns[0] == ns[1]:
            ns[1] = int(torch.randint(1, 9, (), generator=gen))
        case = []
        for r, n in enumerate(ns):
            offset = torch.randn(1, c, *([1] * len(spatial)), generator=gen) * 2 + (3 if r else -1)
            scale = torch.rand(1, c, *([1] * len(spatial)), generator=gen) + 0.5
            x = torch.randn(n, c, *spatial, generator=gen) * scale + offset
            if dtype == torch.float16:
                x = x + 4  # float16 sums of these overflow
            case.append(x.to(dtype))
        cases.append(case)
        names.append(
            f"hidden case {trial}: batches {ns}, shape (N, {c}, {spatial}), {dtype} (seed {seed})"
        )
    # Far from zero: a mean of about 500 against a spread of about 1. x * x is about 250000,
    # where float32's spacing is 1/64, so E[x^2] - E[x]^2 cancels; deviations from the global
    # mean do not.
    far = [
        torch.randn(n, 3, 6, generator=gen) * (torch.rand(1, 3, 1, generator=gen) + 0.5) + 500 + r
        for r, n in enumerate((int(torch.randint(2, 9, (), generator=gen)), 5))
    ]
    cases.append(far)
    names.append(
        f"hidden case: float32 values near 500 with a spread near 1, batches "
        f"{[t.shape[0] for t in far]} (E[x^2] - E[x]^2 cancels in float32: subtract the "
        f"global mean before squaring; seed {seed})"
    )
    alone = [
        torch.randn(int(torch.randint(2, 6, (), generator=gen)), 3, 4, generator=gen) + 3 * r
        for r in range(2)
    ]
    return cases, names, alone


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
