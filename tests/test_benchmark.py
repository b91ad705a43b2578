"""Unit tests for lesson 09's benchmark (course.benchmark) and helpers (course.capstone)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch
from matplotlib.figure import Figure

from course import benchmark as B
from course.capstone import (
    BenchmarkDashboard,
    cast_table,
    drifting_tensors,
    fp8_max,
    plot_training_curves,
    replay_scaling,
)
from grader import REPO_ROOT

TINY = dict(sizes=(8,), batch_size=4, repeats=1, min_run_time=0.01, warmup=1, device="cpu")


def test_parse_mode_reads_names_and_rejects_unknown_ones():
    m = B.parse_mode("fp16-amp+cl")
    assert (m.amp_dtype, m.tf32, m.channels_last, m.uses_scaler) == (
        torch.float16,
        False,
        True,
        True,
    )
    assert B.parse_mode("bf16-amp").uses_scaler is False
    assert B.parse_mode("tf32").tf32 and B.parse_mode("tf32").amp_dtype is None
    with pytest.raises(ValueError, match="unknown mode"):
        B.parse_mode("fp8-amp")


def test_unsupported_reasons_on_cpu():
    assert "CUDA math mode" in B.unsupported_reason("tf32", "cpu")
    assert "cnn" in B.unsupported_reason("bf16-amp+cl", "cpu", model="mlp")
    assert B.unsupported_reason("bf16-amp+cl", "cpu", model="cnn") == ""
    for mode in ("fp32", "fp16-amp", "bf16-amp"):
        assert B.unsupported_reason(mode, "cpu") == ""


def test_every_mode_starts_from_the_same_weights_and_a_step_trains():
    dev = torch.device("cpu")
    a = B.make_setup(B.parse_mode("fp32"), "mlp", 8, 4, dev)
    b = B.make_setup(B.parse_mode("bf16-amp"), "mlp", 8, 4, dev)
    before = [p.detach().clone() for p in a.model.parameters()]
    for p, q in zip(a.model.parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q)
    seen = []
    b.model[0].register_forward_hook(lambda _m, _i, out: seen.append(out.dtype))
    a.step()
    b.step()
    assert seen == [torch.bfloat16], "the bf16-amp step should run the layer under autocast"
    assert any(not torch.equal(p, q) for p, q in zip(before, a.model.parameters(), strict=True))
    assert b.scaler.is_enabled() is False
    c = B.make_setup(B.parse_mode("fp16-amp+cl"), "cnn", 4, 2, dev, image_size=8)
    assert c.scaler.is_enabled() and c.x.is_contiguous(memory_format=torch.channels_last)
    c.step()


def test_math_mode_sets_and_restores_tf32():
    before = torch.get_float32_matmul_precision()
    with B.math_mode(True):
        assert torch.get_float32_matmul_precision() == "high"
        assert torch.backends.cudnn.allow_tf32 is True
    with B.math_mode(False):
        assert torch.get_float32_matmul_precision() == "highest"
        assert torch.backends.cudnn.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == before


def test_run_benchmark_on_cpu_measures_what_exists_and_says_what_not():
    calls = []
    res = B.run_benchmark(
        ["tf32", "bf16-amp", "fp16-amp"], progress=lambda *a: calls.append(a), **TINY
    )
    assert [r.mode for r in res] == ["fp32", "tf32", "bf16-amp", "fp16-amp"]
    by = {r.mode: r for r in res}
    assert by["fp32"].speedup == 1.0
    assert not by["tf32"].measured and "CUDA" in by["tf32"].note
    for mode in ("bf16-amp", "fp16-amp"):
        r = by[mode]
        assert r.measured and r.step_time > 0 and r.peak_memory is None
        assert r.throughput == pytest.approx(4 / r.step_time)
        assert r.speedup == pytest.approx(by["fp32"].step_time / r.step_time)
        assert r.memory_saving is None
    assert [c[:2] for c in calls] == [(1, 3), (2, 3), (3, 3)]


def test_no_setup_outlives_its_measurement():
    """A mode's peak memory (CUDA) must not include the previous mode's model and optimizer:
    by the time the next mode is built, nothing of the last setup may be alive."""

    def live_setups() -> int:
        gc.collect()
        return sum(type(o) is B.StepSetup for o in gc.get_objects())

    before = live_setups()
    alive = []
    B.run_benchmark(["bf16-amp"], progress=lambda *a: alive.append(live_setups()), **TINY)
    assert alive == [before, before], f"setups still alive after each measurement: {alive}"


def test_run_benchmark_gives_one_block_per_size_and_rejects_bad_arguments():
    res = B.run_benchmark(["fp32"], **{**TINY, "sizes": (6, 8)})
    assert [(r.mode, r.size) for r in res] == [("fp32", 6), ("fp32", 8)]
    with pytest.raises(ValueError):
        B.run_benchmark(["fp32"], **{**TINY, "repeats": 0})
    with pytest.raises(ValueError):
        B.run_benchmark(["fp32"], model="rnn", sizes=(4,), device="cpu")


def test_format_table_has_the_columns_and_the_cpu_notes():
    res = B.run_benchmark(["tf32", "bf16-amp"], **TINY)
    text = B.format_table(res, "test device")
    for word in ("mode", "step time", "throughput", "peak memory", "speed-up", "mem saving"):
        assert word in text
    assert "Measured on test device" in text
    assert "AMX" in text and "not measured" in text
    assert "TF32 is a CUDA math mode" in text
    assert "torch.cuda.max_memory_allocated" in text
    bf16_line = next(ln for ln in text.splitlines() if ln.startswith("bf16-amp"))
    assert "samples/s" in bf16_line and "n/a" in bf16_line


def test_cli_prints_a_table(capsys):
    argv = ["--device", "cpu", "--modes", "bf16-amp", "--sizes", "8", "--batch-size", "4"]
    assert B.main([*argv, "--repeats", "1", "--min-run-time", "0.01"]) == 0
    out = capsys.readouterr().out
    assert "bf16-amp" in out and "fp32" in out and "speed-up" in out
    with pytest.raises(SystemExit) as exc:
        B.main(["--modes", "fp64"])
    assert exc.value.code == 2


def test_cli_help_runs_as_a_module():
    done = subprocess.run(
        [sys.executable, "-m", "course.benchmark", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--device", "--modes", "--batch-size", "--sizes", "--repeats"):
        assert flag in done.stdout


def test_dashboard_run_button_measures_and_redraws():
    dash = BenchmarkDashboard("cpu", size=8, batch_sizes=(4, 8), batch_size=4, min_run_time=0.01)
    assert dash.checkboxes["tf32"].disabled and not dash.checkboxes["tf32"].value
    assert dash.results == [] and dash.throughput_bars == {}
    dash.checkboxes["fp16-amp"].value = False
    dash.button.click()
    assert dash.runs == 1
    assert set(dash.throughput_bars) == {"fp32", "bf16-amp"}
    assert all(r.batch_size == 4 for r in dash.results)
    assert dash.progress.value == dash.progress.max == 2
    assert dash.memory_bars == {}, "peak memory is not measured on the CPU"
    assert "measured on cpu" in dash.status.value
    first = dict(dash.throughput_bars)
    dash.batch.value = 8
    dash.checkboxes["fp16-amp"].value = True
    dash.button.click()
    assert dash.runs == 2 and all(r.batch_size == 8 for r in dash.results)
    assert set(dash.throughput_bars) == {"fp32", "fp16-amp", "bf16-amp"}
    assert dash.throughput_bars != first
    assert not dash.button.disabled


def test_dashboard_shows_progress_while_running_and_needs_a_mode():
    seen = []

    def fake_runner(modes, progress, batch_size, **kwargs):
        for i in range(3):
            progress(i + 1, 3, f"step {i}")
            seen.append((dash.progress.value, dash.progress.max, dash.button.disabled))
        return [
            B.Result(m, "mlp", 8, batch_size, "cpu", step_time=0.01, speedup=1.0)
            for m in ["fp32", *modes]
        ]

    dash = BenchmarkDashboard("cpu", size=8, runner=fake_runner)
    dash.run()
    assert seen == [(1, 3, True), (2, 3, True), (3, 3, True)]
    assert dash.throughput_bars["fp32"] == pytest.approx(64 / 0.01)
    for box in dash.checkboxes.values():
        box.value = False
    previous = dash.results
    assert dash.run() is previous and "Tick at least one mode" in dash.status.value


def test_fp8_helpers():
    assert fp8_max(torch.float8_e4m3fn) == 448.0 and fp8_max(torch.float8_e5m2) == 57344.0
    with pytest.raises(ValueError):
        fp8_max(torch.float16)
    table = cast_table([1e5, float("inf")]).splitlines()
    assert table[2].split() == ["100000", "448", "inf"]
    stream = drifting_tensors(steps=12, numel=256, spike_at=10)
    assert len(stream) == 12
    amax = [float(t.abs().max()) for t in stream]
    assert amax[10] > 4 * amax[9] and amax[11] < amax[10] / 4

    def clamp_only(x):
        return x.clamp(-448, 448).to(torch.float8_e4m3fn), 1.0

    log = replay_scaling(
        clamp_only, lambda q, s: q.float() / s, [torch.tensor([1.0, 1000.0])], torch.float8_e4m3fn
    )
    assert log["scale"] == [1.0] and log["saturated"] == [0.5] and log["amax"] == [1000.0]
    assert log["rel_error"][0] == pytest.approx(552 / (1000**2 + 1) ** 0.5)


def test_plot_training_curves_draws_both_runs_on_one_axes():
    fig = Figure()
    ax = fig.add_subplot()
    result = {
        "fp32_losses": [2.0, 1.0],
        "amp_losses": [2.1, 0.9],
        "fp32_acc": 0.9,
        "amp_acc": 0.85,
        "difference": 0.05,
    }
    curves = plot_training_curves(ax, result, "bf16 AMP")
    assert curves == [[2.0, 1.0], [2.1, 0.9]] and len(ax.lines) == 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "90.00%" in labels[0] and "bf16 AMP" in labels[1] and "85.00%" in labels[1]


def test_format_table_warns_when_rounds_disagree():
    calm = B.Result("fp32", "mlp", 8, 4, "cpu", step_time=0.01, speedup=1.0, times=(0.01, 0.012))
    busy = B.Result("bf16-amp", "mlp", 8, 4, "cpu", step_time=0.01, speedup=1.0, times=(0.01, 0.05))
    assert "warning" not in B.format_table([calm])
    text = B.format_table([calm, busy])
    assert "warning" in text and "bf16-amp, size 8, 3.0x" in text


def test_cpu_half_precision_flags_name_every_flag():
    flags = B.cpu_half_precision_flags()
    assert set(flags) == set(B.CPU_HALF_FLAGS) and all(type(v) is bool for v in flags.values())
    line = B.describe_cpu_half_precision()
    for flag in B.CPU_HALF_FLAGS:
        assert flag in line
