"""Lesson 02's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's inputs with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them. The scaler's
scenarios are driven by :func:`~grader.lessons.l02_loss_scaling.inputs.scaler_trace` on both
sides: the driver with the student's class, the judge with ``torch.amp.GradScaler``.
"""

from __future__ import annotations

import math
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
from grader.lessons.l02_loss_scaling.inputs import (
    clean_steps,
    master_batches,
    master_draws,
    master_model,
    master_optimizer,
    scaled_backward,
    scaler_inputs,
    scaler_trace,
    unpack_trace,
)
from grader.observations import Observations


def _torch_scaler(**kw: Any) -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", **kw)


def _default_torch_scaler() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu")


def _student_calls(got: dict[str, Any], events: list[dict[str, Any]], who: str) -> None:
    """The checks the old test made while the student's scaler ran: a second ``unscale_``
    raises RuntimeError, ``step`` steps the optimizer at most once and returns its token (None
    when it skips), in the order the calls were made."""
    twice = iter(got["twice"])
    steps = iter(got["steps"])
    for ev in events:
        for o in sorted(ev["unscale"]):
            if o in ev["twice"]:
                kind, name, classes, message = next(twice)
                what = f"{who}: a second unscale_ of the same optimizer before update()"
                if kind != "raised":
                    raise CheckFailed(f"{what} should raise RuntimeError, but returned {message}.")
                if "RuntimeError" not in classes:
                    raise CheckFailed(
                        f"{what} should raise RuntimeError, but raised {name}: {message}."
                    )
        for _o in ev["order"]:
            delta, did, fine, ret, token = next(steps)
            check(delta in (0, 1), f"{who}: step(optimizer) called optimizer.step() more than once")
            if did:
                check(
                    fine is True,
                    f"{who}: step() should return what optimizer.step() returned ({token}), "
                    f"got {ret}",
                )
            else:
                check(fine is True, f"{who}: step() should return None when it skips, got {ret}")


def _compare(ref: dict[str, Any], got: dict[str, Any], exact: bool, where: str) -> None:
    check(
        type(got["initial"]) is float and got["initial"] == ref["initial"],
        f"get_scale() before the first scale() should be the initial scale {ref['initial']!r}, "
        f"got {got['initial']!r} ({where})",
    )
    for it in range(len(ref["scales"])):
        r, g = ref["scales"][it], got["scales"][it]
        check(type(g) is float, f"get_scale() should return a Python float, got {type(g).__name__}")
        check(
            ref["stepped"][it] == got["stepped"][it],
            f"at iteration {it + 1}, GradScaler stepped/skipped the optimizers as "
            f"{ref['stepped'][it]} (optimizer index, stepped?), yours as {got['stepped'][it]} "
            f"({where}); previous scales {ref['scales'][max(0, it - 4) : it]}. An inf or nan in "
            "the gradient of any parameter of any param group skips that optimizer's step",
        )
        check(
            r == g,
            f"after update {it + 1} GradScaler's scale is {r!r}, yours {g!r} ({where}); "
            f"GradScaler's scales before: {ref['scales'][max(0, it - 5) : it]}, yours: "
            f"{got['scales'][max(0, it - 5) : it]}",
        )
        for k, (a, b) in enumerate(zip(ref["params"][it], got["params"][it], strict=False)):
            what = (
                f"parameter {k} after iteration {it + 1} ({where}; the step must see every "
                "param group's gradients unscaled, once)"
            )
            if exact:
                check_tensor_equal(b, a, what + ", bit for bit")
            else:
                check_close(b, a, what + " (last-bit differences allowed)", rtol=1e-4, atol=1e-6)
        check(len(ref["grads"][it]) == len(got["grads"][it]), f"unscale_ bookkeeping ({where})")
        for a_list, b_list in zip(ref["grads"][it], got["grads"][it], strict=False):
            for a, b in zip(a_list, b_list, strict=False):
                what = (
                    f"a gradient right after unscale_ at iteration {it + 1} ({where}; "
                    "unscale_ multiplies every gradient of every param group by "
                    "1/scale, also after it found an inf or nan)"
                )
                if exact:
                    check_tensor_equal(b, a, what)
                else:
                    check_close(
                        b, a, what + " (last-bit differences allowed)", rtol=1e-4, atol=1e-6
                    )
    check(len(ref["states"]) == len(got["states"]), f"state_dict round trips ({where})")
    for a, b in zip(ref["states"], got["states"], strict=False):
        check_equal(b, a, f"state_dict() compared with GradScaler's ({where})")


def dynamic_loss_scaler(obs: Observations) -> None:
    """Ten random scenarios (one or two optimizers with two param groups each, infs and nans in
    any gradient, unscale_ with clipping, state_dict round trips, trackers near the interval)
    compared with GradScaler iteration by iteration; then clean steps at the top of float32's
    range and before the first scale()."""
    seed = obs.seed
    check(
        obs.next("hand written") is True,
        "DynamicLossScaler should be a class written by hand, not a subclass of GradScaler",
    )
    scenarios, clean = scaler_inputs(seed)
    for n, (cfg, n_opt, events, data_seed) in enumerate(scenarios):
        where = (
            f"scenario {n}: {cfg}, {n_opt} optimizer(s) with 2 param groups each, some "
            f"unscale_ calls followed by clip_grad_norm_, seed {seed}"
        )
        ref = scaler_trace(_torch_scaler, _default_torch_scaler, cfg, n_opt, events, data_seed)
        ref = unpack_trace(ref, events)
        got = obs.next("trace")
        check(
            isinstance(got, dict) and isinstance(got.get("twice"), list),
            "internal: the scaler's trace is missing",
        )
        got = unpack_trace(got, events)
        _student_calls(got, events, "your DynamicLossScaler")
        pow2 = (cfg["growth_factor"], cfg["backoff_factor"]) in ((2.0, 0.5), (4.0, 0.25)) and (
            math.log2(cfg["init_scale"]).is_integer()
        )
        _compare(ref, got, pow2, where)
    # The top of float32's range: GradScaler keeps the old scale when the grown one would be inf
    # in float32, and still restarts the growth count. And before the first scale() its
    # state_dict holds init_scale as it was given (not rounded to float32).
    for cfg in clean:
        ref = clean_steps(_torch_scaler, cfg)
        got = obs.next("clean steps")
        check(
            isinstance(got, list) and len(got) == len(ref),
            "internal: the clean steps' trace is missing",
        )
        for it, ((rs, rsd), (gs, gsd)) in enumerate(zip(ref, got, strict=True)):
            where = (
                f"DynamicLossScaler(**{cfg}) after {it} clean iterations, seed {seed}; "
                f"GradScaler's scales: {[s for s, _ in ref]}"
            )
            check(
                gs == rs,
                f"get_scale() should be {rs!r}, got {gs!r} ({where}): a grown scale "
                "that would be inf in float32 is not taken, and the tracker restarts anyway",
            )
            check_equal(gsd, rsd, f"state_dict() ({where})")
    ran = obs.next("GradScaler's ops")
    check(
        ran == [],
        f"DynamicLossScaler must be written without torch's GradScaler: it ran {ran} (the ops "
        "GradScaler updates its scale and unscales gradients with)",
    )


def _ref_master(model: nn.Module) -> list[nn.Parameter]:
    return [nn.Parameter(p.detach().float().clone()) for p in model.parameters()]


def _ref_step(
    model: nn.Module, master: list[nn.Parameter], opt: torch.optim.Optimizer, scale: float
) -> bool:
    bad = False
    for p, m in zip(model.parameters(), master, strict=True):
        m.grad = None if p.grad is None else p.grad.detach().float() / scale
        if m.grad is not None and not bool(torch.isfinite(m.grad).all()):
            bad = True
    if not bad:
        opt.step()
        with torch.no_grad():
            for p, m in zip(model.parameters(), master, strict=True):
                p.copy_(m)
    for m in master:
        m.grad = None
    model.zero_grad(set_to_none=True)
    return not bad


def master_weights(obs: Observations) -> None:
    """Random float16 models with a buffer (SGD with momentum or Adam, weight decay) for eight
    steps at six scales, some with an inf or nan, compared with the reference step by step; then
    float16 gradients below float16's normal range that must be divided in float32."""
    seed = obs.seed
    trials, (small_scale, small_values) = master_draws(seed)
    for trial, draw in enumerate(trials):
        sizes, scale = draw["sizes"], draw["scale"]
        exact = math.log2(scale).is_integer()
        b = master_model(draw)
        want = _ref_master(b)
        where = f"(model sizes {sizes}, scale {scale}, seed {seed})"
        n = obs.next("masters")
        check(
            n is not None and n == len(want),
            f"make_master_params should give one master per parameter {where}: "
            f"{len(want)} for this model, whose state_dict() also holds a buffer "
            "(model.parameters() lists the parameters alone)",
        )
        for k, (is_param, m, p, apart) in enumerate(obs.next("each master")):
            check(is_param is True, f"master {k} should be an nn.Parameter {where}")
            check_dtype(m, torch.float32, f"master {k} {where}")
            check_tensor_equal(m, p.float(), f"master {k}'s values {where}")
            check(apart is True, f"master {k} must not share memory with the model")
        ob = master_optimizer(draw, want)
        for it, batch in enumerate(master_batches(seed, trial, sizes)):
            inject = draw["injections"][it] is not None
            where_it = f"at step {it + 1} {where}" + (" with an inf/nan gradient" if inject else "")
            scaled_backward(b, draw, batch, it)
            got = obs.next("step")
            exp = _ref_step(b, want, ob, scale)
            check(
                type(got) is bool and got == exp,
                f"master_step should return {exp} {where_it}, got {got!r}",
            )
            after = obs.next("after")
            for k, ((p, m, cleared), w, q) in enumerate(
                zip(after, want, b.parameters(), strict=False)
            ):
                check_dtype(p, torch.float16, f"model parameter {k} {where_it}")
                check_dtype(m, torch.float32, f"master {k} {where_it}")
                if exact:
                    check_tensor_equal(m, w.detach(), f"master {k} {where_it}")
                    check_tensor_equal(p, q.detach(), f"model parameter {k} {where_it}")
                else:
                    check_close(m, w.detach(), f"master {k} {where_it}", rtol=1e-5, atol=1e-7)
                    check_close(
                        p, q.detach(), f"model parameter {k} {where_it}", rtol=2e-3, atol=1e-6
                    )
                if exp:
                    check(
                        cleared is True,
                        f"the model's gradients should be cleared after a step {where_it}",
                    )
            check(
                obs.next("unused") is True,
                "a parameter the forward pass never used should keep .grad None",
            )
            check(
                obs.next("master grads") is True,
                f"every master's .grad should be None after master_step {where_it}",
            )
    # Unscaled gradients below float16's normal range (2^-14): dividing in float32 keeps every
    # digit, dividing in float16 rounds them to float16's subnormal grid of 2^-24.
    small = torch.tensor([small_values])
    grad = (small * small_scale).half()
    want_small = -(grad.float() / small_scale)  # one SGD step with lr 1 from weights of 0
    ok = obs.next("subnormal step")
    check(ok is True, f"master_step should return True for finite gradients, got {ok!r}")
    check_tensor_equal(
        obs.next("subnormal master"),
        want_small,
        f"the master after one SGD step (lr 1) on float16 gradients {small.tolist()} "
        f"times the scale {small_scale}; convert to float32 before dividing (seed {seed})",
    )


JUDGES = {
    "dynamic_loss_scaler_tests": ("dynamic_loss_scaler", dynamic_loss_scaler),
    "master_weights_tests": ("master_weights", master_weights),
}
