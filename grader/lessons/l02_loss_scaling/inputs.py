"""Lesson 02's hidden tests: the scenarios and models built from a seed, and the drivers that feed
them to the student's scaler and master-weight functions.

The judges (``judge.py``) build the same inputs with the same functions and read the drivers'
observations in the order the drivers made them. The scaler's scenarios are driven by
:func:`scaler_trace` on both sides: the driver with the student's class, the judge with
``torch.amp.GradScaler``. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import random
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from grader.lessons.drive import observer

# -- dynamic_loss_scaler's scenarios --------------------------------------------------------------
# The driver runs the student's scaler through them and records what it sees; the judge runs
# torch.amp.GradScaler through the same ones, from the same seed, and compares. Nothing here is
# a loss scaler.


class TokenSGD(torch.optim.SGD):
    """SGD whose ``step()`` returns a token of its own, so a scaler's ``step`` can be seen to
    pass back what the optimizer returned."""

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        super().step(closure)
        self.calls = getattr(self, "calls", 0) + 1
        self.token = ("stepped", self.calls, id(self))
        return self.token


class TokenAdam(torch.optim.Adam):
    """Adam whose ``step()`` returns a token of its own (see :class:`TokenSGD`)."""

    def step(self, closure: Callable[[], float] | None = None) -> Any:
        super().step(closure)
        self.calls = getattr(self, "calls", 0) + 1
        self.token = ("stepped", self.calls, id(self))
        return self.token


def scaler_scenario(
    rng: random.Random, n_opt: int | None = None, **override: Any
) -> tuple[dict[str, Any], int, list[dict[str, Any]]]:
    """A random scaler configuration, a number of optimizers (1 or 2) and 36 iterations of
    events drawn from ``rng``: infs and nans put into gradients, ``unscale_`` calls (some twice,
    some followed by gradient clipping), the optimizers' step order, ``state_dict`` round trips
    and growth trackers set near ``growth_interval``."""
    factors = rng.choice([(2.0, 0.5), (1.7, 0.3), (4.0, 0.25), (1.25, 0.8), (2.0, 0.5)])
    cfg = dict(
        init_scale=rng.choice([2.0**16, 2.0**10, 1000.0, 3.0, 2.0**16, 1000.1]),
        growth_factor=factors[0],
        backoff_factor=factors[1],
        growth_interval=rng.choice([1, 2, 3, 2000]),
    )
    cfg.update(override)
    n_opt = n_opt or rng.choice([1, 2, 2])
    rate = rng.choice([0.1, 0.25, 0.5])
    events = []
    for it in range(36):
        ev: dict[str, Any] = {
            "bad": {},
            "unscale": set(),
            "twice": set(),
            "clip": set(),
            "order": list(range(n_opt)),
            "roundtrip": False,
            "tracker": None,
        }
        for o in range(n_opt):
            if rng.random() < rate:  # an inf/nan in any parameter of any param group
                ev["bad"][o] = (
                    rng.choice([float("inf"), -float("inf"), float("nan")]),
                    rng.randrange(8),
                    rng.randrange(12),
                )
            if rng.random() < 0.3:
                ev["unscale"].add(o)
                if rng.random() < 0.3:
                    ev["twice"].add(o)
                if rng.random() < 0.5:  # clip the unscaled gradients, as a training loop does
                    ev["clip"].add(o)
        if n_opt == 2 and it in (5, 17):  # both optimizers overflow in the same iteration
            ev["bad"] = {o: (float("inf"), 0, rng.randrange(12)) for o in range(2)}
        rng.shuffle(ev["order"])
        ev["roundtrip"] = rng.random() < 0.12
        if cfg["growth_interval"] == 2000 and it in (8, 24):
            ev["tracker"] = 1996 + rng.randrange(4)
        events.append(ev)
    return cfg, n_opt, events


def _outcome(fn: Callable[[], Any]) -> tuple[str, str, list[str], str]:
    """What calling ``fn`` did: ``("raised", type, classes, message)`` or ``("returned", ...)``."""
    try:
        result = fn()
    except Exception as exc:  # noqa: BLE001 - recorded, the tests judge it
        t = type(exc)
        return "raised", t.__qualname__, [c.__qualname__ for c in t.mro()], str(exc)[:2000]
    return "returned", "", [], repr(result)[:2000]


def pack_tensors(nested: Any) -> dict[str, Any]:
    """Nested lists of tensors as one flat tensor per dtype and a JSON layout (shapes, dtypes,
    nesting), so that a trace of hundreds of small tensors stays small once saved; a value that
    is not a plain tensor is kept as its type's name. :func:`unpack_tensors` undoes it."""
    flat: dict[str, list[torch.Tensor]] = {}

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(v) for v in value]
        if type(value) is not torch.Tensor:
            return {"type": type(value).__qualname__}
        name = str(value.dtype).removeprefix("torch.")
        flat.setdefault(name, []).append(value.detach().cpu().reshape(-1))
        return {"dtype": name, "shape": list(value.shape)}

    layout = zlib.compress(json.dumps(walk(nested), separators=(",", ":")).encode())
    return {"layout": layout, "data": {name: torch.cat(parts) for name, parts in flat.items()}}


def unpack_tensors(packed: dict[str, Any]) -> Any:
    """The nested lists of tensors :func:`pack_tensors` packed (None for a value that was not
    a plain tensor)."""
    offsets = dict.fromkeys(packed["data"], 0)

    def walk(value: Any) -> Any:
        if isinstance(value, list):
            return [walk(v) for v in value]
        if "dtype" not in value:
            return None
        name, shape = value["dtype"], value["shape"]
        n = math.prod(shape)
        start = offsets[name]
        offsets[name] = start + n
        part = packed["data"][name][start : start + n]
        if part.dtype != getattr(torch, name) or part.numel() != n:
            raise ValueError("the packed tensors do not match their layout")
        return part.reshape(shape).clone()

    inflate = zlib.decompressobj()
    text = inflate.decompress(packed["layout"], 1 << 22)
    if inflate.unconsumed_tail:
        raise ValueError("the packed layout is too large")
    return walk(json.loads(text))


def scaler_trace(
    make: Callable[..., Any],
    make_default: Callable[[], Any],
    cfg: dict[str, Any],
    n_opt: int,
    events: list[dict[str, Any]],
    seed: int,
) -> dict[str, Any]:
    """Train two small linear layers (two param groups per optimizer, a parameter the loss
    never uses) under the scaler ``make(**cfg)`` through ``events``; returns what was seen.

    The trace holds, per iteration, the scale after ``update()``, the parameters, the gradients
    right after each ``unscale_``, the ``state_dict()`` of each round trip (after which the
    scaler is a fresh ``make_default()`` loaded with it), and what the scaler did that the
    comparison cannot see afterwards: the outcome of each second ``unscale_``, and per ``step``
    call the optimizer, how many times it stepped and whether ``step`` returned its token (None
    when it skipped; the reprs of both when it did not). Compact (a few kB once saved):
    :func:`unpack_trace` gives it back as lists.
    """
    torch.manual_seed(seed)
    lin = [nn.Linear(4, 3), nn.Linear(3, 2)]
    unused = nn.Parameter(torch.randn(3))
    groups = [list(lin[0].parameters()), list(lin[1].parameters()) + [unused]]
    if n_opt == 1:
        groups = [groups[0] + groups[1]]
    kinds = [TokenSGD, TokenAdam]
    opts: list[torch.optim.Optimizer] = []
    for o, params in enumerate(groups):
        # Two param groups per optimizer (the second with its own learning rate); the parameter
        # that the loss never uses (its .grad stays None) is in the last group.
        half = max(1, len(params) // 2)
        if kinds[(seed + o) % 2] is TokenSGD:
            opts.append(
                TokenSGD(
                    [{"params": params[:half]}, {"params": params[half:], "lr": 0.02}],
                    lr=0.05,
                    momentum=0.9,
                )
            )
        else:
            opts.append(
                TokenAdam(
                    [{"params": params[:half]}, {"params": params[half:], "lr": 0.003}], lr=0.01
                )
            )
    scaler = make(**cfg)
    trace: dict[str, Any] = {
        "initial": scaler.get_scale(),
        "scales": [],
        "params": [],
        "grads": [],
        "states": [],
        "twice": [],
        "steps": [],
        "step_reprs": {},
    }
    xgen = torch.Generator().manual_seed(seed + 7)
    for ev in events:
        x = torch.randn(5, 4, generator=xgen)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        loss = lin[1](torch.tanh(lin[0](x))).pow(2).mean()
        scaler.scale(loss).backward()
        with torch.no_grad():
            for o, (value, which, j) in ev["bad"].items():
                grads = [p for p in groups[o] if p.grad is not None]
                g = grads[which % len(grads)].grad.view(-1)
                g[j % g.numel()] = value
        unscaled = []
        for o in sorted(ev["unscale"]):
            scaler.unscale_(opts[o])
            if o in ev["twice"]:
                trace["twice"].append(_outcome(functools.partial(scaler.unscale_, opts[o])))
            # Every gradient, also those of an optimizer that found an inf or nan.
            unscaled.append([p.grad.clone() for p in groups[o] if p.grad is not None])
            if o in ev["clip"]:
                nn.utils.clip_grad_norm_(groups[o], max_norm=0.5)
        trace["grads"].append(unscaled)
        for o in ev["order"]:
            before = getattr(opts[o], "calls", 0)
            ret = scaler.step(opts[o])
            delta = getattr(opts[o], "calls", 0) - before
            did = delta > 0
            token = getattr(opts[o], "token", None)
            fine = ret is token if did else ret is None
            if not fine:
                trace["step_reprs"][len(trace["steps"])] = [repr(ret)[:2000], repr(token)]
            trace["steps"].append([o, delta, int(did), int(fine)])
        scaler.update()
        trace["scales"].append(scaler.get_scale())
        trace["params"].append([p.detach().clone() for group in groups for p in group])
        if ev["roundtrip"] or ev["tracker"] is not None:
            sd = scaler.state_dict()
            trace["states"].append(sd)
            if ev["tracker"] is not None:
                sd = dict(sd, _growth_tracker=ev["tracker"])
            fresh = make_default()
            fresh.load_state_dict(dict(sd))
            scaler = fresh
    trace["params"] = pack_tensors(trace["params"])
    trace["grads"] = pack_tensors(trace["grads"])
    trace["steps"] = torch.tensor(trace["steps"], dtype=torch.int64).reshape(-1, 4)
    return trace


def unpack_trace(trace: dict[str, Any], events: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`scaler_trace`'s trace with its packed parts as lists: ``params`` and ``grads``,
    ``steps`` as ``(delta, did, fine, repr of the return, repr of the token)`` per ``step``
    call, and ``stepped``, per iteration, the sorted ``(optimizer, stepped?)`` pairs."""
    out = dict(trace)
    out["params"] = unpack_tensors(trace["params"])
    out["grads"] = unpack_tensors(trace["grads"])
    rows = trace["steps"].tolist()
    reprs = trace["step_reprs"]
    out["steps"] = [
        (delta, bool(did), bool(fine), *reprs.get(i, ["", ""]))
        for i, (_o, delta, did, fine) in enumerate(rows)
    ]
    out["stepped"] = []
    for ev in events:
        taken, rows = rows[: len(ev["order"])], rows[len(ev["order"]) :]
        out["stepped"].append(sorted((o, bool(did)) for o, _delta, did, _fine in taken))
    return out


def clean_steps(make: Callable[..., Any], cfg: dict[str, Any]) -> list[tuple[Any, Any]]:
    """``(get_scale(), state_dict())`` of the scaler ``make(**cfg)`` before and after each of
    seven clean iterations (finite gradients), near the top of float32's range or before the
    first ``scale()``."""
    scaler = make(**cfg)
    trace = [(scaler.get_scale(), scaler.state_dict())]
    p = nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD([p], lr=0.0)
    for _ in range(7):
        scaler.scale(torch.ones(()))
        p.grad = torch.zeros(2)  # a finite gradient: every step is clean
        scaler.step(opt)
        scaler.update()
        trace.append((scaler.get_scale(), scaler.state_dict()))
    return trace


#: What :func:`without_grad_scaler` takes away: GradScaler's methods and the ops it runs on.
_SCALER_METHODS = (
    "__init__", "scale", "unscale_", "step", "update", "get_scale", "state_dict",
    "load_state_dict", "_unscale_grads_",
)  # fmt: skip
_SCALER_OPS = ("_amp_update_scale_", "_amp_foreach_non_finite_check_and_unscale_")


def _forbidden(*args: Any, **kwargs: Any) -> None:
    from course.checks import CheckFailed

    raise CheckFailed("DynamicLossScaler must be written without torch's GradScaler")


@contextlib.contextmanager
def without_grad_scaler() -> Iterator[None]:
    """Within the block, torch's GradScaler and its two ops raise (a hand-written scaler must
    not lean on them); restored afterwards."""
    import torch.amp.grad_scaler as gs_module

    saved = {name: getattr(gs_module.GradScaler, name) for name in _SCALER_METHODS}
    saved_ops = {name: getattr(torch, name) for name in _SCALER_OPS}
    try:
        for name in _SCALER_METHODS:
            setattr(gs_module.GradScaler, name, _forbidden)
        for name in _SCALER_OPS:
            setattr(torch, name, _forbidden)
        yield
    finally:
        for name, fn in saved.items():
            setattr(gs_module.GradScaler, name, fn)
        for name, fn in saved_ops.items():
            setattr(torch, name, fn)


class GradScalerOps(TorchDispatchMode):
    """Notes every op of :data:`_SCALER_OPS` dispatched inside the block, however it was
    reached: a class that took GradScaler's methods or ops before :func:`without_grad_scaler`
    replaced them still runs them through the dispatcher."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        name = func.overloadpacket.__name__
        if name in _SCALER_OPS:
            self.seen.add(name)
        return func(*args, **(kwargs or {}))


#: The first five scenarios' fixed settings (the other five are drawn whole).
FIXED = [
    dict(growth_interval=1, growth_factor=2.0, backoff_factor=0.5, init_scale=2.0**16),
    dict(growth_interval=2, growth_factor=1.7, backoff_factor=0.3, init_scale=1000.1),
    dict(growth_interval=3, n_opt=2),
    dict(growth_interval=2000),
    dict(n_opt=2),
]


def scaler_inputs(seed: int) -> tuple[list[tuple[Any, ...]], list[dict[str, Any]]]:
    """dynamic_loss_scaler's ten scenarios ``(cfg, n_opt, events, data_seed)`` (one or two
    optimizers with two param groups each, infs and nans in any gradient, unscale_ with clipping,
    state_dict round trips, trackers near the interval), then the settings of two runs of clean
    steps: at the top of float32's range, and with init_scale read before the first scale()."""
    rng = random.Random(seed)
    scenarios = []
    for n in range(10):
        cfg, n_opt, events = scaler_scenario(rng, **(FIXED[n] if n < len(FIXED) else {}))
        scenarios.append((cfg, n_opt, events, rng.randrange(10**6)))
    top = dict(
        init_scale=rng.choice([2.0**126, 1.5 * 2.0**126, 3.0e38]),
        growth_factor=rng.choice([2.0, 1.7, 4.0]),
        growth_interval=rng.choice([1, 2]),
    )
    return scenarios, [top, dict(init_scale=1000.1 + rng.randrange(100), growth_interval=3)]


def drive_dynamic_loss_scaler(namespace: dict[str, Any], DynamicLossScaler: type) -> None:  # noqa: N803
    """Whether the class is written by hand, each scenario's trace (``scaler_trace``,
    with torch's GradScaler refusing to run), the clean steps, and which of GradScaler's ops ran
    while the student's scaler did."""
    obs, seed = observer("dynamic_loss_scaler", namespace)
    obs.record(
        "hand written",
        isinstance(DynamicLossScaler, type)
        and not issubclass(DynamicLossScaler, torch.amp.GradScaler),
    )
    scenarios, clean = scaler_inputs(seed)
    ops = GradScalerOps()
    for cfg, n_opt, events, data_seed in scenarios:
        # torch's GradScaler (and its ops) raise while the student's scaler runs.
        with without_grad_scaler(), ops:
            trace = scaler_trace(
                DynamicLossScaler, DynamicLossScaler, cfg, n_opt, events, data_seed
            )
        obs.record("trace", trace)
    for cfg in clean:
        with ops:
            obs.record("clean steps", clean_steps(DynamicLossScaler, cfg))
    obs.record("GradScaler's ops", sorted(ops.seen))
    obs.done()


class ReluStack(nn.Module):
    """Linear layers of the given sizes with ReLU between them, a layer ``unused`` that the
    forward pass never calls (its parameters keep ``.grad`` None), and a buffer ``input_scale``
    (ones, multiplying the input) that is state but not a parameter: it is in ``state_dict()``,
    and no optimizer or master copy is made for it."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=False)
        )
        self.unused = nn.Linear(2, 2)
        self.register_buffer("input_scale", torch.ones(sizes[0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x * self.input_scale
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


#: The loss scale of each of master_weights' six trials.
MASTER_SCALES = (1.0, 2.0**8, 2.0**12, 2.0**16, 1000.0, 2.0**10)


def master_draws(seed: int) -> tuple[list[dict[str, Any]], tuple[float, list[float]]]:
    """master_weights' draws from ``random.Random(seed)``: for each trial the model's sizes, its
    torch seed, the optimizer and, per step, ``None`` or the inf/nan written into a weight
    gradient and the layer; then the scale and gradients of the last case."""
    rng = random.Random(seed)
    trials = []
    for trial in range(6):
        sizes = [rng.randint(2, 9) for _ in range(rng.randint(2, 4))]
        torch_seed = rng.randrange(10**6)
        kind = rng.choice(["sgd", "adam"])
        injections: list[tuple[float, int] | None] = []
        for _ in range(8):
            if rng.random() < 0.3:
                value = rng.choice([float("inf"), float("nan"), -float("inf")])
                injections.append((value, rng.randrange(len(sizes) - 1)))
            else:
                injections.append(None)
        trials.append(
            dict(
                sizes=sizes,
                scale=MASTER_SCALES[trial],
                torch_seed=torch_seed,
                kind=kind,
                injections=injections,
            )
        )
    scale = rng.choice([2.0**10, 2.0**12, 2.0**14])
    return trials, (scale, [rng.uniform(1.0, 2.0) * 2.0**-21 for _ in range(4)])


def master_model(draw: dict[str, Any]) -> nn.Module:
    """A trial's float16 model: a ReluStack, whose ``input_scale`` buffer is in ``state_dict()``
    but is not a parameter."""
    torch.manual_seed(draw["torch_seed"])
    return ReluStack(draw["sizes"]).half()


def master_optimizer(draw: dict[str, Any], params: list) -> torch.optim.Optimizer:
    """SGD with momentum or Adam, both with weight decay (which moves a master that was given a
    gradient, even a zero one)."""
    if draw["kind"] == "sgd":
        return torch.optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=0.01)
    return torch.optim.Adam(params, lr=1e-3, weight_decay=0.01)


def master_batches(seed: int, trial: int, sizes: list[int]) -> list[tuple[torch.Tensor, ...]]:
    """A trial's eight float16 batches and their labels."""
    gen = torch.Generator().manual_seed(seed % 10**6 + trial)
    return [
        (
            torch.randn(6, sizes[0], generator=gen).half(),
            torch.randint(0, sizes[-1], (6,), generator=gen),
        )
        for _ in range(8)
    ]


def scaled_backward(model: nn.Module, draw: dict[str, Any], batch: tuple, it: int) -> None:
    """Step ``it``'s scaled backward pass, with the draw's inf or nan written into a weight
    gradient where it has one."""
    x, y = batch
    loss = nn.functional.cross_entropy(model(x).float(), y)
    (loss * draw["scale"]).backward()
    if draw["injections"][it] is not None:
        value, k = draw["injections"][it]
        with torch.no_grad():
            model.layers[k].weight.grad.view(-1)[0] = value


def drive_master_weights(
    namespace: dict[str, Any], make_master_params: Callable, master_step: Callable
) -> None:
    """Records the masters, the model and the flags after every step; then one step on float16
    gradients below float16's normal range (2^-14), which must be divided in float32."""
    obs, seed = observer("master_weights", namespace)
    trials, (small_scale, small_values) = master_draws(seed)
    for trial, draw in enumerate(trials):
        model = master_model(draw)
        mine = make_master_params(model)
        params = list(model.parameters())
        obs.record("masters", len(mine) if isinstance(mine, list) else None)
        if not (isinstance(mine, list) and len(mine) == len(params)):
            return obs.done()
        obs.record(
            "each master",
            [
                (
                    isinstance(m, nn.Parameter),
                    m.detach() if isinstance(m, torch.Tensor) else None,
                    p.detach(),
                    isinstance(m, torch.Tensor) and m.data_ptr() != p.data_ptr(),
                )
                for m, p in zip(mine, params, strict=True)
            ],
        )
        if not all(isinstance(m, nn.Parameter) for m in mine):
            return obs.done()
        opt = master_optimizer(draw, mine)
        for it, batch in enumerate(master_batches(seed, trial, draw["sizes"])):
            scaled_backward(model, draw, batch, it)
            obs.call("step", master_step, model, mine, opt, draw["scale"])
            obs.record(
                "after",
                [
                    (p.detach(), m.detach(), p.grad is None or not bool(p.grad.any()))
                    for m, p in zip(mine, model.parameters(), strict=False)
                ],
            )
            obs.record("unused", all(p.grad is None for p in model.unused.parameters()))
            obs.record("master grads", all(m.grad is None for m in mine))
    layer = nn.Linear(4, 1, bias=False).half()
    with torch.no_grad():
        layer.weight.zero_()
    masters = make_master_params(layer)
    # What (loss * scale).backward() would leave.
    layer.weight.grad = (torch.tensor([small_values]) * small_scale).half()
    opt = torch.optim.SGD(masters, lr=1.0)
    obs.call("subnormal step", master_step, layer, masters, opt, small_scale)
    obs.record("subnormal master", masters[0].detach())
    obs.done()
