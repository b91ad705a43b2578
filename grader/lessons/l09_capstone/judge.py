"""Lesson 09's judges: the references of its hidden tests and the comparisons.

Each judge builds its driver's inputs with the same functions (``inputs.py``) from the seed the
observations carry, and reads the observations in the order the driver made them. The references
run on one CPU thread (``course.device.one_cpu_thread``): they are tiny, and on a busy machine
torch's thread pool makes them many times slower (0.5 s against 5-19 s measured, 2 cores).
"""

from __future__ import annotations

import math

import torch

from course import gpt_train as T
from course.checks import check, check_close, check_equal
from course.device import one_cpu_thread
from course.gpt import GPT, IGNORE, GPTConfig, lm_loss, random_batches, val_batch
from grader.lessons.l09_capstone.inputs import compare_inputs, flops_inputs
from grader.observations import Observations, Raised


def _ref_flops(config: GPTConfig, tokens: int) -> int:
    d, t = config.d_model, config.block_size
    per_layer = 2 * (3 * d * d + d * d + 2 * d * config.d_ff) + 2 * (2 * t * d)
    return 3 * tokens * (config.n_layer * per_layer + 2 * d * config.vocab_size)


def transformer_flops(obs: Observations) -> None:
    """Random small configs and GPT-2 small's, each against the stated convention."""
    for cfg, tokens in flops_inputs(obs.seed):
        got = obs.next("flops")
        check(
            type(got) is int,
            f"transformer_flops should return a Python int, got {type(got).__name__}",
        )
        check_equal(
            got,
            _ref_flops(cfg, tokens),
            f"transformer_flops({cfg}, {tokens}) (hidden test seed {obs.seed})",
        )


#: Loss tolerances (nats). The fp32 run: a valid reordering of the loss's sum (the mean of
#: equal-length per-window means) moves its losses near 5.5 by 1.4e-6 at most. The AMP run: the
#: same reordering moves some of its losses by up to 3.7e-5 (AdamW turns a 16-bit rounding
#: difference in a near-zero gradient into a full step), so its losses are held to 5e-4, and what
#: the recipe gets right there is checked exactly by the probes (initial weights, batches,
#: autocast's state and dtype, a scaled float16 gradient); a loss computed outside autocast
#: moves some AMP loss by 5.6e-3 or more (all over 300 seeds).
LOSS_ATOL = 1e-5
AMP_LOSS_ATOL = 5e-4
#: The float16 AMP run's gradient reaching the logits, over the fp32 run's at the same step: a
#: GradScaler's scale (65536 at the start); without one, about 1.
MIN_SCALE_RATIO = 2.0
#: The gradients the AMP run's optimizer steps with, over the fp32 run's: about 1 when unscaled
#: first, the scale (65536) when the optimizer steps on scaled gradients.
MAX_STEP_RATIO = 4.0


def _ref_compare(cfg, data, steps, device_type, amp_dtype, seed, lr, batch_size) -> dict:
    train, val = data
    out: dict = {}
    for name, amp in (("fp32", False), ("amp", True)):
        torch.manual_seed(seed)
        model = GPT(cfg)
        out["initial"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        scaler = torch.amp.GradScaler(device_type, enabled=amp and amp_dtype == torch.float16)
        batches = random_batches(train, batch_size, cfg.block_size, seed)
        losses, stepped = [], []
        for _ in range(steps):
            x, y = next(batches)
            out.setdefault(f"{name}_inputs", []).append(x)
            with torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
                loss = lm_loss(model(x), y)
            opt.zero_grad()
            scaler.scale(loss).backward()
            stepped.append(_scaler_step(scaler, opt))
            losses.append(loss.item())
        out[f"{name}_stepped"] = stepped
        xv, yv = val_batch(val, cfg.block_size, max_windows=None)
        out["val_inputs"] = xv
        with torch.no_grad(), torch.autocast(device_type, dtype=amp_dtype, enabled=amp):
            out[f"{name}_val_loss"] = lm_loss(model(xv), yv).item()
        out[f"{name}_losses"] = losses
    out["difference"] = out["amp_val_loss"] - out["fp32_val_loss"]
    return out


def _scaler_step(scaler: torch.amp.GradScaler, opt: torch.optim.Optimizer) -> bool:
    """``scaler.step(opt)`` and ``scaler.update()``; whether the optimizer stepped (a scaler that
    found an inf or a NaN skips the step and backs its scale off; a disabled one always steps)."""
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    return not scaler.is_enabled() or scaler.get_scale() >= before


KEYS = {"fp32_val_loss", "amp_val_loss", "difference", "fp32_losses", "amp_losses"}


def train_compare(obs: Observations) -> None:
    """float16 (at weights so small that its gradients underflow without a scaler) and
    bfloat16 runs on random sizes. The probes are checked exactly: each run's initial weights,
    its batches and evaluation windows, where autocast was on and in which dtype, backward
    outside autocast, a scaled float16 gradient; then the losses against the reference, the
    fp32 run's at a tolerance a reordered sum passes, the AMP run's at one its chaotic 16-bit
    steps pass. Last, a run on data on the meta device (a GPU's stand-in) must put its first
    batch and its model there."""
    for cfg, data, args in compare_inputs(obs.seed):
        steps, dtype = args[0], args[2]
        where = (
            f"(hidden test seed {obs.seed}, {dtype}, {cfg}, steps/seed/lr/batch "
            f"{args[0]}/{args[3]}/{args[4]}/{args[5]})"
        )
        got = obs.next("result")
        probes = obs.next("probes")
        check(
            type(got) is dict and set(got) == KEYS,
            f"train_compare should return a dict with the keys {sorted(KEYS)} {where}",
        )
        check(
            type(probes) is list and len(probes) == 2,
            f"model_fn should be called once per run, twice in all {where}",
        )
        with one_cpu_thread():
            want = _ref_compare(cfg, data, *args)
        for probe, name, amp in ((probes[0], "fp32", False), (probes[1], "AMP", True)):
            _check_probe(probe, name, amp, steps, dtype, want, where)
        if dtype == torch.float16:
            ratios = [
                a / max(f, 1e-30)
                for a, f in zip(probes[1]["grad_norm"], probes[0]["grad_norm"], strict=True)
            ]
            check(
                all(math.isfinite(g) for g in probes[1]["grad_norm"]),
                f"the gradient reaching the float16 AMP run's logits was not finite at some "
                f"step ({probes[1]['grad_norm']}): the scaled loss overflowed float16, as a "
                f"loss computed in float16 outside autocast does (autocast runs cross-entropy "
                f"in float32) {where}",
            )
            check(
                all(r >= MIN_SCALE_RATIO for r in ratios),
                f"the float16 AMP run's gradients should be scaled by a GradScaler (backward "
                f"on scaler.scale(loss)): the gradient reaching the logits was "
                f"{', '.join(f'{r:.3g}' for r in ratios)} times the fp32 run's at its steps, "
                f"not a scale like 65536 {where}",
            )
        fp32_steps, amp_steps = probes[0]["step_grad_norm"], probes[1]["step_grad_norm"]
        # A float16 step whose gradients overflowed is skipped by the GradScaler (on a few seeds
        # the reference's is): the AMP run steps where the reference's stepped.
        taken = want["amp_stepped"]
        skips = taken.count(False)
        less = (
            f", less the {skips} the AMP run's GradScaler skips here (its gradients overflowed "
            f"float16 there: {sum(taken)} steps)"
            if skips
            else ""
        )
        check(
            len(fp32_steps) == steps and len(amp_steps) == sum(taken),
            f"each run should step its optimizer once per step ({steps}){less}; the fp32 run "
            f"stepped {len(fp32_steps)} times, the AMP run {len(amp_steps)} {where}",
        )
        at = [f for f, took in zip(fp32_steps, taken, strict=True) if took]
        ratios = [a / max(f, 1e-30) for a, f in zip(amp_steps, at, strict=True)]
        check(
            all(r <= MAX_STEP_RATIO for r in ratios),
            f"the AMP run's optimizer should step with unscaled gradients (scaler.step(optimizer) "
            f"unscales them, then steps): they were {', '.join(f'{r:.3g}' for r in ratios)} "
            f"times the fp32 run's {where}",
        )
        for key, atol in (("fp32_losses", LOSS_ATOL), ("amp_losses", AMP_LOSS_ATOL)):
            check(
                type(got[key]) is list and len(got[key]) == steps,
                f"result[{key!r}] should hold {steps} losses {where}",
            )
            check_close(
                torch.tensor(got[key], dtype=torch.float64),
                torch.tensor(want[key], dtype=torch.float64),
                f"result[{key!r}] {where}",
                rtol=0,
                atol=atol,
            )
        for key, atol in (
            ("fp32_val_loss", LOSS_ATOL),
            ("amp_val_loss", AMP_LOSS_ATOL),
            ("difference", AMP_LOSS_ATOL),
        ):
            check(type(got[key]) is float, f"result[{key!r}] should be a Python float {where}")
            check_close(got[key], want[key], f"result[{key!r}] {where}", rtol=0, atol=atol)
        check_close(
            got["difference"],
            got["amp_val_loss"] - got["fp32_val_loss"],
            f"result['difference'] should be amp_val_loss - fp32_val_loss {where}",
            rtol=0,
            atol=1e-6,
        )
    _check_placement(obs.next("off_cpu"), obs.next("placement"), f"(hidden test seed {obs.seed})")


def _check_placement(outcome: object, placement: object, where: str) -> None:
    """The run on data on the meta device (a GPU's stand-in, whose values read as zeros there, and
    where autocast on "meta" runs as on the CPU): every forward pass of both runs, training and
    evaluation, must get its batch on that device, and the model must be there too.
    ``model_fn`` builds the model on the CPU, as a model is built before it is moved to a GPU.
    The run need not finish (a step no meta tensor can take ends it); the forward passes made
    before that are checked, and the fp32 run must make at least one."""
    check(
        type(placement) is list
        and len(placement) >= 1
        and all(type(p) is dict and set(p) == {"inputs", "weights"} for p in placement),
        f"model_fn should be called for the fp32 run on data on the meta device (a GPU's "
        f"stand-in): it was not ({outcome!r:.300}) {where}",
    )
    error = getattr(outcome, "message", "")
    check(
        len(placement[0]["inputs"]) >= 1,
        f"on data on the meta device (a GPU's stand-in: train_tokens.device is meta) the fp32 "
        f"run made no forward pass ({error!s:.200}): make the batches on the data's device, "
        f"random_batches(..., device=train_tokens.device), not on the CPU (random_batches' "
        f"default; on a GPU the model would get CPU batches) {where}",
    )
    for run, p in zip(("fp32", "AMP"), placement, strict=False):
        for n, (x, w) in enumerate(zip(p["inputs"], p["weights"], strict=True)):
            check(
                x == "meta",
                f"on data on the meta device (a GPU's stand-in) the {run} run's forward pass "
                f"{n + 1} got its batch on {x}: make every batch, the training ones and "
                f"val_batch(..., device=train_tokens.device), on the data's device {where}",
            )
            check(
                w == "meta",
                f"on data on the meta device (a GPU's stand-in) the {run} run's model was on "
                f"{w} at its forward pass {n + 1}: move the model to the data's device, "
                f"model_fn().to(train_tokens.device) (model_fn builds it on the CPU; a device "
                f"type such as 'cuda' names no particular device) {where}",
            )


def _check_probe(probe: dict, name: str, amp: bool, steps: int, dtype, want: dict, where: str):
    """One run's probe against the recipe: the seeded initial weights, ``steps`` training
    forward passes on the reference's batches with autocast as ``amp`` says (in ``dtype``), one
    evaluation under no_grad on the whole held-out text, every backward outside autocast."""
    initial = probe["initial"]
    check(
        set(initial) == set(want["initial"])
        and all(torch.equal(initial[k], v) for k, v in want["initial"].items()),
        f"the {name} run's model should start from the weights torch.manual_seed(seed) gives "
        f"(call it right before model_fn() in each run) {where}",
    )
    train_on = [a for g, a in zip(probe["grad"], probe["autocast"], strict=True) if g]
    eval_on = [a for g, a in zip(probe["grad"], probe["autocast"], strict=True) if not g]
    check(
        train_on == [amp] * steps,
        f"the {name} run should take {steps} training steps, each forward pass with "
        f"autocast {'on' if amp else 'off'}; its forward passes with gradients had "
        f"autocast {train_on} {where}",
    )
    check(
        eval_on == [amp],
        f"the {name} run should evaluate once, under torch.no_grad(), with autocast "
        f"{'on' if amp else 'off'}; got {eval_on} {where}",
    )
    if amp:
        dtypes = [d for d, a in zip(probe["dtype"], probe["autocast"], strict=True) if a]
        check(
            dtypes == [str(dtype)] * (steps + 1),
            f"the AMP run's autocast should run in amp_dtype ({dtype}); its forward passes "
            f"ran in {dtypes} {where}",
        )
    inputs = [x for g, x in zip(probe["grad"], probe["inputs"], strict=True) if g]
    check(
        all(
            torch.equal(x, w)
            for x, w in zip(inputs, want[f"{'amp' if amp else 'fp32'}_inputs"], strict=True)
        ),
        f"the {name} run's batches should be the first {steps} of random_batches(train_tokens, "
        f"batch_size, block_size, seed) {where}",
    )
    evals = [x for g, x in zip(probe["grad"], probe["inputs"], strict=True) if not g]
    check(
        torch.equal(evals[0], want["val_inputs"]),
        f"the {name} run should evaluate on the whole held-out text, val_batch(val_tokens, "
        f"block_size, max_windows=None) {where}",
    )
    check(
        probe["backward_autocast"] == [False] * steps,
        f"the {name} run should call backward() once per step, outside autocast "
        f"(the recipe: autocast covers the forward pass and the loss only); autocast "
        f"was on at its backward passes: {probe['backward_autocast']} {where}",
    )


WORLD = 2


def reference_run(spec: T.RunSpec, world: int = WORLD, until_stepped: bool = False) -> dict:
    """The ranks' arithmetic in one process: each rank's micro-batches from the same RNG state
    (every rank draws the same dropout masks), its loss summed and divided by the token count
    of all ranks times the world size, the gradients accumulated per rank and averaged as DDP
    does (each divided by the world size, then summed), ``unscale_`` (the gradient's norm noted
    there), clipping, the scaler's step, the schedule stepped only when the optimizer stepped.
    ``world`` 1 is a run without a process group (the bare model). ``until_stepped`` ends the
    run after the first step the optimizer takes (for tests of the inputs)."""
    train_tokens, _ = T.corpus(spec)
    amp_dtype = T.DTYPES[spec.dtype]
    torch.manual_seed(spec.seed)
    model = GPT(spec.config)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=spec.lr)
    scaler = torch.amp.GradScaler(
        "cpu",
        init_scale=spec.init_scale,
        growth_interval=spec.growth_interval,
        enabled=amp_dtype == torch.float16,
    )
    sched = T.lr_schedule(opt, spec.warmup, spec.steps)
    out: dict[str, list] = {k: [] for k in ("losses", "stepped", "lrs", "scales", "grad_norms")}
    for step in range(spec.steps):
        micro = [
            [
                T.micro_batch(train_tokens, spec, r, step * spec.accum + i, "cpu")
                for i in range(spec.accum)
            ]
            for r in range(world)
        ]
        n = sum(int((y != IGNORE).sum()) for batches in micro for _, y in batches)
        out["lrs"].append(opt.param_groups[0]["lr"])
        out["scales"].append(scaler.get_scale() if scaler.is_enabled() else 1.0)
        rng = torch.get_rng_state()
        grads, totals = [], []
        for r in range(world):
            torch.set_rng_state(rng)
            for q in params:
                q.grad = None
            total = torch.zeros((), dtype=torch.float64)
            for x, y in micro[r]:
                with torch.autocast("cpu", dtype=amp_dtype):
                    loss_sum = lm_loss(model(x), y, reduction="sum")
                scaler.scale(loss_sum * (world / n)).backward()
                total += loss_sum.detach().double()
            grads.append([q.grad.clone() for q in params])
            totals.append(total)
        for i, q in enumerate(params):
            acc = grads[0][i] / world
            for g in grads[1:]:
                acc = acc + g[i] / world
            q.grad = acc
        scaler.unscale_(opt)
        out["grad_norms"].append(T.gradient_norm(model))
        torch.nn.utils.clip_grad_norm_(params, spec.max_grad_norm)
        stepped = _scaler_step(scaler, opt)
        if stepped:
            sched.step()
        opt.zero_grad(set_to_none=True)
        out["losses"].append((sum(totals) / n).item())
        out["stepped"].append(stepped)
        if until_stepped and stepped:
            break
    out["state"] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return out


#: Weights and losses against the reference. A correct step whose loss is summed in another
#: order (the per-micro-batch mean times its share of the tokens) moved some weight by up to
#: 2.1e-5 and a returned loss by 1.6e-6 of itself over 60 seeds: AdamW turns a last-bit difference
#: in a near-zero gradient into a larger step, and the runs part a little more at every step. A
#: loss divided by the rank's own tokens instead of all ranks' moved some weight by 4.4e-3 or
#: more on every seed where the ranks' token counts differ.
WEIGHT_ATOL = 5e-4
STEP_LOSS_RTOL = 2e-5


def _rank_checks(got: object, world: int, what: str) -> list[dict]:
    check(
        type(got) is list and len(got) == world and all(type(r) is dict for r in got),
        f"the launcher should return one result per rank ({what})",
    )
    return got  # type: ignore[return-value]


#: The norm of the gradient each step unscaled, against the reference's (relative). A correct
#: step computes the same gradient up to the order of its sums; a loss divided by the token
#: count of all ranks but not multiplied by the world size makes it half as large (2 ranks),
#: which clipping (to max_grad_norm) and AdamW (blind to a constant factor) would hide.
GRAD_NORM_RTOL = 1e-2


def _check_run(got: dict, want: dict, who: str, where: str) -> None:
    """One run's steps against the reference: the gradient's norm at each unscale, stepped,
    learning rates, losses, the final weights."""
    norms = got["grad_norms"]
    check(
        type(norms) is list and len(norms) == len(want["grad_norms"]),
        f"{who}: the record of the gradient norms is malformed {where}",
    )
    for step, (g, w) in enumerate(zip(norms, want["grad_norms"], strict=True)):
        if not math.isfinite(w):
            check(
                not math.isfinite(g),
                f"{who}: at step {step} the scaled gradient should overflow float16 (the "
                f"reference's norm: {w}), got a finite one, {g:.6g}: where it overflows depends "
                f"on the loss's scaling (times the world size, over all ranks' counted "
                f"targets) {where}",
            )
            continue
        check(
            math.isfinite(g) and abs(g - w) <= GRAD_NORM_RTOL * w,
            f"{who}: at step {step} the unscaled gradient (at scaler.unscale_, before clipping) "
            f"had norm {g:.6g}, the reference {w:.6g} ({g / w:.3g}x; nan: the step never called "
            f"scaler.unscale_). DDP averages the ranks' gradients, dividing by the world size, "
            f"so multiply each rank's loss sum by the world size over all ranks' counted "
            f"targets; unscale before clipping {where}",
        )
    check(
        got["stepped"] == want["stepped"],
        f"{who}: whether each step's optimizer stepped should be {want['stepped']} (the first "
        f"scale overflows float16; after every step taken the scaler doubles the scale, so "
        f"compare the scale after scaler.update() with the one before using >=, not ==), got "
        f"{got['stepped']} {where}",
    )
    check(
        got["lrs"] == want["lrs"],
        f"{who}: the learning rate at each step should be {want['lrs']} (the schedule "
        f"steps only when the optimizer did), got {got['lrs']} {where}",
    )
    check_close(
        torch.tensor(got["losses"], dtype=torch.float64),
        torch.tensor(want["losses"], dtype=torch.float64),
        f"{who}: the returned losses (the mean over every rank's counted tokens) {where}",
        rtol=STEP_LOSS_RTOL,
        atol=0,
    )
    for name, value in want["state"].items():
        check_close(
            got["state"][name],
            value,
            f"{who}: {name} after {len(want['losses'])} steps, against the single-process "
            f"reference {where}",
            rtol=0,
            atol=WEIGHT_ATOL,
        )


def distributed_step(obs: Observations) -> None:
    """An unbroken run with a checkpoint at step 3 and a run resumed from it, on 2 gloo ranks,
    against the single-process reference and against each other; then rank 0's checkpoint
    loaded into a run on the meta device, a run in one process without a process group (the
    bare model) against the reference for a world of 1, and a save and load with a GPU's
    generators stood in for."""
    spec = T.graded_spec(obs.seed)
    where = f"(hidden test seed {obs.seed}; {spec.config}, accum {spec.accum}, float16)"
    unbroken = _rank_checks(obs.next("unbroken"), WORLD, "the unbroken run")
    resumed = _rank_checks(obs.next("resumed"), WORLD, "the resumed run")
    off_cpu = obs.next("off_cpu")
    alone = obs.next("alone")
    generators = obs.next("cuda_generators")
    with one_cpu_thread():
        want = reference_run(spec)
    k = spec.save_at[0]
    for r, got in enumerate(unbroken):
        calls = got["allreduces"]
        check(
            calls == [1] * spec.steps,
            f"rank {r}: DDP all-reduces the gradients once per optimizer step (its one bucket, "
            f"after the last micro-batch's backward; no_sync() on the others); per step it "
            f"made {calls} {where}",
        )
        _check_run(got, want, f"rank {r}", where)
    for r, (a, b) in enumerate(zip(unbroken, resumed, strict=True)):
        check(
            b["start_step"] == k,
            f"rank {r}: resumed from the checkpoint saved after step {k}, the run should "
            f"continue at step {k} (load_checkpoint returns the data position, "
            f"{k} * accum micro-batches); it started at {b['start_step']} {where}",
        )
        for key in ("losses", "stepped", "lrs", "scales"):
            check(
                b[key] == a[key][k:],
                f"rank {r}: the resumed run's {key} should equal the unbroken run's from step "
                f"{k} on, bit for bit: {a[key][k:]}, got {b[key]} {where}",
            )
        for name, value in a["state"].items():
            check(
                torch.equal(b["state"][name], value),
                f"rank {r}: {name} of the resumed run should equal the unbroken run's bit for "
                f"bit (model, optimizer, scaler, scheduler, RNG state and data position all "
                f"restored) {where}",
            )

    _check_off_cpu(off_cpu, where)
    check(
        not isinstance(alone, Raised),
        f"in one process without a process group (a world of 1: the model is the bare GPT, "
        f"not DDP), distributed_step raised {getattr(alone, 'type', '')}: "
        f"{getattr(alone, 'message', '')!s:.300}; call model.no_sync() and dist.all_reduce "
        f"only when dist.is_initialized() {where}",
    )
    check(type(alone) is dict, f"the run in one process returned no result {where}")
    with one_cpu_thread():
        want_alone = reference_run(spec, world=1)
    _check_run(alone, want_alone, "in one process (a world of 1)", where)
    _check_cuda_generators(generators, where)


def _check_cuda_generators(trip: dict, where: str) -> None:
    """``course.gpt_train.cuda_generators_round_trip``: a save and a load as on a machine with a
    GPU (its generators stood in for) must put back the CUDA generators' state."""
    check(
        type(trip) is dict and set(trip) == {"error", "saved", "restored"},
        f"the record of the save and load with a GPU's generators is malformed {where}",
    )
    check(
        trip["error"] is None,
        f"save_checkpoint and load_checkpoint failed as on a machine with a GPU (the test "
        f"stands in for its generators: torch.cuda.is_available() is True, and "
        f"torch.cuda.get_rng_state_all() gives one CPU ByteTensor per GPU): {trip['error']} "
        f"{where}",
    )
    saved, restored = trip["saved"], trip["restored"]
    check(
        len(saved) == len(restored) and all(map(torch.equal, saved, restored)),
        f"on a machine with a GPU, load_checkpoint should put back the CUDA generators' state "
        f"that save_checkpoint saved (torch.cuda.get_rng_state_all(), restored with "
        f"torch.cuda.set_rng_state_all()): there dropout draws its masks from them, so a run "
        f"resumed without them draws other masks. The test pretends the machine has one GPU; "
        f"after the load its generator held {restored[0].tolist() if restored else None}, at "
        f"the save {saved[0].tolist() if saved else None} {where}",
    )


def _check_off_cpu(loads: dict, where: str) -> None:
    """``course.gpt_train.load_off_cpu``'s two loads of rank 0's checkpoint: the one into a model
    on the meta device (a GPU's stand-in) must succeed and restore what the CPU one restores."""
    check(
        type(loads) is dict and set(loads) == {"cpu", "meta"},
        f"the loads of the checkpoint into a run on the CPU and one on the meta device should "
        f"both be recorded {where}",
    )
    cpu, meta = loads["cpu"], loads["meta"]
    check(
        cpu["error"] is None,
        f"load_checkpoint failed on the CPU: {cpu['error']} {where}",
    )
    check(
        meta["error"] is None,
        f"load_checkpoint failed for a model that is not on the CPU (on the meta device, which "
        f"stands in for a GPU and holds no data): {meta['error']}. Load the checkpoint onto the "
        f"CPU (torch.load(path, map_location='cpu')): every generator state must reach "
        f"torch.set_rng_state as a CPU ByteTensor, and load_state_dict copies the weights to "
        f"the model's device {where}",
    )
    for key, what in (
        ("rng", "the generator state"),
        ("position", "the returned data position"),
        ("scale", "the scaler's scale"),
        ("lr", "the learning rate"),
        ("last_epoch", "the scheduler's step count"),
    ):
        same = torch.equal(cpu[key], meta[key]) if key == "rng" else cpu[key] == meta[key]
        check(
            same,
            f"loading into a model on the meta device (a GPU's stand-in) should restore "
            f"{what} as loading into one on the CPU does: {meta[key]!r:.120} against "
            f"{cpu[key]!r:.120}; load the checkpoint onto the CPU (map_location='cpu') {where}",
        )


JUDGES = {
    "transformer_flops_tests": ("transformer_flops", transformer_flops),
    "train_compare_tests": ("train_compare", train_compare),
    "distributed_step_tests": ("distributed_step", distributed_step),
}
