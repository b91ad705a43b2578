"""Lesson 04's hidden tests: the models and inputs built from a seed, and the drivers that feed
them to the student's functions.

The judges (``judge.py``) build the same inputs with the same functions and read the drivers'
observations in the order the drivers made them. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course.normalization import (
    NORM_TEST_KINDS,
    Probe,
    norm_layers_in,
    norm_test_model,
    one_thread,
    own_tensors,
    record_norm_calls,
    tensor_dtypes,
)
from grader.lessons.drive import observer


@dataclass
class NormCase:
    """One keep_norm_fp32 case: a float32 model of ``kind`` (its normalization layers subclassed
    when ``sub``) in ``mode``, its float16 input, and in training mode the weights of the output
    whose weighted sum is differentiated."""

    kind: str
    sub: bool
    mode: str
    base: nn.Module
    x16: torch.Tensor
    weights: torch.Tensor | None


def norm_cases(seed: int) -> list[NormCase]:
    """Seven kinds of model (:data:`course.normalization.NORM_TEST_KINDS`), with the norm layers'
    subclasses, in training and eval mode."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    with one_thread():
        for kind in NORM_TEST_KINDS:
            for sub in (False, True) if kind != "no_norm" else (False,):
                for mode in ("train", "eval"):
                    base, shape = norm_test_model(kind, sub, gen)
                    x16 = torch.randn(shape, generator=gen).half()
                    weights = None
                    if mode == "train":
                        with torch.no_grad():
                            out = copy.deepcopy(base).eval()(x16.float())
                        weights = torch.randn(out.shape, generator=gen)
                    cases.append(NormCase(kind, sub, mode, base, x16, weights))
    return cases


def drive_keep_norm_fp32(namespace: dict[str, Any], half_with_fp32_norm: Callable) -> None:
    """Records what half_with_fp32_norm returns for each case: the dtypes, the normalization
    layers' tensors, a forward pass (the output, the dtypes the probes around each normalization
    layer saw, the normalization functions' input dtypes), the running statistics and, in
    training mode, the gradients."""
    obs, seed = observer("keep_norm_fp32", namespace)
    with one_thread():
        for case in norm_cases(seed):
            got = half_with_fp32_norm(copy.deepcopy(case.base))
            obs.record("returned", [isinstance(got, nn.Module), type(got).__name__])
            if not isinstance(got, nn.Module):
                continue
            got.train(case.mode == "train")
            obs.record("dtypes", tensor_dtypes(got))
            norm_tensors = [[t.detach() for _, t in own_tensors(a)] for a in norm_layers_in(got)]
            obs.record("norm tensors", norm_tensors)
            probes = [m for m in got.modules() if isinstance(m, Probe)]
            try:
                with record_norm_calls() as calls:
                    out = got(case.x16)
            except RuntimeError as exc:
                obs.record("forward", {"error": str(exc), "seen": [p.seen for p in probes]})
                continue
            forward = {
                "out": out,
                "seen": [p.seen for p in probes],
                "calls": [[c.name, c.input_dtype, c.weight_dtype] for c in calls],
            }
            obs.record("forward", forward)
            obs.record("dtypes after", tensor_dtypes(got))
            statistics = ("running_mean", "running_var", "num_batches_tracked")
            obs.record(
                "statistics",
                [[getattr(a, s, None) for s in statistics] for a in norm_layers_in(got)],
            )
            if case.weights is not None:
                (out.float() * case.weights).sum().backward()
                grads = [[n, p.dtype, p.grad] for n, p in got.named_parameters()]
                obs.record("gradients", grads)
    obs.done()


@dataclass
class MomentumInputs:
    """bn_momentum's inputs: Keras momenta in [0, 1] with the edges, values out of range, and
    ``(keras_momentum, channels, batches)`` of BatchNorm1d layers trained on 20 batches."""

    momenta: list[float]
    out_of_range: list[float]
    layers: list[tuple[float, int, list[torch.Tensor]]]


def momentum_inputs(seed: int) -> MomentumInputs:
    """bn_momentum's inputs for a seed."""
    gen = torch.Generator().manual_seed(seed)
    momenta = torch.rand(200, generator=gen, dtype=torch.float64).tolist() + [0.0, 1.0, 0.5]
    above, below = (
        1 + float(torch.rand((), generator=gen)) * 10,
        -float(torch.rand((), generator=gen)) * 10,
    )
    bad = [above, below, -1e-9, 1 + 1e-9, float("nan"), float("inf"), -float("inf"), 2, -1]
    layers = []
    for _ in range(5):
        km = 0.5 + 0.499 * float(torch.rand((), generator=gen))
        c = int(torch.randint(1, 6, (), generator=gen))
        layers.append((km, c, [torch.randn(12, c, generator=gen) * 2 - 1 for _ in range(20)]))
    return MomentumInputs(momenta, bad, layers)


def drive_bn_momentum(namespace: dict[str, Any], pytorch_momentum: Callable) -> None:
    """What pytorch_momentum returns or raises, and the running statistics of BatchNorm1d layers
    built with its answers."""
    obs, seed = observer("bn_momentum", namespace)
    inputs = momentum_inputs(seed)
    for k in inputs.momenta:
        obs.call("momentum", pytorch_momentum, k)
    obs.call("zero", pytorch_momentum, 0)
    for k in inputs.out_of_range:
        obs.raises("out of range", pytorch_momentum, k)
    with one_thread():  # tiny batch_norm calls: one thread is faster
        for km, c, batches in inputs.layers:
            layer = nn.BatchNorm1d(c, momentum=pytorch_momentum(km))
            for b in batches:
                layer(b)
            obs.record("running statistics", [layer.running_mean, layer.running_var])
    obs.done()
