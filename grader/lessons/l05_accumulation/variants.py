"""Wrong answers to lesson 05's exercises that the graders must reject, and valid ones they keep."""

VARIANTS = {
    "no_division_by_count": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: the micro-batch losses are not divided by their count, so the gradient is k times
    # the large batch's.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "update_per_micro_batch": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: steps and updates the scaler after every micro-batch, so the growth tracker counts
    # micro-batches and each step sees one micro-batch's gradient.
    stepped = True
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
        if max_grad_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        stepped = stepped and scaler.get_scale() >= before
    return bool(stepped)
""",
    ),
    "clip_scaled_gradients": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: clips before unscale_, so the norm is measured on gradients times the scale.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "grads_not_cleared": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: never clears the gradients, so the next step adds onto this one's.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    return bool(scaler.get_scale() >= before)
""",
    ),
    "stepped_if_scale_unchanged": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: "stepped" taken as "the scale did not change", so a clean step after which the
    # scale grows (growth_interval reached) is reported as skipped.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scale_before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return scaler.get_scale() == scale_before
""",
    ),
    "one_backward_for_all": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: adds up the micro-batches' losses and runs one backward pass at the end. The
    # gradient is the same, but every micro-batch's activations stay alive until then, so the
    # memory accumulation exists to save is spent anyway.
    total = 0.0
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            total = total + loss_fn(model(xb), yb) / len(micro_batches)
    scaler.scale(total).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "loss_outside_autocast": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: only the model's forward runs under autocast; the loss is computed outside it, on
    # low-precision logits, instead of in the dtype autocast chooses for the loss.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            out = model(xb)
        loss = loss_fn(out, yb) / len(micro_batches)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "zero_grad_every_micro_batch": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: clears the gradients before every micro-batch, as in an ordinary training loop, so
    # only the last micro-batch's gradient reaches the step.
    for xb, yb in micro_batches:
        optimizer.zero_grad(set_to_none=True)
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "clip_error_if_nonfinite": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: clips with error_if_nonfinite=True, which raises on every overflow step instead of
    # letting the scaler skip it.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm,
                                       error_if_nonfinite=True)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "backward_inside_autocast": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: runs the backward pass inside the autocast block; autocast is for the forward pass
    # and the loss, and the backward pass already runs in the dtypes the forward chose.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
            scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "stepped_if_losses_finite": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Wrong: "stepped" taken as "every loss was finite"; a scaled backward pass can overflow
    # float16 while every loss is finite, and the scaler then skips the step.
    finite = True
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        finite = finite and bool(torch.isfinite(loss))
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return finite
""",
    ),
    "no_optimizer_state": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: the optimizer's state (AdamW's moments and step count, SGD's momentum) is not
    # saved, so the resumed run takes different steps.
    torch.save({"model": model.state_dict(), "scaler": scaler.state_dict(),
                "cpu_rng": torch.get_rng_state()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu_rng"])
""",
    ),
    "no_scaler_state": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: the scaler's scale and growth tracker are not saved.
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "cpu_rng": torch.get_rng_state()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["cpu_rng"])
""",
    ),
    "no_rng_state": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: the random state is not saved, so batches and dropout masks differ after resuming.
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
""",
    ),
    "scale_without_tracker": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: keeps the scale but not the growth tracker, so the resumed scaler grows the scale
    # after another number of clean steps than the run that never stopped.
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scale": scaler.get_scale(), "cpu_rng": torch.get_rng_state()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict({**scaler.state_dict(), "scale": state["scale"]})
    torch.set_rng_state(state["cpu_rng"])
""",
    ),
    "reseed_instead_of_rng_state": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: saves the seed the generator started from, not where it is now; reseeding on load
    # replays the random numbers from the start of the run.
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "seed": torch.initial_seed()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.manual_seed(state["seed"])
""",
    ),
    "state_kept_in_memory": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: writes the file but also keeps the state in a variable of the kernel and loads
    # that, so a checkpoint works only in the process that wrote it, and only the latest one.
    global _LATEST_STATE
    _LATEST_STATE = copy.deepcopy({"model": model.state_dict(),
                                   "optimizer": optimizer.state_dict(),
                                   "scaler": scaler.state_dict(),
                                   "cpu_rng": torch.get_rng_state()})
    torch.save(_LATEST_STATE, path)


def load_training_state(path, model, optimizer, scaler):
    state = _LATEST_STATE
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu_rng"])
""",
    ),
    "no_cuda_rng_state": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: saves the CPU generator's state but not the GPUs' (torch.cuda.get_rng_state_all),
    # so on a GPU the resumed run draws other dropout masks.
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "cpu_rng": torch.get_rng_state()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu_rng"])
""",
    ),
    "cuda_rng_current_gpu_only": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: saves the generator state of the current GPU only (torch.cuda.get_rng_state()),
    # not every GPU's.
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict(), "cpu_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state()
    torch.save(state, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu_rng"])
    if "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"])
""",
    ),
    "cuda_rng_saved_not_restored": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Wrong: saves every GPU's generator state but never restores it.
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict(), "cpu_rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    torch.save(state, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu_rng"])
""",
    ),
}

VALID = {
    "accumulate_with_enumerate": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Valid: keyword arguments, a float scale read before the step and a negated comparison.
    k = len(micro_batches)
    for i, (xb, yb) in enumerate(micro_batches):
        with torch.amp.autocast(device_type=device_type, dtype=dtype):
            out = model(xb)
            loss = loss_fn(out, yb) / k
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_grad_norm)
    before = float(scaler.get_scale())
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    return not float(scaler.get_scale()) < before
""",
    ),
    "accumulate_try_finally": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Valid: clears the gradients in a finally block and clips through a list of parameters.
    params = [p for p in model.parameters()]
    try:
        for xb, yb in micro_batches:
            with torch.amp.autocast(device_type, dtype=dtype):
                loss = loss_fn(model(xb), yb)
            scaler.scale(loss / len(micro_batches)).backward()
        if max_grad_norm is not None:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        old_scale = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        return bool(old_scale <= scaler.get_scale())
    finally:
        optimizer.zero_grad(set_to_none=True)
""",
    ),
    "weight_by_share": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Valid: weights each micro-batch's mean loss by its share of the examples, n_i / B, which
    # for equal micro-batches is 1 / k (and stays right for unequal ones).
    total = sum(len(yb) for _, yb in micro_batches)
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) * (len(yb) / total)
        scaler.scale(loss).backward()
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    before = scaler.get_scale()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return bool(scaler.get_scale() >= before)
""",
    ),
    "unscale_always_check_grads": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Valid: unscales on every step (step then does not unscale again), scales the divided loss
    # with torch.autocast, and decides "stepped" from the unscaled gradients' finiteness, which
    # is what the scaler itself checks.
    for xb, yb in micro_batches:
        with torch.autocast(device_type=device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb)
        scaler.scale(loss).div(len(micro_batches)).backward()
    scaler.unscale_(optimizer)
    finite = all(bool(torch.isfinite(p.grad).all())
                 for p in model.parameters() if p.grad is not None)
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return finite
""",
    ),
    "checkpoint_file_object": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Valid: writes through an open file, with the random states under one key.
    rng = {"cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    with open(path, "wb") as f:
        torch.save({"model": model.state_dict(), "optim": optimizer.state_dict(),
                    "scaler": scaler.state_dict(), "rng": rng}, f)


def load_training_state(path, model, optimizer, scaler):
    with open(path, "rb") as f:
        state = torch.load(f, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optim"])
    scaler.load_state_dict(state["scaler"])
    torch.random.set_rng_state(state["rng"]["cpu"])
    if "cuda" in state["rng"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["rng"]["cuda"])
""",
    ),
    "checkpoint_list": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Valid: a list instead of a dict, in a fixed order.
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    torch.save([model.state_dict(), optimizer.state_dict(), scaler.state_dict(),
                torch.get_rng_state(), cuda], str(path))


def load_training_state(path, model, optimizer, scaler):
    model_sd, optim_sd, scaler_sd, cpu_rng, cuda_rng = torch.load(
        str(path), map_location="cpu", weights_only=True)
    model.load_state_dict(model_sd)
    optimizer.load_state_dict(optim_sd)
    scaler.load_state_dict(scaler_sd)
    torch.set_rng_state(cpu_rng)
    if cuda_rng is not None:
        torch.cuda.set_rng_state_all(cuda_rng)
""",
    ),
    "finite_scaled_grads": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Valid: decides "stepped" from the gradients before the scaler touches them; multiplying
    # by the finite 1 / scale keeps an inf an inf and a finite value finite, so the scaled
    # gradients are finite exactly when the unscaled ones are.
    params = list(model.parameters())
    for xb, yb in micro_batches:
        with torch.autocast(device_type, dtype):
            loss = loss_fn(model(xb), yb) * (1.0 / len(micro_batches))
        scaler.scale(loss).backward()
    finite = all(bool(p.grad.isfinite().all()) for p in params if p.grad is not None)
    if max_grad_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
    scaler.step(optimizer)
    scaler.update()
    for p in params:
        p.grad = None
    return finite
""",
    ),
    "clip_scaled_with_scaled_threshold": (
        "accumulated_step",
        """
def accumulated_step(model, optimizer, scaler, micro_batches, loss_fn, device_type, dtype,
                     max_grad_norm=None):
    # Valid: clips the still-scaled gradients to max_grad_norm times the scale, which is the
    # same clipping (the scale is a power of two), and lets scaler.step unscale; on an overflow
    # step the clipped gradients hold NaN, which step's own unscale_ finds.
    for xb, yb in micro_batches:
        with torch.amp.autocast(device_type, dtype=dtype):
            loss = loss_fn(model(xb), yb) / len(micro_batches)
        scaler.scale(loss).backward()
    scale = scaler.get_scale()
    if max_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm * scale)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return scaler.get_scale() >= scale
""",
    ),
    "checkpoint_rng_first": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Valid: the random state saved first and restored first, the path through os.fspath.
    state = {"rng": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    state.update(model=model.state_dict(), opt=optimizer.state_dict(),
                 amp=scaler.state_dict())
    torch.save(state, os.fspath(path))


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(os.fspath(path), weights_only=True)
    torch.set_rng_state(state["rng"])
    if "cuda_rng" in state:
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    scaler.load_state_dict(state["amp"])
    optimizer.load_state_dict(state["opt"])
    model.load_state_dict(state["model"])
""",
    ),
    "checkpoint_cuda_per_device": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Valid: saves the GPUs' generator states one device at a time and restores them the same
    # way, with no is_available() test (device_count() is 0 without a GPU).
    gpus = [torch.cuda.get_rng_state(i) for i in range(torch.cuda.device_count())]
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "cpu": torch.get_rng_state(), "gpus": gpus},
               path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu"])
    for i, gpu_state in enumerate(state["gpus"]):
        torch.cuda.set_rng_state(gpu_state, f"cuda:{i}")
""",
    ),
    "checkpoint_cuda_unconditional": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Valid: torch.cuda.get_rng_state_all() is an empty list without a GPU, and
    # set_rng_state_all of an empty list does nothing, so no is_available() test is needed.
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "rng": torch.get_rng_state(),
                "cuda_rng": torch.cuda.get_rng_state_all()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["rng"])
    torch.cuda.set_rng_state_all(state["cuda_rng"])
""",
    ),
    "checkpoint_cuda_imported_functions": (
        "checkpoint_state",
        """
from torch.cuda import get_rng_state_all, set_rng_state_all


def save_training_state(path, model, optimizer, scaler):
    # Valid: torch.cuda's functions imported by name when the cell runs, before any test.
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "cpu_rng": torch.get_rng_state(),
                "cuda_rng": get_rng_state_all()}, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu_rng"])
    set_rng_state_all(state["cuda_rng"])
""",
    ),
    "checkpoint_cuda_device_context": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Valid: selects each GPU with torch.cuda.device(i) and reads the current device's state.
    gpus = []
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            with torch.cuda.device(i):
                gpus.append(torch.cuda.get_rng_state())
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "cpu": torch.get_rng_state(), "gpus": gpus},
               path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu"])
    for i, gpu_state in enumerate(state["gpus"]):
        torch.cuda.set_device(i)
        torch.cuda.set_rng_state(gpu_state)
    if state["gpus"]:
        torch.cuda.set_device(0)
""",
    ),
    "checkpoint_accelerator_guard": (
        "checkpoint_state",
        """
def save_training_state(path, model, optimizer, scaler):
    # Valid: asks torch.accelerator whether there is a GPU, and torch.cuda.random for the states.
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scaler": scaler.state_dict(), "cpu": torch.get_rng_state()}
    if torch.accelerator.is_available():
        state["cuda"] = [torch.cuda.random.get_rng_state(i)
                         for i in range(torch.accelerator.device_count())]
    torch.save(state, path)


def load_training_state(path, model, optimizer, scaler):
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.accelerator.is_available():
        torch.cuda.random.set_rng_state_all(state["cuda"])
""",
    ),
}
