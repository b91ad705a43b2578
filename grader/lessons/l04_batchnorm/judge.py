"""Lesson 04's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's inputs with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from course.checks import (
    CheckFailed,
    check,
    check_close,
    check_dtype,
    check_equal,
    check_tensor_equal,
)
from course.normalization import NORM_TYPES, OTHER_NORM_TYPES, NormCall, one_thread
from grader.lessons.l04_batchnorm.inputs import (
    NormCase,
    momentum_inputs,
    norm_cases,
    norm_layers_in,
    own_tensors,
)
from grader.observations import Observations, Raised


def _ref_half_with_fp32_norm(model: nn.Module) -> nn.Module:
    # The reference: norm layers untouched in float32, cast in and out; the rest float16.
    for m in model.modules():
        if isinstance(m, NORM_TYPES):
            m.register_forward_pre_hook(lambda mod, args: tuple(a.float() for a in args))
            m.register_forward_hook(lambda mod, args, out: out.half())
        else:
            for p in m.parameters(recurse=False):
                p.data = p.data.half()
            for name, b in m.named_buffers(recurse=False):
                if b.is_floating_point():
                    setattr(m, name, b.half())
    return model


#: The type names of the normalization layers the task leaves off its list (the driver's table
#: holds type names; the hidden models use these classes themselves, no subclass of them).
_OTHER_NORM_NAMES = frozenset(t.__name__ for t in OTHER_NORM_TYPES)


def _check_dtypes(table: Any, what: str) -> None:
    """The dtypes the driver recorded (``inputs.tensor_dtypes``) against the
    contract: float32 inside normalization layers, float16 elsewhere, integers kept."""
    check(isinstance(table, list), f"internal: {what}: the model's dtypes are missing")
    for mname, type_name, norm, tensors in table:
        for tname, dtype in tensors:
            full = f"{mname}.{tname}" if mname else tname
            if tname in ("num_batches_tracked", "hits"):
                want = torch.long  # integer tensors keep their dtype, as under .half()
            elif not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
                continue
            else:
                want = torch.float32 if norm else torch.float16
            kind = f"{type_name} (a normalization layer)" if norm else type_name
            if want == torch.long:
                hint = " (integer tensors keep their dtype, as under .half())"
            elif want == torch.float16 and type_name in _OTHER_NORM_NAMES:
                hint = (
                    " (only BatchNorm1d/2d/3d, LayerNorm, GroupNorm and their subclasses stay "
                    "float32)"
                )
            elif want == torch.float16:
                hint = " (every other floating point parameter and buffer becomes float16)"
            else:
                hint = ""
            check(dtype == want, f"{what}: {full} of {kind} should be {want}, got {dtype}{hint}")


def _close_as_fp16(
    got: Any, mixed: torch.Tensor, exact: torch.Tensor, what: str, scale: float | None = None
) -> None:
    # Within twice the error that float16 storage itself causes (the reference's error),
    # plus 0.2% of the values' scale.
    check(type(got) is torch.Tensor, f"{what} should be a tensor, got {type(got).__name__}")
    got, mixed, exact = got.detach().double(), mixed.detach().double(), exact.detach().double()
    check(bool(torch.isfinite(got).all()), f"{what} is not finite: {got.flatten()[:6].tolist()}")
    if scale is None:
        scale = max(1.0, exact.abs().max().item())
    fp16_err = (mixed - exact).abs().max().item()
    err = (got - exact).abs().max().item()
    limit = 2 * fp16_err + 2e-3 * scale
    check(
        err <= limit,
        f"{what} is off by up to {err:.4g} from the float32 model; float16 "
        f"storage alone explains {fp16_err:.4g} (limit {limit:.4g})",
    )


def _case(obs: Observations, case: NormCase) -> None:
    base = case.base
    what = (
        f"half_with_fp32_norm on a {'subclassed ' if case.sub else ''}{case.kind} model in "
        f"{case.mode} mode (seed {obs.seed})"
    )
    train = case.mode == "train"
    exact = copy.deepcopy(base).train(train)
    mixed = _ref_half_with_fp32_norm(copy.deepcopy(base)).train(train)
    is_module, type_name = obs.next("returned")
    check(is_module is True, f"{what}: should return an nn.Module, got {type_name}")
    _check_dtypes(obs.next("dtypes"), what)
    norm_tensors = obs.next("norm tensors")
    check(isinstance(norm_tensors, list), f"internal: {what}: the norm layers' tensors are missing")
    for tensors, e in zip(norm_tensors, norm_layers_in(base), strict=False):
        for t, (tname, t0) in zip(tensors, own_tensors(e), strict=False):
            check_tensor_equal(
                t,
                t0.detach(),
                f"{what}: {tname} of a {type(e).__name__} (a normalization "
                f"layer's tensors keep their exact float32 values)",
            )
    count = len(norm_tensors)
    check(
        count == len(norm_layers_in(exact)),
        f"{what}: the model should still hold {len(norm_layers_in(exact))} normalization layers, "
        f"found {count}",
    )
    out_exact, out_mixed = exact(case.x16.float()), mixed(case.x16)
    forward = obs.next("forward")
    check(isinstance(forward, dict), f"internal: {what}: the forward pass was not recorded")
    if "error" in forward:
        raise CheckFailed(
            f"{what}: the model failed on float16 input ({forward['error']}); the layers around "
            f"the normalization layers saw {forward['seen']}: each "
            f"normalization layer must take and return float16"
        )
    out = forward["out"]
    calls = [NormCall(*c) for c in forward["calls"]]
    check_dtype(out, torch.float16, f"{what}: the model's output")
    check(
        len(calls) == len(norm_layers_in(exact)),
        f"{what}: {len(norm_layers_in(exact))} normalization layers should each call their "
        f"normalization function once, saw {calls}",
    )
    check(
        all(c.input_dtype == torch.float32 for c in calls),
        f"{what}: the normalization layers should compute on float32 input, saw {calls}: "
        "cast each one's input to float32, not only its tensors",
    )
    for seen in forward["seen"]:
        check(
            seen == [torch.float16],
            f"{what}: the layers around each normalization layer should see float16 "
            f"tensors, one saw {seen}",
        )
    _close_as_fp16(out, out_mixed, out_exact, f"{what}: the output")
    _check_dtypes(obs.next("dtypes after"), what + " after a forward pass")
    stats = obs.next("statistics")
    for a, r, e in zip(stats, norm_layers_in(mixed), norm_layers_in(exact), strict=False):
        if e.__dict__["_buffers"].get("running_var") is None:
            continue
        for got, stat in zip(a, ("running_mean", "running_var"), strict=False):
            _close_as_fp16(
                got,
                getattr(r, stat),
                getattr(e, stat),
                f"{what}: {stat} of a {type(e).__name__}",
            )
        tracked = a[2]
        check(
            type(tracked) is torch.Tensor and tracked.numel() == 1,
            f"{what}: num_batches_tracked of a {type(e).__name__} should be a one-element tensor",
        )
        check_equal(
            int(tracked),
            int(e.num_batches_tracked),
            f"{what}: num_batches_tracked of a {type(e).__name__}",
        )
    if case.weights is not None:
        w = case.weights
        for o in (out_mixed, out_exact):
            (o.float() * w).sum().backward()
        gscale = max(e.grad.abs().max().item() for e in exact.parameters()) + 1e-6
        grads = obs.next("gradients")
        for (name, dtype, grad), q, e in zip(
            grads, mixed.parameters(), exact.parameters(), strict=False
        ):
            check(grad is not None, f"{what}: {name} received no gradient")
            check(
                type(grad) is torch.Tensor and grad.dtype == dtype,
                f"{what}: the gradient of {name} should be {dtype}",
            )
            _close_as_fp16(grad, q.grad, e.grad, f"{what}: the gradient of {name}", gscale)


def keep_norm_fp32(obs: Observations) -> None:
    """Seven kinds of model (MLP, 2-D and 3-D convolutions, a sequence model, nested containers,
    a normalization layer first, none at all), with the norm layers' subclasses, in training and
    eval mode: dtypes, exact float32 statistics, float32 computation inside, float16 around,
    outputs, running statistics and gradients within float16's own error of float32's. Every
    draw holds InstanceNorm1d/2d/3d and RMSNorm layers, which are not on the task's list: their
    tensors must become float16."""
    with one_thread():
        for case in norm_cases(obs.seed):
            _case(obs, case)


def _raised(got: object, what: str) -> None:
    """Like ``course.checks.check_raises(ValueError, ...)`` on what the driver observed."""
    if isinstance(got, Raised):
        if not got.is_a("ValueError"):
            raise CheckFailed(
                f"{what} should raise ValueError, but raised {got.type}: {got.message}."
            )
        return
    raise CheckFailed(f"{what} should raise ValueError, but returned {got!r}.")


def bn_momentum(obs: Observations) -> None:
    """200 random Keras momenta and the edges, out-of-range values that must raise, and
    BatchNorm1d layers whose running statistics must follow Keras's weights."""
    seed = obs.seed
    inputs = momentum_inputs(seed)
    for k in inputs.momenta:
        got = obs.next("momentum")
        check(
            type(got) is float,
            f"pytorch_momentum({k!r}) should return a float, got "
            f"{obs.type_of() or type(got).__name__}",
        )
        check_close(got, 1.0 - k, f"pytorch_momentum({k!r}) (seed {seed})", rtol=0, atol=1e-15)
    check_equal(obs.next("zero"), 1.0, "pytorch_momentum(0)")
    for k in inputs.out_of_range:
        _raised(obs.next("out of range"), f"pytorch_momentum({k!r})")
    for km, c, batches in inputs.layers:
        mean, var = torch.zeros(c, dtype=torch.float64), torch.ones(c, dtype=torch.float64)
        for b in batches:
            mean = km * mean + (1 - km) * b.double().mean(0)
            var = km * var + (1 - km) * b.double().var(0)
        running_mean, running_var = obs.next("running statistics")
        check_close(
            running_mean,
            mean,
            f"running_mean with Keras momentum {km:.4f} translated (seed {seed})",
            rtol=1e-4,
            atol=1e-5,
        )
        check_close(
            running_var,
            var,
            f"running_var with Keras momentum {km:.4f} translated (seed {seed})",
            rtol=1e-4,
            atol=1e-5,
        )


JUDGES = {
    "keep_norm_fp32_tests": ("keep_norm_fp32", keep_norm_fp32),
    "bn_momentum_tests": ("bn_momentum", bn_momentum),
}
