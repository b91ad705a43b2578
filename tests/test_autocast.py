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

# Documented names whose aten op is spelled differently; None: a Python-level or composite op
# with no kernel of its own (it decomposes into listed ops).
_ATEN_NAME = {
    "__matmul__": "matmul",
    "multi_dot": "linalg_multi_dot",
    "GRUCell": "gru_cell",
    "LSTMCell": "lstm_cell",
    "RNNCell": "rnn_tanh_cell",
    "__pow__": "pow",
    "__rpow__": "pow",
    "__rdiv__": None,
    "__rtruediv__": None,
    "cross_entropy": None,
    "normalize": "norm",
    "softmin": "softmax",
    "grid_sample": "grid_sampler",
}
_ALL_OPS = [n for n in torch._C._dispatch_get_all_op_names() if n.startswith("aten::")]


def _has_autocast_kernel(name: str, key: str) -> bool:
    base = _ATEN_NAME.get(name, name)
    for op in _ALL_OPS:
        if op.split("::")[1].split(".")[0] != base:
            continue
        for line in torch._C._dispatch_dump(op).splitlines():
            if line.startswith(key + ":") and "fallthrough" not in line:
                return True
    return False


@pytest.mark.parametrize("device_type,key", [("cuda", "AutocastCUDA"), ("cpu", "AutocastCPU")])
def test_every_documented_op_has_an_autocast_kernel_in_this_torch(device_type, key):
    missing = [
        name
        for names in A.OP_LISTS[device_type].values()
        for name in names
        if _ATEN_NAME.get(name, name) is not None and not _has_autocast_kernel(name, key)
    ]
    assert not missing, f"documented {device_type} ops with no {key} kernel in torch: {missing}"


def test_batchnorm_is_on_no_list_and_softmax_differs():
    assert not _has_autocast_kernel("batch_norm", "AutocastCUDA")
    assert not _has_autocast_kernel("batch_norm", "AutocastCPU")
    assert A.op_policy("batch_norm", "cuda") == A.op_policy("batch_norm", "cpu") == A.NO_LIST
    assert A.op_policy("softmax", "cuda") == A.FLOAT32
    assert A.op_policy("softmax", "cpu") == A.NO_LIST
    assert ("softmax", A.FLOAT32, A.NO_LIST) in A.list_differences()
    assert ("layer_norm", A.FLOAT32, A.NO_LIST) in A.list_differences()
    assert A.op_policy("binary_cross_entropy", "cuda") == A.REFUSED
    assert A.op_policy("binary_cross_entropy", "cpu") == A.FLOAT32
    assert A.op_policy("cross_entropy", "cpu") == A.FLOAT32  # spelled cross_entropy_loss there
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
    }
    for name, call in calls.items():
        print("OP", name, str(call().dtype).removeprefix("torch."))
    try:
        F.binary_cross_entropy(h, h)
        print("OP binary_cross_entropy ran")
    except RuntimeError:
        print("OP binary_cross_entropy raises")
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
        inputs = (torch.float32,) if name in ("linear", "matmul") else (h,)
        if name == "addcmul":
            inputs = (h, torch.float32, h)
        try:
            want = A.short(A.documented_dtype(name, inputs, "cuda", h))
        except RuntimeError:
            want = "raises"
        assert got == want, f"{name}: torch's CUDA kernel gives {got}, the lists say {want}"
    assert len(ops) == 13


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
