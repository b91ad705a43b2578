"""Unit tests for lesson 09's benchmark (course.benchmark) and helpers (course.capstone)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest
import torch
from matplotlib.figure import Figure

from course import benchmark as B
from course.capstone import BenchmarkDashboard, memory_breakdown, plot_memory_breakdown, plot_parity
from course.gpt import GPT, GPTConfig, random_batches, stdlib_corpus
from grader import REPO_ROOT

TINY = dict(sizes=(8,), batch_size=4, repeats=1, min_run_time=0.01, warmup=1, device="cpu")
#: A GPT small enough that even float16 autocast (slow on CPUs without AVX-512 FP16) is quick.
NANO = GPTConfig(vocab_size=256, block_size=16, n_layer=1, n_head=2, d_model=32, d_ff=64)
GPT_TINY = dict(
    model="gpt", config=NANO, batch_size=2, repeats=1, min_run_time=0.01, warmup=1, device="cpu"
)


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
    c = B.parse_mode("bf16-amp+compile")
    assert c.compiled and c.base == "bf16-amp" and not c.channels_last
    assert B.parse_mode("fp16-amp+cl+compile").channels_last
    for bad in ("bf16-amp+compile+compile", "fp32+fast"):
        with pytest.raises(ValueError, match="unknown mode"):
            B.parse_mode(bad)


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


def test_float32_precision_effect_reads_onednn_and_restores_the_setting():
    torch.set_float32_matmul_precision("medium")
    try:
        effect = B.float32_precision_effect(size=64)
        assert torch.get_float32_matmul_precision() == "medium"
    finally:
        torch.set_float32_matmul_precision("highest")
    # torch 2.13: "high" reaches oneDNN as "tf32" (not only CUDA's matmuls).
    assert effect.onednn_setting == "tf32"
    assert 0.0 <= effect.max_relative_difference < 1e-2 and effect.speedup > 0
    said = effect.sentence()
    assert "'tf32'" in said and "64x64" in said and f"{effect.speedup:.2f}x" in said
    assert ("same bits" in said) == effect.identical
    moved = B.PrecisionEffect("cpu", 8, "tf32", 4e-4, 1.7).sentence()
    assert "4.0e-04" in moved and "1.70x" in moved and "same bits" not in moved


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


def test_dashboard_run_button_measures_the_gpt_and_redraws():
    dash = BenchmarkDashboard("cpu", config=NANO, batch_sizes=(2, 4), batch_size=2)
    assert dash.checkboxes["tf32"].disabled and not dash.checkboxes["tf32"].value
    assert dash.results == [] and dash.throughput_bars == {}
    assert dash.selected_modes() == ["fp32", "bf16-amp"]
    dash.button.click()
    assert dash.runs == 1
    assert set(dash.throughput_bars) == {"fp32", "bf16-amp"}
    assert all(r.batch_size == 2 and r.unit == "tokens" for r in dash.results)
    assert dash.throughput_bars["fp32"] == pytest.approx(2 * 16 / dash.results[0].step_time)
    assert set(dash.mfu_bars) == {"fp32", "bf16-amp"} and all(v > 0 for v in dash.mfu_bars.values())
    assert dash.progress.value == dash.progress.max == 2
    assert dash.memory_bars == {}, "peak memory is not measured on the CPU"
    assert "measured on cpu" in dash.status.value
    first = dict(dash.throughput_bars)
    dash.batch.value = 4
    dash.checkboxes["bf16-amp"].value = False
    dash.button.click()
    assert dash.runs == 2 and all(r.batch_size == 4 for r in dash.results)
    assert set(dash.throughput_bars) == {"fp32"}
    assert dash.throughput_bars != first
    assert not dash.button.disabled


def test_dashboard_shows_progress_while_running_and_needs_a_mode():
    seen = []
    asked = {}

    def fake_runner(modes, progress, batch_size, **kwargs):
        asked.update(kwargs, modes=modes)
        for i in range(3):
            progress(i + 1, 3, f"step {i}")
            seen.append((dash.progress.value, dash.progress.max, dash.button.disabled))
        return [
            B.Result(
                m,
                "gpt",
                8,
                batch_size,
                "cpu",
                step_time=0.01,
                speedup=1.0,
                items_per_step=batch_size * 64,
                unit="tokens",
            )  # fmt: skip
            for m in ["fp32", *modes]
        ]

    def learners_count(config, tokens):  # the lesson passes its transformer_flops
        return 6 * tokens

    dash = BenchmarkDashboard("cpu", runner=fake_runner, flops_fn=learners_count)
    dash.compile.value = True
    dash.run()
    assert asked["modes"] == ["fp32+compile", "bf16-amp+compile"] and asked["model"] == "gpt"
    assert asked["flops_fn"] is learners_count, "the MFU must come from the learner's count"
    assert "your FLOP count" in dash.ax_mfu.get_title()
    assert seen == [(1, 3, True), (2, 3, True), (3, 3, True)]
    assert dash.throughput_bars["fp32"] == pytest.approx(8 * 64 / 0.01)
    for box in dash.checkboxes.values():
        box.value = False
    previous = dash.results
    assert dash.run() is previous and "Tick at least one mode" in dash.status.value


def test_gpt_benchmark_counts_tokens_flops_and_mfu():
    calls = []
    res = B.run_benchmark(["bf16-amp", "tf32"], progress=lambda *a: calls.append(a), **GPT_TINY)
    by = {r.mode: r for r in res}
    assert list(by) == ["fp32", "bf16-amp", "tf32"] and not by["tf32"].measured
    fp32, bf16 = by["fp32"], by["bf16-amp"]
    assert fp32.items_per_step == 2 * 16 and fp32.unit == "tokens"
    assert fp32.throughput == pytest.approx(32 / fp32.step_time)
    # 3x the forward matmuls: the linear layers and tied head, the scores and the values
    d, t, ff, v, tokens = 32, 16, 64, 256, 32
    linear = 2 * tokens * (4 * d * d + 2 * d * ff + d * v)
    attention = 2 * tokens * 2 * t * d
    assert fp32.flops == bf16.flops == 3 * (linear + attention)
    assert fp32.achieved == pytest.approx(fp32.flops / fp32.step_time)
    assert fp32.peak_datasheet is None and fp32.peak_measured > 0
    assert fp32.mfu_measured == pytest.approx(fp32.achieved / fp32.peak_measured)
    assert bf16.peak_measured != fp32.peak_measured, "each dtype has its own measured peak"
    text = B.format_table(res, "cpu")
    assert "tokens/s" in text and "MFU" in text and f"{fp32.flops:,}" in text
    own = B.run_benchmark(
        ["fp32"], flops_fn=lambda cfg, n: 1000 * n, measure_peaks=False, **GPT_TINY
    )
    assert own[0].flops == 32_000 and own[0].mfu_measured is None


def test_compiled_mode_reports_its_compile_time_apart(monkeypatch):
    """The first step of a +compile mode is timed on its own (torch.compile is replaced by an
    identity here: compiling for real takes tens of seconds on a CPU)."""
    wrapped = []
    monkeypatch.setattr(B.torch, "compile", lambda m: wrapped.append(m) or m)
    res = B.run_benchmark(["fp32+compile"], **GPT_TINY, measure_peaks=False)
    by = {r.mode: r for r in res}
    assert wrapped and by["fp32+compile"].compile_time > 0 and by["fp32"].compile_time is None
    assert "compile" in B.format_table(res)


def test_datasheet_peaks_and_measured_peak():
    assert B.datasheet_peak("cpu", "bf16") is None
    assert B.DATASHEET_TFLOPS["H200 SXM"]["bf16"] == B.DATASHEET_TFLOPS["H100 SXM"]["bf16"]
    assert set(B.REPORTED_NAMES) == set(B.DATASHEET_TFLOPS)
    assert B.measure_peak("cpu", "fp32", sizes=(32, 64)) > 0
    assert [B.peak_dtype(B.parse_mode(m)) for m in ("fp32", "tf32+compile", "fp16-amp")] == [
        "fp32",
        "tf32",
        "fp16",
    ]


def test_memory_breakdown_counts_each_part():
    train, _ = stdlib_corpus(max_bytes=50_000)
    x, y = next(random_batches(train, 4, NANO.block_size, seed=0))
    parts = {m: memory_breakdown(lambda: GPT(NANO), m, x, y) for m in ("fp32", "bf16-amp")}
    n_params = sum(p.numel() for p in GPT(NANO).parameters())
    for m, b in parts.items():
        assert b["weights"] == b["gradients"] == 4 * n_params, m
        assert b["optimizer state"] >= 2 * 4 * n_params, "AdamW keeps two float32 moments"
        assert "allocator peak" not in b
    assert parts["fp32"]["16-bit weight copies"] == 0
    # autocast's bf16 copies of the matmul weights (qkv, proj, two MLP layers, tied head)
    matmul_weights = 4 * 32 * 32 + 2 * 32 * 64 + 256 * 32
    assert parts["bf16-amp"]["16-bit weight copies"] == 2 * matmul_weights
    assert 0 < parts["bf16-amp"]["activations"] < parts["fp32"]["activations"]
    fig = Figure()
    ax = fig.add_subplot()
    plot_memory_breakdown(ax, parts, "test")
    assert len(ax.patches) == 2 * 5


def test_plot_parity_draws_fp32_and_each_amp_run():
    fig = Figure()
    ax = fig.add_subplot()
    run = {"fp32_losses": [3.0, 2.0, 1.0], "amp_losses": [3.0, 2.1, 1.1]}
    results = {
        "bf16": {**run, "fp32_val_loss": 1.5, "amp_val_loss": 1.6},
        "fp16": {"fp32_losses": [3.0], "amp_losses": [3.1], "fp32_val_loss": 2.5,
                 "amp_val_loss": 1.7},
    }  # fmt: skip
    plot_parity(ax, results, window=2)
    assert len(ax.lines) == 3
    assert list(ax.lines[0].get_ydata()) == [3.0, 2.5, 1.5]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "1.50000" in labels[0] and "bf16 AMP" in labels[1] and "fp32" not in labels[1]
    assert "1.70000" in labels[2] and "fp32 2.50000 after the same 1 steps" in labels[2]


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
    implication = B.cpu_precision_implication()
    native_bf16 = flags["amx_bf16"] or flags["avx512_bf16"]
    assert ("bfloat16 matmuls run natively" in implication) == native_bf16
    assert ("far slower" in implication) != (flags["amx_fp16"] or flags["avx512_fp16"])


def _lm_result(mode: str, step_time: float, peak: float, datasheet: float | None = None):
    """A made-up GPT row: 1e9 FLOPs per step, so ``1e9 / step_time`` FLOP/s achieved."""
    return B.Result(
        mode, "gpt", 8, 2, "cpu", step_time=step_time, times=(step_time,), speedup=1.0,
        items_per_step=128, unit="tokens", flops=10**9, peak_measured=peak,
        peak_datasheet=datasheet,
    )  # fmt: skip


def test_an_mfu_above_the_peak_is_said_plainly_not_clamped():
    """MFU above 100% of the measured matmul peak (a peak probe disturbed by a busy machine)
    is shown as it is and named, in the table and on the dashboard; below 100% nothing is said."""
    calm = _lm_result("fp32", 0.01, peak=2e11)  # 1e11 FLOP/s: 50%
    over = _lm_result("bf16-amp", 0.001, peak=2e12 / 3)  # 1e12 FLOP/s: 150%
    assert B.mfu_warnings([calm]) == []
    assert "warning" not in B.format_table([calm])
    (said,) = B.mfu_warnings([calm, over])
    assert said.startswith("bf16-amp: MFU 150% is above the matmul peak measured in this run")
    assert "rerun on a quiet machine" in said
    text = B.format_table([calm, over])
    assert f"warning: {said}." in text and "150.0%" in text, "the value itself, not clamped"
    sheet = B.mfu_warnings([_lm_result("fp16-amp", 0.001, peak=2e12, datasheet=5e11)])
    assert len(sheet) == 1 and "datasheet entry is not this device's" in sheet[0]

    def runner(modes, progress, batch_size, **kwargs):
        return [calm, over]

    dash = BenchmarkDashboard("cpu", runner=runner)
    dash.run()
    assert dash.mfu_bars["bf16-amp"] == pytest.approx(150.0)
    assert said in dash.status.value and "bf16-amp above 100%" in dash.ax_mfu.get_title()
    dash = BenchmarkDashboard("cpu", runner=lambda modes, progress, batch_size, **kw: [calm])
    dash.run()
    assert "warning" not in dash.status.value and "100%" not in dash.ax_mfu.get_title()
