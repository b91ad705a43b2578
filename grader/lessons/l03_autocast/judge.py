"""Lesson 03's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's inputs with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from course.autocast import digit_images, lesson_model, op_policy, short
from course.checks import CheckFailed, _short, check, check_close, check_dtype, check_equal
from grader.lessons.l03_autocast.inputs import (
    GRADCHECK_SHAPES,
    cuda_trace_model,
    first_output_tensor,
    fits_float16,
    lse_edge,
    lse_inputs,
    trace_inputs,
)
from grader.observations import ObservationError, Observations, Raised


def _ref_trace(
    model: nn.Module, inputs: tuple, device_type: str, dtype: torch.dtype
) -> dict[str, torch.dtype]:
    out: dict[str, torch.dtype] = {}
    handles = []

    def hook(name: str) -> Any:
        def record(m: nn.Module, a: object, o: object) -> None:
            t = first_output_tensor(o)
            if t is not None:
                out[name] = t.dtype

        return record

    try:
        for name, mod in model.named_modules():
            if name:
                handles.append(mod.register_forward_hook(hook(name)))
        with torch.amp.autocast(device_type, dtype=dtype):
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return out


def _raised(got: object, exception: str, what: str, hint: str = "") -> None:
    """Like ``course.checks.check_raises(exception, ...)`` on what the driver observed."""
    if isinstance(got, Raised):
        if not got.is_a(exception):
            raise CheckFailed(
                f"{what} should raise {exception}, but raised {got.type}: {got.message}. "
                f"{hint}".strip()
            )
        return
    raise CheckFailed(
        f"{what} should raise {exception}, but returned {_short(got)}. {hint}".strip()
    )


def trace_dtypes(obs: Observations) -> None:
    """Random chains of blocks under CPU autocast in both low dtypes, chains that raise at any
    depth (hooks removed, someone else's kept, autocast off again), a CUDA chain on a GPU."""
    seed = obs.seed
    cases, raising = trace_inputs(seed)
    for kinds, embed, model, inputs in cases:
        for dtype in (torch.bfloat16, torch.float16):
            want = _ref_trace(model, inputs, "cpu", dtype)
            hooks = obs.next("hooks before")
            check_equal(
                obs.next("trace"),
                want,
                f"trace_dtypes on a random model of {kinds} "
                f"({'embedding first, ' if embed else ''}{len(inputs)} input(s)) under "
                f"cpu autocast {dtype} (seed {seed})",
            )
            check_equal(obs.next("hooks after"), hooks, "hooks left after trace_dtypes")
    for pos, _model, _x in raising:
        before = obs.next("hooks before")
        _raised(
            obs.next("raised"),
            "RuntimeError",
            f"trace_dtypes on a model that raises in block {pos} (seed {seed})",
        )
        check_equal(
            obs.next("hooks after"),
            before,
            f"the hook count after a forward pass that raised in block {pos} "
            f"(you must remove yours and only yours)",
        )
        check(obs.next("autocast after") is False, "autocast is still on after trace_dtypes raised")
    if obs.next("gpu") is True:
        got = obs.next("cuda")
        if not torch.cuda.is_available():
            raise ObservationError(
                "trace_dtypes ran on a CUDA GPU: its trace can only be judged where CUDA is"
            )
        model = cuda_trace_model().cuda()
        want = _ref_trace(model, (torch.randn(4, 8, device="cuda"),), "cuda", torch.float16)
        check_equal(got, want, "trace_dtypes on a CUDA model under cuda float16 autocast")


# The key, derived from the CUDA lists in torch's header (course.autocast.op_lists("cuda")) and the
# model's forward: x (float32) -> conv -> bn -> relu -> pool -> flatten -> fc1 -> norm -> gelu
# -> block [x + act(fc(x))] -> fc2 -> log_probs.
#   conv       conv2d is on the lower precision list                      -> float16
#   bn         batch_norm is on no list: runs in its input's dtype (conv)  -> float16
#   relu       relu: no list, input float16                                -> float16
#   pool       max_pool2d: no list, input float16                          -> float16
#   flatten    a view: no list, input float16                              -> float16
#   fc1        linear: lower precision list                                -> float16
#   norm       layer_norm is on the float32 list                           -> float32
#   gelu       gelu: no list, input float32 (from norm)                    -> float32
#   block.fc   linear: lower precision list (casts its float32 input down) -> float16
#   block.act  tanh: no list, input float16                                -> float16
#   block      x + act(...): add is on no list; float32 + float16 promotes -> float32
#   fc2        linear: lower precision list                                -> float16
#   log_probs  log_softmax is on the float32 list                          -> float32
_H, _S = torch.float16, torch.float32
KEY = {
    "conv": _H,
    "bn": _H,
    "relu": _H,
    "pool": _H,
    "flatten": _H,
    "fc1": _H,
    "norm": _S,
    "gelu": _S,
    "block.fc": _H,
    "block.act": _H,
    "block": _S,
    "fc2": _H,
    "log_probs": _S,
}
WHY = {
    "conv": "conv2d is on CUDA's lower precision list",
    "bn": "batch_norm is on no list, so it runs in its input's dtype, and conv gave it float16",
    "relu": "relu is on no list and its input (bn) is float16",
    "pool": "max_pool2d is on no list and its input is float16",
    "flatten": "flatten is a view: it keeps its input's float16",
    "fc1": "linear is on the lower precision list",
    "norm": "layer_norm is on CUDA's float32 list",
    "gelu": "gelu is on no list and its input (norm's output) is float32",
    "block.fc": "linear is on the lower precision list: it casts its float32 input down",
    "block.act": "tanh is on no list and its input (block.fc) is float16",
    "block": "the residual add is on no list: float32 x plus float16 act(fc(x)) promotes to "
    "float32",
    "fc2": "linear is on the lower precision list",
    "log_probs": "log_softmax is on CUDA's float32 list",
}


def _ref_trace_cuda(model: nn.Module, inputs: tuple) -> dict[str, torch.dtype]:
    out: dict[str, torch.dtype] = {}
    handles = []

    def hook(name: str) -> Any:
        def record(m: nn.Module, a: object, o: torch.Tensor) -> None:
            out[name] = o.dtype

        return record

    try:
        for name, mod in model.named_modules():
            if name:
                handles.append(mod.register_forward_hook(hook(name)))
        with torch.amp.autocast("cuda", dtype=torch.float16):
            model(*inputs)
    finally:
        for h in handles:
            h.remove()
    return out


def predict_cuda_dtypes(obs: Observations) -> None:
    """The answer against the key (which agrees with the CUDA lists as course.autocast reads
    them), every wrong layer named with its reason; on a CUDA machine the key is measured."""
    # The key agrees with the lists as course.autocast reads them from the header.
    for name in ("conv", "fc1", "block.fc", "fc2"):
        check(
            op_policy("conv2d" if name == "conv" else "linear", "cuda") == "lower precision",
            "the CUDA lists changed: the answer key needs a look",
        )
    for op in ("layer_norm", "log_softmax"):
        check(op_policy(op, "cuda") == "float32", "the course's CUDA lists changed")
    for op in ("batch_norm", "relu", "gelu", "tanh", "max_pool2d", "add"):
        check(op_policy(op, "cuda") == "no list", "the course's CUDA lists changed")
    answer = obs.next("answer")
    check(type(answer) is dict, "predict_cuda_dtypes should be a plain dict")
    wrong = [n for n in KEY if dict.get(answer, n) is not KEY[n]]
    check(
        not wrong,
        "under CUDA float16 autocast these layers are not what you predicted: "
        + "; ".join(f"{n} outputs {short(KEY[n])} ({WHY[n]})" for n in wrong),
    )
    check(sorted(answer) == sorted(KEY), "predict_cuda_dtypes has extra entries")
    if torch.cuda.is_available():
        real = _ref_trace_cuda(lesson_model(seed=0, device="cuda"), (digit_images(16, "cuda"),))
        check_equal(
            real,
            KEY,
            "the documented key measured on this CUDA GPU (if this fails, the "
            "lists changed in this torch release: tell the instructor)",
        )


def custom_fwd_function(obs: Observations) -> None:
    """Values of several scales and offsets, shapes with a batch dimension of size 1, outside
    autocast (float32 and float16 keep their dtype) and under autocast in both low dtypes
    (float32 out, computed in float32; float64 stays float64), gradients with ``backward()``
    called inside the region (the backward must see autocast off), gradcheck, rows with -inf."""
    seed = obs.seed
    check(obs.next("function") is True, "LogSumExp32 must be an autograd Function")
    cases, _ = lse_inputs(seed)
    for shape, scale, offset, x, weights in cases:
        x32 = x.float()
        # Outside autocast, float32 in, float32 out, accurate even for huge values.
        got = obs.next("float32")
        want = torch.logsumexp(x32.double(), -1)
        check_dtype(got, torch.float32, f"LogSumExp32 on float32 input of shape {shape}")
        check_close(
            got,
            want,
            f"LogSumExp32 on float32 values of scale {scale} around "
            f"{offset:.1f}, shape {shape} (seed {seed}; the result has shape x.shape[:-1])",
            rtol=2e-6,
            atol=1e-4,
        )
        # Outside autocast, float16 in, float16 out: custom_fwd does nothing there.
        x16 = fits_float16(x32, scale, offset).half()
        got16 = obs.next("float16 outside autocast")
        check_dtype(
            got16,
            torch.float16,
            f"LogSumExp32 on a float16 input of shape {shape} outside autocast (outside "
            "autocast custom_fwd does nothing: the result has the input's dtype)",
        )
        check_close(
            got16,
            torch.logsumexp(x16.double(), -1),
            f"LogSumExp32 on float16 values of scale {scale} around {offset:.1f}, shape {shape}, "
            f"outside autocast (seed {seed}; float16's precision)",
            rtol=2e-3,
            atol=1e-2,
        )
        for dt, w in weights.items():
            if obs.next("skipped") is True:
                check(dt == torch.bfloat16, "internal: only bfloat16 may be skipped")
                continue
            xl = fits_float16(x32, scale, offset).to(dt)
            # Float32 input under autocast: stays float32, no overflow.
            g32 = obs.next("float32 under autocast")
            glow = obs.next("low under autocast")
            g64 = obs.next("float64 under autocast")
            check_dtype(g32, torch.float32, f"LogSumExp32 on float32 input under {dt} autocast")
            check_close(
                g32,
                want,
                f"LogSumExp32 under {dt} autocast on float32 values around "
                f"{offset:.1f} (seed {seed})",
                rtol=2e-6,
                atol=1e-4,
            )
            check_dtype(
                glow,
                torch.float32,
                f"LogSumExp32 on a {dt} input under {dt} autocast "
                "(the forward must run in float32: cast_inputs=torch.float32)",
            )
            check_close(
                glow,
                torch.logsumexp(xl.double(), -1),
                f"LogSumExp32 on {dt} input of shape {shape} under autocast, computed in "
                f"float32 (seed {seed})",
                rtol=2e-6,
                atol=1e-4,
            )
            check_dtype(
                g64,
                torch.float64,
                f"LogSumExp32 on a float64 input under {dt} autocast (cast_inputs leaves float64 "
                "alone: the result stays float64)",
            )
            check_close(
                g64,
                torch.logsumexp(x, -1),
                f"LogSumExp32 on float64 input of shape {shape} under {dt} autocast, computed "
                f"in float64 (seed {seed})",
                rtol=1e-9,
                atol=1e-9,
            )
            # Gradient under autocast, equal to the softmax; backward() inside the region.
            grad = obs.next("grad")
            check_dtype(grad, dt, f"the gradient of a {dt} input")
            ref_grad = torch.softmax(xl.double(), -1) * w.double().unsqueeze(-1)
            check_close(
                grad,
                ref_grad,
                f"the gradient of LogSumExp32 on {dt} input under "
                f"autocast, weighted by random output gradients (seed {seed})",
                rtol=2e-2,
                atol=2e-3,
            )
            saw = obs.next("backward autocast")
            check(isinstance(saw, list), "internal: the backward's autocast state is missing")
            check(
                not any(s is not False for s in saw),
                f"LogSumExp32's backward ran with {dt} autocast on: backward() was called inside "
                "an autocast region, and the backward must run with autocast off; custom_bwd runs "
                "backward in the forward body's autocast state, which cast_inputs turns off "
                "(torch.amp.custom_bwd(device_type=...) on backward), or run its body in a "
                "torch.amp.autocast(device_type, enabled=False) region",
            )
    # gradcheck in float64 outside autocast, several shapes.
    for shape in GRADCHECK_SHAPES:
        check(
            obs.next("gradcheck") is True,
            f"gradcheck of LogSumExp32 in float64 on shape {shape} (seed {seed})",
        )
    # A row of -inf mixed with finite values behaves like torch.logsumexp.
    edge = lse_edge()
    check_close(
        obs.next("edge"),
        torch.logsumexp(edge.double(), -1),
        "LogSumExp32 on rows with -inf and values beyond exp's float32 range",
        rtol=1e-6,
        atol=1e-5,
    )


JUDGES = {
    "trace_dtypes_tests": ("trace_dtypes", trace_dtypes),
    "predict_cuda_dtypes_tests": ("predict_cuda_dtypes", predict_cuda_dtypes),
    "custom_fwd_function_tests": ("custom_fwd_function", custom_fwd_function),
}
