"""Unit tests of course.float8 (lesson 08's helpers); of the lesson itself only the 2-rank
section's cells run here, on a torch without a CPU scaled_mm."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.utils.benchmark  # the stand-ins below replace its Timer, whatever ran first

import course.float8 as F8
from course.float8 import (
    FP8_FORMATS,
    Float8Explorer,
    TransformerBlock,
    cast_table,
    drifting_tensors,
    float8_matmul_support,
    fp8_emax,
    fp8_max,
    matmul_tflops,
    replay,
    replay_scaling,
    scaled_mm_kernels,
    scaled_mm_status,
    tensor_kind,
    torchao_status,
    trained_tensors,
)

F = torch.nn.functional
TENSOR, ROW = F.ScalingType.TensorWise, F.ScalingType.RowWise


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


def test_fp8_emax_is_the_exponent_of_the_largest_power_of_two():
    assert fp8_emax(torch.float8_e4m3fn) == 8 and fp8_emax(torch.float8_e5m2) == 15
    for fmt in FP8_FORMATS:
        assert 2.0 ** fp8_emax(fmt) <= fp8_max(fmt) < 2.0 ** (fp8_emax(fmt) + 1)


def test_replay_counts_saturated_and_flushed_elements():
    x = torch.tensor([1000.0, 1e-6, 2.0, 0.0])

    def roundtrip(t):
        return t.float(), t.float().clamp(-448, 448).to(torch.float8_e4m3fn).float()

    log = replay(roundtrip, [x], torch.float8_e4m3fn)
    assert log["saturated"] == [0.25]  # 1000 of the four elements
    assert log["flushed"] == [pytest.approx(1 / 3)]  # 1e-6 of the three non-zero ones
    assert log["amax"] == [1000.0]
    back = torch.tensor([448.0, 0.0, 2.0, 0.0])
    assert log["rel_error"][0] == pytest.approx(float((back - x).norm() / x.norm()))


def test_trained_tensors_records_what_the_layers_saw():
    records = trained_tensors(steps=3, record_last=2, batch_size=32)
    assert len(records) == 2
    last = records[-1]
    kinds = {name: tensor_kind(name) for name in last}
    assert sorted(kinds.values()).count("gradient") == 6
    assert kinds["fc2.input"] == "activation" and kinds["fc2.weight"] == "weight"
    assert last["fc1.input"].shape == (32, 64) and last["fc3.grad_output"].shape == (32, 10)
    for i in (1, 2, 3):
        # The weight gradient of a Linear is grad_output^T @ input: the hooks saw the right tensors.
        expect = last[f"fc{i}.grad_output"].t() @ last[f"fc{i}.input"]
        torch.testing.assert_close(last[f"fc{i}.weight.grad"], expect, rtol=1e-4, atol=1e-7)
    # The weights moved between the two recorded steps (one optimizer step apart).
    assert not torch.equal(records[0]["fc1.weight"], records[1]["fc1.weight"])
    with pytest.raises(ValueError):
        trained_tensors(steps=2, record_last=3)


def test_float8_matmul_support_says_why_not_on_a_cpu():
    ok, reason = float8_matmul_support("cpu")
    assert not ok and "8.9" in reason


@pytest.mark.parametrize(
    ("capability", "supported"), [((8, 0), False), ((8, 9), True), ((9, 0), True)]
)
def test_float8_matmul_support_on_cuda_needs_compute_capability_8_9(
    monkeypatch, capability, supported
):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "a test GPU")
    ok, reason = float8_matmul_support("cuda")
    assert ok is supported
    assert f"{capability[0]}.{capability[1]}" in reason
    assert supported or "8.9 or newer" in reason
    monkeypatch.setattr(torch.version, "hip", "6.2")
    ok, reason = float8_matmul_support("cuda")
    assert not ok and "ROCm" in reason


def test_matmul_tflops_runs_the_scaled_mm_path_on_a_cpu():
    rows = matmul_tflops([16, 32], "cpu", min_run_time=0.01)
    assert [r["n"] for r in rows] == [16, 32]
    for row in rows:
        assert row["bf16_s"] > 0 and row["fp8_s"] > 0 and row["fp8_fast_s"] > 0
        assert row["fp8_tflops"] == pytest.approx(2 * row["n"] ** 3 / row["fp8_s"] / 1e12)
        assert row["fp8_fast_tflops"] == pytest.approx(2 * row["n"] ** 3 / row["fp8_fast_s"] / 1e12)


def test_matmul_tflops_times_fast_accumulation_apart(monkeypatch):
    # Both accumulation modes are timed, each with its own flag; a kernel that refuses the fast
    # one leaves it None rather than failing the table.
    stmts = []

    class Record(_RunOnce):
        def blocked_autorange(self, min_run_time):
            stmts.append(self.stmt)
            if "use_fast_accum=True" in self.stmt:
                raise RuntimeError("use_fast_accum is not supported here")
            return super().blocked_autorange(min_run_time)

    monkeypatch.setattr(torch.utils.benchmark, "Timer", Record)
    (row,) = matmul_tflops([16], "cpu")
    assert [("use_fast_accum=False" in s, "use_fast_accum=True" in s) for s in stmts] == [
        (False, False),
        (True, False),
        (False, True),
    ]
    assert row["fp8_s"] == 1.0 and row["fp8_fast_s"] is None and row["fp8_fast_tflops"] is None


class _RunOnce:
    """A stand-in for torch.utils.benchmark.Timer that runs the statement once (median 1 s)."""

    def __init__(self, stmt, globals):
        self.stmt, self.globals = stmt, globals

    def blocked_autorange(self, min_run_time):
        eval(self.stmt, dict(self.globals))
        return type("Measurement", (), {"median": 1.0})()


def test_matmul_tflops_calls_scaled_mm_as_cuda_requires(monkeypatch):
    # No GPU here: fake CUDA tensors go through torch's meta checks of scaled_mm for CUDA
    # (row-major a, column-major b, dimensions multiples of 16, float32 scales).
    from torch._subclasses.fake_tensor import FakeTensorMode

    monkeypatch.setattr(torch.utils.benchmark, "Timer", _RunOnce)
    with FakeTensorMode():
        rows = matmul_tflops([16, 64], "cuda")
    assert [r["n"] for r in rows] == [16, 64]
    with FakeTensorMode():
        a8 = torch.empty(32, 32, device="cuda", dtype=torch.float8_e4m3fn)
        one = torch.ones((), device="cuda")
        with pytest.raises(RuntimeError, match="col_major"):  # the check the layout must pass
            F.scaled_mm(a8, a8, one, TENSOR, one, TENSOR, output_dtype=torch.bfloat16)


def test_lesson_row_wise_scales_fit_scaled_mm_on_cuda():
    # The lesson's row-wise call: scales from amax(dim=-1, keepdim=True), reciprocals, the
    # second one transposed to (1, N) and made contiguous.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        a = torch.randn(48, 64, device="cuda")
        w = torch.randn(32, 64, device="cuda")
        sa = 448.0 / a.abs().amax(dim=-1, keepdim=True)
        sw = 448.0 / w.abs().amax(dim=-1, keepdim=True)
        qa, qw = (a * sa).to(torch.float8_e4m3fn), (w * sw).to(torch.float8_e4m3fn)
        y = F.scaled_mm(qa, qw.t(), sa.reciprocal(), ROW, sw.reciprocal().t().contiguous(), ROW)
        assert y.shape == (48, 32) and y.device.type == "cuda"
    # The same call runs on the CPU's kernel.
    qa, qw = torch.ones(48, 64).to(torch.float8_e4m3fn), torch.ones(32, 64).to(torch.float8_e4m3fn)
    sa, sw = torch.ones(48, 1), torch.ones(32, 1)
    assert F.scaled_mm(qa, qw.t(), sa, ROW, sw.t().contiguous(), ROW).shape == (48, 32)


def test_scaled_mm_scales_are_dequantization_factors():
    # The convention the lesson states: scaled_mm multiplies by scale_a and scale_b.
    gen = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, 32, generator=gen), torch.randn(48, 32, generator=gen)
    a8, b8 = (a * 4).to(torch.float8_e4m3fn), (b * 8).to(torch.float8_e4m3fn)
    quarter, eighth = torch.tensor(0.25), torch.tensor(0.125)
    out = F.scaled_mm(a8, b8.t(), quarter, TENSOR, eighth, TENSOR, output_dtype=torch.float32)
    expect = (a8.float() / 4) @ (b8.float() / 8).t()
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)
    rows = torch.full((16, 1), 0.25), torch.full((1, 48), 0.125)
    out = F.scaled_mm(a8, b8.t(), rows[0], ROW, rows[1], ROW, output_dtype=torch.float32)
    torch.testing.assert_close(out, expect, rtol=1e-5, atol=1e-5)


def test_scaled_mm_refuses_mxfp8_block_scales_on_a_cpu():
    # What the lesson says: on a CPU, torch 2.13 runs TensorWise and RowWise, not BlockWise1x32.
    a8 = torch.ones(16, 32).to(torch.float8_e4m3fn)
    e8m0 = torch.full((16, 1), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu)
    with pytest.raises(ValueError, match="Invalid scaling configuration"):
        F.scaled_mm(
            a8,
            a8.t(),
            e8m0,
            F.ScalingType.BlockWise1x32,
            e8m0,
            F.ScalingType.BlockWise1x32,
            swizzle_a=F.SwizzleType.NO_SWIZZLE,
            swizzle_b=F.SwizzleType.NO_SWIZZLE,
        )


def test_transformer_block_is_causal_and_keeps_the_shape():
    torch.manual_seed(0)
    block = TransformerBlock(dim=32, heads=4)
    x = torch.randn(2, 6, 32)
    y = block(x)
    assert y.shape == x.shape
    x2 = x.clone()
    x2[:, -1] += 1.0  # changing the last position changes no earlier output
    torch.testing.assert_close(block(x2)[:, :-1], y[:, :-1])
    assert {n for n, m in block.named_modules() if isinstance(m, torch.nn.Linear)} == {
        "qkv",
        "proj",
        "up",
        "down",
    }
    with pytest.raises(ValueError):
        TransformerBlock(dim=30, heads=4)


def test_torchao_status_without_torchao(monkeypatch):
    monkeypatch.setattr(F8.importlib.util, "find_spec", lambda name: None)
    module, line = torchao_status()
    assert module is None and "not installed" in line


def _quantize_tensorwise(t):
    """Tensor-wise current scaling in e4m3fn: (float8 tensor, scale fmax / amax)."""
    amax = t.float().abs().amax()
    scale = 448.0 / amax
    return (t.float() * scale).clamp(-448, 448).to(torch.float8_e4m3fn), scale


def _two_roundings_bound(qa, scale_a, qb, scale_b, y1, y2):
    """How far two correct kernels' bfloat16 products of the same float8 operands can differ,
    element by element, where both accumulate in float32 and round to nearest once at the end.

    Each kernel's float32 result is the exact sum z plus an error below (K + 2) 2^-24 sum|a b|
    (K float32 additions and the dequantizing multiplications), and rounding to bfloat16 moves
    it by at most half a step, 2^-8 of its magnitude. So |y1 - y2| <= 2^-8 (|y1| + |y2|) (1.01
    for the step measured at the rounded values) + 2 (K + 2) 2^-24 (|A| @ |B|)."""
    a = qa.double() * scale_a.double()
    b = qb.double() * scale_b.double()
    sums = a.abs() @ b.abs()
    k = a.shape[1]
    return 2**-8 * 1.01 * (y1.double().abs() + y2.double().abs()) + 2 * (k + 2) * 2.0**-24 * sums


def test_torchao_float8_linear_is_current_scaling_and_scaled_mm():
    """What lesson 08 shows on its page: torchao's default Float8Linear forward is torch._scaled_mm
    of the tensor-wise current-scaled input and weight (inverse scales, bfloat16 out, the
    output GEMM's use_fast_accum), plus the bias, bit for bit on any CPU (the same kernel);
    F.scaled_mm of the same operands equals it where both run the same CPU kernel and stays
    within two roundings of it where they do not (oneDNN on a CPU with AMX-INT8); a block
    converted with each recipe stays close to bfloat16."""
    import copy

    module, _ = torchao_status()
    if module is None:
        pytest.skip("torchao is not installed")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 96)).to(torch.bfloat16)
    layer8 = copy.deepcopy(layer)
    convert_to_float8_training(layer8)
    assert type(layer8[0]).__name__ == "Float8Linear"
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        got = layer8(x)

    (qx, sx), (qw, sw) = _quantize_tensorwise(x), _quantize_tensorwise(layer[0].weight.detach())
    bias = layer[0].bias.detach()
    fast = layer8[0].config.gemm_config_output.use_fast_accum
    assert fast is True  # torchao's forward GEMM asks for fast accumulation (config.py)
    same_call = torch._scaled_mm(
        qx,
        qw.t(),
        scale_a=sx.reciprocal(),
        scale_b=sw.reciprocal(),
        out_dtype=torch.bfloat16,
        use_fast_accum=fast,
    )
    assert torch.equal(same_call + bias, got)  # the call torchao makes: the same kernel
    assert not torch.equal(same_call, got)  # the bias is added after the float8 product
    y = F.scaled_mm(qx, qw.t(), sx.reciprocal(), TENSOR, sw.reciprocal(), TENSOR)
    same_kernel, _ = scaled_mm_kernels("cpu")
    if same_kernel:
        assert torch.equal(y, same_call)
    else:
        bound = _two_roundings_bound(qx, sx.reciprocal(), qw.t(), sw.reciprocal(), y, same_call)
        assert bool(((y.double() - same_call.double()).abs() <= bound).all())
    for recipe in ("tensorwise", "rowwise"):
        torch.manual_seed(0)
        block = TransformerBlock(64, 4).to(torch.bfloat16)
        block8 = copy.deepcopy(block)
        convert_to_float8_training(block8, config=Float8LinearConfig.from_recipe_name(recipe))
        xb = torch.randn(2, 16, 64, dtype=torch.bfloat16)
        with torch.no_grad():
            out, out8 = block(xb).float(), block8(xb).float()
        assert 0 < float((out8 - out).norm() / out.norm()) < 0.2, recipe


def test_private_and_public_scaled_mm_agree_on_the_float32_cpu_path(monkeypatch):
    # With oneDNN off, torch._scaled_mm takes the float32 path F.scaled_mm always takes on a CPU
    # (AMX-INT8 or not): the same kernel, so the same bits, with or without fast accumulation.
    torch.manual_seed(1)
    (qa, sa), (qb, sb) = (
        _quantize_tensorwise(torch.randn(48, 64)),
        _quantize_tensorwise(torch.randn(32, 64)),
    )
    y = F.scaled_mm(qa, qb.t(), sa.reciprocal(), TENSOR, sb.reciprocal(), TENSOR)
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert scaled_mm_kernels("cpu")[0]
    for fast in (False, True):
        private = torch._scaled_mm(
            qa,
            qb.t(),
            scale_a=sa.reciprocal(),
            scale_b=sb.reciprocal(),
            out_dtype=torch.bfloat16,
            use_fast_accum=fast,
        )
        assert torch.equal(private, y)


def test_two_roundings_bound_holds_for_another_correct_kernel():
    # The float64 product rounded once to bfloat16 is another correct kernel: it stays within
    # the bound of F.scaled_mm's result, and the bound is below two bfloat16 steps.
    torch.manual_seed(2)
    (qa, sa), (qb, sb) = (
        _quantize_tensorwise(torch.randn(64, 256)),
        _quantize_tensorwise(torch.randn(48, 256)),
    )
    y = F.scaled_mm(qa, qb.t(), sa.reciprocal(), TENSOR, sb.reciprocal(), TENSOR)
    exact = (qa.double() / sa.double()) @ (qb.double() / sb.double()).t()
    other = exact.to(torch.bfloat16)
    bound = _two_roundings_bound(qa, sa.reciprocal(), qb.t(), sb.reciprocal(), y, other)
    assert bool(((y.double() - other.double()).abs() <= bound).all())
    # Not a loose bound: for the typical element it is about one bfloat16 step.
    assert float((bound / y.double().abs().clamp(min=1e-6)).median()) < 2**-6


def test_scaled_mm_kernels_says_when_torch_scaled_mm_runs_onednn(monkeypatch):
    caps = dict(torch.cpu.get_capabilities())
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**caps, "amx_int8": True})
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", True)
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    same, sentence = scaled_mm_kernels("cpu")
    assert not same and "oneDNN" in sentence
    monkeypatch.setattr(torch.backends.mkldnn, "enabled", False)
    assert scaled_mm_kernels("cpu")[0]
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: {**caps, "amx_int8": False})
    assert scaled_mm_kernels("cpu")[0]
    same, sentence = scaled_mm_kernels("cuda")
    assert not same and "use_fast_accum" in sentence


def _clamp_recipe(fmt, margin):
    scale = 100.0 * 2.0**margin  # a fake recipe: a larger margin makes more saturate here
    fmax = fp8_max(fmt)

    def roundtrip(x):
        scaled = x.float() * scale
        return scaled, scaled.clamp(-fmax, fmax).to(fmt).float() / scale

    return roundtrip


def _unwritten(fmt, margin):
    def roundtrip(x):
        raise NotImplementedError

    return roundtrip


def test_explorer_replays_the_chosen_recipe_and_reports_unwritten_ones():
    explorer = Float8Explorer(
        {"clamp": _clamp_recipe, "todo": _unwritten}, steps=8, numel=256, row=64
    )
    assert explorer.log is not None and len(explorer.log["rel_error"]) == 8
    assert "on cpu" in explorer.stats.value
    explorer.spike.value = 3
    assert explorer.log["amax"][3] > 4 * explorer.log["amax"][2]
    before = sum(explorer.log["saturated"])
    explorer.margin.value = 4
    assert sum(explorer.log["saturated"]) > before
    explorer.recipe.value = "todo"
    assert explorer.log is None and "write its exercise" in explorer.stats.value
    with pytest.raises(ValueError):
        Float8Explorer({"clamp": _clamp_recipe}, numel=100, row=64)
    with pytest.raises(ValueError):
        Float8Explorer({})


def test_casts_overflow_to_nan_only_beyond_the_range():
    from grader.lessons.l08_float8.inputs import with_nan_overflow

    x = torch.tensor([1.0, -448.0, 500.0, -7e4, 3e38])
    with F8.CastsOverflowToNaN():
        e4 = x.to(torch.float8_e4m3fn).float()
        e5 = x.to(torch.float8_e5m2).float()
        into = torch.empty(5, dtype=torch.float8_e4m3fn).copy_(x.bfloat16()).float()
        clamped = x.clamp(-448, 448).to(torch.float8_e4m3fn).float()
        back = clamped.to(torch.float8_e4m3fn).view(torch.uint8)  # float8 to float8 untouched
    assert e4[:2].tolist() == [1.0, -448.0] and e4[2:].isnan().all()
    assert e5[:3].tolist() == [1.0, -448.0, 512.0] and e5[3:].isnan().all()
    assert into[2:].isnan().all() and clamped.tolist() == [1.0, -448.0, 448.0, -448.0, 448.0]
    assert back.tolist() == clamped.to(torch.float8_e4m3fn).view(torch.uint8).tolist()
    # Outside the mode the cast is the build's own (torch 2.13 on a CPU saturates e4m3fn).
    assert not x.to(torch.float8_e4m3fn).float().isnan().any()
    strict = with_nan_overflow(lambda t: t.to(torch.float8_e4m3fn))
    assert strict(x).float()[2:].isnan().all()


def test_torchao_import_noise_filter_drops_only_its_two_records(monkeypatch):
    import logging

    noise = F8._TorchaoImportNoise()

    def record(name, msg, *args):
        return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, None)

    class FromTorchao:
        __module__ = "torchao.quantization"

    class Elsewhere:
        __module__ = "mypackage"

    enum_msg = "%s is an Enum subclass and is now natively supported by torch.compile"
    monkeypatch.setattr(torch.version, "cuda", None)
    assert not noise.filter(record("torchao", "Failed to load /x/_C_mxfp8.so: nope"))
    assert not noise.filter(record("torch.utils._pytree", enum_msg, FromTorchao))
    assert noise.filter(record("torch.utils._pytree", enum_msg, Elsewhere))
    assert noise.filter(record("torchao", "something else went wrong"))
    assert noise.filter(record("course", "Failed to load /x/_C_mxfp8.so: nope"))
    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a CUDA build must hear of it
    assert noise.filter(record("torchao", "Failed to load /x/_C_mxfp8.so: nope"))


def test_scaled_mm_status_says_why_a_device_has_no_kernel(monkeypatch):
    assert scaled_mm_status("cpu") == (True, "")  # torch 2.13 has CPU kernels

    def missing(*args, **kwargs):
        raise NotImplementedError(
            "Could not run 'aten::_scaled_mm_v2' with arguments from the 'CPU' backend. This "
            "could be because the operator doesn't exist for this backend.\nmore"
        )

    monkeypatch.setattr(F, "scaled_mm", missing)
    ok, reason = scaled_mm_status("cpu")
    assert not ok
    assert reason == (
        "NotImplementedError: Could not run 'aten::_scaled_mm_v2' with arguments from the "
        "'CPU' backend."
    )


def test_two_rank_section_is_left_out_without_a_cpu_scaled_mm(capsys):
    """Lesson 08's 2-rank cells where F.scaled_mm has no CPU kernel (torch 2.11's gloo ranks on
    a GPU machine): they say why, start no ranks, and the plot cell reads nothing missing."""
    import matplotlib
    import nbformat

    from course.launch import describe_backend, pick_backend
    from tests.conftest import SOLUTIONS, lesson_notebook

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nb = nbformat.read(lesson_notebook(SOLUTIONS, "08-float8"), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    first = next(i for i, s in enumerate(cells) if "def gathered_matmul(" in s)
    launched: list = []
    reason = "NotImplementedError: Could not run 'aten::_scaled_mm_v2'"
    namespace = {
        "torch": torch,
        "plt": plt,
        "device": torch.device("cpu"),
        "last": {"fc2.weight": torch.randn(6, 4), "fc2.input": torch.randn(3, 4)},
        "tensor_kind": tensor_kind,
        "describe_backend": describe_backend,
        "pick_backend": pick_backend,
        "launch": lambda *args, **kwargs: launched.append(args),
        "scaled_mm_status": lambda device: (False, reason),
    }
    for source in cells[first : first + 2]:
        exec(source, namespace)  # noqa: S102 - the lesson's own code
    out = capsys.readouterr().out
    assert not launched and namespace["gather"] == {} and namespace["chosen"] == []
    assert "the 2-rank experiment is left out" in out and reason in out
    assert "no plot" in out


def test_the_pages_round_up_rule_saturates_nothing_and_matches_torchaos_rceil():
    """Lesson 08's two MX rules on random blocks with a wide spread: the solution's floor rule
    equals torchao's FLOOR and the page's round-up rule (``mx_quantize_rceil``) its RCEIL, bit
    for bit; the floor rule saturates some blocks' largest elements, the round-up rule none."""
    import ast

    import nbformat

    from tests.conftest import SOLUTIONS, lesson_notebook

    pytest.importorskip("torchao.prototype.mx_formats")
    from torchao.prototype.mx_formats.config import ScaleCalculationMode
    from torchao.prototype.mx_formats.mx_tensor import to_mx

    nb = nbformat.read(lesson_notebook(SOLUTIONS, "08-float8"), as_version=4)
    cells = [c.source for c in nb.cells if c.cell_type == "code"]
    namespace = {"torch": torch, "fp8_max": fp8_max, "fp8_emax": F8.fp8_emax}
    for name in ("mx_quantize", "mx_quantize_rceil"):  # the functions alone, not the cells
        tree = ast.parse(next(s for s in cells if s.startswith(f"def {name}(")))
        only = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        exec(compile(ast.Module(only, []), name, "exec"), namespace)  # noqa: S102
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(64, 256, generator=gen) * torch.exp2(torch.randint(-20, 20, (64, 1)).float())
    fmax = fp8_max(torch.float8_e4m3fn)
    saturated = {}
    for rule, mode, mine in (
        ("floor", ScaleCalculationMode.FLOOR, namespace["mx_quantize"]),
        ("rceil", ScaleCalculationMode.RCEIL, namespace["mx_quantize_rceil"]),
    ):
        scale, data = to_mx(x.contiguous(), torch.float8_e4m3fn, 32, mode)
        q, e = mine(x, 32, torch.float8_e4m3fn)
        assert torch.equal(scale.view(torch.uint8).int().reshape(e.shape) - 127, e.int()), rule
        assert torch.equal(data.view(torch.uint8), q.view(torch.uint8)), rule
        per_element = e.repeat_interleave(32, dim=-1).float()
        saturated[rule] = int(((x * torch.exp2(-per_element)).abs() > fmax).sum())
    assert saturated["floor"] > 0 and saturated["rceil"] == 0, saturated


def test_first_sentence_keeps_one_line_of_torchs_long_refusal():
    """Lesson 08 prints first_sentence(exc) where a torch refuses scaled_mm: torch 2.11's CPU
    refusal (rehearsed by scripts/older_torch.py in its real shape, about 50 lines) becomes its
    type and first sentence."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
    try:
        import older_torch
    finally:
        sys.path.pop(0)
    message = older_torch.NO_CPU_KERNEL
    assert message.count("\n") >= 5 and len(message) > 500
    got = F8.first_sentence(NotImplementedError(message))
    assert got == (
        "NotImplementedError: Could not run 'aten::_scaled_mm_v2' with arguments from the "
        "'CPU' backend."
    )
    assert F8.first_sentence(RuntimeError("")) == "RuntimeError"
