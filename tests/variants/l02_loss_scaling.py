"""Wrong answers to lesson 02's exercises that the graders must reject.

The DynamicLossScaler variants are the right class with one common mistake each (built from
``_SCALER`` by a single text replacement, so each differs from a correct answer in one place).
"""

LESSON = "02-loss-scaling"

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


def _scaler(old: str, new: str) -> tuple[str, str]:
    assert _SCALER.count(old) == 1, old
    return ("dynamic_loss_scaler", _SCALER.replace(old, new))


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
    # Wrong: the master gradients are not divided by the loss scale.
    "master_not_unscaled": _master(
        "m.grad = p.grad.detach().float() / scale",
        "m.grad = p.grad.detach().float()",
    ),
    # Wrong: steps even when a gradient is inf or nan.
    "master_steps_on_inf": _master(
        "    if not found_inf:\n        optimizer.step()",
        "    if True:\n        optimizer.step()",
    ),
    # Wrong: the master weights are updated but never copied back into the float16 model.
    "master_not_copied_back": _master(
        """        with torch.no_grad():
            for p, m in zip(params, master_params):
                p.copy_(m)""",
        "        pass",
    ),
}
