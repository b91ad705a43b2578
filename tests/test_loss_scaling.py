"""Unit tests for course/loss_scaling.py (lesson 02's helpers and widget)."""

from __future__ import annotations

import math

import pytest
import torch

from course.loss_scaling import (
    LOSS_WEIGHT,
    ScaleTrajectoryExplorer,
    accumulate,
    digits_logistic_fp16,
    lost_update_fraction,
    scale_sweep,
    simulate_grad_scaler,
    train_digits,
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


def test_train_digits_records_each_step():
    fp32 = train_digits("cpu", "fp32", steps=3)
    fp16 = train_digits("cpu", "fp16", steps=3)
    assert len(fp32.losses) == len(fp32.zero_fraction) == len(fp32.scales) == 3
    assert fp32.losses[0] == pytest.approx(fp16.losses[0], rel=1e-2)
    # The loss weight pushes the float16 gradients below float16's range.
    assert fp16.zero_fraction[0] > 0.8 > fp32.zero_fraction[0]
    scaled = train_digits("cpu", "fp16", steps=2, static_scale=2.0**16)
    assert scaled.zero_fraction[0] < 0.5 and scaled.label.endswith("2^16")
    with pytest.raises(ValueError):
        train_digits("cpu", "bf16", steps=1)


def test_train_digits_with_a_scaler_reports_skips():
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**44)
    run = train_digits("cpu", "fp16", steps=4, scaler=scaler)
    assert run.skipped[0] and run.scales[0] == 2.0**43
    assert run.skipped_steps == [i for i, s in enumerate(run.skipped) if s]


def test_scale_sweep_finds_underflow_and_overflow():
    sweep = scale_sweep("cpu", [0, 16, 44])
    assert sweep["log2_scale"] == [0.0, 16.0, 44.0]
    assert sweep["lost"][0] > 0.5
    assert sweep["lost"][1] < 0.01 and sweep["overflow"][1] == 0.0
    assert sweep["overflow"][2] > 0.0 and math.isnan(sweep["rel_error"][2])
    assert LOSS_WEIGHT == 2.0**-16


def test_digits_logistic_fp16_is_float16():
    model, (x, y, x_test, y_test) = digits_logistic_fp16("cpu")
    assert all(p.dtype == torch.float16 for p in model.parameters())
    assert x.dtype == x_test.dtype == torch.float16 and y.dtype == torch.long
    assert model(x).shape == (len(x), 10)


def test_small_model_threads_restores_the_thread_count():
    from course.loss_scaling import small_model_threads

    before = torch.get_num_threads()
    with small_model_threads("cpu"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), small_model_threads(torch.device("cpu")):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
