"""Lesson 02's exercises: wrong answers the graders must reject (``VARIANTS``) and valid answers
written differently from the reference (``VALID``).

The DynamicLossScaler variants are the right class with one common mistake each (built from
``_SCALER`` by a single text replacement, so each differs from a correct answer in one place).
"""

_SCALER = """
class DynamicLossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self._scale = torch.tensor(init_scale, dtype=torch.float32)
        self._init_scale = init_scale
        self._started = False
        self._growth_factor = growth_factor
        self._backoff_factor = backoff_factor
        self._growth_interval = growth_interval
        self._tracker = 0
        self._stage = {}
        self._found_inf = {}
        self._loss_finite = True

    def scale(self, loss):
        self._started = True
        self._loss_finite = bool(torch.isfinite(loss).all())
        return loss * self._scale.to(loss.device)

    def unscale_(self, optimizer):
        key = id(optimizer)
        if self._stage.get(key) == "unscaled":
            raise RuntimeError("unscale_() called twice")
        inv_scale = torch.tensor(1.0 / float(self._scale), dtype=torch.float32)
        found = False
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        continue
                    if not bool(torch.isfinite(p.grad).all()):
                        found = True
                    p.grad.mul_(inv_scale)
        self._found_inf[key] = found
        self._stage[key] = "unscaled"

    def step(self, optimizer):
        key = id(optimizer)
        if key not in self._stage:
            self.unscale_(optimizer)
        self._stage[key] = "stepped"
        if self._found_inf[key]:
            return None
        return optimizer.step()

    def update(self):
        if any(self._found_inf.values()):
            self._scale = torch.tensor(float(self._scale) * self._backoff_factor,
                                       dtype=torch.float32)
            self._tracker = 0
        else:
            self._tracker += 1
            if self._tracker == self._growth_interval:
                grown = torch.tensor(float(self._scale) * self._growth_factor,
                                     dtype=torch.float32)
                if bool(torch.isfinite(grown)):
                    self._scale = grown
                self._tracker = 0
        self._started = True
        self._stage = {}
        self._found_inf = {}

    def get_scale(self):
        return float(self._scale) if self._started else float(self._init_scale)

    def state_dict(self):
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": int(self._tracker)}

    def load_state_dict(self, d):
        self._init_scale = d["scale"]
        self._scale = torch.tensor(d["scale"], dtype=torch.float32)
        self._growth_factor = d["growth_factor"]
        self._backoff_factor = d["backoff_factor"]
        self._growth_interval = d["growth_interval"]
        self._tracker = int(d["_growth_tracker"])
"""


def _scaler(old: str, new: str, *more: str) -> tuple[str, str]:
    """The reference scaler with ``old`` replaced by ``new`` (and further old/new pairs)."""
    source = _SCALER
    pairs = [(old, new), *zip(more[::2], more[1::2], strict=True)]
    for a, b in pairs:
        assert source.count(a) == 1, a
        source = source.replace(a, b)
    return ("dynamic_loss_scaler", source)


_MASTER = """
def make_master_params(model):
    return [nn.Parameter(p.detach().float().clone()) for p in model.parameters()]


def master_step(model, master_params, optimizer, scale):
    params = list(model.parameters())
    found_inf = False
    for p, m in zip(params, master_params):
        if p.grad is None:
            m.grad = None
            continue
        m.grad = p.grad.detach().float() / scale
        if not bool(torch.isfinite(m.grad).all()):
            found_inf = True
    if not found_inf:
        optimizer.step()
        with torch.no_grad():
            for p, m in zip(params, master_params):
                p.copy_(m)
    for m in master_params:
        m.grad = None
    model.zero_grad(set_to_none=True)
    return not found_inf
"""


def _master(old: str, new: str) -> tuple[str, str]:
    assert _MASTER.count(old) == 1, old
    return ("master_weights", _MASTER.replace(old, new))


VARIANTS = {
    # Wrong: after an overflow the growth tracker keeps counting from where it was.
    "no_tracker_reset_on_overflow": _scaler(
        """                                       dtype=torch.float32)
            self._tracker = 0
        else:""",
        """                                       dtype=torch.float32)
        else:""",
    ),
    # Wrong: grows after growth_interval + 1 clean steps.
    "grows_one_step_late": _scaler(
        "if self._tracker == self._growth_interval:",
        "if self._tracker > self._growth_interval:",
    ),
    # Wrong: grows after growth_interval - 1 clean steps.
    "grows_one_step_early": _scaler(
        "if self._tracker == self._growth_interval:",
        "if self._tracker >= self._growth_interval - 1:",
    ),
    # Wrong: update() does nothing to the scale or the tracker when a step was skipped.
    "skips_update_bookkeeping_on_skipped_steps": _scaler(
        """        if any(self._found_inf.values()):
            self._scale = torch.tensor(float(self._scale) * self._backoff_factor,
                                       dtype=torch.float32)
            self._tracker = 0
        else:""",
        """        if any(self._found_inf.values()):
            pass
        else:""",
    ),
    # Wrong: one backoff per optimizer that overflowed, instead of one per iteration.
    "backoff_per_optimizer": _scaler(
        """        if any(self._found_inf.values()):
            self._scale = torch.tensor(float(self._scale) * self._backoff_factor,
                                       dtype=torch.float32)""",
        """        if any(self._found_inf.values()):
            for found in self._found_inf.values():
                if found:
                    self._scale = torch.tensor(float(self._scale) * self._backoff_factor,
                                               dtype=torch.float32)""",
    ),
    # Wrong: step() unscales again even after an explicit unscale_().
    "unscales_twice": _scaler(
        """        if key not in self._stage:
            self.unscale_(optimizer)""",
        """        self._stage.pop(key, None)
        self.unscale_(optimizer)""",
    ),
    # Wrong: checks the loss for inf/nan instead of the gradients.
    "checks_only_the_loss": _scaler(
        """                    if not bool(torch.isfinite(p.grad).all()):
                        found = True""",
        """                    if not self._loss_finite:
                        found = True""",
    ),
    # Wrong: unscales and checks only the optimizer's first param group (the others keep their
    # scaled gradients, and an inf there goes unnoticed).
    "first_param_group_only": _scaler(
        "for group in optimizer.param_groups:",
        "for group in optimizer.param_groups[:1]:",
    ),
    # Wrong: assumes every parameter has a gradient (a parameter the loss never used has None).
    "assumes_every_grad_exists": _scaler(
        """                    if p.grad is None:
                        continue
                    if not""",
        """                    if not""",
    ),
    # Wrong: unscale_ only records; the division waits until step(), so clipping between
    # unscale_ and step (the reason unscale_ exists) sees the scaled gradients.
    "unscales_lazily_in_step": _scaler(
        """                    p.grad.mul_(inv_scale)
        self._found_inf[key] = found""",
        """        self._inv = inv_scale
        self._found_inf[key] = found""",
        """        if self._found_inf[key]:
            return None
        return optimizer.step()""",
        """        if self._found_inf[key]:
            return None
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        p.grad.mul_(self._inv)
        return optimizer.step()""",
    ),
    # Wrong: the new scale is a float32 product (a float32 tensor times a Python float is
    # computed in float32), not float(scale) * factor in float64 rounded to float32.
    "scale_product_in_float32": _scaler(
        """            self._scale = torch.tensor(float(self._scale) * self._backoff_factor,
                                       dtype=torch.float32)""",
        """            self._scale = self._scale * self._backoff_factor""",
        """                grown = torch.tensor(float(self._scale) * self._growth_factor,
                                     dtype=torch.float32)""",
        """                grown = self._scale * self._growth_factor""",
    ),
    # Wrong: the scale is a Python float (float64) that is never rounded to float32.
    "scale_kept_in_float64": _scaler(
        """            self._scale = torch.tensor(float(self._scale) * self._backoff_factor,
                                       dtype=torch.float32)""",
        """            self._scale = torch.tensor(float(self._scale) * self._backoff_factor,
                                       dtype=torch.float64)""",
        """                grown = torch.tensor(float(self._scale) * self._growth_factor,
                                     dtype=torch.float32)""",
        """                grown = torch.tensor(float(self._scale) * self._growth_factor,
                                     dtype=torch.float64)""",
        """        self._scale = torch.tensor(init_scale, dtype=torch.float32)""",
        """        self._scale = torch.tensor(init_scale, dtype=torch.float64)""",
    ),
    # Wrong: once one optimizer found an inf, every optimizer stepped after it is skipped too
    # (only the optimizer whose own gradients overflowed skips; update() backs off once).
    "skips_every_optimizer_after_an_inf": _scaler(
        """        if self._found_inf[key]:
            return None""",
        """        if any(self._found_inf.values()):
            return None""",
    ),
    # Wrong: update() never forgets the iteration's records, so the next iteration's step()
    # thinks it has already unscaled and reuses the old inf verdict.
    "records_kept_across_iterations": _scaler(
        """        self._started = True
        self._stage = {}
        self._found_inf = {}""",
        """        self._started = True""",
    ),
    # Wrong: load_state_dict restores the scale and the factors but restarts the growth count.
    "load_forgets_growth_tracker": _scaler(
        """        self._tracker = int(d["_growth_tracker"])""",
        """        self._tracker = 0""",
    ),
    # Wrong: unscale_ stops multiplying at the first inf or nan ("the step is skipped anyway"),
    # leaving the other gradients scaled.
    "unscale_stops_at_first_inf": _scaler(
        """                    if not bool(torch.isfinite(p.grad).all()):
                        found = True
                    p.grad.mul_(inv_scale)""",
        """                    if found:
                        break
                    if not bool(torch.isfinite(p.grad).all()):
                        found = True
                    p.grad.mul_(inv_scale)""",
    ),
    # Wrong: get_scale() returns the float32 scale even before the first scale() call, where
    # GradScaler returns the init_scale it was given.
    "get_scale_rounded_before_first_scale": _scaler(
        """        return float(self._scale) if self._started else float(self._init_scale)""",
        """        return float(self._scale)""",
    ),
    # Wrong: grows the scale without checking that it is still finite in float32, so at the top
    # of float32's range the scale becomes inf (GradScaler keeps the old scale instead).
    "growth_without_inf_check": _scaler(
        """                if bool(torch.isfinite(grown)):
                    self._scale = grown""",
        """                self._scale = grown""",
    ),
    # Wrong: when the grown scale would be inf the growth count is not restarted (GradScaler
    # restarts it whether or not the new scale was taken).
    "tracker_kept_when_growth_refused": _scaler(
        """                if bool(torch.isfinite(grown)):
                    self._scale = grown
                self._tracker = 0""",
        """                if bool(torch.isfinite(grown)):
                    self._scale = grown
                    self._tracker = 0""",
    ),
    # Wrong: state_dict() reads the float32 scale even before the first scale() call, where
    # GradScaler's state_dict holds init_scale as it was given.
    "state_dict_rounded_before_first_scale": _scaler(
        """        return {"scale": self.get_scale(),""",
        """        return {"scale": float(self._scale),""",
    ),
    # Wrong: the master gradients are not divided by the loss scale.
    # Wrong: not written by hand. torch's GradScaler, its methods and ops taken before the test
    # replaces them, put back around each call (the driver notes the ops GradScaler runs).
    "grad_scaler_taken_before_the_test": (
        "dynamic_loss_scaler",
        """
import torch

_GS = torch.amp.GradScaler
_METHODS = {n: getattr(_GS, n) for n in ("__init__", "scale", "unscale_", "step", "update",
            "get_scale", "state_dict", "load_state_dict", "_unscale_grads_")}
_OPS = {n: getattr(torch, n) for n in ("_amp_update_scale_",
                                       "_amp_foreach_non_finite_check_and_unscale_")}


class DynamicLossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self._g = object.__new__(_GS)
        self._call("__init__", "cpu", init_scale=init_scale, growth_factor=growth_factor,
                   backoff_factor=backoff_factor, growth_interval=growth_interval)

    def _call(self, name, *args, **kwargs):
        saved = {n: getattr(_GS, n) for n in _METHODS}
        saved_ops = {n: getattr(torch, n) for n in _OPS}
        try:
            for n, f in _METHODS.items():
                setattr(_GS, n, f)
            for n, f in _OPS.items():
                setattr(torch, n, f)
            return _METHODS[name](self._g, *args, **kwargs)
        finally:
            for n, f in saved.items():
                setattr(_GS, n, f)
            for n, f in saved_ops.items():
                setattr(torch, n, f)

    def scale(self, loss):
        return self._call("scale", loss)

    def unscale_(self, optimizer):
        return self._call("unscale_", optimizer)

    def step(self, optimizer, *args, **kwargs):
        return self._call("step", optimizer, *args, **kwargs)

    def update(self, new_scale=None):
        return self._call("update", new_scale)

    def get_scale(self):
        return self._call("get_scale")

    def state_dict(self):
        return self._call("state_dict")

    def load_state_dict(self, state_dict):
        return self._call("load_state_dict", state_dict)
""",
    ),
    "master_not_unscaled": _master(
        "m.grad = p.grad.detach().float() / scale",
        "m.grad = p.grad.detach().float()",
    ),
    # Wrong: steps even when a gradient is inf or nan.
    "master_steps_on_inf": _master(
        "    if not found_inf:\n        optimizer.step()",
        "    if True:\n        optimizer.step()",
    ),
    # Wrong: divides the float16 gradient by the scale in float16, then converts: the small
    # unscaled values round (or underflow) in float16 before reaching float32.
    "master_unscales_in_float16": _master(
        "m.grad = p.grad.detach().float() / scale",
        "m.grad = (p.grad.detach() / scale).float()",
    ),
    # Wrong: copies the masters into the model before the optimizer step, so the float16 model
    # is always one step behind its masters.
    "master_copied_back_before_step": _master(
        """        optimizer.step()
        with torch.no_grad():
            for p, m in zip(params, master_params):
                p.copy_(m)""",
        """        with torch.no_grad():
            for p, m in zip(params, master_params):
                p.copy_(m)
        optimizer.step()""",
    ),
    # Wrong: clears the masters' gradients but not the model's, so the next backward adds to
    # the old float16 gradients.
    "master_keeps_model_grads": _master(
        "    model.zero_grad(set_to_none=True)\n",
        "",
    ),
    # Wrong: a parameter without a gradient gets a zero master gradient instead of None, so an
    # optimizer with weight decay (or any that updates on a zero gradient) moves its master.
    "master_zero_grad_for_unused": _master(
        """            m.grad = None
            continue""",
        """            m.grad = torch.zeros_like(m)
            continue""",
    ),
    # Wrong: the masters keep their gradients after the step (only the model's are cleared), so
    # every float32 gradient stays allocated between steps.
    "master_keeps_master_grads": _master(
        """    for m in master_params:
        m.grad = None
""",
        "",
    ),
    # Wrong: masters made from state_dict(), which holds the model's buffers beside its
    # parameters: a model with a buffer gets a master (and an optimizer entry) for it too.
    "master_from_state_dict": _master(
        "return [nn.Parameter(p.detach().float().clone()) for p in model.parameters()]",
        "return [nn.Parameter(t.detach().float().clone()) for t in model.state_dict().values()]",
    ),
    # Wrong: the master weights are updated but never copied back into the float16 model.
    "master_not_copied_back": _master(
        """        with torch.no_grad():
            for p, m in zip(params, master_params):
                p.copy_(m)""",
        "        pass",
    ),
}


VALID = {
    # A Python float for the scale (rounded to float32 after every change), one record per
    # optimizer in a small dict, inf/nan found with isinf/isnan.
    "scaler_python_float_scale": (
        "dynamic_loss_scaler",
        """
def _as_float32(value):
    return float(torch.tensor(value, dtype=torch.float32))


class DynamicLossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self.scale_value = _as_float32(init_scale)
        self.initial = init_scale
        self.used = False
        self.factors = {"growth_factor": growth_factor, "backoff_factor": backoff_factor,
                        "growth_interval": growth_interval}
        self.tracker = 0
        self.records = {}

    def scale(self, loss):
        self.used = True
        return loss * torch.tensor(self.scale_value, dtype=torch.float32, device=loss.device)

    def unscale_(self, optimizer):
        record = self.records.setdefault(id(optimizer), {"unscaled": False, "stepped": False})
        if record["unscaled"]:
            raise RuntimeError("unscale_() already called for this optimizer since update()")
        inv = torch.tensor(1.0 / self.scale_value, dtype=torch.float32)
        bad = False
        with torch.no_grad():
            grads = [p.grad for g in optimizer.param_groups for p in g["params"]
                     if p.grad is not None]
            for grad in grads:
                bad = bad or bool(torch.isinf(grad).any() or torch.isnan(grad).any())
                grad.mul_(inv.to(grad.device))
        record.update(unscaled=True, bad=bad)

    def step(self, optimizer):
        record = self.records.get(id(optimizer))
        if record is None or not record["unscaled"]:
            self.unscale_(optimizer)
            record = self.records[id(optimizer)]
        record["stepped"] = True
        return None if record["bad"] else optimizer.step()

    def update(self):
        if any(r["bad"] for r in self.records.values()):
            self.scale_value = _as_float32(self.scale_value * self.factors["backoff_factor"])
            self.tracker = 0
        else:
            self.tracker += 1
            if self.tracker == self.factors["growth_interval"]:
                grown = _as_float32(self.scale_value * self.factors["growth_factor"])
                if math.isfinite(grown):
                    self.scale_value = grown
                self.tracker = 0
        self.used = True
        self.records = {}

    def get_scale(self):
        return self.scale_value if self.used else float(self.initial)

    def state_dict(self):
        return {"scale": self.get_scale(), **self.factors, "_growth_tracker": self.tracker}

    def load_state_dict(self, d):
        self.initial = d["scale"]
        self.scale_value = _as_float32(d["scale"])
        self.factors = {k: d[k] for k in ("growth_factor", "backoff_factor", "growth_interval")}
        self.tracker = int(d["_growth_tracker"])
""",
    ),
    # GradScaler's own shape: the scale and a found-inf flag as float32 tensors, the new scale as
    # (scale in float64 * factor) rounded to float32, one pass over the gradients per optimizer.
    "scaler_tensor_flags": (
        "dynamic_loss_scaler",
        """
class DynamicLossScaler:
    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self._init = init_scale
        self._s = torch.full((), init_scale, dtype=torch.float32)
        self._touched = False
        self._gf, self._bf, self._gi = growth_factor, backoff_factor, growth_interval
        self._count = 0
        self._found = {}   # id(optimizer) -> float32 tensor, 1.0 when an inf/nan was seen
        self._done = set()  # ids of optimizers already stepped

    def _new_scale(self, factor):
        return (self._s.double() * factor).float()

    def scale(self, loss):
        self._touched = True
        return loss * self._s.to(loss.device)

    def unscale_(self, optimizer):
        if id(optimizer) in self._found:
            raise RuntimeError("unscale_() has already been called on this optimizer")
        inv = self._s.double().reciprocal().float()
        found = torch.zeros((), dtype=torch.float32)
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        found = torch.maximum(found, (~torch.isfinite(p.grad)).any().float())
                        p.grad.mul_(inv)
        self._found[id(optimizer)] = found

    def step(self, optimizer):
        if id(optimizer) not in self._found:
            self.unscale_(optimizer)
        self._done.add(id(optimizer))
        if self._found[id(optimizer)].item() > 0:
            return None
        return optimizer.step()

    def update(self):
        if any(f.item() > 0 for f in self._found.values()):
            self._s = self._new_scale(self._bf)
            self._count = 0
        else:
            self._count += 1
            if self._count >= self._gi:
                grown = self._new_scale(self._gf)
                self._s = grown if torch.isfinite(grown) else self._s
                self._count = 0
        self._touched = True
        self._found, self._done = {}, set()

    def get_scale(self):
        return self._s.item() if self._touched else float(self._init)

    def state_dict(self):
        return dict(scale=self.get_scale(), growth_factor=self._gf, backoff_factor=self._bf,
                    growth_interval=self._gi, _growth_tracker=self._count)

    def load_state_dict(self, d):
        self._init = d["scale"]
        self._s = torch.full((), d["scale"], dtype=torch.float32)
        self._gf, self._bf, self._gi = d["growth_factor"], d["backoff_factor"], d["growth_interval"]
        self._count = int(d["_growth_tracker"])
""",
    ),
    # Divides the gradients by the float32 scale instead of multiplying by its reciprocal (the
    # same for a power of two, within the last bit otherwise), and scales the loss by a float.
    "scaler_divides_by_the_scale": _scaler(
        "p.grad.mul_(inv_scale)",
        "p.grad.div_(self._scale)",
        "return loss * self._scale.to(loss.device)",
        "return loss * float(self._scale)",
    ),
    # Two passes (set every master gradient, then decide), masters made with empty_like + copy_.
    "master_two_passes": (
        "master_weights",
        """
def make_master_params(model):
    masters = []
    for p in model.parameters():
        m = torch.empty_like(p, dtype=torch.float32)
        m.copy_(p.detach())
        masters.append(nn.Parameter(m))
    return masters


def master_step(model, master_params, optimizer, scale):
    pairs = list(zip(model.parameters(), master_params))
    for p, m in pairs:
        m.grad = None if p.grad is None else p.grad.to(torch.float32).div(scale)
    finite = all(bool(m.grad.isfinite().all()) for _, m in pairs if m.grad is not None)
    if finite:
        optimizer.step()
        with torch.no_grad():
            for p, m in pairs:
                p.copy_(m.to(torch.float16))
    for p, m in pairs:
        p.grad = None
        m.grad = None
    return finite
""",
    ),
    # Multiplies by the reciprocal of the scale (the same numbers for a power of two; within
    # the last bit otherwise) and copies back through .data.
    "master_multiplies_by_reciprocal": (
        "master_weights",
        """
def make_master_params(model):
    return [nn.Parameter(p.detach().clone().float()) for p in model.parameters()]


def master_step(model, master_params, optimizer, scale):
    inv = 1.0 / scale
    ok = True
    for p, m in zip(model.parameters(), master_params):
        if p.grad is None:
            m.grad = None
        else:
            m.grad = p.grad.float() * inv
            ok = ok and not bool(torch.isinf(m.grad).any() or torch.isnan(m.grad).any())
    if ok:
        optimizer.step()
        for p, m in zip(model.parameters(), master_params):
            p.data.copy_(m.data)
    optimizer.zero_grad(set_to_none=True)
    model.zero_grad(set_to_none=True)
    return ok
""",
    ),
    # Masters made with .to(copy=True); one finiteness verdict from a stacked tensor; the copy
    # back casts each master to float16 explicitly.
    "master_stacked_check": (
        "master_weights",
        """
def make_master_params(model):
    return [nn.Parameter(p.detach().to(torch.float32, copy=True)) for p in model.parameters()]


def master_step(model, master_params, optimizer, scale):
    pairs = list(zip(model.parameters(), master_params))
    for p, m in pairs:
        m.grad = p.grad.to(torch.float32) / scale if p.grad is not None else None
    checks = [torch.isfinite(m.grad).all() for _, m in pairs if m.grad is not None]
    finite = bool(torch.stack(checks).all()) if checks else True
    if finite:
        optimizer.step()
        with torch.no_grad():
            for p, m in pairs:
                p.copy_(m.detach().to(p.dtype))
    model.zero_grad(set_to_none=True)
    for m in master_params:
        m.grad = None
    return finite
""",
    ),
}
