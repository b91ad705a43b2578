"""Normalization layers in reduced precision (lesson 04).

Data, a small classifier, dtype tables and running-statistics simulations for the lesson, and its
widget. The graded exercises (keeping normalization layers in float32 inside a float16 model, and
translating momentum between conventions) are left to the student.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from typing import Any

import ipywidgets as W
import torch
from IPython.display import display
from torch import nn

from course.device import one_cpu_thread
from course.plotting import new_figure

#: The largest finite float16; lesson 04 draws it on its plots.
FP16_MAX = 65504.0

#: Names the lesson's dtype controls accept.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
}


def one_thread() -> contextlib.AbstractContextManager[None]:
    """Run torch's CPU ops on one thread inside the block (lesson 04); see ``one_cpu_thread``."""
    return one_cpu_thread("cpu")


def dtype_name(dtype: torch.dtype | None) -> str:
    """``torch.float16`` -> ``"float16"``; ``None`` -> ``"-"`` (lesson 04)."""
    return "-" if dtype is None else str(dtype).removeprefix("torch.")


def breast_cancer(
    device: torch.device | str = "cpu", test_fraction: float = 0.25, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, list[str]]:
    """scikit-learn's breast cancer data in its raw units (lesson 04).

    569 breast masses, 30 measurements each of the cell nuclei in a digitized image (radius,
    perimeter, area, ... in the image's own units), two classes. The data ships inside
    scikit-learn: nothing is downloaded. The features are *not* standardized, so
    some have variances far above float16's largest value. Returns ``(x_train, y_train, x_test,
    y_test, feature_names)`` with float32 features and long labels, split by a fixed permutation.
    """
    from sklearn.datasets import load_breast_cancer

    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must lie strictly between 0 and 1, got {test_fraction}")
    data = load_breast_cancer()
    x = torch.tensor(data.data, dtype=torch.float32)
    y = torch.tensor(data.target, dtype=torch.long)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = int(len(x) * test_fraction)
    test, train = order[:n_test], order[n_test:]
    names = [str(n) for n in data.feature_names]
    return x[train].to(device), y[train].to(device), x[test].to(device), y[test].to(device), names


def input_norm_classifier(n_features: int, n_classes: int, hidden: int = 64) -> nn.Sequential:
    """A classifier that standardizes raw inputs with a BatchNorm layer (lesson 04).

    ``BatchNorm1d(n_features) -> Linear -> BatchNorm1d -> ReLU -> Linear -> LayerNorm -> ReLU ->
    Linear``: the first BatchNorm's running statistics are the raw features' mean and variance.
    """
    if n_features < 1 or n_classes < 2 or hidden < 1:
        raise ValueError(
            f"need n_features >= 1, n_classes >= 2, hidden >= 1; got {n_features}, "
            f"{n_classes}, {hidden}"
        )
    return nn.Sequential(
        nn.BatchNorm1d(n_features),
        nn.Linear(n_features, hidden),
        nn.BatchNorm1d(hidden),
        nn.ReLU(),
        nn.Linear(hidden, hidden),
        nn.LayerNorm(hidden),
        nn.ReLU(),
        nn.Linear(hidden, n_classes),
    )


def train_classifier(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    steps: int = 200,
    lr: float = 1e-2,
    batch_size: int = 64,
    seed: int = 0,
) -> list[float]:
    """Train ``model`` in float32 with Adam on random mini-batches; returns the losses (lesson 04).

    Leaves the model in training mode; its BatchNorm layers' running statistics are those of
    the last ``steps`` mini-batches.
    """
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    losses = []
    with one_thread():
        for _ in range(steps):
            idx = torch.randint(0, len(x), (batch_size,), generator=gen).to(x.device)
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    return losses


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    input_dtype: torch.dtype = torch.float32,
    autocast_dtype: torch.dtype | None = None,
) -> tuple[float, torch.Tensor]:
    """Accuracy and float32 logits of ``model`` in eval mode (lesson 04).

    ``x`` is cast to ``input_dtype`` first (float16 for a ``.half()`` model); with
    ``autocast_dtype`` the forward pass runs under autocast on ``x``'s device type. The model's
    training flag is restored afterwards.
    """
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(
            x.device.type,
            dtype=autocast_dtype or torch.float16,
            enabled=autocast_dtype is not None,
        ):
            logits = model(x.to(input_dtype))
    finally:
        model.train(was_training)
    acc = (logits.argmax(-1) == y).double().mean().item()
    return acc, logits.float()


@torch.no_grad()
def update_running_stats(
    model: nn.Module,
    x: torch.Tensor,
    steps: int = 50,
    batch_size: int = 64,
    input_dtype: torch.dtype = torch.float32,
    autocast_dtype: torch.dtype | None = None,
    seed: int = 0,
) -> nn.Module:
    """Feed ``steps`` random mini-batches of ``x`` through ``model`` in training mode, without
    gradients, so its BatchNorm layers update their running statistics (lesson 04).

    Batches are cast to ``input_dtype``; with ``autocast_dtype`` each forward pass runs under
    autocast. The same ``seed`` gives every model the same batches. Returns the model, left in
    training mode.
    """
    gen = torch.Generator().manual_seed(seed)
    model.train()
    with one_thread():
        for _ in range(steps):
            idx = torch.randint(0, len(x), (batch_size,), generator=gen).to(x.device)
            with torch.autocast(
                x.device.type,
                dtype=autocast_dtype or torch.float16,
                enabled=autocast_dtype is not None,
            ):
                model(x[idx].to(input_dtype))
    return model


def compare_running_vars(truth: nn.Module, others: dict[str, nn.Module]) -> list[dict[str, str]]:
    """How far each model's BatchNorm ``running_var`` buffers are from ``truth``'s (lesson 04).

    BatchNorm layers are matched in the order ``modules()`` lists them. One row per model and
    layer: the buffer's dtype, how many entries are inf, and the largest relative error among
    the finite ones.
    """
    kinds = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
    true_bns = [m for m in truth.modules() if isinstance(m, kinds)]
    rows = []
    for label, model in others.items():
        bns = [m for m in model.modules() if isinstance(m, kinds)]
        for i, (bn, ref) in enumerate(zip(bns, true_bns, strict=True)):
            got = bn.running_var.detach().double().cpu()
            want = ref.running_var.detach().double().cpu()
            finite = torch.isfinite(got)
            rel = ((got - want).abs() / want.abs())[finite]
            rows.append(
                {
                    "model": label,
                    "BatchNorm": f"#{i} ({len(got)} channels)",
                    "running_var dtype": dtype_name(bn.running_var.dtype),
                    "inf entries": str(int((~finite).sum())),
                    "worst relative error (finite)": f"{rel.max().item():.2e}" if len(rel) else "-",
                }
            )
    return rows


def norm_io_dtypes(modules: dict[str, nn.Module], run: Callable[[], Any]) -> list[dict[str, str]]:
    """Call ``run()`` and report, for each of ``modules``, the dtypes it saw (lesson 04).

    One row per module: its class, the dtype of its first input, of its ``weight`` and of its
    ``running_var`` (``-`` where it has none), and of its output, as observed during ``run()``.
    The hooks are removed afterwards, also when ``run()`` raises.
    """
    seen: dict[str, dict[str, str]] = {}
    handles = []

    def recorder(name: str) -> Callable:
        def hook(module: nn.Module, args: tuple, output: Any) -> None:
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            out = output[0] if isinstance(output, (tuple, list)) else output
            weight = getattr(module, "weight", None)
            running_var = getattr(module, "running_var", None)
            seen[name] = {
                "layer": name,
                "type": type(module).__name__,
                "input": dtype_name(getattr(first, "dtype", None)),
                "weight": dtype_name(getattr(weight, "dtype", None)),
                "running_var": dtype_name(getattr(running_var, "dtype", None)),
                "output": dtype_name(getattr(out, "dtype", None)),
            }

        return hook

    try:
        for name, module in modules.items():
            handles.append(module.register_forward_hook(recorder(name)))
        run()
    finally:
        for handle in handles:
            handle.remove()
    return [seen[name] for name in modules if name in seen]


class NormCall:
    """One call of a normalization function seen by :func:`record_norm_calls` (lesson 04)."""

    def __init__(self, name: str, input_dtype: torch.dtype, weight_dtype: torch.dtype | None):
        self.name = name
        self.input_dtype = input_dtype
        self.weight_dtype = weight_dtype

    def __repr__(self) -> str:
        return (
            f"{self.name}(input {dtype_name(self.input_dtype)}, "
            f"weight {dtype_name(self.weight_dtype)})"
        )


class _NormCallRecorder(torch.overrides.TorchFunctionMode):
    """Records the input dtype of every ``F.batch_norm``/``layer_norm``/``group_norm`` call."""

    def __init__(self, calls: list[NormCall]) -> None:
        super().__init__()
        self.calls = calls
        self.watched = {
            nn.functional.batch_norm: "batch_norm",
            nn.functional.layer_norm: "layer_norm",
            nn.functional.group_norm: "group_norm",
        }

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = self.watched.get(func)
        if name is not None:
            x = args[0] if args else kwargs.get("input")
            weight = kwargs.get("weight")
            if weight is None:
                # batch_norm(input, running_mean, running_var, weight, ...); the others take
                # (input, normalized_shape or num_groups, weight, ...).
                position = 3 if name == "batch_norm" else 2
                weight = args[position] if len(args) > position else None
            self.calls.append(
                NormCall(
                    name,
                    x.dtype,
                    weight.dtype if isinstance(weight, torch.Tensor) else None,
                )
            )
        return func(*args, **kwargs)


@contextlib.contextmanager
def record_norm_calls():
    """Record what every normalization function computes on inside the block (lesson 04).

    A ``torch.overrides.TorchFunctionMode`` sees each call of ``F.batch_norm``,
    ``F.layer_norm`` and ``F.group_norm`` (which every BatchNorm, LayerNorm and GroupNorm
    layer's forward makes) and appends a :class:`NormCall` with its input's and weight's dtype
    to the list it yields. CPU kernels accept float16 input with float32 weights, so only
    watching the call itself tells a layer that computes in float32 from one that does not.
    """
    calls: list[NormCall] = []
    with _NormCallRecorder(calls):
        yield calls


def format_rows(rows: Sequence[dict[str, Any]], title: str = "") -> str:
    """A plain text table of dict rows with the same keys (lesson 04)."""
    if not rows:
        return title + "\n(no rows)" if title else "(no rows)"
    keys = list(rows[0])
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in keys}
    head = "  ".join(f"{k:<{widths[k]}}" for k in keys)
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    lines += ["  ".join(f"{str(r[k]):<{widths[k]}}" for k in keys) for r in rows]
    return "\n".join(lines)


def _support_cases() -> list[tuple[str, Callable[[], nn.Module], tuple[int, ...]]]:
    return [
        ("BatchNorm1d", lambda: nn.BatchNorm1d(4), (8, 4)),
        ("BatchNorm2d", lambda: nn.BatchNorm2d(4), (8, 4, 3, 3)),
        ("BatchNorm3d", lambda: nn.BatchNorm3d(4), (8, 4, 2, 2, 2)),
        ("LayerNorm", lambda: nn.LayerNorm(4), (8, 4)),
        ("GroupNorm", lambda: nn.GroupNorm(2, 4), (8, 4, 3)),
    ]


def _try(fn: Callable[[], torch.Tensor]) -> str:
    try:
        out = fn()
    except Exception as exc:  # noqa: BLE001 - the table reports what failed
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"fails: {type(exc).__name__}: {first_line[:60]}"
    return f"runs -> {dtype_name(out.dtype)}"


def norm_support(device: torch.device | str = "cpu") -> list[dict[str, str]]:
    """What runs on ``device``: each normalization layer in float16, in bfloat16, and in
    float32 fed float16 input, in training mode (forward and backward) and eval mode.

    Each entry says ``runs -> <output dtype>`` or ``fails: <error>``, as measured (lesson 04).
    Runs on one CPU thread: the layers are tiny, and waking a thread pool costs more than them.
    """
    device = torch.device(device)
    settings = [
        ("float16 layer", torch.float16, torch.float16),
        ("bfloat16 layer", torch.bfloat16, torch.bfloat16),
        ("float32 layer, float16 input", torch.float32, torch.float16),
    ]
    rows = []
    with one_thread():
        for name, make, shape in _support_cases():  # noqa: B007 - bound as defaults below
            for mode in ("train", "eval"):
                row = {
                    "layer": name,
                    "mode": "train (fwd+bwd)" if mode == "train" else "eval (fwd)",
                }
                for label, layer_dtype, input_dtype in settings:

                    def case(make=make, shape=shape, mode=mode, ld=layer_dtype, idt=input_dtype):
                        layer = make().to(device=device, dtype=ld).train(mode == "train")
                        x = torch.randn(shape, device=device).to(idt)
                        if mode == "train":
                            x.requires_grad_(True)
                            out = layer(x)
                            out.float().square().sum().backward()
                            return out
                        with torch.no_grad():
                            return layer(x)

                    row[label] = _try(case)
                rows.append(row)
    return rows


def mixed_input_agreement(device: torch.device | str = "cpu") -> list[dict[str, str]]:
    """Does a float32 layer fed float16 input compute what it computes on that input cast to
    float32 first? One row per normalization layer and mode (lesson 04).

    Each layer (random affine parameters) runs twice on the same float16 batch: as given, and
    as ``x.float()`` with the output rounded to float16. Each row says whether the two outputs
    have the same bits, or how far apart they are, or that the float16 call failed.
    """
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    rows = []
    with one_thread():
        for name, make, shape in _support_cases():
            for mode in ("train", "eval"):
                layer = make().to(device)
                with torch.no_grad():
                    for p in layer.parameters():
                        p.copy_(torch.randn(p.shape, generator=gen))
                twin = make().to(device)
                twin.load_state_dict(layer.state_dict())
                layer.train(mode == "train")
                twin.train(mode == "train")
                x = (torch.randn(shape, generator=gen) * 30 + 5).to(
                    device=device, dtype=torch.float16
                )
                with torch.no_grad():
                    try:
                        mixed = layer(x)
                    except Exception as exc:  # noqa: BLE001 - the table reports what failed
                        verdict = f"float16 input fails: {type(exc).__name__}"
                    else:
                        cast = twin(x.float()).half()
                        if torch.equal(mixed, cast):
                            verdict = "same bits"
                        else:
                            gap = (mixed.float() - cast.float()).abs().max().item()
                            verdict = f"differ by up to {gap:.3g}"
                rows.append({"layer": name, "mode": mode, "float16 input vs cast first": verdict})
    return rows


def autocast_header_lists(ops: Sequence[str]) -> dict[str, list[str]] | None:
    """Which op lists of the installed torch's ``ATen/autocast_mode.h`` name each op (lesson 04).

    The header ships inside the wheel (``torch/include``) and holds the lists CUDA autocast uses
    (``AT_FORALL_LOWER_PRECISION_FP``, ``AT_FORALL_FP32``, ...), which other backends may reuse;
    the CPU lists live in a source file the wheel does not ship. Returns ``{op: [list names]}``
    (an empty list: on none), or ``None`` where this install has no header.
    """
    import re
    from pathlib import Path

    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.is_file():
        return None
    lists: dict[str, set[str]] = {}
    current = None
    for line in header.read_text().splitlines():
        start = re.match(r"#define (AT_FORALL_\w+)\(_\)", line)
        if start:
            current = start.group(1)
            lists[current] = set()
        elif current is not None:
            entry = re.match(r"\s*_\((?:ADD_NS\()?(\w+)", line)
            if entry:
                lists[current].add(entry.group(1))
        if current is not None and not line.rstrip().endswith("\\"):
            current = None
    return {op: sorted(name for name, names in lists.items() if op in names) for op in ops}


def autocast_kernels(op: str) -> list[str]:
    """The autocast dispatch keys that have a kernel for ``aten::<op>`` in this torch (lesson 04).

    Read from the dispatcher (``torch._C._dispatch_dump``), which knows the CPU build's own
    registrations too: an op with no ``AutocastCPU`` entry is left alone by CPU autocast.
    """
    dump = torch._C._dispatch_dump(f"aten::{op}")
    return sorted({line.split(":")[0] for line in dump.splitlines() if line.startswith("Autocast")})


def noisy_batches(
    true_var: float,
    steps: int = 300,
    batch_size: int = 32,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """``steps`` float32 batches of shape ``(batch_size, 1)`` from N(0, true_var) (lesson 04)."""
    if true_var < 0 or steps < 1 or batch_size < 2:
        raise ValueError(
            f"need true_var >= 0, steps >= 1, batch_size >= 2; got {true_var}, {steps}, "
            f"{batch_size}"
        )
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(steps, batch_size, 1, generator=gen)
    return (base * math.sqrt(true_var)).to(device)


@torch.no_grad()
def running_var_trace(
    batches: torch.Tensor, momentum: float | None, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The ``running_var`` of a one-channel BatchNorm kept in ``dtype``, after each batch.

    The layer's buffers and input are in ``dtype``; it sees the float32 ``batches`` one at a
    time in training mode, through the same ``batch_norm`` call a ``.to(dtype)`` model makes.
    ``momentum=None`` is PyTorch's cumulative average. Returns a float64 CPU
    tensor of length ``len(batches)`` (lesson 04).
    """
    device = batches.device
    running_mean = torch.zeros(1, dtype=dtype, device=device)
    running_var = torch.ones(1, dtype=dtype, device=device)
    trace = torch.empty(len(batches), dtype=dtype, device=device)
    inputs = batches.to(dtype)
    with one_thread():
        for i in range(len(inputs)):
            # What nn.BatchNorm1d(1, momentum=momentum).to(dtype) calls in training mode.
            factor = momentum if momentum is not None else 1.0 / (i + 1)
            nn.functional.batch_norm(
                inputs[i], running_mean, running_var, training=True, momentum=factor
            )
            trace[i] = running_var[0]
    return trace.double().cpu()


def rule_trace(
    batches: torch.Tensor,
    momentum: float,
    dtype: torch.dtype,
    round_weights: bool = False,
) -> torch.Tensor:
    """The momentum rule applied by hand to the batches' variances, stored in ``dtype``.

    Each batch is rounded to ``dtype`` and its unbiased variance taken (float32), then
    ``running = (1 - momentum) * running + momentum * var`` is computed in float64 and rounded to
    ``dtype`` once per step, from ``running = 1``. With ``round_weights`` the two weights and the
    product ``(1 - momentum) * running`` are rounded to ``dtype`` as well, the way arithmetic
    carried out in that dtype would round them. Comparing with :func:`running_var_trace` shows
    whether a device's kernel follows the rule rounded once. Returns float64, like that function
    (lesson 04).
    """
    variances = batches.to(dtype).float().var(1).flatten().double().cpu()
    keep, new = torch.tensor(1.0 - momentum), torch.tensor(momentum)
    if round_weights:
        keep, new = keep.to(dtype).double(), new.to(dtype).double()
    keep, new = keep.double(), new.double()
    r = torch.tensor(1.0, dtype=dtype)
    trace = torch.empty(len(variances), dtype=torch.float64)
    for i, v in enumerate(variances):
        kept = keep * r.double()
        if round_weights:
            kept = kept.to(dtype).double()
        r = (kept + new * v).to(dtype)
        trace[i] = r.double()
    return trace


@torch.no_grad()
def kernel_stall(
    true_var: float,
    momentum: float,
    dtype: torch.dtype,
    device: torch.device | str = "cpu",
    max_steps: int = 100_000,
) -> tuple[float, float]:
    """Where the device's own ``batch_norm`` stops moving a ``dtype`` running variance (lesson 04).

    Feeds the same two-sample batch ``[a, -a]`` (``a = sqrt(true_var / 2)`` rounded to
    ``dtype``) through ``F.batch_norm`` in training mode, from ``running_var = 1``, until the
    buffer no longer changes: the noise-free stall of the kernel itself. Returns ``(the batch's
    unbiased variance, where the buffer stopped)``.
    """
    a = math.sqrt(true_var / 2)
    batch = torch.tensor([[a], [-a]], device=device).to(dtype)
    target = batch.double().var().item()
    running_mean = torch.zeros(1, dtype=dtype, device=device)
    running_var = torch.ones(1, dtype=dtype, device=device)
    with one_thread():
        for _ in range(max_steps):
            before = running_var.clone()
            nn.functional.batch_norm(
                batch, running_mean, running_var, training=True, momentum=momentum
            )
            if torch.equal(before, running_var) or not bool(torch.isfinite(running_var).all()):
                break
    return target, running_var.item()


def rounding_stall(
    true_var: float,
    momentum: float,
    dtype: torch.dtype,
    start: float = 1.0,
    max_steps: int = 1_000_000,
) -> float:
    """Where a running variance kept in ``dtype`` stops moving towards ``true_var`` (lesson 04).

    Applies ``running = (1 - momentum) * running + momentum * true_var`` (computed in float64,
    stored in ``dtype``) from ``start`` until the stored value no longer changes: the update
    has become smaller than half the gap between neighbouring ``dtype`` numbers and rounds away.
    With no noise in the batches this is where the estimate stalls.
    """
    if not 0.0 < momentum <= 1.0:
        raise ValueError(f"momentum must lie in (0, 1], got {momentum}")
    r = torch.tensor(start, dtype=dtype)
    for _ in range(max_steps):
        new = ((1.0 - momentum) * r.double() + momentum * true_var).to(dtype)
        if bool(new == r) or not bool(torch.isfinite(new)):
            return float(new)
        r = new
    return float(r)


@torch.no_grad()
def layer_norm_errors(
    scales: Sequence[float],
    by_hand: Callable[[torch.Tensor], torch.Tensor],
    dtypes: Sequence[torch.dtype] = (torch.float16, torch.bfloat16),
    rows: int = 64,
    width: int = 512,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> dict[str, list[float]]:
    """Largest error of layer norm in low precision, for activations of each size (lesson 04).

    For each scale ``s`` the input is ``s * (N(0, 1) + 2)`` (rows x width), rounded to each
    dtype. Two implementations run in that dtype: ``torch.nn.functional.layer_norm`` (PyTorch's
    kernel) and ``by_hand`` (the lesson's hand-written layer norm over the last dimension, shown
    in its notebook). The error is the largest ``|output - reference|``,
    the reference being float64 layer norm of the same rounded input; ``inf`` marks output
    that is not finite. Returns ``{"kernel float16": [...], "by hand float16": [...], ...}``.
    """
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(rows, width, generator=gen) + 2.0
    out: dict[str, list[float]] = {}
    for dtype in dtypes:
        kernel, by_hand_errors = [], []
        for s in scales:
            x = (base * s).to(device=device, dtype=dtype)
            ref = nn.functional.layer_norm(x.double(), (width,))
            for values, fn in (
                (kernel, lambda t: nn.functional.layer_norm(t, (width,))),
                (by_hand_errors, by_hand),
            ):
                y = fn(x)
                if not bool(torch.isfinite(y).all()):
                    values.append(math.inf)
                else:
                    values.append((y.double() - ref).abs().max().item())
        out[f"kernel {dtype_name(dtype)}"] = kernel
        out[f"by hand {dtype_name(dtype)}"] = by_hand_errors
    return out


class RunningVarianceExplorer:
    """Lesson 04's widget: momentum, dtype and true-variance controls over a live plot of a
    BatchNorm layer's running variance against the true variance.

    The chosen dtype's trace is drawn beside the float32 trace for the same batches. The
    state of the last redraw is kept on the object (``trace``, ``reference``, ``summary``).
    """

    def __init__(
        self,
        momentum: float = 0.1,
        dtype: str = "float16",
        true_var: float = 3000.0,
        steps: int = 600,
        batch_size: int = 32,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self.steps, self.batch_size, self.seed = steps, batch_size, seed
        self.device = torch.device(device)
        self._base = noisy_batches(1.0, steps, batch_size, seed, self.device)
        self.momentum = W.FloatLogSlider(
            value=momentum,
            base=10,
            min=-3,
            max=0,
            step=0.1,
            description="momentum",
            readout_format=".3g",
            continuous_update=False,
        )
        self.dtype = W.Dropdown(options=list(DTYPES), value=dtype, description="buffer dtype")
        self.true_var = W.FloatLogSlider(
            value=true_var,
            base=10,
            min=0,
            max=7,
            step=0.25,
            description="true variance",
            readout_format=".3g",
            continuous_update=False,
        )
        self.stats = W.HTML()
        self.output = W.Output()
        self.figure, (self.ax,) = new_figure(8, 3.6)
        for control in (self.momentum, self.dtype, self.true_var):
            control.observe(lambda change: self.update(), names="value")
        self.widget = W.VBox(
            [W.HBox([self.momentum, self.dtype, self.true_var]), self.stats, self.output]
        )
        self.update()

    def update(self) -> None:
        """Recompute both traces for the controls' values and redraw."""
        m, name, true_var = float(self.momentum.value), self.dtype.value, float(self.true_var.value)
        batches = self._base * math.sqrt(true_var)
        #: The running variance after each batch, in the chosen dtype and in float32.
        self.trace = running_var_trace(batches, m, DTYPES[name])
        self.reference = running_var_trace(batches, m, torch.float32)
        half = self.steps // 2
        finite = torch.isfinite(self.trace)
        late = self.trace[half:]
        if bool(finite.all()):
            mean_late = late.mean().item()
            verdict = (
                f"mean over the last {len(late)} steps: <b>{mean_late:.6g}</b> "
                f"({(mean_late / true_var - 1):+.1%} from the truth)"
            )
        else:
            first_inf = int((~finite).nonzero()[0])
            verdict = f"<b>running_var became inf at step {first_inf + 1}</b> (above {FP16_MAX:g})"
        ref_late = self.reference[half:].mean().item()
        #: The text shown above the plot.
        self.summary = (
            f"momentum {m:.3g} (averages roughly the last {1 / m:.0f} batches) | {name} buffers: "
            f"{verdict} | float32: {ref_late:.6g} ({(ref_late / true_var - 1):+.1%}) | "
            f"true variance {true_var:.6g}"
        )
        self.stats.value = self.summary
        ax = self.ax
        ax.clear()
        steps = range(1, self.steps + 1)
        ax.plot(steps, self.reference.numpy(), color="0.6", lw=1, label="float32 buffers")
        shown = self.trace.clone()
        shown[~torch.isfinite(shown)] = float("nan")
        ax.plot(steps, shown.numpy(), color="tab:red", lw=1.5, label=f"{name} buffers")
        ax.axhline(true_var, color="k", ls="--", lw=1, label="true variance")
        if name == "float16":
            ax.axhline(FP16_MAX, color="tab:purple", ls=":", lw=1, label="float16 max 65504")
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("running_var")
        ax.set_title("BatchNorm running variance against the true variance")
        ax.legend(loc="lower right", fontsize="small")
        with self.output:
            self.output.clear_output(wait=True)
            display(self.figure)

    def _ipython_display_(self) -> None:
        display(self.widget)


# -- the layers half_with_fp32_norm counts as normalization layers --------------------------------

#: The normalization layers half_with_fp32_norm keeps in float32 (lesson 04). SyncBatchNorm and
#: the lazy BatchNorm classes derive from BatchNorm's base class, not from BatchNorm1d/2d/3d; the
#: task counts them as BatchNorm (the hidden models hold neither: SyncBatchNorm refuses CPU input,
#: and a lazy layer turns into its BatchNorm class once it has run).
NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.BatchNorm1d,
    nn.BatchNorm2d,
    nn.BatchNorm3d,
    nn.SyncBatchNorm,
    nn.LazyBatchNorm1d,
    nn.LazyBatchNorm2d,
    nn.LazyBatchNorm3d,
    nn.LayerNorm,
    nn.GroupNorm,
)

#: Normalization layers that are *not* :data:`NORM_TYPES` (nor subclasses of them): they become
#: float16 like any other layer. Every draw of the hidden test holds both (lesson 04).
OTHER_NORM_TYPES: tuple[type[nn.Module], ...] = (
    nn.InstanceNorm1d,
    nn.InstanceNorm2d,
    nn.InstanceNorm3d,
    nn.RMSNorm,
)
