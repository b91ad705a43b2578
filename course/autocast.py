"""What autocast does to each op: torch's documented op lists, two small models, a widget
(lesson 03).

The op lists below are data copied from PyTorch's documentation (see :data:`DOC_SOURCE`);
``tests/test_autocast.py`` checks them against the autocast kernels registered in the installed
torch, and against CPU autocast as measured. The graded exercises (tracing every layer's output
dtype, predicting the CUDA dtypes of the lesson's model, a float32 custom autograd function) are
left to the student: nothing here traces a model.
"""

from __future__ import annotations

import copy
import html
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as W
import torch
from IPython.display import display
from torch import nn

#: Where the op lists come from.
DOC_SOURCE = (
    "PyTorch documentation, 'Automatic Mixed Precision package - torch.amp', section "
    "'Autocast Op Reference' (https://pytorch.org/docs/stable/amp.html#autocast-op-reference), "
    "lists as published for torch 2.x; checked against torch 2.13's registered autocast kernels"
)

#: CUDA ops that autocast runs in the lower precision dtype (float16 or bfloat16).
CUDA_LOWER_PRECISION_OPS: tuple[str, ...] = (
    "__matmul__", "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul",
    "multi_dot", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
    "conv_transpose3d", "GRUCell", "linear", "LSTMCell", "matmul", "mm", "mv", "prelu",
    "RNNCell",
)  # fmt: skip

#: CUDA ops that autocast runs in float32 (inputs in a lower precision are cast up).
CUDA_FLOAT32_OPS: tuple[str, ...] = (
    "__pow__", "__rdiv__", "__rpow__", "__rtruediv__", "acos", "asin",
    "binary_cross_entropy_with_logits", "cosh", "cosine_embedding_loss", "cdist",
    "cosine_similarity", "cross_entropy", "cumprod", "cumsum", "dist", "erfinv", "exp", "expm1",
    "group_norm", "hinge_embedding_loss", "kl_div", "l1_loss", "layer_norm", "log",
    "log_softmax", "log10", "log1p", "log2", "margin_ranking_loss", "mse_loss",
    "multilabel_margin_loss", "multi_margin_loss", "nll_loss", "norm", "normalize", "pdist",
    "poisson_nll_loss", "pow", "prod", "reciprocal", "rsqrt", "sinh", "smooth_l1_loss",
    "soft_margin_loss", "softmax", "softmin", "softplus", "sum", "renorm", "tan",
    "triplet_margin_loss",
)  # fmt: skip

#: CUDA ops that autocast runs in the widest floating dtype among their inputs.
CUDA_PROMOTE_OPS: tuple[str, ...] = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "grid_sample", "index_put",
    "scatter_add", "tensordot",
)  # fmt: skip

#: CUDA ops that raise inside an autocast region ("prefer binary_cross_entropy_with_logits").
CUDA_REFUSED_OPS: tuple[str, ...] = ("binary_cross_entropy",)

#: CPU ops that autocast runs in the lower precision dtype (bfloat16 or float16).
CPU_LOWER_PRECISION_OPS: tuple[str, ...] = (
    "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm", "addbmm",
    "linear", "_convolution", "matmul", "conv_tbc", "mkldnn_rnn_layer", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "prelu", "scaled_dot_product_attention",
    "_native_multi_head_attention",
)  # fmt: skip

#: CPU ops that autocast runs in float32.
CPU_FLOAT32_OPS: tuple[str, ...] = (
    "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "quantile",
    "nanquantile", "stft", "cdist", "trace", "view_as_complex", "cholesky", "cholesky_inverse",
    "cholesky_solve", "inverse", "lu_solve", "orgqr", "ormqr", "pinverse", "max_pool3d",
    "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "reflection_pad1d",
    "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
    "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
    "poisson_nll_loss", "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss",
    "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "ctc_loss", "kl_div", "multilabel_margin_loss", "binary_cross_entropy_with_logits",
    "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft",
    "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft", "fft_ihfft",
    "linalg_cond", "linalg_matrix_rank", "linalg_solve", "linalg_cholesky", "linalg_svdvals",
    "linalg_eigvals", "linalg_eigvalsh", "linalg_inv", "linalg_householder_product",
    "linalg_tensorinv", "linalg_tensorsolve", "fake_quantize_per_tensor_affine", "geqrf",
    "_lu_with_info", "qr", "svd", "triangular_solve", "fractional_max_pool2d",
    "fractional_max_pool3d", "adaptive_max_pool3d", "multilabel_margin_loss_forward",
    "linalg_qr", "linalg_cholesky_ex", "linalg_svd", "linalg_eig", "linalg_eigh", "linalg_lstsq",
    "linalg_inv_ex",
)  # fmt: skip

#: CPU ops that autocast runs in the widest floating dtype among their inputs.
CPU_PROMOTE_OPS: tuple[str, ...] = ("stack", "cat", "index_copy")

#: CPU autocast refuses no op.
CPU_REFUSED_OPS: tuple[str, ...] = ()

LOWER = "lower precision"
FLOAT32 = "float32"
PROMOTE = "widest input"
REFUSED = "refused"
NO_LIST = "no list"

#: ``OP_LISTS[device_type][policy]``: the documented lists by device type and policy.
OP_LISTS: dict[str, dict[str, tuple[str, ...]]] = {
    "cuda": {
        LOWER: CUDA_LOWER_PRECISION_OPS,
        FLOAT32: CUDA_FLOAT32_OPS,
        PROMOTE: CUDA_PROMOTE_OPS,
        REFUSED: CUDA_REFUSED_OPS,
    },
    "cpu": {
        LOWER: CPU_LOWER_PRECISION_OPS,
        FLOAT32: CPU_FLOAT32_OPS,
        PROMOTE: CPU_PROMOTE_OPS,
        REFUSED: CPU_REFUSED_OPS,
    },
}

#: Names the CPU list spells differently from the CUDA list (same op).
_CPU_SPELLING = {
    "__matmul__": "matmul",
    "cross_entropy": "cross_entropy_loss",
    "grid_sample": "grid_sampler",
}


def _lists_for(device_type: str) -> dict[str, tuple[str, ...]]:
    if device_type not in OP_LISTS:
        raise ValueError(f"no documented autocast lists for device type {device_type!r}")
    return OP_LISTS[device_type]


def op_policy(op: str, device_type: str) -> str:
    """Which documented list ``op`` is on for ``device_type`` (lesson 03).

    One of ``"lower precision"``, ``"float32"``, ``"widest input"``, ``"refused"`` or
    ``"no list"`` (an op on no list runs in the dtype of its inputs).
    """
    lists = _lists_for(device_type)
    names = {op, _CPU_SPELLING.get(op, op)} if device_type == "cpu" else {op}
    for policy in (REFUSED, LOWER, FLOAT32, PROMOTE):
        if names & set(lists[policy]):
            return policy
    return NO_LIST


def documented_dtype(
    op: str, input_dtypes: tuple[torch.dtype, ...], device_type: str, dtype: torch.dtype
) -> torch.dtype:
    """The output dtype the documented lists give ``op`` under autocast (lesson 03).

    ``input_dtypes`` are the dtypes of the op's floating tensor inputs (its activations, not
    its parameters: a layer's parameters stay float32). Ops on no list run in the dtype their
    inputs promote to; a refused op raises ``RuntimeError`` as torch does.
    """
    if not input_dtypes:
        raise ValueError(f"{op}: give the dtype of at least one input")
    policy = op_policy(op, device_type)
    if policy == REFUSED:
        raise RuntimeError(f"{op} is unsafe to autocast on {device_type} and raises there")
    if policy == LOWER:
        return dtype
    if policy == FLOAT32:
        return torch.float32
    out = input_dtypes[0]
    for other in input_dtypes[1:]:
        out = torch.promote_types(out, other)
    return out


def list_differences() -> list[tuple[str, str, str]]:
    """``(op, CUDA policy, CPU policy)`` for each op whose two policies differ (lesson 03)."""
    ops: set[str] = set()
    for lists in OP_LISTS.values():
        for names in lists.values():
            ops.update(names)
    cuda_names = {n for names in OP_LISTS["cuda"].values() for n in names}
    ops -= {n for n in _CPU_SPELLING.values() if n not in cuda_names}
    rows = [(op, op_policy(op, "cuda"), op_policy(op, "cpu")) for op in ops]
    return sorted((r for r in rows if r[1] != r[2]), key=lambda r: (r[1], r[2], r[0]))


def short(dtype: torch.dtype | str | None) -> str:
    """``torch.float16`` -> ``"float16"``; strings pass through, None is ``"-"`` (lesson 03)."""
    if dtype is None:
        return "-"
    return dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")


def dtype_table(columns: dict[str, dict[str, torch.dtype | str]], first: str = "layer") -> str:
    """A text table: one row per key, one column per ``columns`` entry (lesson 03)."""
    names: list[str] = []
    for col in columns.values():
        names += [n for n in col if n not in names]
    width = max([len(first), *map(len, names)]) + 2
    widths = [max(len(title), 9) + 2 for title in columns]
    head = f"{first:<{width}}" + "".join(f"{t:<{w}}" for t, w in zip(columns, widths, strict=True))
    rows = [head, "-" * len(head)]
    for name in names:
        cells = [short(col.get(name)) for col in columns.values()]
        rows.append(
            f"{name:<{width}}" + "".join(f"{c:<{w}}" for c, w in zip(cells, widths, strict=True))
        )
    return "\n".join(rows)


def count_forward_hooks(model: nn.Module) -> int:
    """Forward and forward-pre hooks on ``model``'s modules plus global module hooks (lesson 03).

    A tracer that cleans up after itself leaves this number where it found it.
    """
    from torch.nn.modules import module as _module

    total = len(_module._global_forward_hooks) + len(_module._global_forward_pre_hooks)
    for m in model.modules():
        total += len(m._forward_hooks) + len(m._forward_pre_hooks)
    return total


# --------------------------------------------------------------------------------------------
# The lesson's model: a small convolutional classifier for 8x8 digit images.


class ResidualTanh(nn.Module):
    """``x + tanh(fc(x))``: a residual block (lesson 03)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.act = nn.Tanh()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.fc(x))


class DigitsConvNet(nn.Module):
    """Lesson 03's model: conv, BatchNorm, pooling, linear layers, LayerNorm, a residual block,
    log-probabilities. Takes ``(N, 1, 8, 8)`` images, returns ``(N, 10)`` log-probabilities."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 8, kernel_size=3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Linear(8 * 4 * 4, 64)
        self.norm = nn.LayerNorm(64)
        self.gelu = nn.GELU()
        self.block = ResidualTanh(64)
        self.fc2 = nn.Linear(64, 10)
        self.log_probs = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.relu(self.bn(self.conv(x))))
        x = self.gelu(self.norm(self.fc1(self.flatten(x))))
        return self.log_probs(self.fc2(self.block(x)))


def lesson_model(seed: int = 0, device: torch.device | str = "cpu") -> DigitsConvNet:
    """A freshly initialised :class:`DigitsConvNet` on ``device`` (lesson 03)."""
    torch.manual_seed(seed)
    return DigitsConvNet().to(device)


def digit_images(n: int = 64, device: torch.device | str = "cpu") -> torch.Tensor:
    """The first ``n`` training digits as float32 images of shape ``(n, 1, 8, 8)`` (lesson 03)."""
    from course.data import digits

    x, _, _, _ = digits(device)
    return x[:n].reshape(-1, 1, 8, 8)


# --------------------------------------------------------------------------------------------
# The widget's model: self-attention over the 8 rows of a digit image.


class Scores(nn.Module):
    """Attention scores ``q @ k^T / sqrt(d)`` from a packed ``qkv`` tensor (lesson 03)."""

    def forward(self, qkv: torch.Tensor) -> torch.Tensor:
        q, k, _ = qkv.chunk(3, dim=-1)
        return q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5


class Mix(nn.Module):
    """Attention output ``probs @ v`` (lesson 03)."""

    def forward(self, probs: torch.Tensor, qkv: torch.Tensor) -> torch.Tensor:
        return probs @ qkv.chunk(3, dim=-1)[2]


class MeanPool(nn.Module):
    """Mean over the sequence dimension (lesson 03)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=1)


class RowAttention(nn.Module):
    """The widget's model: each 8x8 digit is a sequence of 8 rows of 8 pixels (lesson 03)."""

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = nn.Linear(8, width)
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.scores = Scores()
        self.softmax = nn.Softmax(dim=-1)
        self.mix = Mix()
        self.out = nn.Linear(width, width)
        self.pool = MeanPool()
        self.head = nn.Linear(width, 10)
        self.log_probs = nn.LogSoftmax(dim=-1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.embed(x.reshape(x.shape[0], 8, 8)))
        qkv = self.qkv(h)
        mixed = self.mix(self.softmax(self.scores(qkv)), qkv)
        return self.log_probs(self.head(self.pool(self.out(mixed))))


@dataclass(frozen=True)
class LayerOp:
    """The op autocast sees when a layer runs, and which layers' outputs feed it (lesson 03)."""

    op: str
    inputs: tuple[str, ...]


#: For each layer of :class:`RowAttention`: its op and the layers it reads ("input": the model's
#: float32 input).
ROW_ATTENTION_OPS: dict[str, LayerOp] = {
    "embed": LayerOp("linear", ("input",)),
    "norm": LayerOp("layer_norm", ("embed",)),
    "qkv": LayerOp("linear", ("norm",)),
    "scores": LayerOp("matmul", ("qkv", "qkv")),
    "softmax": LayerOp("softmax", ("scores",)),
    "mix": LayerOp("matmul", ("softmax", "qkv")),
    "out": LayerOp("linear", ("mix",)),
    "pool": LayerOp("mean", ("out",)),
    "head": LayerOp("linear", ("pool",)),
    "log_probs": LayerOp("log_softmax", ("head",)),
}


def row_attention(seed: int = 0, device: torch.device | str = "cpu") -> RowAttention:
    """A freshly initialised :class:`RowAttention` on ``device`` (lesson 03)."""
    torch.manual_seed(seed)
    return RowAttention().to(device)


def documented_layer_dtypes(
    layer_ops: dict[str, LayerOp],
    device_type: str,
    dtype: torch.dtype,
    input_dtype: torch.dtype = torch.float32,
) -> dict[str, torch.dtype]:
    """Each layer's output dtype as the documented lists predict it, following ``layer_ops``
    in order from the model's input (lesson 03)."""
    known: dict[str, torch.dtype] = {"input": input_dtype}
    for name, spec in layer_ops.items():
        ins = tuple(known[i] for i in spec.inputs)
        known[name] = documented_dtype(spec.op, ins, device_type, dtype)
    del known["input"]
    return known


# --------------------------------------------------------------------------------------------
# The widget.

TraceFn = Callable[[nn.Module, tuple, str, torch.dtype], dict[str, torch.dtype]]
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


class AutocastTable:
    """Lesson 03's widget: device type and dtype controls over a per-layer dtype table.

    CPU rows are measured with ``trace_fn`` (the student's ``trace_dtypes``). CUDA rows are
    measured the same way when a CUDA GPU is present and otherwise *documented*: derived from
    :data:`OP_LISTS` and ``layer_ops``. ``self.rows`` holds what the table shows.
    """

    def __init__(
        self,
        model: nn.Module,
        inputs: tuple[torch.Tensor, ...],
        layer_ops: dict[str, LayerOp],
        trace_fn: TraceFn | None = None,
        device_type: str = "cpu",
        dtype: str = "bfloat16",
        gpu_available: bool | None = None,
    ) -> None:
        self.model = copy.deepcopy(model).cpu()
        self.inputs = tuple(t.detach().cpu() for t in inputs)
        self.layer_ops = dict(layer_ops)
        self.trace_fn = trace_fn
        self.gpu = torch.cuda.is_available() if gpu_available is None else gpu_available
        self.device_type = W.ToggleButtons(
            options=["cpu", "cuda"], value=device_type, description="device type"
        )
        self.dtype = W.ToggleButtons(
            options=list(_DTYPES), value=dtype, description="autocast dtype"
        )
        self.note = W.HTML()
        self.output = W.HTML()
        self.rows: list[dict[str, str]] = []
        self.source = ""
        self._setting = False
        for control in (self.device_type, self.dtype):
            control.observe(self._changed, names="value")
        self.widget = W.VBox([self.device_type, self.dtype, self.note, self.output])
        self.update()

    def _changed(self, _change: dict) -> None:
        if not self._setting:
            self.update()

    def _measure(self, device_type: str, dtype: torch.dtype) -> dict[str, torch.dtype]:
        if self.trace_fn is None:
            raise NotImplementedError("no trace function given")
        device = torch.device("cuda" if device_type == "cuda" else "cpu")
        model = copy.deepcopy(self.model).to(device)
        inputs = tuple(t.to(device) for t in self.inputs)
        result = self.trace_fn(model, inputs, device_type, dtype)
        if not isinstance(result, dict):
            raise TypeError(f"trace_dtypes returned a {type(result).__name__}, not a dict")
        return result

    def update(self, device_type: str | None = None, dtype: str | None = None) -> None:
        """Rebuild the table for the chosen device type and dtype (the controls call this)."""
        if device_type is not None or dtype is not None:
            self._setting = True
            try:
                if device_type is not None:
                    self.device_type.value = device_type
                if dtype is not None:
                    self.dtype.value = dtype
            finally:
                self._setting = False
        dev, name = self.device_type.value, self.dtype.value
        torch_dtype = _DTYPES[name]
        documented = documented_layer_dtypes(self.layer_ops, dev, torch_dtype)
        measured: dict[str, torch.dtype] | None = None
        why = ""
        if dev == "cuda" and not self.gpu:
            why = "no CUDA GPU here: CUDA rows are <b>documented</b> (from torch's op lists)"
        else:
            try:
                measured = self._measure(dev, torch_dtype)
                where = "this machine's CUDA GPU" if dev == "cuda" else "this CPU"
                why = f"<b>measured</b> on {where} with your <code>trace_dtypes</code>"
            except NotImplementedError:
                why = "write <code>trace_dtypes</code> above to measure; showing <b>documented</b>"
            except Exception as exc:  # noqa: BLE001 - shown to the student, not raised
                why = (
                    f"your <code>trace_dtypes</code> raised {type(exc).__name__}: "
                    f"{html.escape(str(exc))}; showing <b>documented</b>"
                )
        self.source = "measured" if measured is not None else "documented"
        modules = dict(self.model.named_modules())
        self.rows = []
        for layer, spec in self.layer_ops.items():
            got = measured.get(layer) if measured is not None else documented[layer]
            self.rows.append(
                {
                    "layer": layer,
                    "module": type(modules[layer]).__name__ if layer in modules else "?",
                    "op": spec.op,
                    "list": op_policy(spec.op, dev),
                    "dtype": short(got),
                    "source": self.source,
                }
            )
        self.note.value = f"autocast({dev!r}, dtype=torch.{name}): {why}"
        self.output.value = self._html()

    def _html(self) -> str:
        head = "".join(f"<th style='padding:2px 10px'>{k}</th>" for k in self.rows[0])
        body = []
        for row in self.rows:
            color = "#d6eaff" if row["dtype"] == "float32" else "#ffe9c7"
            cells = "".join(
                f"<td style='padding:2px 10px{';background:' + color if k == 'dtype' else ''}'>"
                f"{html.escape(v)}</td>"
                for k, v in row.items()
            )
            body.append(f"<tr>{cells}</tr>")
        return f"<table><tr>{head}</tr>{''.join(body)}</table>"

    def _ipython_display_(self) -> None:
        display(self.widget)
