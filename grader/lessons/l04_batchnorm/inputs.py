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

from course.normalization import NORM_TYPES, one_thread, record_norm_calls
from grader.lessons.drive import observer

# -- the models half_with_fp32_norm is graded on ------------------------------------------------
# The driver builds them from its seed beside the student's code, and the judge builds the same
# ones again to run its reference; neither holds anything of the reference itself.


def norm_layers_in(model: nn.Module) -> list[nn.Module]:
    """The normalization layers of ``model`` (``NORM_TYPES`` or subclasses), in order."""
    return [m for m in model.modules() if isinstance(m, NORM_TYPES)]


#: The kinds of model :func:`norm_test_model` builds.
NORM_TEST_KINDS = ("mlp", "cnn2d", "cnn3d", "seq", "nested", "norm_first", "no_norm")


class Probe(nn.Module):
    """Sits before and after a normalization layer and records the dtype that flows past.

    Its floating point buffer is an "other" tensor that half_with_fp32_norm sends to float16;
    its integer buffer keeps torch.long, as under ``.half()`` (lesson 04).
    """

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[torch.dtype] = []
        self.register_buffer("mark", torch.full((2,), 0.1))
        self.register_buffer("hits", torch.zeros(2, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102 - see the class
        self.seen.append(x.dtype)
        return x


class SubBN1d(nn.BatchNorm1d):
    """A subclass of BatchNorm1d: still a normalization layer (lesson 04)."""


class SubBN2d(nn.BatchNorm2d):
    """A subclass of BatchNorm2d with a forward of its own (lesson 04)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102 - see the class
        return super().forward(x)


class SubBN3d(nn.BatchNorm3d):
    """A subclass of BatchNorm3d (lesson 04)."""


class SubLN(nn.LayerNorm):
    """A subclass of LayerNorm (lesson 04)."""

    def extra_repr(self) -> str:  # noqa: D102 - see the class
        return "subclass, " + super().extra_repr()


class SubGN(nn.GroupNorm):
    """A subclass of GroupNorm (lesson 04)."""


class Tower(nn.Module):
    """Normalization layers nested two containers deep and one at the very end; the root module
    holds a floating point buffer of its own (lesson 04)."""

    def __init__(self, blocks: list[nn.Module], head: nn.Module) -> None:
        super().__init__()
        self.parts = nn.ModuleDict({"body": nn.ModuleList(blocks)})
        self.head = head
        self.register_buffer("spare", torch.full((3,), 0.25))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # noqa: D102 - see the class
        for block in self.parts["body"]:
            x = block(x)
        return self.head(x)


def _wrap(norm: nn.Module) -> list[nn.Module]:
    return [Probe(), norm, Probe()]


def _ri(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, (), generator=gen))


def _build(kind: str, sub: bool, gen: torch.Generator) -> tuple[nn.Module, tuple[int, ...]]:
    bn1, bn2, bn3 = (
        (SubBN1d, SubBN2d, SubBN3d) if sub else (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    )
    ln, gn = (SubLN, SubGN) if sub else (nn.LayerNorm, nn.GroupNorm)
    b = _ri(gen, 6, 12)
    if kind == "mlp":
        d, h, o = _ri(gen, 3, 12), _ri(gen, 4, 24), _ri(gen, 2, 6)
        m = nn.Sequential(
            nn.Linear(d, h),
            *_wrap(bn1(h)),
            nn.ReLU(),
            nn.Linear(h, h),
            *_wrap(ln(h)),
            nn.GELU(),
            nn.RMSNorm(h),
            nn.Linear(h, o),
        )
        return m, (b, d)
    if kind == "cnn2d":
        c, k, g = _ri(gen, 1, 4), 4 * _ri(gen, 1, 3), 2
        s = _ri(gen, 4, 6)
        m = nn.Sequential(
            nn.Conv2d(c, k, 3, padding=1),
            *_wrap(bn2(k)),
            nn.ReLU(),
            nn.InstanceNorm2d(k, affine=True, track_running_stats=True),
            nn.Conv2d(k, k, 3),
            *_wrap(gn(g, k)),
            nn.Flatten(),
            nn.Linear(k * (s - 2) ** 2, 3),
        )
        return m, (b, c, s, s)
    if kind == "cnn3d":
        c, k = _ri(gen, 1, 3), _ri(gen, 2, 6)
        m = nn.Sequential(
            nn.Conv3d(c, k, 3, padding=1),
            *_wrap(bn3(k)),
            nn.ReLU(),
            nn.InstanceNorm3d(k, affine=True),
            nn.Flatten(),
            nn.Linear(k * 27, 4),
        )
        return m, (b, c, 3, 3, 3)
    if kind == "seq":
        c, k, length = _ri(gen, 1, 4), 4 * _ri(gen, 1, 3), _ri(gen, 5, 9)
        m = nn.Sequential(
            nn.Conv1d(c, k, 3),
            *_wrap(gn(4, k)),
            nn.ReLU(),
            nn.InstanceNorm1d(k, affine=True, track_running_stats=True),
            nn.Conv1d(k, k, 1),
            *_wrap(bn1(k)),
            nn.Flatten(),
            nn.Linear(k * (length - 2), 2),
            *_wrap(ln(2)),
        )
        return m, (b, c, length)
    if kind == "nested":
        d, h = _ri(gen, 3, 10), _ri(gen, 4, 16)
        blocks = [
            nn.Sequential(nn.Linear(d, h), *_wrap(bn1(h, affine=False)), nn.ReLU()),
            nn.Sequential(nn.Linear(h, h), *_wrap(ln(h, elementwise_affine=False))),
            nn.Sequential(nn.Linear(h, h), *_wrap(nn.BatchNorm1d(h, track_running_stats=False))),
        ]
        head = nn.Sequential(nn.Linear(h, h), *_wrap(ln(h)), nn.RMSNorm(h, eps=1e-5))
        return Tower(blocks, head), (b, d)
    if kind == "norm_first":
        d = _ri(gen, 2, 10)
        return nn.Sequential(bn1(d), Probe(), nn.Linear(d, 3)), (b, d)
    if kind == "no_norm":
        d, h = _ri(gen, 2, 10), _ri(gen, 4, 16)
        return nn.Sequential(nn.Linear(d, h), Probe(), nn.Tanh(), nn.Linear(h, 2)), (b, d)
    raise ValueError(f"no test model of kind {kind!r}")


def _randomize(model: nn.Module, gen: torch.Generator) -> None:
    # Non-trivial affine parameters and running statistics, some beyond float16's range.
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, NORM_TYPES):
                if getattr(m, "weight", None) is not None:
                    m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=gen))
                    m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen))
                if getattr(m, "running_var", None) is not None:
                    n = m.running_var.numel()
                    big = torch.rand(n, generator=gen) < 0.3
                    var = torch.where(
                        big,
                        1e4 + 2e5 * torch.rand(n, generator=gen),
                        0.5 + 1.5 * torch.rand(n, generator=gen),
                    )
                    mean = torch.where(
                        big,
                        300 * torch.randn(n, generator=gen),
                        0.3 * torch.randn(n, generator=gen),
                    )
                    m.running_var.copy_(var)
                    m.running_mean.copy_(mean)
                    m.num_batches_tracked.fill_(_ri(gen, 0, 50))


def norm_test_model(
    kind: str, sub: bool, gen: torch.Generator
) -> tuple[nn.Module, tuple[int, ...]]:
    """A float32 model of ``kind`` (one of :data:`NORM_TEST_KINDS`) and its input's shape, drawn
    from ``gen`` (lesson 04's hidden test of half_with_fp32_norm).

    Sizes come from ``gen``; the weights from torch's global generator, seeded from ``gen`` inside
    the call and restored after it. Normalization layers (their subclasses when ``sub``) get
    random affine parameters and running statistics, about a third of them beyond float16's
    range. Each normalization layer sits between two :class:`Probe` layers. The ``mlp``,
    ``cnn2d``, ``cnn3d``, ``seq`` and ``nested`` models also hold an InstanceNorm or an RMSNorm
    (:data:`OTHER_NORM_TYPES`, with float parameters), which the task does not count as
    normalization layers: they become float16.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(0, 2**31, (), generator=gen)))
        model, shape = _build(kind, sub, gen)
    _randomize(model, gen)
    return model, shape


def own_tensors(module: nn.Module) -> list[tuple[str, torch.Tensor]]:
    """A module's own parameters then buffers, without its children's (lesson 04)."""
    return list(module.named_parameters(recurse=False)) + list(module.named_buffers(recurse=False))


def tensor_dtypes(model: nn.Module) -> list[list[Any]]:
    """``[[module name, type name, is a normalization layer, [[tensor name, dtype], ...]], ...]``
    for every module of ``model``: its dtypes as plain data (lesson 04)."""
    return [
        [
            name,
            type(m).__name__,
            isinstance(m, NORM_TYPES),
            [[t, v.dtype] for t, v in own_tensors(m)],
        ]
        for name, m in model.named_modules()
    ]


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
    """Seven kinds of model (:data:`NORM_TEST_KINDS`), with the norm layers'
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
