"""Lesson 06's hidden tests: the inputs built from a seed, and the drivers that start the student's
functions on CPU ranks.

Each driver starts the ranks with :func:`course.launch.launch` around the visible test's probe
(which calls the student's function in each rank) and records what each rank returned, rank 0
first. The judges (``judge.py``) build the same inputs with the same functions and run the
reference in the grader's process. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import torch

from course.launch import launch
from course.multigpu import AmpDDPConfig
from grader.lessons.drive import observer

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


def probe_then_alone(
    rank: int,
    world_size: int,
    probe: Callable[[int, int, Any], Any],
    fn: Callable[..., Any],
    cases: Any,
    alone: Sequence[torch.Tensor],
) -> tuple[Any, Any]:
    """Inside a rank: ``probe(rank, world_size, cases)`` on the default group, then
    ``fn(alone[rank].clone(), group=...)`` in a group of this rank alone (lesson 06).

    The graders' worker for the collectives that take a ``group``: every rank creates every
    one-rank group (``new_group`` is collective), so a function that ignores ``group`` and
    reduces over the default group mixes in the other rank. Returns both results.
    """
    import torch.distributed as dist

    out = probe(rank, world_size, cases)
    groups = [dist.new_group([r]) for r in range(world_size)]
    return out, fn(alone[rank].clone(), group=groups[rank])


def drive_ddp_amp_worker(namespace: dict[str, Any], probe: Callable) -> None:
    """``probe`` runs the student's worker in each rank on every configuration."""
    obs, seed = observer("ddp_amp_worker", namespace)
    # One torch thread per rank wherever the ranks start (the judge's reference computes so too).
    for rank_runs in launch(probe, 2, (ddp_configs(seed),), timeout=60, threads=1):
        obs.record("rank", rank_runs)
    obs.done()


def drive_fp16_allreduce_mean(
    namespace: dict[str, Any], probe: Callable, fp16_allreduce_mean: Callable
) -> None:
    """The cases on 2 ranks, then each rank alone in a group of its own, then the cases on
    ``FOUR`` ranks."""
    obs, seed = observer("fp16_allreduce_mean", namespace)
    cases, _, alone, four = fp16_cases(seed)
    args = (probe, fp16_allreduce_mean, cases, alone)
    for rank_runs in launch(probe_then_alone, 2, args, timeout=60):
        obs.record("rank", rank_runs)
    for rank_runs in launch(probe, FOUR, ([case for case, _, _ in four],), timeout=60):
        obs.record("rank of four", rank_runs)
    obs.done()


def drive_sync_bn_stats(
    namespace: dict[str, Any], probe: Callable, sync_bn_stats: Callable
) -> None:
    """The cases on 2 ranks, then each rank alone in a group of its own."""
    obs, seed = observer("sync_bn_stats", namespace)
    cases, _, alone = bn_cases(seed)
    for rank_runs in launch(probe_then_alone, 2, (probe, sync_bn_stats, cases, alone), timeout=60):
        obs.record("rank", rank_runs)
    obs.done()
