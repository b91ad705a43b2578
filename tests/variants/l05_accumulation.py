"""Wrong answers to lesson 05's exercises that the graders must reject."""

LESSON = "05-accumulation"

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
}
