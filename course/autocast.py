"""What autocast does to each op: the installed torch's op lists, two small models, a widget
(lesson 03).

The CUDA lists are read from the header shipped inside the torch wheel
(``torch/include/ATen/autocast_mode.h``, its ``AT_FORALL_*`` macros), plus the few CUDA kernels
registered outside them (:data:`CUDA_OUTSIDE_HEADER`). The CPU lists live in a source file the
wheel does not ship, so they are measured (:func:`measure_cpu_policy`): each op with an
``AutocastCPU`` kernel runs under CPU autocast on small inputs, and the casts autocast makes to
those inputs say its policy. The measured CPU lists are kept in :data:`CPU_MEASURED` so that the
lesson stays fast; ``tests/test_autocast.py`` measures them all again and checks both devices'
lists against the dispatcher (``torch._C._dispatch_dump``) in both directions.

The graded exercises (tracing every layer's output dtype, predicting the CUDA dtypes of the
lesson's model, a float32 custom autograd function) are left to the student: nothing here traces
a model.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import html
import re
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import ipywidgets as W
import torch
from IPython.display import display
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

LOWER = "lower precision"
FLOAT32 = "float32"
PROMOTE = "widest input"
REFUSED = "refused"
NO_LIST = "no list"

#: The header inside the installed torch wheel that holds the CUDA lists.
HEADER = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"

#: The header's list macros and the policy each one stands for on CUDA (``fp32_set_opt_dtype``
#: and ``fp32_append_dtype`` are float32 too: they pass ``dtype=torch.float32`` to the op
#: instead of casting its inputs).
HEADER_MACROS: dict[str, str] = {
    "AT_FORALL_LOWER_PRECISION_FP": LOWER,
    "AT_FORALL_FP32": FLOAT32,
    "AT_FORALL_FP32_SET_OPT_DTYPE": FLOAT32,
    "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE": FLOAT32,
    "AT_FORALL_PROMOTE": PROMOTE,
}

#: Ops with an ``AutocastCUDA`` kernel that the header's lists leave out (registered in
#: ``autocast_mode.cpp``, which the wheel does not ship); ``tests/test_autocast.py`` checks that
#: these are exactly the dispatcher's extra ops, and runs the CUDA kernels on fake CUDA tensors.
CUDA_OUTSIDE_HEADER: dict[str, str] = {
    "binary_cross_entropy": REFUSED,
    "cudnn_convolution": LOWER,
    "cudnn_convolution_transpose": LOWER,
}

#: CUDA autocast kernels that only builds with cuDNN register (a CPU wheel has none of them):
#: ``_cudnn_rnn``, the cuDNN kernel behind ``nn.LSTM``/``nn.GRU``/``nn.RNN`` on a GPU, whose
#: wrapper (``aten/src/ATen/cudnn/AutocastRNN.cpp``, not shipped in the wheel) casts the input,
#: the states and the flattened weights down (to float16 in the source read for this course;
#: what it does under bfloat16 autocast was not measured here). Seen registered on a CUDA build
#: (torch 2.11, an H200).
CUDNN_BUILD_ONLY: dict[str, str] = {"_cudnn_rnn": LOWER}


def _has_cuda_autocast_kernel(op: str) -> bool:
    """Whether this torch build's dispatcher has an ``AutocastCUDA`` kernel for ``aten::op``."""
    try:
        return "\nAutocastCUDA:" in torch._C._dispatch_dump(f"aten::{op}")
    except RuntimeError:  # no such op in this build
        return False


#: Python-level spellings and the aten op autocast sees for them.
ATEN_NAME: dict[str, str] = {
    "__matmul__": "matmul",
    "cross_entropy": "cross_entropy_loss",
    "grid_sample": "grid_sampler",
    "multi_dot": "linalg_multi_dot",
}

#: Ops on a CUDA list with no CPU autocast kernel whose parts have one, so that under CPU
#: autocast they still come out in this policy (``einsum`` runs as ``bmm``): measured by
#: :func:`measure_cpu_policy` from the op's output dtype; every other such op measured "no list".
CPU_VIA_PARTS: dict[str, str] = {
    "chain_matmul": LOWER, "einsum": LOWER, "linalg_multi_dot": LOWER, "rnn_relu_cell": LOWER,
    "rnn_tanh_cell": LOWER, "tensordot": LOWER,
}  # fmt: skip

#: The same for CUDA: ``F.cross_entropy`` has no CUDA autocast kernel and runs as
#: ``log_softmax`` and then ``nll_loss``, which is on the float32 list.
CUDA_VIA_PARTS: dict[str, str] = {"cross_entropy_loss": FLOAT32}

VIA_PARTS: dict[str, dict[str, str]] = {"cuda": CUDA_VIA_PARTS, "cpu": CPU_VIA_PARTS}


def parse_header(text: str) -> dict[str, tuple[str, ...]]:
    """The op names in each list macro of ``autocast_mode.h`` (lesson 03).

    Returns ``{macro: ("op", "op.overload", ...)}`` for the macros in :data:`HEADER_MACROS`,
    spelled as the dispatcher spells them (``"conv_transpose2d.input"``, ``"norm.Scalar"``).
    """
    found: dict[str, tuple[str, ...]] = {}
    for macro in HEADER_MACROS:
        match = re.search(rf"#define {macro}\(_\)((?:.*\\\n)*.*)", text)
        if match is None:
            raise ValueError(f"{macro} not found in the autocast header")
        body = match.group(1).replace("\\\n", " ")
        names = []
        if macro == "AT_FORALL_DIFFERENT_REDISPATCH_SIGNATURE":
            names = re.findall(r'"([A-Za-z0-9_.]+)"', body)
        else:
            for entry in re.findall(r"_\(\s*([A-Za-z0-9_]+)\s*(?:,\s*([A-Za-z0-9_]+)\s*)?\)", body):
                names.append(entry[0] + (f".{entry[1]}" if entry[1] else ""))
        found[macro] = tuple(names)
    return found


def cuda_overloads() -> dict[str, str]:
    """``{"op.overload": policy}`` for every CUDA autocast kernel: the installed torch's header
    lists plus :data:`CUDA_OUTSIDE_HEADER`, and the :data:`CUDNN_BUILD_ONLY` kernels this build
    registers (lesson 03)."""
    lists = parse_header(HEADER.read_text())
    out = {name: HEADER_MACROS[macro] for macro, names in lists.items() for name in names}
    cudnn = {op: p for op, p in CUDNN_BUILD_ONLY.items() if _has_cuda_autocast_kernel(op)}
    return {**out, **CUDA_OUTSIDE_HEADER, **cudnn}


#: The CPU lists, by op overload: what :func:`measure_cpu_policy` measured under CPU autocast
#: with torch 2.13.0 (bfloat16 and float16 agree). ``tests/test_autocast.py`` measures every
#: op with an ``AutocastCPU`` kernel again and fails if one differs, or if the dispatcher has
#: a CPU autocast kernel that is not here.
CPU_MEASURED: dict[str, tuple[str, ...]] = {
    LOWER: (
        "_addmm_activation", "_convolution.deprecated", "_native_multi_head_attention",
        "addbmm", "addmm", "baddbmm", "bmm", "conv1d", "conv1d.padding", "conv2d",
        "conv2d.padding", "conv3d", "conv3d.padding", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d.input", "conv_transpose3d.input", "linalg_vecdot", "linear", "matmul",
        "mkldnn_rnn_layer", "mm", "prelu", "scaled_dot_product_attention"
    ),
    FLOAT32: (
        "_grid_sampler_2d_cpu_fallback", "_lu_with_info", "adaptive_avg_pool3d",
        "adaptive_max_pool3d", "avg_pool3d", "binary_cross_entropy",
        "binary_cross_entropy_with_logits", "cdist", "cholesky", "cholesky_inverse",
        "cholesky_solve", "cosine_embedding_loss", "cross_entropy_loss", "ctc_loss.IntList",
        "ctc_loss.Tensor", "fake_quantize_per_tensor_affine", "fft_fft", "fft_fft2", "fft_fftn",
        "fft_hfft", "fft_ifft", "fft_ifft2", "fft_ifftn", "fft_ihfft", "fft_irfft",
        "fft_irfft2", "fft_irfftn", "fft_rfft", "fft_rfft2", "fft_rfftn",
        "fractional_max_pool2d", "fractional_max_pool3d", "geqrf", "grid_sampler",
        "grid_sampler_2d", "grid_sampler_3d", "hinge_embedding_loss", "huber_loss", "inverse",
        "kl_div", "l1_loss", "linalg_cholesky", "linalg_cholesky_ex", "linalg_cond",
        "linalg_cond.p_str", "linalg_eig", "linalg_eigh", "linalg_eigvals", "linalg_eigvalsh",
        "linalg_householder_product", "linalg_inv", "linalg_inv_ex", "linalg_lstsq",
        "linalg_matrix_rank", "linalg_matrix_rank.atol_rtol_float",
        "linalg_matrix_rank.atol_rtol_tensor", "linalg_matrix_rank.tol_tensor", "linalg_qr",
        "linalg_solve", "linalg_svd", "linalg_svdvals", "linalg_tensorinv",
        "linalg_tensorsolve", "lu_solve", "margin_ranking_loss", "max_pool3d", "max_unpool2d",
        "max_unpool3d", "mse_loss", "multi_margin_loss", "multilabel_margin_loss",
        "multilabel_margin_loss_forward", "nanquantile", "nanquantile.scalar", "nll_loss",
        "nll_loss2d", "orgqr", "ormqr", "pinverse", "poisson_nll_loss", "polar", "prod",
        "prod.dim_int", "qr", "quantile", "quantile.scalar", "reflection_pad1d",
        "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
        "smooth_l1_loss", "soft_margin_loss", "stft", "stft.center", "svd", "trace",
        "triangular_solve", "triplet_margin_loss", "view_as_complex"
    ),
    PROMOTE: (
        "cat", "index_copy", "stack"
    ),
}  # fmt: skip


class _Inputs:
    """Makes a probe's floating inputs in the dtype under test, and remembers their ids."""

    def __init__(self, dtypes: Callable[[int], torch.dtype]) -> None:
        self.dtypes = dtypes
        self.made: list[torch.Tensor] = []
        self.ids: set[int] = set()
        self.gen = torch.Generator().manual_seed(0)

    def _keep(self, base: torch.Tensor) -> torch.Tensor:
        t = base.to(self.dtypes(len(self.made)), copy=True)
        self.made.append(t)
        self.ids.add(id(t))
        return t

    def __call__(self, *shape: int) -> torch.Tensor:
        return self._keep(torch.randn(shape, generator=self.gen))

    def u(self, *shape: int, lo: float = 0.1, hi: float = 0.9) -> torch.Tensor:
        return self._keep(lo + (hi - lo) * torch.rand(shape, generator=self.gen))

    def of(self, base: torch.Tensor) -> torch.Tensor:
        return self._keep(base)


@functools.cache
def _fixtures() -> dict[str, torch.Tensor]:
    """Well-conditioned float32 matrices and integer targets for the probes (made on first use)."""
    spd = torch.eye(4) * 3 + torch.full((4, 4), 0.25)
    lu, piv = torch.linalg.lu_factor(spd)
    qr_a, qr_tau = torch.geqrf(torch.eye(4, 3) + 0.25)
    return {
        "spd": spd, "chol": torch.linalg.cholesky(spd), "lu": lu, "piv": piv, "qr_a": qr_a,
        "qr_tau": qr_tau, "sign": torch.tensor([[1.0, -1.0, 1.0, -1.0]] * 3),
        "tok": torch.tensor([0, 2, 4]),
        "ml": torch.tensor([[0, 1, -1, 0], [2, -1, 0, 0], [3, -1, 0, 0]]),
    }  # fmt: skip


def _fft_probe(kind: str) -> Callable[[_Inputs], object]:
    op = getattr(torch.ops.aten, f"fft_{kind}")
    return lambda t: op(t(4, 8) if kind[-1] in "2n" else t(8))


def _probes() -> dict[str, Callable[[_Inputs], object]]:
    a, k = torch.ops.aten, _fixtures()
    i64 = torch.long
    return {
        "_addmm_activation": lambda t: a._addmm_activation(t(3), t(3, 4), t(4, 3)),
        "_convolution.deprecated": lambda t: a._convolution.deprecated(
            t(1, 2, 5, 5), t(3, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
            False, False, True),
        "_grid_sampler_2d_cpu_fallback": lambda t: a._grid_sampler_2d_cpu_fallback(
            t(1, 2, 4, 4), t.u(1, 3, 3, 2, lo=-1, hi=1), 0, 0, False),
        "_lu_with_info": lambda t: torch._lu_with_info(t.of(k["spd"])),
        "_native_multi_head_attention": lambda t: a._native_multi_head_attention(
            t(1, 3, 4), t(1, 3, 4), t(1, 3, 4), 4, 2, t(12, 4), t(12), t(4, 4), t(4)),
        "adaptive_avg_pool3d": lambda t: a.adaptive_avg_pool3d(t(1, 2, 4, 4, 4), [2, 2, 2]),
        "adaptive_max_pool3d": lambda t: a.adaptive_max_pool3d(t(1, 2, 4, 4, 4), [2, 2, 2]),
        "addbmm": lambda t: a.addbmm(t(3, 3), t(2, 3, 4), t(2, 4, 3)),
        "addmm": lambda t: a.addmm(t(3, 3), t(3, 4), t(4, 3)),
        "avg_pool3d": lambda t: a.avg_pool3d(t(1, 2, 4, 4, 4), [2, 2, 2]),
        "baddbmm": lambda t: a.baddbmm(t(2, 3, 3), t(2, 3, 4), t(2, 4, 3)),
        "binary_cross_entropy": lambda t: a.binary_cross_entropy(t.u(3, 4), t.u(3, 4)),
        "binary_cross_entropy_with_logits": lambda t: a.binary_cross_entropy_with_logits(
            t(3, 4), t.u(3, 4)),
        "bmm": lambda t: a.bmm(t(2, 3, 4), t(2, 4, 3)),
        "cat": lambda t: a.cat([t(2, 3), t(2, 3)]),
        "cdist": lambda t: a.cdist(t(3, 4), t(5, 4)),
        "cholesky": lambda t: torch.cholesky(t.of(k["spd"])),
        "cholesky_inverse": lambda t: a.cholesky_inverse(t.of(k["chol"])),
        "cholesky_solve": lambda t: a.cholesky_solve(t(4, 2), t.of(k["chol"])),
        "conv1d": lambda t: a.conv1d(t(1, 2, 6), t(3, 2, 3)),
        "conv1d.padding": lambda t: a.conv1d.padding(t(1, 2, 6), t(3, 2, 3), None, [1], "same"),
        "conv2d": lambda t: a.conv2d(t(1, 2, 5, 5), t(3, 2, 3, 3)),
        "conv2d.padding": lambda t: a.conv2d.padding(
            t(1, 2, 5, 5), t(3, 2, 3, 3), None, [1, 1], "same"),
        "conv3d": lambda t: a.conv3d(t(1, 2, 4, 4, 4), t(3, 2, 2, 2, 2)),
        "conv3d.padding": lambda t: a.conv3d.padding(
            t(1, 2, 4, 4, 4), t(3, 2, 3, 3, 3), None, [1, 1, 1], "same"),
        "conv_tbc": lambda t: a.conv_tbc(t(5, 1, 2), t(3, 2, 4), t(4)),
        "conv_transpose1d": lambda t: a.conv_transpose1d(t(1, 2, 5), t(2, 3, 3)),
        "conv_transpose2d.input": lambda t: a.conv_transpose2d.input(
            t(1, 2, 4, 4), t(2, 3, 3, 3)),
        "conv_transpose3d.input": lambda t: a.conv_transpose3d.input(
            t(1, 2, 3, 3, 3), t(2, 3, 2, 2, 2)),
        "cosine_embedding_loss": lambda t: a.cosine_embedding_loss(
            t(3, 4), t(3, 4), t.of(torch.tensor([1.0, -1.0, 1.0]))),
        "cross_entropy_loss": lambda t: a.cross_entropy_loss(t(3, 5), k["tok"]),
        "ctc_loss.IntList": lambda t: a.ctc_loss.IntList(
            t(6, 2, 4), torch.tensor([[1, 2], [3, 1]]), [6, 6], [2, 2]),
        "ctc_loss.Tensor": lambda t: a.ctc_loss.Tensor(
            t(6, 2, 4), torch.tensor([[1, 2], [3, 1]]), torch.tensor([6, 6]),
            torch.tensor([2, 2])),
        "fake_quantize_per_tensor_affine": lambda t: a.fake_quantize_per_tensor_affine(
            t(4), 0.1, 0, 0, 255),
        **{f"fft_{kind}": _fft_probe(kind) for kind in (
            "fft", "ifft", "rfft", "irfft", "hfft", "ihfft", "fft2", "ifft2", "rfft2", "irfft2",
            "fftn", "ifftn", "rfftn", "irfftn")},
        "fractional_max_pool2d": lambda t: a.fractional_max_pool2d(
            t(1, 2, 6, 6), [2, 2], [3, 3], t.u(1, 2, 2)),
        "fractional_max_pool3d": lambda t: a.fractional_max_pool3d(
            t(1, 2, 6, 6, 6), [2, 2, 2], [3, 3, 3], t.u(1, 2, 3)),
        "geqrf": lambda t: a.geqrf(t(4, 4)),
        "grid_sampler": lambda t: a.grid_sampler(
            t(1, 2, 4, 4), t.u(1, 3, 3, 2, lo=-1, hi=1), 0, 0, False),
        "grid_sampler_2d": lambda t: a.grid_sampler_2d(
            t(1, 2, 4, 4), t.u(1, 3, 3, 2, lo=-1, hi=1), 0, 0, False),
        "grid_sampler_3d": lambda t: a.grid_sampler_3d(
            t(1, 2, 4, 4, 4), t.u(1, 2, 2, 2, 3, lo=-1, hi=1), 0, 0, False),
        "hinge_embedding_loss": lambda t: a.hinge_embedding_loss(t(3, 4), t.of(k["sign"])),
        "huber_loss": lambda t: a.huber_loss(t(3, 4), t(3, 4)),
        "index_copy": lambda t: a.index_copy(t(4, 3), 0, torch.tensor([0, 2]), t(2, 3)),
        "inverse": lambda t: a.inverse(t.of(k["spd"])),
        "kl_div": lambda t: a.kl_div(t(3, 4), t.u(3, 4)),
        "l1_loss": lambda t: a.l1_loss(t(3, 4), t(3, 4)),
        "linalg_cholesky": lambda t: a.linalg_cholesky(t.of(k["spd"])),
        "linalg_cholesky_ex": lambda t: a.linalg_cholesky_ex(t.of(k["spd"])),
        "linalg_cond": lambda t: a.linalg_cond(t.of(k["spd"])),
        "linalg_cond.p_str": lambda t: a.linalg_cond.p_str(t.of(k["spd"]), "fro"),
        "linalg_eig": lambda t: a.linalg_eig(t.of(k["spd"])),
        "linalg_eigh": lambda t: a.linalg_eigh(t.of(k["spd"])),
        "linalg_eigvals": lambda t: a.linalg_eigvals(t.of(k["spd"])),
        "linalg_eigvalsh": lambda t: a.linalg_eigvalsh(t.of(k["spd"])),
        "linalg_householder_product": lambda t: a.linalg_householder_product(
            t.of(k["qr_a"]), t.of(k["qr_tau"])),
        "linalg_inv": lambda t: a.linalg_inv(t.of(k["spd"])),
        "linalg_inv_ex": lambda t: a.linalg_inv_ex(t.of(k["spd"])),
        "linalg_lstsq": lambda t: a.linalg_lstsq(t(5, 3), t(5, 2)),
        "linalg_matrix_rank": lambda t: a.linalg_matrix_rank(t.of(k["spd"]), 1e-5),
        "linalg_matrix_rank.atol_rtol_float": lambda t: a.linalg_matrix_rank.atol_rtol_float(
            t.of(k["spd"])),
        "linalg_matrix_rank.atol_rtol_tensor": lambda t: a.linalg_matrix_rank.atol_rtol_tensor(
            t.of(k["spd"])),
        "linalg_matrix_rank.tol_tensor": lambda t: a.linalg_matrix_rank.tol_tensor(
            t.of(k["spd"]), torch.tensor(1e-5)),
        "linalg_qr": lambda t: a.linalg_qr(t(4, 3)),
        "linalg_solve": lambda t: a.linalg_solve(t.of(k["spd"]), t(4, 2)),
        "linalg_svd": lambda t: a.linalg_svd(t(4, 3)),
        "linalg_svdvals": lambda t: a.linalg_svdvals(t(4, 3)),
        "linalg_tensorinv": lambda t: a.linalg_tensorinv(t.of(k["spd"].reshape(4, 2, 2)), 1),
        "linalg_tensorsolve": lambda t: a.linalg_tensorsolve(
            t.of(k["spd"].reshape(2, 2, 4)), t(2, 2)),
        "linalg_vecdot": lambda t: a.linalg_vecdot(t(3, 4), t(3, 4)),
        "linear": lambda t: a.linear(t(3, 4), t(5, 4), t(5)),
        "lu_solve": lambda t: torch.lu_solve(t(4, 2), t.of(k["lu"]), k["piv"]),
        "margin_ranking_loss": lambda t: a.margin_ranking_loss(t(3, 4), t(3, 4), t.of(k["sign"])),
        "matmul": lambda t: a.matmul(t(3, 4), t(4, 5)),
        "max_pool3d": lambda t: a.max_pool3d(t(1, 2, 4, 4, 4), [2, 2, 2]),
        "max_unpool2d": lambda t: a.max_unpool2d(
            t(1, 1, 2, 2), torch.tensor([[[[0, 3], [8, 11]]]]), [4, 4]),
        "max_unpool3d": lambda t: a.max_unpool3d(
            t(1, 1, 1, 1, 1), torch.zeros(1, 1, 1, 1, 1, dtype=i64), [2, 2, 2], [2, 2, 2],
            [0, 0, 0]),
        "mkldnn_rnn_layer": lambda t: a.mkldnn_rnn_layer(
            t(3, 1, 4), t(8, 4), t(8, 2), t(8), t(8), t(1, 2), t(1, 2), False, [], 2, 2, 1,
            True, False, False, False),
        "mm": lambda t: a.mm(t(3, 4), t(4, 5)),
        "mse_loss": lambda t: a.mse_loss(t(3, 4), t(3, 4)),
        "multi_margin_loss": lambda t: a.multi_margin_loss(t(3, 5), k["tok"]),
        "multilabel_margin_loss": lambda t: a.multilabel_margin_loss(t(3, 4), k["ml"]),
        "multilabel_margin_loss_forward": lambda t: a.multilabel_margin_loss_forward(
            t(3, 4), k["ml"], 1),
        "nanquantile": lambda t: a.nanquantile(t(8), t.of(torch.tensor([0.25, 0.5]))),
        "nanquantile.scalar": lambda t: a.nanquantile.scalar(t(8), 0.5),
        "nll_loss": lambda t: a.nll_loss(t(3, 5), k["tok"]),
        "nll_loss2d": lambda t: a.nll_loss2d(t(1, 3, 2, 2), torch.zeros(1, 2, 2, dtype=i64)),
        "orgqr": lambda t: a.orgqr(t.of(k["qr_a"]), t.of(k["qr_tau"])),
        "ormqr": lambda t: a.ormqr(t.of(k["qr_a"]), t.of(k["qr_tau"]), t(4, 2)),
        "pinverse": lambda t: a.pinverse(t(4, 3)),
        "poisson_nll_loss": lambda t: a.poisson_nll_loss(t(3, 4), t.u(3, 4), True, False, 1e-8, 1),
        "polar": lambda t: a.polar(t.u(4), t(4)),
        "prelu": lambda t: a.prelu(t(2, 3, 4), t(3)),
        "prod": lambda t: a.prod(t(4)),
        "prod.dim_int": lambda t: a.prod.dim_int(t(3, 4), 1),
        "qr": lambda t: torch.qr(t(4, 3)),
        "quantile": lambda t: a.quantile(t(8), t.of(torch.tensor([0.25, 0.5]))),
        "quantile.scalar": lambda t: a.quantile.scalar(t(8), 0.5),
        "reflection_pad1d": lambda t: a.reflection_pad1d(t(1, 2, 5), [1, 1]),
        "reflection_pad2d": lambda t: a.reflection_pad2d(t(1, 2, 4, 4), [1, 1, 1, 1]),
        "replication_pad1d": lambda t: a.replication_pad1d(t(1, 2, 5), [1, 1]),
        "replication_pad2d": lambda t: a.replication_pad2d(t(1, 2, 4, 4), [1, 1, 1, 1]),
        "replication_pad3d": lambda t: a.replication_pad3d(t(1, 1, 3, 3, 3), [1] * 6),
        "scaled_dot_product_attention": lambda t: a.scaled_dot_product_attention(
            t(1, 2, 3, 4), t(1, 2, 3, 4), t(1, 2, 3, 4)),
        "smooth_l1_loss": lambda t: a.smooth_l1_loss(t(3, 4), t(3, 4)),
        "soft_margin_loss": lambda t: a.soft_margin_loss(t(3, 4), t.of(k["sign"])),
        "stack": lambda t: a.stack([t(2, 3), t(2, 3)]),
        "stft": lambda t: a.stft(t(32), 8, window=torch.ones(8), return_complex=True),
        "stft.center": lambda t: a.stft.center(
            t(32), 8, window=torch.ones(8), return_complex=True),
        "svd": lambda t: a.svd(t(4, 3)),
        "trace": lambda t: a.trace(t(4, 4)),
        "triangular_solve": lambda t: torch.triangular_solve(
            t(4, 2), t.of(k["chol"].T.contiguous())),
        "triplet_margin_loss": lambda t: a.triplet_margin_loss(t(3, 4), t(3, 4), t(3, 4)),
        "view_as_complex": lambda t: a.view_as_complex(t(4, 2)),
    }  # fmt: skip


#: CUDA kernels with no CPU implementation at all (nothing to measure on the CPU).
CUDA_ONLY_KERNELS: tuple[str, ...] = (
    "_scaled_dot_product_flash_attention", "_thnn_fused_gru_cell", "_thnn_fused_lstm_cell",
    "cudnn_convolution", "cudnn_convolution_transpose",
)  # fmt: skip


def _parts_probes() -> dict[str, Callable[[_Inputs], object]]:
    """Probes for the ops on a CUDA list that have no CPU autocast kernel: under CPU autocast
    they run as they are, or as ops that do have one (``einsum`` as ``bmm``)."""
    a = torch.ops.aten
    unary = (
        "acos",
        "asin",
        "cosh",
        "erfinv",
        "exp",
        "expm1",
        "log",
        "log10",
        "log1p",
        "log2",
        "reciprocal",
        "rsqrt",
        "sinh",
        "tan",
        "softplus",
        "sum",
        "native_layer_norm",
    )
    probes: dict[str, Callable[[_Inputs], object]] = {
        name: (lambda op: lambda t: op(t.u(3, 4)))(getattr(a, name))
        for name in unary
        if name != "native_layer_norm"
    }
    probes.update(
        {
            "native_layer_norm": lambda t: a.native_layer_norm(t(3, 4), [4], None, None, 1e-5),
            "_upsample_bicubic2d_aa": lambda t: a._upsample_bicubic2d_aa(
                t(1, 1, 4, 4), [6, 6], False
            ),
            "_upsample_bilinear2d_aa": lambda t: a._upsample_bilinear2d_aa(
                t(1, 1, 4, 4), [6, 6], False
            ),
            "_upsample_nearest_exact1d": lambda t: a._upsample_nearest_exact1d(t(1, 1, 4), [6]),
            "_upsample_nearest_exact2d": lambda t: a._upsample_nearest_exact2d(
                t(1, 1, 4, 4), [6, 6]
            ),
            "_upsample_nearest_exact3d": lambda t: a._upsample_nearest_exact3d(
                t(1, 1, 2, 2, 2), [3, 3, 3]
            ),
            "upsample_bicubic2d": lambda t: a.upsample_bicubic2d(t(1, 1, 4, 4), [6, 6], False),
            "upsample_bilinear2d": lambda t: a.upsample_bilinear2d(t(1, 1, 4, 4), [6, 6], False),
            "upsample_linear1d": lambda t: a.upsample_linear1d(t(1, 1, 4), [6], False),
            "upsample_nearest1d": lambda t: a.upsample_nearest1d(t(1, 1, 4), [6]),
            "upsample_nearest2d": lambda t: a.upsample_nearest2d(t(1, 1, 4, 4), [6, 6]),
            "upsample_nearest3d": lambda t: a.upsample_nearest3d(t(1, 1, 2, 2, 2), [3, 3, 3]),
            "upsample_trilinear3d": lambda t: a.upsample_trilinear3d(
                t(1, 1, 2, 2, 2), [3, 3, 3], False
            ),
            "addcdiv": lambda t: a.addcdiv(t(3, 4), t(3, 4), t.u(3, 4)),
            "addcmul": lambda t: a.addcmul(t(3, 4), t(3, 4), t(3, 4)),
            "addmv": lambda t: a.addmv(t(3), t(3, 4), t(4)),
            "addr": lambda t: a.addr(t(3, 4), t(3), t(4)),
            "atan2": lambda t: a.atan2(t(3, 4), t(3, 4)),
            "bilinear": lambda t: a.bilinear(t(2, 3), t(2, 4), t(5, 3, 4), t(5)),
            "chain_matmul": lambda t: torch.chain_matmul(t(3, 4), t(4, 5), t(5, 2)),  # deprecated
            "convolution": lambda t: a.convolution(
                t(1, 2, 5, 5), t(3, 2, 3, 3), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1
            ),
            "cosine_similarity": lambda t: a.cosine_similarity(t(3, 4), t(3, 4)),
            "cross": lambda t: a.cross(t(2, 3), t(2, 3), 1),
            "cumprod": lambda t: a.cumprod(t(3, 4), 1),
            "cumsum": lambda t: a.cumsum(t(3, 4), 1),
            "dist": lambda t: a.dist(t(3, 4), t(3, 4)),
            "dot": lambda t: a.dot(t(4), t(4)),
            "einsum": lambda t: a.einsum("bij,bjk->bik", [t(2, 3, 4), t(2, 4, 5)]),
            "frobenius_norm.dim": lambda t: torch.frobenius_norm(t(3, 4), [1]),  # deprecated
            "group_norm": lambda t: a.group_norm(t(2, 4, 3), 2),
            "gru_cell": lambda t: a.gru_cell(t(2, 3), t(2, 4), t(12, 3), t(12, 4)),
            "index_put": lambda t: a.index_put(t(4, 3), [torch.tensor([0, 2])], t(2, 3)),
            "layer_norm": lambda t: a.layer_norm(t(3, 4), [4]),
            "linalg_matrix_norm": lambda t: a.linalg_matrix_norm(t(3, 4), 2),
            "linalg_matrix_norm.str_ord": lambda t: a.linalg_matrix_norm.str_ord(t(3, 4), "nuc"),
            "linalg_multi_dot": lambda t: a.linalg_multi_dot([t(3, 4), t(4, 5), t(5, 2)]),
            "linalg_vector_norm": lambda t: a.linalg_vector_norm(t(3, 4)),
            "log_softmax.int": lambda t: a.log_softmax.int(t(3, 4), 1),
            "logsumexp": lambda t: a.logsumexp(t(3, 4), [1]),
            "lstm_cell": lambda t: a.lstm_cell(t(2, 3), [t(2, 4), t(2, 4)], t(16, 3), t(16, 4)),
            "mv": lambda t: a.mv(t(3, 4), t(4)),
            "norm.Scalar": lambda t: a.norm.Scalar(t(3, 4)),
            "norm.ScalarOpt_dim": lambda t: a.norm.ScalarOpt_dim(t(3, 4), 2, [1]),
            "nuclear_norm": lambda t: torch.nuclear_norm(t(3, 4)),  # deprecated: warns in Python
            "nuclear_norm.dim": lambda t: torch.nuclear_norm(t(3, 4), dim=[0, 1]),
            "pdist": lambda t: a.pdist(t(3, 4)),
            "pow.Scalar": lambda t: a.pow.Scalar(2.0, t(3, 4)),
            "pow.Tensor_Scalar": lambda t: a.pow.Tensor_Scalar(t(3, 4), 2.0),
            "pow.Tensor_Tensor": lambda t: a.pow.Tensor_Tensor(t.u(3, 4), t(3, 4)),
            "renorm": lambda t: a.renorm(t(3, 4), 2, 0, 1.0),
            "rms_norm": lambda t: a.rms_norm(t(3, 4), [4]),
            "rnn_relu_cell": lambda t: a.rnn_relu_cell(t(2, 3), t(2, 4), t(4, 3), t(4, 4)),
            "rnn_tanh_cell": lambda t: a.rnn_tanh_cell(t(2, 3), t(2, 4), t(4, 3), t(4, 4)),
            "scatter_add": lambda t: a.scatter_add(
                t(3, 4), 1, torch.zeros(3, 2, dtype=torch.long), t(3, 2)
            ),
            "softmax.int": lambda t: a.softmax.int(t(3, 4), 1),
            "sum.dim_IntList": lambda t: a.sum.dim_IntList(t(3, 4), [1]),
            "tensordot": lambda t: a.tensordot(t(3, 4), t(4, 5), [1], [0]),
            "vdot": lambda t: a.vdot(t(4), t(4)),
        }
    )
    return probes


class _CastRecorder(TorchDispatchMode):
    """Records the dtypes autocast casts a probe's own inputs to (the casts run as _to_copy)."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Never run under torch.compile: skip the default wrapper, whose first call imports
        # torch._dynamo (about a second).
        return False

    def __init__(self, ids: set[int]) -> None:
        super().__init__()
        self.ids = ids
        self.casts: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        if func is torch.ops.aten._to_copy.default and args and id(args[0]) in self.ids:
            self.casts.add(kwargs.get("dtype", args[0].dtype))
        return func(*args, **kwargs)


_REAL = {torch.complex64: torch.float32, torch.complex32: torch.float16}


def _first_dtype(out: object) -> torch.dtype | None:
    items = out if isinstance(out, (tuple, list)) else (out,)
    for item in items:
        if isinstance(item, torch.Tensor) and (item.is_floating_point() or item.is_complex()):
            return _REAL.get(item.dtype, item.dtype)
    return None


def _run_probe(
    probe: Callable, low: torch.dtype, dtypes: Callable[[int], torch.dtype]
) -> tuple[set[torch.dtype], torch.dtype | None]:
    t = _Inputs(dtypes)
    recorder = _CastRecorder(t.ids)
    out = None
    with (
        warnings.catch_warnings(),  # deprecated ops (torch.qr, ...) are probed on purpose
        torch.amp.autocast("cpu", dtype=low, cache_enabled=False),
        recorder,
    ):
        warnings.simplefilter("ignore")
        try:
            out = _first_dtype(probe(t))
        except RuntimeError:  # the casts are recorded before the kernel runs
            pass
    return recorder.casts, out


def measure_cpu_policy(op: str, low: torch.dtype = torch.bfloat16) -> str:
    """The policy CPU autocast applies to ``op`` ("op" or "op.overload"), measured (lesson 03).

    Runs the op under ``torch.amp.autocast("cpu", dtype=low)`` on small inputs (up to three
    times) and watches which casts autocast makes to them: low precision inputs cast up or a
    float32 result (float32), float32 inputs cast down or a low precision result (lower
    precision), or a low precision input cast up only when a float32 one is beside it (widest
    input). Ops this module has no probe for raise
    ``KeyError``; an op whose inputs autocast leaves alone is ``"no list"``.
    """
    kernels = _probes()
    probe = kernels[op] if op in kernels else _parts_probes()[op]

    def run(dtypes: Callable[[int], torch.dtype]) -> tuple[set[torch.dtype], torch.dtype | None]:
        casts, out = _run_probe(probe, low, dtypes)
        # An op without an autocast kernel may cast inside itself (rms_norm computes in
        # float32): only an autocast kernel's casts, made before the op runs, say its policy.
        return (casts if op in kernels else set()), out

    casts, out = run(lambda i: low)
    if torch.float32 in casts or out == torch.float32:
        return FLOAT32
    casts, out = run(lambda i: torch.float32)
    if low in casts or out == low:
        return LOWER
    casts, out = run(lambda i: low if i == 0 else torch.float32)
    if torch.float32 in casts:
        return PROMOTE
    return NO_LIST


@functools.cache
def cpu_overloads(low: torch.dtype = torch.bfloat16) -> dict[str, str]:
    """``{"op.overload": policy}`` for every op this module probes, measured on this CPU under
    CPU autocast with ``low`` (lesson 03). Measured once per process (about a second on a
    loaded 2-core CPU); the lesson uses :data:`CPU_MEASURED` and measures a sample itself."""
    return {op: measure_cpu_policy(op, low) for op in _probes()}


def _by_policy(overloads: dict[str, str]) -> dict[str, tuple[str, ...]]:
    lists: dict[str, set[str]] = {LOWER: set(), FLOAT32: set(), PROMOTE: set(), REFUSED: set()}
    for name, policy in overloads.items():
        if policy in lists:
            lists[policy].add(name.split(".")[0])
    return {policy: tuple(sorted(names)) for policy, names in lists.items()}


@functools.cache
def op_lists(device_type: str) -> dict[str, tuple[str, ...]]:
    """``{policy: (op, ...)}`` for ``"cuda"`` (read from the installed torch's header) or
    ``"cpu"`` (:data:`CPU_MEASURED`), by aten op name without overloads (lesson 03)."""
    if device_type == "cuda":
        return _by_policy(cuda_overloads())
    if device_type == "cpu":
        return _by_policy({n: policy for policy, names in CPU_MEASURED.items() for n in names})
    raise ValueError(f"no autocast lists for device type {device_type!r}")


def op_policy(op: str, device_type: str) -> str:
    """Which list ``op`` is on for ``device_type``, or runs as through its parts (lesson 03).

    One of ``"lower precision"``, ``"float32"``, ``"widest input"``, ``"refused"`` or
    ``"no list"`` (an op on no list runs in the dtype of its inputs). ``op`` is an aten name
    (``"layer_norm"``) or a Python spelling in :data:`ATEN_NAME` (``"cross_entropy"``). An op
    with no autocast kernel of its own counts by :data:`VIA_PARTS`.
    """
    lists = op_lists(device_type)
    name = ATEN_NAME.get(op, op).split(".")[0]
    for policy in (REFUSED, LOWER, FLOAT32, PROMOTE):
        if name in lists[policy]:
            return policy
    return VIA_PARTS[device_type].get(name, NO_LIST)


def documented_dtype(
    op: str, input_dtypes: tuple[torch.dtype, ...], device_type: str, dtype: torch.dtype
) -> torch.dtype:
    """The output dtype the lists give ``op`` under autocast (lesson 03).

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
    """``(op, CUDA policy, CPU policy)`` for each op whose two policies differ (lesson 03).

    Covers every op on a list of either device type, each counted by :func:`op_policy` (so an
    op without a kernel of its own counts by what its parts do: ``einsum`` is lower precision
    on both devices, ``cross_entropy_loss`` float32 on both).
    """
    ops = {n for d in ("cuda", "cpu") for names in op_lists(d).values() for n in names}
    rows = [(op, op_policy(op, "cuda"), op_policy(op, "cpu")) for op in sorted(ops)]
    return sorted((r for r in rows if r[1] != r[2]), key=lambda r: (r[1], r[2], r[0]))


def promotes_by_itself(op: str, low: torch.dtype = torch.float16) -> bool:
    """Whether ``op``, run *without* autocast on a ``low`` input beside float32 ones, returns
    float32: ordinary type promotion already gives the widest input (lesson 03). Measured on
    the CPU with the same probes as :func:`measure_cpu_policy`; an op that refuses mixed dtypes
    (``dot``, ``index_put``) or returns ``low`` does not promote."""
    kernels = _probes()
    probe = kernels[op] if op in kernels else _parts_probes()[op]
    t = _Inputs(lambda i: low if i == 0 else torch.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return _first_dtype(probe(t)) == torch.float32
        except RuntimeError:
            return False


def nominal_difference(op: str) -> str | None:
    """Why the two devices' different policies for ``op`` make no difference, or None (lesson 03).

    Two cases: one device promotes to the widest input and the other has no list, while the op
    promotes by itself (:func:`promotes_by_itself`), so both give the same dtypes; or CUDA has a
    lower-precision kernel and the CPU none, while the op is composite (no CPU kernel of its
    own, a ``CompositeImplicitAutograd`` one): on the CPU it runs as ops with policies of their
    own (``lstm_cell``'s matmuls are ``linear``, lower precision there too), though its outputs'
    dtype can still differ (float32 state in, float32 state out).
    """
    cuda, cpu = op_policy(op, "cuda"), op_policy(op, "cpu")
    if cuda == cpu:
        return None
    if {cuda, cpu} == {PROMOTE, NO_LIST}:
        try:
            promotes = promotes_by_itself(op)
        except KeyError:
            return None
        return "promotes by itself without autocast" if promotes else None
    if (cuda, cpu) == (LOWER, NO_LIST):
        dump = torch._C._dispatch_dump(f"aten::{op}")
        if "CompositeImplicitAutograd" in dump and "\nCPU:" not in dump:
            return "composite on the CPU: runs as ops with their own policies"
    return None


class count_casts(TorchDispatchMode):  # noqa: N801 - used like a function: with count_casts()
    """Counts the dtype casts (``aten::_to_copy``) that run inside the ``with`` block (lesson 03).

    Inside an autocast region these are autocast's own casts: ``with count_casts() as c: ...``
    then ``c.count``. Used to watch autocast's weight-cast cache (``cache_enabled``).
    """

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # Never run under torch.compile: skip the default wrapper, whose first call imports
        # torch._dynamo (about a second).
        return False

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten._to_copy.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


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
    :func:`op_lists` and ``layer_ops``. ``self.rows`` holds what the table shows.
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


@contextlib.contextmanager
def autocast_in_backward(output: torch.Tensor, device_type: str) -> Iterator[list[bool]]:
    """Record whether ``device_type`` autocast is on while the backward of ``output``'s
    ``grad_fn`` works on its incoming gradient (lesson 03).

    A hook on ``output`` hands that backward its gradient as a tensor subclass whose
    ``__torch_function__`` appends ``torch.is_autocast_enabled(device_type)`` to the yielded
    list for each torch function called on it, then runs the function on plain tensors. So the
    list holds one entry per op whose arguments include the incoming gradient (``grad.unsqueeze``,
    ``grad * p``, ...); ops on the saved tensors alone are not seen. A custom autograd function
    decorated with ``torch.amp.custom_bwd`` runs its backward in the autocast state its forward's
    body ran in (off after ``cast_inputs``), even when ``backward()`` is called inside an autocast
    region; a backward whose body runs in ``torch.autocast(device_type, enabled=False)`` has it
    off too; otherwise the backward runs in the state ``backward()`` was called in.
    """
    seen: list[bool] = []

    class Watched(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            seen.append(torch.is_autocast_enabled(device_type))
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))

    handle = output.register_hook(lambda grad: grad.as_subclass(Watched))
    try:
        yield seen
    finally:
        handle.remove()
