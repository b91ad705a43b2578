"""Lesson 03's hidden tests: random models and inputs built from a seed, and the drivers that feed
them to the student's tracer, answer and autograd function.

The judges (``judge.py``) build the same inputs with the same functions and read the drivers'
observations in the order the drivers made them. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from course.autocast import autocast_in_backward, count_forward_hooks
from grader.lessons.drive import observer

# -- random models for trace_dtypes: the driver records what the student's tracer returns on
# -- them, the judge traces the same ones itself. Nothing here traces a model.


def first_output_tensor(out: object) -> torch.Tensor | None:
    """``out`` if it is a tensor, else the first tensor in it (a tuple or list), else None."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, (tuple, list)):
        for item in out:
            if isinstance(item, torch.Tensor):
                return item
    return None


class _Pair(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fc(x), x.float()


class _Tagged(nn.Module):
    # The first element is not a tensor: the first TENSOR is the linear output.
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
        return 7, self.fc(x), x.float()


class _Listed(nn.Module):
    # Returns a list, not a tuple: the first tensor in it is the linear output.
    def __init__(self, d: int) -> None:
        super().__init__()
        self.fc = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [self.fc(x), x.float()]


class _Count(nn.Module):
    # Returns a number: no tensor, so no entry.
    def forward(self, x: torch.Tensor) -> int:
        return x.shape[0]


class _Pick(nn.Module):
    # Returns an integer tensor: its entry is torch.int64.
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.argmax(-1)


class _Side(nn.Module):
    # Side branches whose outputs are not used: a count (no tensor) and an argmax (int64).
    def __init__(self, d: int) -> None:
        super().__init__()
        self.count, self.pick, self.fc = _Count(), _Pick(), nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count(x)
        self.pick(x)
        return self.fc(x)


class _ToFloat(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.float()


class _Residual(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(d, d), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.inner(x)


class _SelfAttention(nn.Module):
    def __init__(self, d: int) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(d, 2, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.unsqueeze(1)
        return self.attn(s, s, s)[0].squeeze(1)


class Boom(nn.Module):
    """A layer whose forward pass raises ``RuntimeError`` (a failing model, lesson 03)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom (raised on purpose by the hidden tests)")


class TraceChain(nn.Module):
    """Blocks called one after another on the first tensor each returns (lesson 03's tests).

    With ``gate``, a submodule ``spare`` that the forward pass never calls; a second input, when
    given, multiplies the first.
    """

    def __init__(self, blocks: list[nn.Module], gate: bool = False) -> None:
        super().__init__()
        self.order = []
        for i, b in enumerate(blocks):
            setattr(self, f"b{i}", b)
            self.order.append(f"b{i}")
        if gate:
            self.spare = nn.Sequential(nn.Linear(2, 2), nn.ReLU())

    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        if rest:
            x = x * rest[0]
        for name in self.order:
            x = first_output_tensor(getattr(self, name)(x))
        return x


#: The kinds of block :func:`trace_block` builds.
TRACE_KINDS = (
    "linear", "seq", "softmax", "logsoftmax", "ln", "bn", "tofloat", "pair", "tagged",
    "residual", "mha", "lstm_like", "listed", "side",
)  # fmt: skip


def trace_block(kind: str, d: int) -> nn.Module:
    """A block of width ``d`` of one of :data:`TRACE_KINDS` (outputs of every shape a tracer
    meets: tensors, tuples, lists, a non-tensor first element, int64, float32 inside)."""
    return {
        "linear": lambda: nn.Linear(d, d),
        "seq": lambda: nn.Sequential(
            nn.Linear(d, d), nn.ReLU(), nn.Sequential(nn.LayerNorm(d), nn.GELU())
        ),
        "softmax": lambda: nn.Softmax(dim=-1),
        "logsoftmax": lambda: nn.LogSoftmax(dim=-1),
        "ln": lambda: nn.LayerNorm(d),
        "bn": lambda: nn.BatchNorm1d(d),
        "tofloat": lambda: _ToFloat(),
        "pair": lambda: _Pair(d),
        "tagged": lambda: _Tagged(d),
        "residual": lambda: _Residual(d),
        "mha": lambda: _SelfAttention(d),
        "lstm_like": lambda: nn.Sequential(nn.Linear(d, d), nn.Sigmoid()),
        "listed": lambda: _Listed(d),
        "side": lambda: _Side(d),
    }[kind]()


def _rint(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi, (), generator=gen))


def trace_cases(
    gen: torch.Generator,
) -> Iterator[tuple[list[str], bool, TraceChain, tuple[torch.Tensor, ...]]]:
    """Eight random chains and their inputs, drawn from ``gen``: ``(kinds, embedding first,
    model, inputs)``. Every kind appears in some chain whatever the seed."""
    for trial in range(8):
        d = 2 * _rint(gen, 2, 9)
        kinds = [TRACE_KINDS[_rint(gen, 0, len(TRACE_KINDS))] for _ in range(_rint(gen, 3, 9))]
        for k in (2 * trial, 2 * trial + 1):
            kinds.insert(_rint(gen, 0, len(kinds) + 1), TRACE_KINDS[k % len(TRACE_KINDS)])
        blocks = [trace_block(k, d) for k in kinds]
        embed = trial % 4 == 3
        if embed:
            blocks.insert(0, nn.Embedding(11, d))
        model = TraceChain(blocks, gate=trial % 2 == 0)
        n = _rint(gen, 2, 7)
        if embed:
            inputs: tuple[torch.Tensor, ...] = (torch.randint(0, 11, (n,), generator=gen),)
        elif trial % 4 == 1:
            inputs = (torch.randn(n, d, generator=gen), torch.rand(n, 1, generator=gen))
        else:
            inputs = (torch.randn(n, d, generator=gen),)
        yield kinds, embed, model, inputs


def _someone_elses_hook(module: nn.Module, args: object, output: object) -> None:
    return None


def raising_cases(gen: torch.Generator) -> Iterator[tuple[int, TraceChain, torch.Tensor]]:
    """Four chains that raise in block ``position`` (a :class:`Boom`, alone or inside a
    ``Sequential``), each with a hook of someone else's on its first two modules, drawn from
    ``gen`` after :func:`trace_cases`: ``(position, model, input)``."""
    for trial in range(4):
        d = 4
        blocks = [trace_block(TRACE_KINDS[_rint(gen, 0, 6)], d) for _ in range(_rint(gen, 1, 4))]
        pos = _rint(gen, 0, len(blocks) + 1)
        blocks.insert(pos, nn.Sequential(nn.Linear(d, d), Boom()) if trial % 2 else Boom())
        model = TraceChain(blocks)
        x = torch.randn(3, d, generator=gen)
        for m in list(model.modules())[:2]:
            m.register_forward_hook(_someone_elses_hook)
        yield pos, model, x


def cuda_trace_model() -> TraceChain:
    """The chain the tests trace under CUDA autocast (on the CPU; move it to the GPU)."""
    return TraceChain([trace_block(k, 8) for k in ("seq", "softmax", "bn", "pair", "residual")])


# -- the inputs LogSumExp32 is graded on ---------------------------------------------------

#: ``(shape, scale, spread of the offset)`` of each input LogSumExp32 is graded on (lesson 03).
#: ``(1, 11)`` and ``(3, 1, 9)`` hold a batch dimension of size 1 (a bare ``.squeeze()`` drops
#: it); ``(4, 1)`` reduces a last dimension of size 1.
LSE_TRIALS: tuple[tuple[tuple[int, ...], float, float], ...] = (
    ((7,), 1.0, 0.0),
    ((5, 9), 30.0, 500.0),
    ((2, 3, 33), 400.0, 5000.0),
    ((4, 1), 3000.0, 200.0),
    ((3, 257), 10.0, 1e4),
    ((1, 11), 5.0, 100.0),
    ((3, 1, 9), 50.0, 1000.0),
)


def lse_cases(
    gen: torch.Generator,
) -> Iterator[tuple[tuple[int, ...], float, float, torch.Tensor]]:
    """The float64 inputs of LogSumExp32's hidden test, drawn from ``gen`` one shape at a time:
    ``(shape, scale, offset, x)`` with ``x = randn(shape) * scale + offset`` (lesson 03). The
    test draws more from ``gen`` between two of them, so consume them in the test's order."""
    for shape, scale, spread in LSE_TRIALS:
        offset = float(torch.randn((), generator=gen)) * spread
        x = torch.randn(shape, generator=gen, dtype=torch.float64) * scale + offset
        yield shape, scale, offset, x


def fits_float16(x: torch.Tensor, scale: float, offset: float) -> torch.Tensor:
    """``x`` (float32), divided by 4 where its values could pass float16's largest finite value
    (lesson 03): the input the low precision dtypes get."""
    return x if abs(offset) + 4 * scale < 6e4 else x / 4


def trace_inputs(seed: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """trace_dtypes' random chains (:func:`trace_cases`), then the chains that raise
    (:func:`raising_cases`), from one generator."""
    gen = torch.Generator().manual_seed(seed)
    cases = list(trace_cases(gen))
    return cases, list(raising_cases(gen))


def drive_trace_dtypes(namespace: dict[str, Any], trace_dtypes: Callable, gpu: bool) -> None:
    """Every chain under CPU autocast in both low dtypes with the hooks counted around the call;
    the chains that raise at any depth (the error propagates, hooks are removed, autocast is off
    again); a CUDA chain where ``gpu``."""
    obs, seed = observer("trace_dtypes", namespace)
    cases, raising = trace_inputs(seed)
    for _, _, model, inputs in cases:
        for dtype in (torch.bfloat16, torch.float16):
            obs.record("hooks before", count_forward_hooks(model))
            obs.call("trace", trace_dtypes, model, inputs, "cpu", dtype)
            obs.record("hooks after", count_forward_hooks(model))
    for _, model, x in raising:
        obs.record("hooks before", count_forward_hooks(model))
        obs.raises("raised", trace_dtypes, model, (x,), "cpu", torch.bfloat16)
        obs.record("hooks after", count_forward_hooks(model))
        obs.record("autocast after", torch.is_autocast_enabled("cpu"))
    obs.record("gpu", bool(gpu))
    if gpu:
        model = cuda_trace_model().cuda()
        x = torch.randn(4, 8, device="cuda")
        obs.call("cuda", trace_dtypes, model, (x,), "cuda", torch.float16)
    obs.done()


def drive_predict_cuda_dtypes(namespace: dict[str, Any], predict_cuda_dtypes: Any) -> None:
    """Records the answer; the judge compares it with the key (and, on a CUDA machine, measures
    the key on the GPU)."""
    obs, _ = observer("predict_cuda_dtypes", namespace)
    obs.record("answer", predict_cuda_dtypes)
    obs.done()


#: The float64 inputs of LogSumExp32's gradcheck.
GRADCHECK_SHAPES = [(6,), (3, 4), (2, 3, 5)]


def lse_inputs(seed: int) -> tuple[list[tuple[Any, ...]], list[torch.Tensor]]:
    """LogSumExp32's inputs: ``(shape, scale, offset, x, weights)`` for each of
    :func:`lse_cases`, with the random output gradients its gradient is weighted by under
    bfloat16 and float16 autocast (``weights[dtype]``); then the float64 inputs of gradcheck."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for shape, scale, offset, x in lse_cases(gen):
        weights = {
            dt: torch.randn(shape[:-1], generator=gen) for dt in (torch.bfloat16, torch.float16)
        }
        cases.append((shape, scale, offset, x, weights))
    grads = [
        torch.randn(shape, generator=gen, dtype=torch.float64) * 3 for shape in GRADCHECK_SHAPES
    ]
    return cases, grads


def lse_edge() -> torch.Tensor:
    """Rows of -inf mixed with finite values, and values beyond exp's float32 range."""
    return torch.tensor([[-float("inf"), 0.0, 1.0], [88.0, 89.0, 90.0], [-88.0, -100.0, -120.0]])


def drive_custom_fwd_function(
    namespace: dict[str, Any],
    LogSumExp32: type,
    device: torch.device,  # noqa: N803
) -> None:
    """LogSumExp32 on ``device``: outside autocast in float32 and float16, under autocast in both
    low dtypes (float32, low and float64 inputs), its gradient with ``backward()`` called inside
    the region (and the autocast state its backward's ops saw), gradcheck, the edge rows."""
    obs, seed = observer("custom_fwd_function", namespace)
    gpu = device.type == "cuda"
    obs.record(
        "function",
        isinstance(LogSumExp32, type) and issubclass(LogSumExp32, torch.autograd.Function),
    )
    cases, grads = lse_inputs(seed)
    for _, scale, offset, x, weights in cases:
        x32 = x.float().to(device)
        obs.call("float32", LogSumExp32.apply, x32)
        obs.call(
            "float16 outside autocast", LogSumExp32.apply, fits_float16(x32, scale, offset).half()
        )
        for dt, w in weights.items():
            skip = bool(gpu and dt == torch.bfloat16 and not torch.cuda.is_bf16_supported())
            obs.record("skipped", skip)
            if skip:
                continue
            xl = fits_float16(x32, scale, offset).to(dt)
            with torch.amp.autocast(device.type, dtype=dt):
                obs.call("float32 under autocast", LogSumExp32.apply, x32)
                obs.call("low under autocast", LogSumExp32.apply, xl)
                obs.call("float64 under autocast", LogSumExp32.apply, x.to(device))
            xg = xl.clone().requires_grad_(True)
            with torch.amp.autocast(device.type, dtype=dt):
                out = LogSumExp32.apply(xg)
                with autocast_in_backward(out, device.type) as backward_saw:
                    (out * w.to(device)).sum().backward()
            obs.record("grad", xg.grad)
            obs.record("backward autocast", list(backward_saw))
    for x in grads:
        x = x.to(device).requires_grad_(True)
        obs.call(
            "gradcheck", torch.autograd.gradcheck, LogSumExp32.apply, (x,), raise_exception=False
        )
    obs.call("edge", LogSumExp32.apply, lse_edge().to(device))
    obs.done()
