"""Unit tests for course/autocast.py (lesson 03): the op lists against torch, the models, the
widget."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course import autocast as A
from grader.lessons.l03_autocast import inputs as I


def _autocast_kernels(key: str) -> set[str]:
    """Every op overload with a ``key`` kernel in the installed torch's dispatcher."""
    found = set()
    for op in torch._C._dispatch_get_all_op_names():
        if op.startswith("aten::") and f"\n{key}:" in torch._C._dispatch_dump(op):
            found.add(op.removeprefix("aten::"))
    return found


def test_dispatch_dump_shows_autocast_kernels_in_this_cpu_build():
    dump = torch._C._dispatch_dump("aten::linear")
    assert "\nAutocastCUDA:" in dump and "\nAutocastCPU:" in dump
    assert "\nAutocastCUDA:" not in torch._C._dispatch_dump("aten::batch_norm")


def test_every_cuda_autocast_kernel_is_classified_and_every_listed_op_has_one():
    kernels = _autocast_kernels("AutocastCUDA")
    listed = set(A.cuda_overloads())
    assert kernels - listed == set(), "CUDA autocast kernels on no list"
    assert listed - kernels == set(), "listed CUDA ops with no AutocastCUDA kernel"
    header = {n for names in A.parse_header(A.HEADER.read_text()).values() for n in names}
    cudnn = {op for op in A.CUDNN_BUILD_ONLY if op in kernels}
    assert kernels - header == set(A.CUDA_OUTSIDE_HEADER) | cudnn
    if torch.version.cuda is None:  # a CPU wheel registers no cuDNN kernel
        assert cudnn == set()


def test_a_cudnn_builds_rnn_kernel_is_listed_where_the_dispatcher_has_it(monkeypatch):
    """A CUDA build with cuDNN registers an AutocastCUDA kernel for _cudnn_rnn (seen on an
    H200 with torch 2.11): the lists then include it, so no kernel is left unclassified."""
    assert "_cudnn_rnn" not in A.cuda_overloads() or torch.version.cuda is not None
    real = A._has_cuda_autocast_kernel
    monkeypatch.setattr(A, "_has_cuda_autocast_kernel", lambda op: op == "_cudnn_rnn" or real(op))
    assert A.cuda_overloads()["_cudnn_rnn"] == A.LOWER


def test_every_cpu_autocast_kernel_is_measured_and_every_probe_has_one():
    kernels = _autocast_kernels("AutocastCPU")
    probed = set(A._probes())
    assert kernels - probed == set(), "CPU autocast kernels this course does not measure"
    assert probed - kernels == set(), "measured CPU ops with no AutocastCPU kernel"
    assert len(kernels) > 100


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_every_cpu_autocast_kernel_has_a_measured_policy(dtype):
    policies = A.cpu_overloads(dtype)
    unclassified = [op for op, policy in policies.items() if policy == A.NO_LIST]
    assert not unclassified, f"CPU autocast left these inputs alone: {unclassified}"
    stored = {name: policy for policy, names in A.CPU_MEASURED.items() for name in names}
    changed = {op: (stored.get(op), got) for op, got in policies.items() if stored.get(op) != got}
    assert not changed, f"CPU_MEASURED (stored, measured) differs from this torch: {changed}"
    assert set(stored) == set(policies)
    assert policies["linear"] == policies["scaled_dot_product_attention"] == A.LOWER
    assert policies["binary_cross_entropy"] == policies["fft_fft"] == A.FLOAT32
    assert policies["cat"] == policies["stack"] == A.PROMOTE


def _cpu_kernel_bases() -> set[str]:
    return {name.split(".")[0] for names in A.CPU_MEASURED.values() for name in names}


def test_cuda_listed_ops_without_a_cpu_kernel_are_measured_through_their_parts():
    bases = _cpu_kernel_bases()
    need = {n for n in A.cuda_overloads() if n.split(".")[0] not in bases}
    need -= set(A.CUDA_ONLY_KERNELS)
    assert set(A._parts_probes()) == need
    for name in A.CUDA_ONLY_KERNELS:
        dump = torch._C._dispatch_dump(f"aten::{name}")
        assert "\nCPU:" not in dump and "CompositeImplicitAutograd" not in dump, name
    for dtype in (torch.bfloat16, torch.float16):
        by_base: dict[str, set[str]] = {}
        for op in sorted(need):
            by_base.setdefault(op.split(".")[0], set()).add(A.measure_cpu_policy(op, dtype))
        got = {base: min(p) for base, p in by_base.items() if p != {A.NO_LIST}}
        assert all(len(p) == 1 for p in by_base.values()), by_base
        assert got == A.CPU_VIA_PARTS, f"measured through their parts under {dtype}: {got}"


def test_cross_entropy_runs_as_log_softmax_and_nll_loss():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        @classmethod
        def _should_skip_dynamo(cls):
            return False

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.append(func.__name__)
            return func(*args, **(kwargs or {}))

    seen = []
    logits, target = torch.randn(3, 5), torch.tensor([0, 2, 4])
    with Ops():
        F.cross_entropy(logits, target)
    assert seen == ["_log_softmax.default", "nll_loss_forward.default"], seen
    assert "\nAutocastCUDA:" not in torch._C._dispatch_dump("aten::cross_entropy_loss")
    assert A.op_policy("nll_loss", "cuda") == A.CUDA_VIA_PARTS["cross_entropy_loss"]


def test_measurement_tells_the_policies_apart(monkeypatch):
    # Probes whose casts differ: each is read as the policy it has, and an op autocast leaves
    # alone reads as "no list".
    probes = A._probes()
    probes["relu (test)"] = lambda t: torch.relu(t(3, 4))
    monkeypatch.setattr(A, "_probes", lambda: probes)
    assert A.measure_cpu_policy("relu (test)") == A.NO_LIST
    assert A.measure_cpu_policy("mm") == A.LOWER
    assert A.measure_cpu_policy("mse_loss", torch.float16) == A.FLOAT32
    assert A.measure_cpu_policy("index_copy") == A.PROMOTE


def test_parse_header_reads_overloads_and_refuses_a_header_without_lists():
    text = A.HEADER.read_text()
    lists = A.parse_header(text)
    assert "scaled_dot_product_attention" in lists["AT_FORALL_LOWER_PRECISION_FP"]
    assert "conv_transpose2d.input" in lists["AT_FORALL_LOWER_PRECISION_FP"]
    assert "softmax.int" in lists["AT_FORALL_FP32_SET_OPT_DTYPE"]
    assert lists["AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE"] == (
        "norm.Scalar",
        "norm.ScalarOpt_dim",
    )
    with pytest.raises(ValueError):
        A.parse_header(text.replace("AT_FORALL_PROMOTE", "AT_FORALL_SOMETHING"))


def test_batchnorm_is_on_no_list_and_softmax_differs():
    for device_type in ("cuda", "cpu"):
        for op in ("batch_norm", "mean", "amax", "var", "relu", "add"):
            assert A.op_policy(op, device_type) == A.NO_LIST, (op, device_type)
    for op in (
        "scaled_dot_product_attention",
        "einsum",
        "bmm",
        "baddbmm",
        "matmul",
        "conv2d",
        "linear",
        "lstm_cell",
        "gru_cell",
        "rnn_tanh_cell",
    ):
        assert A.op_policy(op, "cuda") == A.LOWER, op
    for op in (
        "logsumexp",
        "huber_loss",
        "nll_loss2d",
        "layer_norm",
        "group_norm",
        "softmax",
        "log_softmax",
        "sum",
        "cumsum",
        "prod",
        "mse_loss",
        "nll_loss",
    ):
        assert A.op_policy(op, "cuda") == A.FLOAT32, op
    assert A.op_policy("softmax", "cpu") == A.NO_LIST
    diffs = A.list_differences()
    assert ("softmax", A.FLOAT32, A.NO_LIST) in diffs
    assert ("layer_norm", A.FLOAT32, A.NO_LIST) in diffs
    assert ("avg_pool3d", A.NO_LIST, A.FLOAT32) in diffs
    assert ("lstm_cell", A.LOWER, A.NO_LIST) in diffs
    assert ("tensordot", A.PROMOTE, A.LOWER) in diffs  # CPU: no kernel, runs as mm
    same = {
        "scaled_dot_product_attention",
        "huber_loss",
        "nll_loss2d",
        "cross_entropy_loss",
        "linear",
        "mse_loss",
        "prod",
        "einsum",
        "linalg_multi_dot",
    }
    assert not same & {op for op, _, _ in diffs}, "ops on the same list reported as different"
    assert A.op_policy("binary_cross_entropy", "cuda") == A.REFUSED
    assert A.op_policy("binary_cross_entropy", "cpu") == A.FLOAT32
    assert A.op_policy("cross_entropy", "cpu") == A.FLOAT32  # aten::cross_entropy_loss
    assert A.op_policy("cross_entropy", "cuda") == A.FLOAT32  # runs as log_softmax, nll_loss
    assert A.op_policy("einsum", "cpu") == A.LOWER  # no CPU kernel: runs as bmm
    assert A.op_policy("__matmul__", "cpu") == A.LOWER
    with pytest.raises(ValueError):
        A.op_policy("linear", "tpu")


def test_documented_dtype_rules():
    h, b, s = torch.float16, torch.bfloat16, torch.float32
    assert A.documented_dtype("linear", (s,), "cuda", h) == h
    assert A.documented_dtype("linear", (s,), "cpu", b) == b
    assert A.documented_dtype("softmax", (h,), "cuda", h) == s
    assert A.documented_dtype("softmax", (b,), "cpu", b) == b
    assert A.documented_dtype("addcmul", (h, s, h), "cuda", h) == s
    assert A.documented_dtype("add", (s, h), "cuda", h) == s
    assert A.documented_dtype("relu", (h,), "cuda", h) == h
    assert A.documented_dtype("cross_entropy", (h,), "cuda", h) == s
    with pytest.raises(RuntimeError):
        A.documented_dtype("binary_cross_entropy", (h,), "cuda", h)
    with pytest.raises(ValueError):
        A.documented_dtype("relu", (), "cuda", h)


_CPU_CALLS = {
    "linear": lambda a, t: F.linear(a, a),
    "matmul": lambda a, t: a @ a.T,
    "softmax": lambda a, t: torch.softmax(a, -1),
    "log_softmax": lambda a, t: F.log_softmax(a, -1),
    "layer_norm": lambda a, t: F.layer_norm(a, (8,)),
    "batch_norm": lambda a, t: F.batch_norm(a, None, None, training=True),
    "exp": lambda a, t: a.exp(),
    "relu": lambda a, t: F.relu(a),
    "mse_loss": lambda a, t: F.mse_loss(a, t),
    "l1_loss": lambda a, t: F.l1_loss(a, t),
    "binary_cross_entropy": lambda a, t: F.binary_cross_entropy(torch.sigmoid(a), t),
    "cat": lambda a, t: torch.cat([a, t]),
    "stack": lambda a, t: torch.stack([a, t]),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("op", sorted(_CPU_CALLS))
def test_cpu_lists_match_what_cpu_autocast_measures(op, dtype):
    a = torch.randn(4, 8).to(dtype)  # an activation in the low precision dtype
    t = (torch.rand(4, 8) > 0.5).float()  # float32 targets
    with torch.amp.autocast("cpu", dtype=dtype):
        got = _CPU_CALLS[op](a, t).dtype
    inputs = (dtype, torch.float32) if op in ("cat", "stack") else (dtype,)
    assert got == A.documented_dtype(op, inputs, "cpu", dtype), op


def _trace(model, inputs, device_type, dtype):
    out, handles = {}, []
    try:
        for name, mod in model.named_modules():
            if name:
                handles.append(
                    mod.register_forward_hook(
                        lambda m, a, o, name=name: out.__setitem__(name, o.dtype)
                    )
                )
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return out


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_row_attention_documented_cpu_table_matches_measurement(dtype):
    model, x = A.row_attention(), torch.rand(5, 1, 8, 8)
    measured = _trace(model, (x,), "cpu", dtype)
    assert list(measured) == list(A.ROW_ATTENTION_OPS)
    assert measured == A.documented_layer_dtypes(A.ROW_ATTENTION_OPS, "cpu", dtype)


def test_row_attention_documented_cuda_table():
    got = A.documented_layer_dtypes(A.ROW_ATTENTION_OPS, "cuda", torch.float16)
    fp32 = {name for name, d in got.items() if d == torch.float32}
    assert fp32 == {"norm", "softmax", "log_probs"}
    assert all(d == torch.float16 for name, d in got.items() if name not in fp32)


_FAKE_CUDA = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    from torch import nn
    from course import autocast as A
    try:
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        mode.__enter__()
        torch.empty(1, device="cuda")
    except Exception as exc:
        print("SETUP_FAILED", exc)
        raise SystemExit(0)
    # Run torch's own AutocastCUDA kernels on fake CUDA tensors (no GPU needed).
    torch.set_autocast_enabled("cuda", True)
    torch.set_autocast_dtype("cuda", torch.float16)
    torch.autocast_increment_nesting()
    h = torch.empty(4, 8, device="cuda", dtype=torch.float16)
    s = torch.empty(4, 8, device="cuda")
    w = torch.empty(8, 8, device="cuda")
    calls = {
        "linear": lambda: F.linear(s, w), "matmul": lambda: s @ w,
        "softmax": lambda: torch.softmax(h, -1), "log_softmax": lambda: F.log_softmax(h, -1),
        "layer_norm": lambda: F.layer_norm(h, (8,)), "exp": lambda: h.exp(),
        "sum": lambda: h.sum(), "relu": lambda: F.relu(h), "gelu": lambda: F.gelu(h),
        "mse_loss": lambda: F.mse_loss(h, h), "addcmul": lambda: torch.addcmul(h, s, h),
        "binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits(h, h),
        "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(s, s, s),
        "einsum": lambda: torch.einsum("ij,kj->ik", s, w),
        "logsumexp": lambda: torch.logsumexp(h, -1), "huber_loss": lambda: F.huber_loss(h, h),
        "nll_loss2d": lambda: F.nll_loss(h.view(1, 4, 2, 4), torch.zeros(1, 2, 4, device="cuda",
                                                                         dtype=torch.long)),
        "cumsum": lambda: h.cumsum(-1), "mean": lambda: h.mean(), "amax": lambda: h.amax(),
        "add": lambda: h + s,
    }
    for name, call in calls.items():
        print("OP", name, str(call().dtype).removeprefix("torch."))
    # An explicit dtype= wins over the float32 list (fp32_set_opt_dtype fills in a missing one).
    print("EXPLICIT softmax", str(torch.softmax(h, -1, dtype=torch.float16).dtype))
    print("EXPLICIT sum", str(h.sum(dtype=torch.float16).dtype))
    try:
        F.binary_cross_entropy(h, h)
        print("OP binary_cross_entropy ran")
    except RuntimeError:
        print("OP binary_cross_entropy raises")
    # cudnn_convolution has no fake kernel: read the casts its autocast kernel makes first.
    for name, call in {
        "cudnn_convolution": lambda x, k: torch.ops.aten.cudnn_convolution(
            x, k, [0, 0], [1, 1], [1, 1], 1, False, False, True),
        "cudnn_convolution_transpose": lambda x, k: torch.ops.aten.cudnn_convolution_transpose(
            x, k, [0, 0], [0, 0], [1, 1], [1, 1], 1, False, False, True),
    }.items():
        x = torch.empty(1, 2, 5, 5, device="cuda")
        k = torch.empty(2, 2, 3, 3, device="cuda")
        recorder = A._CastRecorder({id(x), id(k)})
        with recorder:
            try:
                call(x, k)
            except Exception:
                pass
        print("CAST", name, ",".join(sorted(str(d).removeprefix("torch.") for d in recorder.casts)))
    """
)


def test_documented_cuda_lists_match_torch_cuda_kernels_on_fake_tensors():
    """torch's AutocastCUDA kernels run on fake CUDA tensors on a CPU-only machine (in a
    subprocess: ops that need a real CUDA device abort it): the documented policies must agree."""
    proc = subprocess.run(
        [sys.executable, "-c", _FAKE_CUDA], capture_output=True, text=True, timeout=240
    )
    if "SETUP_FAILED" in proc.stdout:
        pytest.skip(f"fake CUDA tensors unavailable in this torch: {proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    ops = dict(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("OP "))
    h = torch.float16
    for name, got in ops.items():
        inputs = (torch.float32,) if name in ("linear", "matmul", "einsum") else (h,)
        if name in ("addcmul", "add"):
            inputs = (h, torch.float32, h)
        if name == "scaled_dot_product_attention":
            inputs = (torch.float32,)
        try:
            want = A.short(A.documented_dtype(name, inputs, "cuda", h))
        except RuntimeError:
            want = "raises"
        assert got == want, f"{name}: torch's CUDA kernel gives {got}, the lists say {want}"
    assert len(ops) == 22
    explicit = dict(
        line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("EXPLICIT")
    )
    assert explicit == {"softmax": "torch.float16", "sum": "torch.float16"}, explicit
    casts = dict(line.split()[1:] for line in proc.stdout.splitlines() if line.startswith("CAST"))
    assert casts == {"cudnn_convolution": "float16", "cudnn_convolution_transpose": "float16"}
    for name, policy in A.CUDA_OUTSIDE_HEADER.items():
        assert policy == (A.REFUSED if name == "binary_cross_entropy" else A.LOWER)


def test_count_forward_hooks_sees_module_and_global_hooks():
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    assert A.count_forward_hooks(model) == 0
    h1 = model[0].register_forward_hook(lambda *a: None)
    h2 = model.register_forward_pre_hook(lambda *a: None)
    h3 = nn.modules.module.register_module_forward_hook(lambda *a: None)
    try:
        assert A.count_forward_hooks(model) == 3
    finally:
        for h in (h1, h2, h3):
            h.remove()
    assert A.count_forward_hooks(model) == 0


def test_lesson_model_and_images():
    x = A.digit_images(6)
    assert x.shape == (6, 1, 8, 8) and x.dtype == torch.float32
    assert 0.0 <= float(x.min()) and float(x.max()) <= 1.0
    out = A.lesson_model()(x)
    assert out.shape == (6, 10)
    assert torch.allclose(out.exp().sum(-1), torch.ones(6), atol=1e-5)
    names = [n for n, _ in A.lesson_model().named_modules() if n]
    assert "block.fc" in names and "bn" in names and len(names) == 13
    assert torch.equal(A.lesson_model(seed=3).fc1.weight, A.lesson_model(seed=3).fc1.weight)


def test_dtype_table_and_short():
    assert A.short(torch.bfloat16) == "bfloat16"
    assert A.short(None) == "-" and A.short("raises") == "raises"
    text = A.dtype_table({"a": {"x": torch.float16}, "b": {"x": torch.float32, "y": "raises"}})
    lines = text.splitlines()
    assert lines[0].split() == ["layer", "a", "b"]
    assert lines[2].split() == ["x", "float16", "float32"]
    assert lines[3].split() == ["y", "-", "raises"]


def _dtypes_shown(table):
    return [row["dtype"] for row in table.rows]


def test_widget_controls_change_the_table():
    model, x = A.row_attention(), torch.rand(4, 1, 8, 8)
    table = A.AutocastTable(
        model, (x,), A.ROW_ATTENTION_OPS, trace_fn=_trace, device_type="cpu", gpu_available=False
    )
    assert table.source == "measured"
    assert set(_dtypes_shown(table)) == {"bfloat16"}
    table.dtype.value = "float16"  # as a click would
    assert set(_dtypes_shown(table)) == {"float16"}
    assert table.source == "measured" and "measured" in table.note.value
    table.device_type.value = "cuda"
    assert table.source == "documented" and "documented" in table.note.value
    assert dict(zip([r["layer"] for r in table.rows], _dtypes_shown(table), strict=True)) == {
        k: A.short(v)
        for k, v in A.documented_layer_dtypes(A.ROW_ATTENTION_OPS, "cuda", torch.float16).items()
    }
    assert all(r["source"] == "documented" for r in table.rows)
    assert "float32" in table.output.value
    table.update(device_type="cpu", dtype="bfloat16")
    assert table.source == "measured" and set(_dtypes_shown(table)) == {"bfloat16"}


def test_widget_without_or_with_broken_trace_function_falls_back_to_documented():
    model, x = A.row_attention(), torch.rand(4, 1, 8, 8)

    def not_written(*args):
        raise NotImplementedError

    def broken(*args):
        raise KeyError("oops")

    for fn, words in ((None, "documented"), (not_written, "write"), (broken, "KeyError")):
        table = A.AutocastTable(model, (x,), A.ROW_ATTENTION_OPS, trace_fn=fn)
        assert table.source == "documented"
        assert words in table.note.value
        assert [r["layer"] for r in table.rows] == list(A.ROW_ATTENTION_OPS)


def test_nominal_differences_are_the_ops_that_promote_by_themselves_or_are_composite():
    """cat, stack, addcmul, addcdiv and atan2 promote without autocast, so their widest-input
    vs no-list difference changes no dtype; lstm_cell and gru_cell are composite on the CPU.
    dot and index_put refuse mixed dtypes: their difference is real."""
    nominal = {op for op, _, _ in A.list_differences() if A.nominal_difference(op)}
    assert nominal == {"cat", "stack", "addcmul", "addcdiv", "atan2", "lstm_cell", "gru_cell"}
    assert A.promotes_by_itself("addcmul") and not A.promotes_by_itself("dot")
    assert A.nominal_difference("index_put") is None
    assert A.nominal_difference("linear") is None  # the same list on both


def test_trace_cases_are_the_same_for_the_same_seed_and_cover_every_kind():
    def structure(seed: int) -> list:
        gen = torch.Generator().manual_seed(seed)
        cases = [
            (kinds, [n for n, _ in model.named_modules()], [x.tolist() for x in inputs])
            for kinds, _embed, model, inputs in I.trace_cases(gen)
        ]
        raising = [(pos, [n for n, _ in m.named_modules()]) for pos, m, _x in I.raising_cases(gen)]
        return cases + raising

    assert structure(3) == structure(3)
    gen = torch.Generator().manual_seed(4)
    seen = {k for kinds, *_ in I.trace_cases(gen) for k in kinds}
    assert seen == set(I.TRACE_KINDS)
    pos, model, x = next(I.raising_cases(torch.Generator().manual_seed(0)))
    assert A.count_forward_hooks(model) == 2
    with pytest.raises(RuntimeError, match="boom"):
        model(x)


def test_lse_cases_hold_a_batch_dimension_of_size_one_in_every_draw():
    # The hidden test of LogSumExp32 draws its inputs with lse_cases: every seed must include
    # an input whose kept dimensions hold a 1 (a bare .squeeze() drops it). The shapes do not
    # depend on the seed, so 20 seeds are enough.
    for seed in range(20):
        gen = torch.Generator().manual_seed(seed)
        shapes = [tuple(x.shape) for _shape, _scale, _offset, x in I.lse_cases(gen)]
        assert shapes == [shape for shape, _, _ in I.LSE_TRIALS]
        assert any(len(s) >= 2 and 1 in s[:-1] for s in shapes), (seed, shapes)
        assert any(s[0] == 1 and len(s) == 2 for s in shapes), (seed, shapes)


def _lse_function(with_custom_bwd: bool) -> type[torch.autograd.Function]:
    class LogSumExp(torch.autograd.Function):
        @staticmethod
        @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return torch.logsumexp(x, -1)

        @staticmethod
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return grad.unsqueeze(-1) * torch.softmax(x, -1)

    if with_custom_bwd:
        LogSumExp.backward = staticmethod(
            torch.amp.custom_bwd(device_type="cpu")(LogSumExp.__dict__["backward"].__func__)
        )
    return LogSumExp


@pytest.mark.parametrize("with_custom_bwd", [True, False])
def test_autocast_in_backward_tells_whether_custom_bwd_turned_autocast_off(with_custom_bwd):
    fn = _lse_function(with_custom_bwd)
    x = torch.randn(3, 5).bfloat16().requires_grad_(True)
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        out = fn.apply(x)
        with A.autocast_in_backward(out, "cpu") as saw:
            out.sum().backward()
    assert saw and all(s is (not with_custom_bwd) for s in saw)
    assert type(x.grad) is torch.Tensor
    torch.testing.assert_close(x.grad.float(), torch.softmax(x.float(), -1), rtol=2e-2, atol=2e-3)
    # backward() outside the region: autocast is off in the backward either way.
    x.grad = None
    with torch.amp.autocast("cpu", dtype=torch.bfloat16):
        out = fn.apply(x)
    with A.autocast_in_backward(out, "cpu") as saw:
        out.sum().backward()
    assert saw and not any(saw)
