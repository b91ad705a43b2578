"""Lesson 02's hidden tests: the scenarios and models built from a seed, and the drivers that feed
them to the student's scaler and master-weight functions.

The judges (``judge.py``) build the same inputs with the same functions and read the drivers'
observations in the order the drivers made them. The scaler's scenarios are driven by
:func:`course.loss_scaling.drive_scaler` on both sides: the driver with the student's class, the
judge with ``torch.amp.GradScaler``. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from course.loss_scaling import (
    ReluStack,
    clean_steps,
    drive_scaler,
    scaler_scenario,
    without_grad_scaler,
)
from grader.lessons.drive import observer

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
    """Whether the class is written by hand, each scenario's trace (the course's
    ``drive_scaler``, with torch's GradScaler refusing to run), the clean steps."""
    obs, seed = observer("dynamic_loss_scaler", namespace)
    obs.record(
        "hand written",
        isinstance(DynamicLossScaler, type)
        and not issubclass(DynamicLossScaler, torch.amp.GradScaler),
    )
    scenarios, clean = scaler_inputs(seed)
    for cfg, n_opt, events, data_seed in scenarios:
        # torch's GradScaler (and its ops) raise while the student's scaler runs.
        with without_grad_scaler():
            trace = drive_scaler(
                DynamicLossScaler, DynamicLossScaler, cfg, n_opt, events, data_seed
            )
        obs.record("trace", trace)
    for cfg in clean:
        obs.record("clean steps", clean_steps(DynamicLossScaler, cfg))
    obs.done()


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
