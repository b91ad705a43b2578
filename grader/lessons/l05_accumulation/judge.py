"""Lesson 05's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's problems with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from course.accumulation import relative_difference, simulated_cuda_states
from course.checks import check, check_close, check_equal, check_tensor_equal
from grader.lessons.l05_accumulation.inputs import (
    Problem,
    accumulation_problems,
    amp_train_steps,
    checkpoint_problems,
    clean,
    loss_fn,
    new_run,
)
from grader.observations import Observations

# The reference reproduces the computation it checks (each micro-batch's loss under autocast,
# divided by their count, scaled, the backward passes summed in float32 .grad, then unscaled as
# the scaler unscales), so a correct step matches it to the last bit. The tolerance (4 eps of
# the autocast dtype: 0.0039 for float16, 0.031 for bfloat16) leaves room for valid solutions
# that round differently, e.g. dividing the scaled loss instead of the loss, which can flip a
# rounding in the dtype. (One batch of k times the size differs by more than rounding: in 1 of
# 200 seeds its 3-step trajectory drifted 0.0055 away.)
TOL = {d: 4 * torch.finfo(d).eps for d in (torch.float16, torch.bfloat16)}


def _ref_batch_grads(
    net: nn.Module, mbs: list[tuple[torch.Tensor, torch.Tensor]], dt: torch.dtype, scale: float
) -> list[torch.Tensor]:
    # What accumulated_step computes, written out: GradScaler.scale multiplies by the float32
    # scale, unscale_ multiplies by its float32 reciprocal (a disabled scaler's scale is 1).
    twin = copy.deepcopy(net)
    s = torch.tensor(float(scale), dtype=torch.float32)
    for xb, yb in mbs:
        with torch.amp.autocast("cpu", dtype=dt):
            loss = loss_fn(twin(xb), yb) / len(mbs)
        (loss * s).backward()
    inv = s.double().reciprocal().float()
    return [p.grad.detach() * inv for p in twin.parameters()]


def _cleared(grads: Any) -> bool:
    return all(g is None or (type(g) is torch.Tensor and not bool(g.any())) for g in grads)


def _norm(ts: list[torch.Tensor]) -> float:
    return torch.cat([t.flatten() for t in ts]).norm().item()


def _difference(seen: Any, ref: list[torch.Tensor], what: str) -> float:
    """relative_difference of what the optimizer stepped with and the reference gradients."""
    check(
        isinstance(seen, list)
        and len(seen) == len(ref)
        and all(
            type(g) is torch.Tensor and g.shape == r.shape for g, r in zip(seen, ref, strict=True)
        ),
        f"every parameter should have a gradient at the step: {what}",
    )
    return relative_difference(seen, ref)


def _mean(obs: Observations, p: Problem, seed: int) -> None:
    """The gradient of k micro-batches is their mean gradient, in float16 with a scaler and in
    bfloat16 with a disabled scaler; one optimizer step; each loss under autocast and backward
    before the next forward; grads cleared."""
    ref = _ref_batch_grads(p.net, p.mbs, p.dtype, p.scaler().get_scale())
    what = f"{p.k} micro-batches, {p.dtype}, scaler enabled={p.enabled} (seed {seed})"
    ret = obs.next("returned")
    check(ret is True, f"accumulated_step should return True for a normal step: {what}")
    check_equal(
        obs.next("forward dtypes"),
        [p.dtype] * p.k,
        f"the autocast dtype of each micro-batch's forward: {what}",
    )
    events = obs.next("events")
    check(isinstance(events, list) and all(type(e) is str for e in events), f"internal: {what}")
    check_equal(
        ", ".join(events),
        ", ".join(["loss (autocast on)", "backward"] * p.k),
        f"the order of losses and backward passes: {what}",
    )
    check_equal(obs.next("steps"), 1, f"optimizer steps per call: {what}")
    seen = obs.next("stepped with")
    check(
        seen is not None and all(g is not None for g in seen),
        f"every parameter should have a gradient at the step: {what}",
    )
    err = _difference(seen, ref, what)
    check(
        err < TOL[p.dtype],
        f"the accumulated gradient differs from the mean of the {p.k} "
        f"micro-batches' gradients (each loss divided by {p.k}) "
        f"by {err:.3g} (relative; allowed {TOL[p.dtype]:.3g}): {what}",
    )
    check(_cleared(obs.next("grads after")), f"gradients should be cleared after the step: {what}")


def _single(obs: Observations, p: Problem, seed: int) -> None:
    """A single micro-batch is an ordinary step."""
    ref = _ref_batch_grads(p.net, p.mbs, torch.float16, p.scale)
    check(obs.next("returned") is True, f"one micro-batch should step (seed {seed})")
    what = f"one micro-batch: the gradient should be the batch's (seed {seed})"
    check(_difference(obs.next("stepped with"), ref, what) < TOL[torch.float16], what)


def _growth(obs: Observations, p: Problem, seed: int) -> None:
    """The growth tracker advances once per optimizer step, not once per micro-batch."""
    interval = p.interval
    for i in range(1, interval):
        check(obs.next("returned") is True, f"a normal step should return True (seed {seed})")
        scale, tracker = obs.next("scale and tracker")
        check_equal(
            tracker,
            i,
            f"the growth tracker after {i} accumulated steps of {p.k} micro-batches "
            f"(growth_interval {interval}, seed {seed})",
        )
        check_equal(scale, p.scale, f"the scale after {i} steps (seed {seed})")
    ret = obs.next("returned")
    check_equal(
        obs.next("scale"),
        2 * p.scale,
        f"the scale after {interval} steps with growth_interval {interval} (seed {seed})",
    )
    check(
        ret is True,
        f"step {interval} grew the scale and stepped: it should return True, got "
        f"{ret!r} (a higher scale is not a skip; seed {seed})",
    )
    check_equal(
        obs.next("steps"), interval, f"optimizer steps after {interval} calls (seed {seed})"
    )


def _clipped(obs: Observations, p: Problem, seed: int) -> None:
    """Clipping acts on unscaled gradients: active (threshold below the norm) and inactive."""
    ref = _ref_batch_grads(p.net, p.mbs, torch.float16, p.scale)
    true = _norm(ref)
    # The driver's own max_grad_norm: the norm it was drawn from is a sum, whose last bits may
    # differ between the kernel's threads and this process's.
    max_norm = obs.next("max_grad_norm")
    check(
        type(max_norm) is float and (max_norm < 0.9 * true if p.factor < 1 else max_norm > true),
        f"internal: max_grad_norm {max_norm!r} against the norm {true!r} (seed {seed})",
    )
    coef = min(1.0, max_norm / true)
    what = (
        f"max_grad_norm = {max_norm:.4g} ({p.factor:.3g} x the batch's float32 gradient norm), "
        f"the true norm {true:.4g}, {p.k} micro-batches, scale {p.scale:g} (seed {seed})"
    )
    check(obs.next("returned") is True, f"a clipped step should still step: {what}")
    seen = obs.next("stepped with")
    check(
        isinstance(seen, list) and all(type(g) is torch.Tensor for g in seen),
        f"every parameter should have a gradient at the step: {what}",
    )
    check_close(
        _norm(seen),
        coef * true,
        f"the norm the optimizer stepped with: {what}",
        rtol=TOL[torch.float16],
    )
    check(
        _difference(seen, [g * coef for g in ref], what) < TOL[torch.float16],
        f"the clipped gradient should be the batch's, shrunk by {coef:.3g}: {what}",
    )
    check(
        _cleared(obs.next("grads after")),
        f"gradients should be cleared after a clipped step: {what}",
    )


def _skipped(obs: Observations, p: Problem, what: str) -> None:
    """A step the scaler skipped: no optimizer step, the scale halved once, gradients cleared."""
    check_equal(obs.next("steps"), 0, f"optimizer.step() calls: {what}")
    if p.bad >= 0:
        check_equal(
            obs.next("optimizer states"), 0, f"optimizer states created (no momentum yet): {what}"
        )
        params = obs.next("parameters")
        before = list(p.net.parameters())
        check(isinstance(params, list) and len(params) == len(before), f"internal: {what}")
        for got, b in zip(params, before, strict=True):
            check_tensor_equal(got, b.detach(), f"a parameter: {what}")
    check_equal(obs.next("scale"), p.scale / 2, f"the scale (halved once): {what}")
    check(
        _cleared(obs.next("grads after")),
        f"gradients should be cleared after a skipped step: {what}",
    )


def _inf(obs: Observations, p: Problem, seed: int) -> None:
    """An inf in any micro-batch: parameters and optimizer untouched, False, scale halved once,
    gradients cleared so the next step is clean again."""
    clip = p.max_norm
    what = f"an inf in micro-batch {p.bad} of {p.k}, max_grad_norm={clip} (seed {seed})"
    ret = obs.next("returned")
    check(ret is False, f"accumulated_step should return False: {what}, got {ret!r}")
    _skipped(obs, p, what)
    ref = _ref_batch_grads(p.net, clean(p.mbs), torch.float16, p.scale / 2)
    ref = [g * min(1.0, clip / (_norm(ref) + 1e-6)) if clip else g for g in ref]
    check(obs.next("returned") is True, f"the clean step after {what} should step")
    message = f"the clean step after {what} should see only its own gradients"
    check(_difference(obs.next("stepped with"), ref, message) < TOL[torch.float16], message)


def _overflow(obs: Observations, p: Problem, seed: int) -> None:
    """A scale too large for clean data: every loss is finite, but the backward pass (on the loss
    times the scale) overflows float16, so the scaler skips and halves the scale."""
    what = f"clean data, init_scale {p.scale:g}, {p.k} micro-batches (seed {seed})"
    ret = obs.next("returned")
    finite = obs.next("finite losses")
    check(isinstance(finite, list) and all(finite), f"every loss should be finite here: {what}")
    check(
        ret is False,
        f"the scaled backward pass overflowed with every loss finite, so the scaler "
        f"skipped: accumulated_step should return False, got {ret!r}: {what}",
    )
    _skipped(obs, p, what)


def _in_a_row(obs: Observations, p: Problem, seed: int) -> None:
    """Several steps in a row follow the same steps taken with the reference gradients."""
    twin = copy.deepcopy(p.net)
    start = [q.detach().clone() for q in p.net.parameters()]
    opt_ref = torch.optim.SGD(twin.parameters(), lr=0.05)
    for step in range(3):
        scale = obs.next("scale")
        check(isinstance(scale, float), f"internal: the scale before step {step} (seed {seed})")
        grads = _ref_batch_grads(twin, p.mbs, torch.float16, scale)
        check(obs.next("returned") is True, f"step {step} of 3 in a row should step (seed {seed})")
        for q, g in zip(twin.parameters(), grads, strict=True):
            q.grad = g
        opt_ref.step()
    params = obs.next("parameters")
    check(
        isinstance(params, list) and len(params) == len(start), f"internal: 3 steps (seed {seed})"
    )
    err = relative_difference(
        [q - s for q, s in zip(params, start, strict=True)],
        [q.detach() - s for q, s in zip(twin.parameters(), start, strict=True)],
    )
    check(
        err < TOL[torch.float16],
        f"after 3 accumulated steps in a row the parameters moved {err:.3g} (relative) away from "
        f"the reference run's: are the gradients cleared after each step? (seed {seed})",
    )


#: The judge of each section of accumulation_problems.
SECTIONS = {
    "mean": _mean,
    "single": _single,
    "growth": _growth,
    "clipping": _clipped,
    "inf": _inf,
    "overflow": _overflow,
    "in_a_row": _in_a_row,
}


def accumulated_step(obs: Observations) -> None:
    """The mean gradient of k micro-batches in float16 and bfloat16, one micro-batch, the growth
    tracker, clipping on unscaled gradients, an inf in any micro-batch, an overflow of the scaled
    backward pass on clean data, and three steps in a row against the reference's trajectory."""
    for section, problems in accumulation_problems(obs.seed).items():
        for p in problems:
            SECTIONS[section](obs, p, obs.seed)


def _check_gpu_states(got: Any, saved: list[torch.Tensor], what: str) -> None:
    """The simulated GPUs' generator states after loading: the ones they held at the save."""
    advice = (
        "save torch.cuda.get_rng_state_all() when torch.cuda.is_available(), and restore it "
        "with torch.cuda.set_rng_state_all(...) in load_training_state"
    )
    check(
        isinstance(got, list) and len(got) == len(saved),
        f"internal: the simulated GPUs' states: {what}",
    )
    restored = [
        type(g) is torch.Tensor and g.dtype == s.dtype and g.shape == s.shape and torch.equal(g, s)
        for g, s in zip(got, saved, strict=True)
    ]
    check(
        all(restored),
        f"after loading, the CUDA generators of GPUs "
        f"{[i for i, ok in enumerate(restored) if not ok]} do not hold the states they held "
        f"when the checkpoint was saved (the test simulates {len(saved)} GPUs on the CPU): "
        f"{advice}: {what}",
    )


def checkpoint_state(obs: Observations) -> None:
    """AdamW and SGD with momentum in float16 (a scale that backs off before the checkpoint),
    AdamW in bfloat16 and SGD in float16 with a steady scale (a growth tracker far from 0 at the
    checkpoint): after loading, the scaler's and the optimizer's state are the saved ones,
    and the resumed run matches the run that never stopped, bit for bit. In the first two runs
    the driver simulates 2 and 3 GPUs (``SimulatedCudaGenerators``): loading must give their
    generators back the states they held at the save."""
    with torch.random.fork_rng(devices=[]):
        _checkpoint_state(obs, obs.seed)


def _checkpoint_state(obs: Observations, seed: int) -> None:
    x, y, sizes, runs = checkpoint_problems(seed)
    for case, run in enumerate(runs):
        what = f"{run.kind}, {run.dtype}, {run.n1} steps then {run.n2} resumed (seed {seed})"
        a = new_run(run, "a", sizes)
        torch.manual_seed(run.rng_a)
        amp_train_steps(*a, run.n1, run.dtype, x, y, loss_fn)
        path, written = obs.next("file written")
        check(written is True, f"save_training_state should write {path}: {what}")
        saved_scaler = a[2].state_dict()
        # The steady run's tracker is not a fresh scaler's 0: a scaler restored without it fails.
        check(
            run.backoff or saved_scaler["_growth_tracker"] > 0,
            f"internal: the growth tracker at the checkpoint is 0: {what}",
        )
        saved_opt = copy.deepcopy(a[1].state_dict())
        amp_train_steps(*a, run.n2, run.dtype, x, y, loss_fn)
        if run.gpus:
            _check_gpu_states(
                obs.next("GPU generator states after loading"),
                simulated_cuda_states(seed, case, run.gpus),
                f"{what}, {run.gpus} simulated GPUs",
            )
        check_equal(
            obs.next("scaler after loading"),
            saved_scaler,
            f"the scaler state after loading: {what}",
        )
        opt_state = obs.next("optimizer state after loading")
        check(isinstance(opt_state, dict), f"the optimizer's state after loading: {what}")
        check_equal(
            sorted(opt_state),
            sorted(saved_opt["state"]),
            f"the optimizer's state after loading: {what}",
        )
        for key, st in saved_opt["state"].items():
            for name, val in st.items():
                if isinstance(val, torch.Tensor):
                    got = opt_state[key].get(name) if isinstance(opt_state[key], dict) else None
                    check_tensor_equal(
                        got, val, f"optimizer state {name} of parameter {key}: {what}"
                    )
        params = obs.next("parameters")
        check(
            isinstance(params, list) and len(params) == len(list(a[0].parameters())),
            f"internal: {what}",
        )
        for (name, pa), (_, pb) in zip(a[0].named_parameters(), params, strict=True):
            check_tensor_equal(pb, pa.detach(), f"parameter {name} of the resumed run: {what}")
        check_equal(obs.next("final scaler"), a[2].state_dict(), f"the final scaler state: {what}")


JUDGES = {
    "accumulated_step_tests": ("accumulated_step", accumulated_step),
    "checkpoint_state_tests": ("checkpoint_state", checkpoint_state),
}
