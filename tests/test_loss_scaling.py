"""Unit tests for course/loss_scaling.py (lesson 02's helpers and widget)."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from course.loss_scaling import (
    RunLog,
    ScaleTrajectoryExplorer,
    accumulate,
    digit_batches,
    digits_logistic_fp16,
    fp16_neighbours,
    lost_update_fraction,
    scale_sweep,
    simulate_grad_scaler,
    zero_grad_fraction,
)


def test_simulated_scaler_grows_every_interval_without_overflow():
    out = simulate_grad_scaler(steps=12, growth_interval=4, init_scale=2.0**10)
    logs = [math.log2(s) for s in out["scales"]]
    assert logs == [10, 10, 10, 11, 11, 11, 11, 12, 12, 12, 12, 13]
    assert not any(out["overflowed"])


def test_simulated_scaler_backs_off_at_the_ceiling():
    out = simulate_grad_scaler(steps=8, growth_interval=1, init_scale=2.0**16, ceiling_log2=18)
    logs = [math.log2(s) for s in out["scales"]]
    # 17, 18, then 19 is reached; the step taken at 2^19 overflows and the scale halves.
    assert logs[:4] == [17, 18, 19, 18]
    assert out["overflowed"][:4] == [False, False, False, True]
    assert max(logs) == 19


def test_simulated_scaler_overflow_rate_and_factors():
    out = simulate_grad_scaler(
        steps=400, overflow_rate=1.0, backoff_factor=0.25, init_scale=2.0**20
    )
    assert all(out["overflowed"])
    assert out["scales"][0] == 2.0**18
    quiet = simulate_grad_scaler(steps=400, overflow_rate=0.1, seed=3)
    assert 10 < sum(quiet["overflowed"]) < 80
    with pytest.raises(ValueError):
        simulate_grad_scaler(overflow_rate=1.5)


def test_simulated_scaler_accepts_another_scaler():
    made = []

    def factory(**kwargs):
        made.append(kwargs)
        return torch.amp.GradScaler("cpu", **kwargs)

    out = simulate_grad_scaler(steps=5, growth_interval=2, scaler_factory=factory, init_scale=4.0)
    assert made == [dict(init_scale=4.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2)]
    assert out["scales"] == [4.0, 8.0, 8.0, 16.0, 16.0]


def test_widget_redraws_when_its_controls_move():
    explorer = ScaleTrajectoryExplorer(steps=120)
    before_summary = explorer.summary.value
    before = list(explorer.result["scales"])
    explorer.rate.value = 0.2
    assert explorer.result["scales"] != before
    assert explorer.summary.value != before_summary
    assert "skipped" in explorer.summary.value
    interval_before = list(explorer.result["scales"])
    explorer.interval.value = 3
    assert explorer.result["scales"] != interval_before
    explorer.use_ceiling.value = False
    explorer.rate.value = 0.0
    assert explorer.result["overflowed"] == [False] * 120
    assert explorer.ax.get_title().startswith("torch.amp.GradScaler")


def test_lost_update_fraction_follows_half_an_ulp():
    ratios = torch.tensor([2.0**-10, 2.0**-11.5, 2.0**-13], dtype=torch.float64)
    lost = lost_update_fraction(ratios)
    assert lost[0] == 0.0
    assert 0.4 < lost[1] < 0.6
    assert lost[2] == 1.0
    assert lost_update_fraction(ratios, dtype=torch.float32)[1] == 0.0


def test_accumulate_stagnates_in_float16_but_not_with_a_master():
    plain = accumulate(1.0, 1e-4, 500, master=False)
    master = accumulate(1.0, 1e-4, 500, master=True)
    assert plain.tolist() == [1.0] * 500
    assert 1.04 < master[-1] < 1.06


def test_lost_update_fraction_downwards_matches_inside_the_binade():
    ratios = torch.tensor([-(2.0**-10), -(2.0**-11.5), -(2.0**-13)], dtype=torch.float64)
    lost = lost_update_fraction(ratios)
    assert lost[0] == 0.0 and lost[2] == 1.0
    assert 0.4 < lost[1] < 0.6


def test_fp16_neighbours_gap_below_a_power_of_two_is_half():
    below, w, above = fp16_neighbours(2.0**-6)
    assert w == 2.0**-6
    assert above - w == 2.0**-16 and w - below == 2.0**-17
    below, w, above = fp16_neighbours(-1.5)
    assert below < w < above and above - w == w - below == 2.0**-10
    with pytest.raises(ValueError):
        fp16_neighbours(0.0)
    with pytest.raises(ValueError):
        fp16_neighbours(1e6)


def test_digit_batches_are_reproducible_and_sized():
    batches, (x_test, y_test) = digit_batches("cpu", 3, batch_size=16)
    again, _ = digit_batches("cpu", 3, batch_size=16)
    assert len(batches) == 3 and batches[0][0].shape == (16, 64) and batches[0][1].shape == (16,)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))
    assert not torch.equal(batches[0][0], batches[1][0])
    assert x_test.dtype == torch.float32 and len(x_test) == len(y_test)
    with pytest.raises(ValueError):
        digit_batches("cpu", 0)


def _deep_sigmoid(depth: int = 7) -> nn.Module:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for n_in in [64] + [64] * (depth - 2):
        layers += [nn.Linear(n_in, 64), nn.Sigmoid()]
    return nn.Sequential(*layers, nn.Linear(64, 10))


def test_run_log_records_skips_and_accuracy():
    model = nn.Linear(2, 3)
    log = RunLog("t")
    loss = model(torch.ones(1, 2)).sum()
    loss.backward()
    with torch.no_grad():
        model.weight.grad[0, 0] = 0.0
    log.record(loss, model, 8.0, 8.0)
    log.record(loss, model, 8.0, 4.0)
    assert log.skipped == [False, True] and log.skipped_steps == [1] and log.scales == [8.0, 4.0]
    assert (
        log.zero_fraction[0] == pytest.approx(zero_grad_fraction(model))
        and 0 < log.zero_fraction[0]
    )
    x, y = torch.randn(10, 2), torch.zeros(10, dtype=torch.long)
    assert 0.0 <= log.finish(model, x, y).test_accuracy <= 1.0


def test_scale_sweep_finds_underflow_and_overflow_in_a_deep_sigmoid_net():
    batches, _ = digit_batches("cpu", 1, batch_size=128)
    model = _deep_sigmoid()
    sweep = scale_sweep(model, *batches[0], [0, 14, 40])
    assert sweep["log2_scale"] == [0.0, 14.0, 40.0]
    # The first layer's float16 gradients underflow without a scale.
    assert sweep["lost"][0] > 0.05
    assert sweep["lost"][1] < 1e-3 and sweep["overflow"][1] == 0.0
    assert sweep["overflow"][2] > 0.5 and math.isnan(sweep["rel_error"][2])
    assert all(p.grad is None for p in model.parameters())


def test_digits_logistic_fp16_is_float16_with_small_weights():
    model, (x, y, x_test, y_test) = digits_logistic_fp16("cpu")
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert x.dtype == x_test.dtype == torch.float16 and y.dtype == torch.long
    assert model(x).shape == (len(x), 10)
    assert 0.015 < float(model.weight.detach().float().std()) < 0.025
    assert not model.bias.detach().any()
    wide, _ = digits_logistic_fp16("cpu", weight_std=0.5)
    assert float(wide.weight.detach().float().std()) > 0.4


def test_small_model_threads_restores_the_thread_count():
    from course.loss_scaling import small_model_threads

    before = torch.get_num_threads()
    with small_model_threads("cpu"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), small_model_threads(torch.device("cpu")):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


def test_simulated_scaler_runs_on_the_given_device():
    # The widget passes the lesson's device; on a GPU the same trajectory comes from its kernels.
    on_cpu = simulate_grad_scaler(steps=40, overflow_rate=0.2, growth_interval=3, seed=1)
    assert (
        simulate_grad_scaler(
            steps=40, overflow_rate=0.2, growth_interval=3, seed=1, device=torch.device("cpu")
        )
        == on_cpu
    )
    if torch.cuda.is_available():
        on_gpu = simulate_grad_scaler(
            steps=40, overflow_rate=0.2, growth_interval=3, seed=1, device="cuda"
        )
        assert on_gpu == on_cpu
    explorer = ScaleTrajectoryExplorer(steps=20, device="cpu")
    assert explorer.device == torch.device("cpu")
    assert "cpu" in explorer.ax.get_title()


def test_packed_tensors_come_back_with_their_dtypes_shapes_and_nesting():
    from grader.lessons.l02_loss_scaling.inputs import pack_tensors, unpack_tensors

    nested = [
        [torch.randn(3, 4), torch.arange(5)],
        [],
        [torch.tensor(2.5, dtype=torch.float16), [torch.randn(0, 2), "not a tensor"]],
    ]
    back = unpack_tensors(pack_tensors(nested))
    flat_in = [nested[0][0], nested[0][1], nested[2][0], nested[2][1][0]]
    flat_out = [back[0][0], back[0][1], back[2][0], back[2][1][0]]
    assert back[1] == [] and back[2][1][1] is None
    for a, b in zip(flat_in, flat_out, strict=True):
        assert b.dtype == a.dtype and b.shape == a.shape and torch.equal(a, b)
    packed = pack_tensors([torch.ones(2)])
    packed["data"]["float32"] = torch.ones(1)
    with pytest.raises(ValueError):
        unpack_tensors(packed)


def test_driving_grad_scaler_through_a_scenario_is_deterministic():
    import random

    from grader.lessons.l02_loss_scaling.inputs import scaler_scenario, scaler_trace, unpack_trace

    cfg, n_opt, events = scaler_scenario(random.Random(5), n_opt=2, growth_interval=2)
    events = events[:7]  # the sixth overflows in both optimizers
    make = lambda **kw: torch.amp.GradScaler("cpu", **kw)  # noqa: E731
    runs = [
        unpack_trace(scaler_trace(make, make, cfg, n_opt, events, 11), events) for _ in range(2)
    ]
    assert runs[0]["scales"] == runs[1]["scales"] and runs[0]["stepped"] == runs[1]["stepped"]
    last = zip(runs[0]["params"][-1], runs[1]["params"][-1], strict=True)
    assert all(torch.equal(a, b) for a, b in last)
    assert len(runs[0]["stepped"]) == 7 and all(len(s) == 2 for s in runs[0]["stepped"])
    # GradScaler returns the optimizer's token and refuses a second unscale_.
    assert all(fine for _delta, _did, fine, _r, _t in runs[0]["steps"])
    assert all(kind == "raised" and "RuntimeError" in c for kind, _n, c, _m in runs[0]["twice"])
    skipped = sum(not did for s in runs[0]["stepped"] for _o, did in s)
    assert skipped >= 2


def test_widget_says_when_the_scale_underflows_to_zero_and_keeps_working():
    # Random overflows at rate 0.3 with backoff 0.2 and no growth for 200 steps: the float32
    # scale backs off below its smallest subnormal, to 0.0.
    explorer = ScaleTrajectoryExplorer(steps=300)
    explorer.use_ceiling.value = False
    explorer.interval.value = 200
    explorer.backoff.value = 0.2
    explorer.rate.value = 0.3
    scales = explorer.result["scales"]
    zero_at = scales.index(0.0) + 1
    assert all(s == 0.0 for s in scales[zero_at - 1 :])
    assert "underflowed to 0.0" in explorer.summary.value
    assert f"at step {zero_at}" in explorer.summary.value
    labels = [t.get_text() for t in explorer.ax.get_legend().get_texts()]
    assert f"scale 0.0 from step {zero_at} on" in labels
    # It keeps redrawing: back to a setting where the scale stays positive.
    explorer.rate.value = 0.01
    assert min(explorer.result["scales"]) > 0
    assert "underflowed" not in explorer.summary.value
    assert "final scale" in explorer.summary.value


def test_every_master_weights_model_has_a_buffer_that_is_not_a_parameter():
    from grader.lessons.l02_loss_scaling.inputs import master_draws, master_model

    for seed in range(200):
        trials, _small = master_draws(seed)
        assert len(trials) == 6
        for draw in trials:
            model = master_model(draw)
            params = list(model.parameters())
            buffers = list(model.buffers())
            assert buffers and all(b.dtype == torch.float16 for b in buffers), seed
            # Masters from state_dict() would hold one more tensor than the parameters.
            assert len(model.state_dict()) == len(params) + len(buffers), seed
