"""Lesson 07's helpers: FSDP2 runs on real gloo ranks, the graders' memory measurement, the
lesson's own inf check and byte count (its notebook's cells, run here), the widget."""

from __future__ import annotations

import functools
import itertools
from dataclasses import replace

import matplotlib
import nbformat
import pytest
import torch

from course.launch import RankFailed, launch
from course.sharded import (
    FSDPConfig,
    RunSpec,
    ShardExplorer,
    as_dtype,
    plot_losses,
    plot_memory,
    relative_error,
    sharded_worker,
    single_process_run,
)
from grader.lessons.l07_sharded.inputs import (
    SPLIT_SIZES,
    fsdp_configs,
    memory_candidates,
    split_hiddens,
    sr_inputs,
)
from grader.lessons.l07_sharded.judge import (
    _unit_bytes,
    bf16_bracket,
    maxima_split,
    measure_memory,
    memory_worker,
)
from tests.conftest import SOLUTIONS, lesson_notebook

matplotlib.use("Agg")

SMALL = FSDPConfig(n_in=8, width=16, hidden=24, depth=2, n_out=5, steps=3, global_batch=8)


@functools.cache
def _page() -> dict:
    """The lesson's setup imports and its code cells that define the inf check and the byte
    count (``amp_step_worker``, ``rank_bytes``), run in a namespace of their own."""
    nb = nbformat.read(lesson_notebook(SOLUTIONS, "07-sharded"), as_version=4)
    namespace: dict = {"__name__": "lesson07"}
    setup = next(c.source for c in nb.cells if c.source.startswith("import math"))
    exec(setup.split("env = course.setup")[0], namespace)  # noqa: S102 - the lesson's own code
    for cell in nb.cells:
        if cell.source.startswith(("DECISIONS = ", "def nbytes(")):
            exec(cell.source, namespace)  # noqa: S102
    return namespace


def test_config_is_deterministic_and_has_root_parameters():
    a, b = SMALL.make_model().state_dict(), SMALL.make_model().state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    root = [k for k in a if not k.startswith("blocks.")]
    assert root == ["embed.weight", "embed.bias", "head.weight", "head.bias"]
    x, y = SMALL.batch(1)
    x2, y2 = SMALL.batch(1)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(x, SMALL.batch(2)[0])
    assert x.shape == (8, 8) and y.dtype == torch.long and int(y.max()) < SMALL.n_out
    assert as_dtype("bfloat16") is torch.bfloat16 and as_dtype(None) is None


def _collectives_by_any_name(rank: int, world_size: int) -> list:
    """Inside a rank: the collectives FSDP2 uses, called by torch 2.13's names and by the
    former ones an older FSDP2 calls (deprecated in 2.13), as the recorder sees them."""
    import warnings

    import torch.distributed as dist

    from course.sharded import record_fsdp_collectives

    full = torch.arange(4 * world_size, dtype=torch.float32)
    with record_fsdp_collectives() as records, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        dist.reduce_scatter_single(torch.empty(4), full)
        dist.reduce_scatter_tensor(torch.empty(4, dtype=torch.bfloat16), full.bfloat16())
        dist.all_gather_into_tensor(torch.empty(4 * world_size), torch.ones(4))
        dist.all_gather_single(torch.empty(4 * world_size), torch.ones(4))
    return records


def test_collectives_are_recorded_under_their_current_names():
    """An older torch's FSDP2 (2.11) reduce-scatters with ``reduce_scatter_tensor``: recorded as
    ``reduce_scatter_single``, once per call, so the lesson's counts hold there too."""
    for records in launch(_collectives_by_any_name, 2, timeout=90):
        assert records == [
            ("reduce_scatter_single", torch.float32, 8),
            ("reduce_scatter_single", torch.bfloat16, 8),
            ("all_gather_single", torch.float32, 4),
            ("all_gather_single", torch.float32, 4),
        ]


@pytest.mark.parametrize("reduce_dtype", [torch.float32, torch.bfloat16])
def test_sharded_worker_records_what_fsdp_sends(reduce_dtype):
    cfg = replace(SMALL, reduce_dtype=reduce_dtype)
    ranks = launch(sharded_worker, 2, (RunSpec(cfg, grad_steps=(0,)),), timeout=90)
    units = cfg.depth + 1
    for run in ranks:
        sent = run["collectives"]
        scatters = [d for n, d, _ in sent if n == "reduce_scatter_single"]
        gathers = [d for n, d, _ in sent if n == "all_gather_single"]
        assert scatters == [reduce_dtype] * (cfg.steps * units)
        assert gathers and set(gathers) == {torch.bfloat16}
        assert run["shapes"]["head.weight"][0] == "DTensor"
        assert run["shapes"]["head.weight"][3] == torch.float32
        assert len(run["losses"]) == cfg.steps
    assert ranks[0]["shapes"]["head.weight"][2] == (3, 16)
    assert ranks[1]["shapes"]["head.weight"][2] == (2, 16)
    for key, value in ranks[0]["state_dict"].items():
        assert (
            value.dtype == torch.float32
            and value.shape == SMALL.make_model().state_dict()[key].shape
        )
        assert torch.equal(value, ranks[1]["state_dict"][key])
    assert ranks[0]["grads"][0]["head.weight"].shape == (5, 16)


def test_float32_sharded_run_matches_one_process():
    cfg = replace(SMALL, param_dtype=None)
    ranks = launch(sharded_worker, 2, (RunSpec(cfg, grad_steps=(0,)),), timeout=90)
    ref = single_process_run(cfg, grad_steps=(0,))
    assert relative_error(ranks[0]["state_dict"], ref["state_dict"]) < 1e-5
    assert relative_error(ranks[0]["grads"][0], ref["grads"][0]) < 1e-5
    # bfloat16 reduction of float32 gradients costs bfloat16's rounding
    bf = launch(
        sharded_worker,
        2,
        (RunSpec(replace(cfg, reduce_dtype=torch.bfloat16), grad_steps=(0,)),),
        timeout=90,
    )
    assert relative_error(bf[0]["grads"][0], ref["grads"][0]) > 1e-4


def test_unwrapped_root_is_never_averaged():
    cfg = replace(SMALL, param_dtype=None)
    ranks = launch(sharded_worker, 2, (RunSpec(cfg, wrap_root=False),), timeout=90)
    a, b = ranks[0]["state_dict"], ranks[1]["state_dict"]
    differ = sorted(k for k in a if not torch.equal(a[k], b[k]))
    assert differ == sorted(["embed.weight", "embed.bias", "head.weight", "head.bias"])
    scatters = sum(n == "reduce_scatter_single" for n, _, _ in ranks[0]["collectives"])
    assert scatters == cfg.steps * cfg.depth


@pytest.mark.parametrize("world_size", [2, 3])
def test_memory_counts_partition_the_model(world_size):
    ranks = launch(memory_worker, world_size, (SMALL, "adamw"), timeout=90)
    model = SMALL.make_model()
    params = list(model.parameters())
    total = sum(p.numel() * 4 for p in params)
    assert sum(r["params"] for r in ranks) == total
    assert sum(r["grads"] for r in ranks) == total
    for r in ranks:
        assert r["optimizer"] == 2 * r["params"] + 4 * len(params)
    block = sum(p.numel() for p in model.blocks[0].parameters()) * 2
    root = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("blocks")) * 2
    assert ranks[0]["units"] == {"root": root, "blocks.0": block, "blocks.1": block}
    assert ranks[0]["gathered"] == max(root, block)
    # the lesson's own count (its notebook's rank_bytes) finds the same bytes
    page = launch(_page()["rank_bytes"], world_size, (SMALL,), timeout=90)
    for own, graders in zip(page, ranks, strict=True):
        assert {k: own[k] for k in graders} == graders
    # the memory under the views: parameters and gradients padded to rank 0's shard on every
    # rank, the optimizer state allocated at the view's size
    for r in page:
        assert r["storage"]["params"] == r["storage"]["grads"] == page[0]["params"]
        assert r["storage"]["optimizer"] == r["optimizer"]
    assert page[-1]["params"] < page[0]["params"]  # 5 head rows: 2, 2, 1 on 3 ranks
    rows = (-(-SMALL.n_out // world_size), SMALL.width)
    assert page[0]["head_state"] == {
        "step": ("float32", ()),
        "exp_avg": ("float32", rows),
        "exp_avg_sq": ("float32", rows),
    }


@pytest.mark.parametrize("reduce_dtype", [torch.float32, torch.bfloat16])
def test_backward_peak_and_mixed_unit_dtypes(reduce_dtype):
    """Units stored in bfloat16 and float32: shards and gradients keep each unit's dtype, the
    backward peak is a unit's full gradients plus its padded reduce-scatter input."""
    bf16, f32 = torch.bfloat16, torch.float32
    cfg = replace(SMALL, param_dtype=None, reduce_dtype=reduce_dtype, unit_dtypes=(bf16, f32, bf16))
    r0 = measure_memory(cfg, 2, "adamw")[0]
    model = cfg.make_model()
    assert {p.dtype for p in model.blocks[0].parameters()} == {f32}
    assert {p.dtype for p in model.head.parameters()} == {bf16}
    shard = sum(
        -(-p.shape[0] // 2) * (p.numel() // p.shape[0]) * p.element_size()
        for p in model.parameters()
    )
    assert r0["params"] == r0["grads"] == shard  # the reduced gradient is cast back
    units = [[p for n, p in model.named_parameters() if not n.startswith("blocks.")]]
    units += [list(b.parameters()) for b in model.blocks]
    peaks = []
    for unit in units:
        full = sum(p.numel() for p in unit) * unit[0].element_size()
        padded = sum(-(-p.shape[0] // 2) * 2 * (p.numel() // p.shape[0]) for p in unit)
        peaks.append(full + padded * reduce_dtype.itemsize)
    # FSDP2 reduces the units in backward order: the last block first, the root last
    assert r0["peaks"] == [peaks[2], peaks[1], peaks[0]]
    assert r0["backward_peak"] == max(peaks)
    assert r0["gathered"] == max(sum(p.numel() * p.element_size() for p in u) for u in units)


def test_hidden_memory_case_splits_the_largest_units():
    """shard_memory's last hidden case: for every size it draws, some block widths give one unit
    the largest gathered copy and another the largest backward peak; on the models drawn, the
    unit with the most parameters, or the unit with the largest gathered copy, taken for "the
    largest unit", gets a count wrong."""
    bf16, f32 = torch.bfloat16, torch.float32
    for n_in, width, n_out in itertools.product(*SPLIT_SIZES):
        for root, block in ((f32, bf16), (bf16, f32)):
            for reduce_dtype, ws in itertools.product((bf16, f32), (2, 3)):
                found = split_hiddens(n_in, width, n_out, root, block, reduce_dtype, ws)
                assert len(found) >= 3, (n_in, width, n_out, root, reduce_dtype, ws)
    same = FSDPConfig(n_in=40, width=16, hidden=16, depth=1, unit_dtypes=(f32, f32))
    assert not maxima_split(same, 2, None, f32)  # one dtype: the largest unit is both
    for seed in range(40):
        cases = memory_candidates(seed)
        assert [len(c) for c in cases] == [24, 24, 24, 24, 1]
        cfg, ws, pd, rd, _ = cases[-1][0]
        assert pd is None and rd is not None and len(set(cfg.unit_dtypes)) == 2
        assert maxima_split(cfg, ws, pd, rd)
        sizes = _unit_bytes(cfg, ws, pd, rd)
        model = cfg.make_model()
        numel = [sum(p.numel() for n, p in model.named_parameters() if not n.startswith("b"))]
        numel += [sum(p.numel() for p in b.parameters()) for b in model.blocks]
        right = (max(s[0] for s in sizes), max(s[1] for s in sizes))
        most = sizes[numel.index(max(numel))]
        largest_copy = max(sizes, key=lambda s: s[0])
        assert most != right and largest_copy[1] != right[1]


def test_hidden_weight_decays_are_never_adamws_default():
    decays = {cfg.weight_decay for seed in range(50) for cfg in fsdp_configs(seed)}
    assert decays and not decays & {
        0.0,
        torch.optim.AdamW([torch.zeros(1)]).defaults["weight_decay"],
    }


def test_memory_with_sgd_and_float32_compute():
    cfg = replace(SMALL, param_dtype=None)
    r0 = measure_memory(cfg, 2, "sgd")[0]
    assert r0["optimizer"] == r0["params"]
    block = sum(p.numel() for p in cfg.make_model().blocks[0].parameters()) * 4
    assert r0["gathered"] == block
    with pytest.raises(Exception, match="optimizer must be"):
        measure_memory(cfg, 2, "lion")


def test_the_pages_amp_step_skips_on_every_rank_only_with_a_collective_check():
    """The lesson's FSDP2 + torch.amp step (its notebook's amp_step_worker), inf planted in the
    last rank's shard: a rank-local decision half-steps, the all-reduced flag and both scalers
    skip on every rank and halve the scale."""
    page = _page()
    for decide in page["DECISIONS"]:
        a, b = launch(page["amp_step_worker"], 2, (SMALL, decide), timeout=90)
        assert (a["mine"], b["mine"]) == (False, True)
        assert a["anywhere"] and b["anywhere"]
        if decide == "local":
            assert (a["stepped"], b["stepped"]) == (True, False)
            assert a["scale"] != b["scale"]
        else:
            assert (a["stepped"], b["stepped"]) == (False, False)
            assert a["scale"] == b["scale"] == 512.0
        # the plain GradScaler agrees through DTensor's reduction of the inf flag alone
        expected_dtensor = 1 if "Scaler" in decide else 0
        assert a["dtensor_inf_reductions"] == b["dtensor_inf_reductions"] == expected_dtensor
        assert a["all_reduces"] == (1 if decide == "ShardedGradScaler" else 0)


def test_plots_draw():
    from course.plotting import new_figure

    fig, (ax1, ax2) = new_figure(ncols=2)
    plot_losses(ax1, {"a": [3.0, 2.0, 1.0] * 5, "short": [1.0, 0.5]}, "t", smooth=4)
    assert len(ax1.lines) == 2
    plot_memory(ax2, [{"params": 10, "grads": 10, "optimizer": 20, "gathered": 5}] * 2, "m")
    assert len(ax2.patches) == 8


def test_widget_measures_real_ranks():
    cfg = replace(SMALL, steps=2, global_batch=12)
    explorer = ShardExplorer(memory_worker, config=cfg, world_size=2)
    two = explorer.results
    assert two["reduced_in"] == ["float32"] and len(two["memory"]) == 2
    explorer.world_size.value = 3
    three = explorer.results
    assert len(three["memory"]) == 3
    assert three["memory"][0]["params"] < two["memory"][0]["params"]
    explorer.reduce_dtype.value = "bfloat16"
    assert explorer.results["reduced_in"] == ["bfloat16"]
    assert "relative error" in explorer.stats.value


def test_course_runs_are_refused_inside_the_block_and_restored_after():
    import course.sharded as module
    from course.checks import CheckFailed
    from course.sharded import COURSE_RUNS, without_course_runs

    alias = module.shard_model  # imported under another name: refused all the same
    calls: list[str] = []
    with without_course_runs("shard_memory", calls):
        with pytest.raises(CheckFailed, match="count\\) yourself"):
            alias(None, None, None)
        for name in COURSE_RUNS:
            args = () if name == "record_backward_peaks" else (None, None, None)
            with pytest.raises(CheckFailed, match=f"shard_memory called course.sharded.{name}"):
                getattr(module, name)(*args)
        # the lesson's own count measures with record_backward_peaks: refused in forked ranks
        with pytest.raises(RankFailed, match="called course.sharded.record_backward_peaks"):
            launch(_page()["rank_bytes"], 2, (SMALL,), timeout=90, show_output=False)
    assert calls == ["shard_model", *COURSE_RUNS]
    assert not module._REFUSING
    assert measure_memory(SMALL, 2)[0]["params"] > 0  # runs again once the block is left


def test_course_runs_are_refused_in_spawned_ranks():
    out = launch(_refused_probe, 2, (SMALL,), start_method="spawn", timeout=120)
    assert out == [(["sharded_worker"], "CheckFailed")] * 2


def _student_calls_the_course(rank, world_size, config):
    from course.sharded import sharded_worker as mine

    return mine(rank, world_size, RunSpec(config))


def _refused_probe(rank, world_size, config):
    from course.sharded import without_course_runs

    refused: list[str] = []
    with without_course_runs("fsdp_amp_worker", refused):
        try:
            _student_calls_the_course(rank, world_size, config)
        except Exception as exc:
            return refused, type(exc).__name__
    return refused, None


def test_stochastic_rounding_draws_always_hold_values_just_below_a_power_of_two():
    """Every hidden draw of stochastic_round_bf16 holds, of each sign, at least two finite values
    just below a power of two that round to nearest up to it: there the gap above the power of
    two is twice the value's own, and a function that takes the gap from the nearest power of
    two returns a value two steps away. The draw is the judge's (and so the driver's)."""
    for seed in range(200):
        values = sr_inputs(seed)["values"]
        lo, hi, frac = bf16_bracket(values)
        mantissa, _ = torch.frexp(hi)
        below = (
            values.isfinite()
            & (hi.abs() <= torch.finfo(torch.bfloat16).max)
            & (mantissa.abs() == 0.5)  # hi is a power of two
            & (lo.abs() < hi.abs())
            & (values.to(torch.bfloat16).float() == hi)  # rounds to nearest up to it
            & (frac > 0)
        )
        assert int((below & (values > 0)).sum()) >= 2, seed
        assert int((below & (values < 0)).sum()) >= 2, seed


def _gathered_during_backward(rank: int, world_size: int, config: FSDPConfig) -> list:
    """Shard as the lesson does; after each unit's pre-backward, which units have their
    parameters gathered (unsharded) or an all-gather done and waiting (prefetched)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    from course.sharded import rank_mesh

    model = config.make_model()
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mesh=rank_mesh(), mp_policy=policy)
    fully_shard(model, mesh=rank_mesh(), mp_policy=policy)
    units = {f"blocks.{i}": b for i, b in enumerate(model.blocks)}
    units["root"] = model
    groups = {n: m._get_fsdp_state()._fsdp_param_group for n, m in units.items()}
    log = []
    original = FSDPParamGroup.pre_backward

    def pre_backward(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        name = next(n for n, g in groups.items() if g is self)
        held = sorted(
            n for n, g in groups.items() if g.is_unsharded or g._all_gather_result is not None
        )
        log.append((name, held))
        return out

    FSDPParamGroup.pre_backward = pre_backward
    x, y = config.batch(0)
    config.loss_fn(model(x.chunk(world_size)[rank]), y.chunk(world_size)[rank]).backward()
    FSDPParamGroup.pre_backward = original
    return log


def test_fsdp2_prefetches_the_next_unit_in_backward_on_cpu_ranks():
    """What section 4 says: by default FSDP2's backward gathers the unit that runs next while the
    current one computes its gradients, so two units' gathered copies are held at once (here on
    gloo CPU ranks too), which rank_bytes, one unit at a time, does not count."""
    log = launch(_gathered_during_backward, 2, (replace(SMALL, depth=3),), timeout=90)[0]
    assert log == [
        ("root", ["blocks.2", "root"]),
        ("blocks.2", ["blocks.1", "blocks.2", "root"]),
        ("blocks.1", ["blocks.0", "blocks.1", "root"]),
        ("blocks.0", ["blocks.0", "root"]),
    ]
