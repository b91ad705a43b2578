"""Float8 formats, real tensors to quantize, and GPU checks (lesson 08).

The graded exercises (per-tensor and row-wise current scaling, the ``DelayedScaling`` scaler and
MX block quantization) are left to the student, and so is the recipe code the lesson runs on the
page (the 2-rank amax all-reduce, torchao's float8 conversion); the helpers here collect the
tensors those exercises quantize, replay a quantizer over a stream of tensors, import torchao
quietly, and time float8 matrix multiplies where the GPU has them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import time
from collections.abc import Callable, Sequence

import ipywidgets as W
import torch
from IPython.display import display
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from course.device import DeviceProfile, float8_gemm
from course.plotting import new_figure

#: The two float8 formats torch casts to, in the order the lesson shows them.
FP8_FORMATS: tuple[torch.dtype, ...] = (torch.float8_e4m3fn, torch.float8_e5m2)

#: A quantizer's round trip: ``x -> (x * scale before the cast, dequantized x)`` (lesson 08).
RoundTrip = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def fp8_max(fmt: torch.dtype) -> float:
    """The largest finite value of a float8 format: 448 for e4m3fn, 57344 for e5m2 (lesson 08)."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"{fmt} is not one of the float8 formats {FP8_FORMATS}")
    return float(torch.finfo(fmt).max)


def fp8_emax(fmt: torch.dtype) -> int:
    """The exponent of the largest power of two a float8 format holds (lesson 08).

    ``floor(log2(max))``: 8 for e4m3fn (max 448 = 1.75 x 2**8), 15 for e5m2 (57344 = 1.75 x
    2**15). OCP MX 1.0 subtracts it from a block's exponent to get the block's shared scale.
    """
    _, exponent = torch.frexp(torch.tensor(fp8_max(fmt), dtype=torch.float32))
    return int(exponent) - 1


class CastsOverflowToNaN(TorchDispatchMode):
    """Within it, every cast to a float8 format turns values beyond the format's max into NaN.

    What a plain cast does beyond the range differs between torch releases and devices (torch
    2.13's CPU cast saturates e4m3fn and overflows e5m2 to inf; other kernels give NaN). A
    quantizer must clamp before it casts, so that its result does not depend on the cast: under
    this mode (``with CastsOverflowToNaN(): ...``) a quantizer that leaves the range to the cast
    yields NaN, whichever device it runs on, and one that clamps is unchanged. It watches
    ``.to(fmt)`` (``aten._to_copy``) and ``copy_`` into a float8 tensor, from any wider floating
    dtype. Lesson 08 grades its quantizers under it.
    """

    _CASTS = ("_to_copy", "copy_", "copy")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        """Run ``func``; if it cast to float8, put NaN where the source was beyond the max."""
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        name = func.overloadpacket.__name__
        if name not in self._CASTS or not isinstance(out, torch.Tensor):
            return out
        if out.dtype not in FP8_FORMATS:
            return out
        src = args[0] if name == "_to_copy" else args[1]
        if not isinstance(src, torch.Tensor) or not src.is_floating_point():
            return out
        if src.dtype in FP8_FORMATS or src.dtype == torch.float8_e8m0fnu:
            return out
        over = src.float().abs().expand(out.shape) > fp8_max(out.dtype)
        if not bool(over.any()):
            return out
        fixed = torch.where(over, float("nan"), out.float()).to(out.dtype)
        if name == "copy_":
            return out.copy_(fixed)
        return fixed


def cast_table(
    values: Sequence[float],
    dtypes: Sequence[torch.dtype] = FP8_FORMATS,
    device: torch.device | str = "cpu",
) -> str:
    """What a plain ``.to(dtype)`` on ``device`` does to each value, as a text table (lesson 08).

    Nothing is clamped or scaled here: the table shows the cast itself, on this torch build.
    """
    x = torch.tensor(list(values), dtype=torch.float32, device=device)
    names = [str(d).removeprefix("torch.") for d in dtypes]
    head = f"{'value':>14}" + "".join(f"{n:>16}" for n in names)
    rows = [head, "-" * len(head)]
    casts = [x.to(d).float() for d in dtypes]
    for i, v in enumerate(x.tolist()):
        rows.append(f"{v:>14.6g}" + "".join(f"{c[i].item():>16.6g}" for c in casts))
    return "\n".join(rows)


def drifting_tensors(
    steps: int = 60, numel: int = 4096, spike_at: int | None = 40, seed: int = 0
) -> list[torch.Tensor]:
    """A sequence of tensors shaped like one layer's activations over training (lesson 08).

    Their magnitude grows slowly (x1.05 per step) and, at ``spike_at``, jumps 8-fold for one step:
    the case delayed scaling handles worst, since its scale comes from earlier steps.
    """
    gen = torch.Generator().manual_seed(seed)
    out = []
    for step in range(steps):
        magnitude = 1.05**step * (8.0 if step == spike_at else 1.0)
        out.append(torch.randn(numel, generator=gen) * magnitude)
    return out


def replay(roundtrip: RoundTrip, tensors: Sequence[torch.Tensor], fmt: torch.dtype) -> dict:
    """Run a quantizer's round trip over each tensor in turn and record what it did (lesson 08).

    ``roundtrip(x)`` returns ``(x_scaled, back)``: ``x`` times its scale(s) before the clamp and
    cast, and the dequantized result. Returns lists, one entry per tensor: ``amax``, the fraction
    of elements that ``saturated`` (``|x_scaled|`` beyond the format's max), the fraction of
    non-zero elements ``flushed`` to zero, and ``rel_error`` = ||back - x|| / ||x||.
    """
    top = fp8_max(fmt)
    log: dict[str, list[float]] = {"amax": [], "saturated": [], "flushed": [], "rel_error": []}
    for x in tensors:
        scaled, back = roundtrip(x)
        xf = x.float()
        back = back.float()
        nonzero = xf != 0
        log["amax"].append(float(xf.abs().max()))
        log["saturated"].append(float((scaled.float().abs() > top).float().mean()))
        log["flushed"].append(float(((back == 0) & nonzero).sum()) / max(1, int(nonzero.sum())))
        log["rel_error"].append(float((back - xf).norm() / xf.norm().clamp_min(1e-30)))
    return log


def replay_scaling(
    quantize: Callable[[torch.Tensor], tuple[torch.Tensor, float]],
    dequantize: Callable[[torch.Tensor, float], torch.Tensor],
    tensors: Sequence[torch.Tensor],
    fmt: torch.dtype,
) -> dict[str, list[float]]:
    """Quantize each tensor in turn with a per-tensor scaler and record what happened (lesson 08).

    Returns lists (one entry per tensor) of the ``scale`` used, the tensor's ``amax``, the
    fraction of elements that ``saturated`` (|x * scale| beyond the format's max), the fraction
    ``flushed`` to zero and the relative round-trip error ``rel_error`` (see :func:`replay`).
    """
    scales: list[float] = []

    def roundtrip(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, scale = quantize(x)
        scales.append(float(scale))
        return x.float() * float(scale), dequantize(q, scale)

    log = replay(roundtrip, tensors, fmt)
    return {"scale": scales, **log}


# --------------------------------------------------------------------------------------------
# Real tensors of a trained model


def trained_tensors(
    device: torch.device | str = "cpu",
    steps: int = 100,
    record_last: int = 9,
    batch_size: int = 256,
    seed: int = 0,
) -> list[dict[str, torch.Tensor]]:
    """Weights, activations and gradients of an MLP trained on digits, over its last steps.

    Trains ``course.data.mlp()`` (64-256-256-10) with SGD on mini-batches of the digits data in
    float32 and, for each of the last ``record_last`` steps, records for every Linear layer
    ``fcN``: ``fcN.weight``, its input ``fcN.input`` (an activation), the gradient of the loss
    with respect to its output ``fcN.grad_output`` (what backward passes down) and
    ``fcN.weight.grad``. Returns one dict per recorded step, oldest first: a delayed scaler takes
    its history from the earlier steps and quantizes the last. Introduced in lesson 08.
    """
    from course.data import digits, mlp
    from course.device import one_cpu_thread

    if not 0 < record_last <= steps:
        raise ValueError(f"record_last must lie in 1..steps, got {record_last} of {steps}")
    torch.manual_seed(seed)
    x_all, y_all, _, _ = digits(device, seed=seed)
    model = mlp().to(device)
    linears = [m for m in model if isinstance(m, nn.Linear)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    gen = torch.Generator().manual_seed(seed)
    current: dict[str, torch.Tensor] = {}

    def recorder(name: str) -> Callable:
        def hook(_module: nn.Module, args: tuple, out: torch.Tensor) -> None:
            current[f"{name}.input"] = args[0].detach().clone()

            def save_grad(grad: torch.Tensor) -> None:
                current[f"{name}.grad_output"] = grad.detach().clone()

            out.register_hook(save_grad)

        return hook

    hooks = [lin.register_forward_hook(recorder(f"fc{i}")) for i, lin in enumerate(linears, 1)]
    records = []
    try:
        with one_cpu_thread(device):
            for step in range(steps):
                idx = torch.randperm(len(x_all), generator=gen)[:batch_size].to(x_all.device)
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x_all[idx]), y_all[idx])
                loss.backward()
                if step >= steps - record_last:
                    snap = {}
                    for i, layer in enumerate(linears, start=1):
                        snap[f"fc{i}.weight"] = layer.weight.detach().clone()
                        snap[f"fc{i}.input"] = current[f"fc{i}.input"]
                        snap[f"fc{i}.grad_output"] = current[f"fc{i}.grad_output"]
                        snap[f"fc{i}.weight.grad"] = layer.weight.grad.detach().clone()
                    records.append(snap)
                opt.step()
    finally:
        for h in hooks:
            h.remove()
    return records


def tensor_kind(name: str) -> str:
    """The kind of a :func:`trained_tensors` name: weight, activation or gradient (lesson 08)."""
    if name.endswith(".grad_output") or name.endswith(".grad"):
        return "gradient"
    return "activation" if name.endswith(".input") else "weight"


# --------------------------------------------------------------------------------------------
# Float8 on the GPU


def float8_matmul_support(device: torch.device | str | DeviceProfile) -> tuple[bool, str]:
    """Whether ``device`` has float8 tensor cores (CUDA compute capability 8.9+), and why not.

    Returns ``(supported, reason)``; ``reason`` is printed where the lesson skips a GPU part.
    Decided by :func:`course.device.float8_gemm` from the device's profile: a ROCm GPU counts
    as unsupported (the lesson's float8 timing is written for NVIDIA's), though the reason names
    the formats its matrix cores take (MI300: e4m3fnuz, e5m2fnuz). Introduced in lesson 08.
    """
    profile = device if isinstance(device, DeviceProfile) else DeviceProfile.of(device)
    return float8_gemm(profile)


def scaled_mm_status(device: torch.device | str) -> tuple[bool, str]:
    """Whether this torch build runs ``torch.nn.functional.scaled_mm`` on ``device``, and why not.

    Tries one small tensor-wise e4m3fn product there (16 x 16, float32 output). Returns
    ``(True, "")``, or ``(False, reason)`` with the error's type and first sentence, which the
    lesson prints where it skips what needs the kernel: lesson 08's 2-rank experiment runs its
    ranks on the CPU, and a torch build without a CPU kernel behind ``scaled_mm`` (or without
    ``scaled_mm``) cannot run it. Introduced in lesson 08.
    """
    device = torch.device(device)
    try:
        a8 = torch.ones(16, 16, device=device).to(torch.float8_e4m3fn)
        one = torch.ones((), device=device)
        F.scaled_mm(
            a8,
            a8.t(),
            one,
            F.ScalingType.TensorWise,
            one,
            F.ScalingType.TensorWise,
            output_dtype=torch.float32,
        )
    except (AttributeError, NotImplementedError, RuntimeError, ValueError) as exc:
        return False, first_sentence(exc)
    return True, ""


def first_sentence(exc: BaseException) -> str:
    """The error's type and the first sentence of its message: what lesson 08 prints where a
    torch refuses an op (torch's "Could not run ... from the 'CPU' backend" message runs to about
    50 lines, naming every backend it has a kernel for)."""
    text = str(exc).strip()
    first = text.splitlines()[0].split(". ")[0] if text else ""
    if first and not first.endswith("."):
        first += "."
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def matmul_tflops(
    sizes: Sequence[int],
    device: torch.device | str,
    fmt: torch.dtype = torch.float8_e4m3fn,
    min_run_time: float = 0.2,
) -> list[dict[str, float | None]]:
    """Time an ``n x n x n`` bfloat16 matmul and a float8 ``F.scaled_mm`` (lesson 08).

    For each ``n``: ``a @ b`` in bfloat16, and ``torch.nn.functional.scaled_mm(a8, b8, one,
    ScalingType.TensorWise, one, ScalingType.TensorWise, output_dtype=torch.bfloat16,
    use_fast_accum=...)`` on float8 operands (``a8`` row-major, ``b8`` column-major, as the CUDA
    kernel requires; tensor-wise float32 scales), once with ``use_fast_accum=False`` (its
    default, ``fp8``) and once with ``True`` (``fp8_fast``: the tensor cores' faster, less precise
    accumulation, which torchao's float8 training asks for in the forward GEMM; it makes a
    difference on Hopper). Timed with ``torch.utils.benchmark`` (``blocked_autorange``
    synchronizes CUDA). Returns rows with ``n``, the median seconds and TFLOP/s (2 n^3 FLOPs) of
    each; ``fp8_fast_s`` and ``fp8_fast_tflops`` are None where the kernel refuses the flag.
    Meaningful only on a GPU with float8 tensor cores; on a CPU it runs (torch 2.13 has CPU
    kernels for it), but its times say nothing about float8 hardware.
    """
    from torch.utils.benchmark import Timer

    device = torch.device(device)
    rows = []
    for n in sizes:
        # The values do not change the time; the operands only need to be in e4m3fn's range.
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        a8 = a.to(fmt)
        b8 = b.to(fmt).t()  # the transpose of a row-major tensor is column-major
        one = torch.ones((), device=device, dtype=torch.float32)
        env = {"F": F, "torch": torch, "a": a, "b": b, "a8": a8, "b8": b8, "one": one}
        bf16 = Timer("a @ b", globals=env).blocked_autorange(min_run_time=min_run_time)
        fp8 = {}
        for fast in (False, True):
            stmt = (
                "F.scaled_mm(a8, b8, one, F.ScalingType.TensorWise, one, F.ScalingType.TensorWise,"
                f" output_dtype=torch.bfloat16, use_fast_accum={fast})"
            )
            try:
                fp8[fast] = (
                    Timer(stmt, globals=env).blocked_autorange(min_run_time=min_run_time).median
                )
            except (NotImplementedError, RuntimeError, ValueError):
                if not fast:
                    raise
                fp8[fast] = None
        flops = 2.0 * n**3
        rows.append(
            {
                "n": n,
                "bf16_s": bf16.median,
                "fp8_s": fp8[False],
                "fp8_fast_s": fp8[True],
                "bf16_tflops": flops / bf16.median / 1e12,
                "fp8_tflops": flops / fp8[False] / 1e12,
                "fp8_fast_tflops": None if fp8[True] is None else flops / fp8[True] / 1e12,
            }
        )
    return rows


def scaled_mm_kernels(device: torch.device | str) -> tuple[bool, str]:
    """Whether ``torch._scaled_mm`` (what torchao's ``Float8Linear`` calls) and
    ``F.scaled_mm`` run the same kernel for two e4m3fn operands with tensor-wise scales on
    ``device``, and a sentence saying which (lesson 08).

    On a CPU, torch's ``_scaled_mm`` kernel hands the product to oneDNN when oneDNN is enabled
    (``torch.backends.mkldnn.enabled``) and the CPU has AMX-INT8
    (``torch.cpu.get_capabilities()["amx_int8"]``, the check its C++ makes with cpuinfo);
    otherwise it dequantizes both operands to float32, multiplies them in float32 and rounds the
    result once to the output dtype. ``F.scaled_mm`` (``_scaled_mm_v2``) always takes that
    float32 path on a CPU, where ``use_fast_accum`` changes nothing. On a GPU both run the
    device's float8 GEMM, but with different ``use_fast_accum`` (torchao sets it for the forward
    GEMM, ``F.scaled_mm`` does not), which changes the accumulation on Hopper: not the same.
    """
    device = torch.device(device)
    if device.type != "cpu":
        return False, (
            f"on {device.type} both run the GPU's float8 GEMM, but torchao asks for "
            "use_fast_accum=True in the forward GEMM and F.scaled_mm's default is False: on "
            "Hopper that accumulates in lower precision, so the two can differ"
        )
    onednn = (
        torch.backends.mkldnn.is_available()
        and torch.backends.mkldnn.enabled
        and bool(torch.cpu.get_capabilities().get("amx_int8", False))
    )
    if onednn:
        return False, (
            "this CPU has AMX-INT8, so torch._scaled_mm runs oneDNN's float8 GEMM while "
            "F.scaled_mm dequantizes to float32 and multiplies there: two kernels whose float32 "
            "sums round differently"
        )
    return True, (
        "this CPU has no AMX-INT8 (or oneDNN is off), so both dequantize to float32, multiply "
        "there and round once: the same kernel (use_fast_accum changes nothing on a CPU)"
    )


class TransformerBlock(nn.Module):
    """A pre-norm transformer block: causal self-attention and a 4x MLP (lesson 08).

    Every matrix multiply is an ``nn.Linear`` (``qkv``, ``proj``, ``up``, ``down``), which is what
    torchao's ``convert_to_float8_training`` swaps for its float8 linear.
    """

    def __init__(self, dim: int = 256, heads: int = 4) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not a multiple of heads {heads}")
        self.heads = heads
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` of shape (batch, sequence, dim) to the same shape."""
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class _TorchaoImportNoise(logging.Filter):
    """Drops two log records torchao 0.18 leaves on a CPU build of torch, and nothing else.

    torchao's import logs a warning for each of its CUDA extensions that a CPU build of torch
    cannot load (logger ``torchao``), and torch's pytree logs that registering an enum (torchao's
    ``KernelPreference``, ``ScaleCalculationMode``) is deprecated (``torch.utils._pytree``).
    Neither is a Python warning, and neither changes what lesson 08 computes.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        """False for those two records (torchao's own objects only), True for everything else."""
        text = str(record.msg)
        if record.name == "torchao" and text.startswith("Failed to load"):
            return torch.version.cuda is not None or not text.rstrip().split(":")[0].endswith(".so")
        if record.name == "torch.utils._pytree" and "is an Enum subclass" in text:
            cls = record.args[0] if isinstance(record.args, tuple) and record.args else None
            return not str(getattr(cls, "__module__", "")).startswith("torchao")
        return True


_TORCHAO_NOISE = _TorchaoImportNoise()


def torchao_status() -> tuple[object | None, str]:
    """torchao's module if it is installed beside this torch, else None; and a line saying so.

    The course installs torchao (pinned, beside the pinned torch); an environment without it, or
    with a build that does not import, still runs lesson 08, which says what it left out.
    Introduced in lesson 08.
    """
    if importlib.util.find_spec("torchao") is None:
        return None, (
            f"torchao is not installed beside torch {torch.__version__} (the course pins "
            "torchao==0.18.0: `pip install --no-deps torchao==0.18.0` adds it without touching "
            "torch)"
        )
    for name in ("torchao", "torch.utils._pytree"):
        if _TORCHAO_NOISE not in logging.getLogger(name).filters:
            logging.getLogger(name).addFilter(_TORCHAO_NOISE)
    try:
        torchao = importlib.import_module("torchao")
        importlib.import_module("torchao.float8")
    except Exception as exc:  # an incompatible build fails in many ways; say which
        return None, f"torchao is installed but does not import here: {type(exc).__name__}: {exc}"
    return torchao, f"torchao {torchao.__version__} beside torch {torch.__version__}"


# --------------------------------------------------------------------------------------------
# The widget


class Float8Explorer:
    """Lesson 08's widget: recipe, format and margin controls over a live tensor stream.

    ``recipes`` maps a recipe's name to a factory ``make(fmt, margin) -> roundtrip``, built in the
    notebook from the student's quantizers (a factory that raises ``NotImplementedError`` shows
    "not written yet"). Each redraw regenerates the stream on ``device``, quantizes every tensor
    in turn there (as rows of ``row`` elements, so that row-wise recipes have rows), and plots the
    relative error and the saturated fraction per step, with the measured time per tensor.
    """

    def __init__(
        self,
        recipes: dict[str, Callable[[torch.dtype, int], RoundTrip]],
        device: torch.device | str = "cpu",
        steps: int = 60,
        numel: int = 4096,
        row: int = 128,
    ) -> None:
        if not recipes:
            raise ValueError("Float8Explorer needs at least one recipe")
        self.recipes = recipes
        self.device = torch.device(device)
        if numel % row:
            raise ValueError(f"numel {numel} is not a multiple of row {row}")
        self.steps, self.numel, self.row = steps, numel, row
        self.recipe = W.Dropdown(options=list(recipes), description="recipe")
        self.fmt = W.Dropdown(
            options=[(str(f).removeprefix("torch."), f) for f in FP8_FORMATS], description="format"
        )
        self.margin = W.IntSlider(
            value=0, min=0, max=4, description="margin", continuous_update=False
        )
        self.spike = W.IntSlider(
            value=40, min=1, max=steps - 1, description="spike at", continuous_update=False
        )
        self.stats = W.HTML()
        self.output = W.Output()
        self.figure, self.axes = new_figure(10, 3.2, ncols=2)
        self.log: dict | None = None
        for control in (self.recipe, self.fmt, self.margin, self.spike):
            control.observe(lambda _change: self.update(), names="value")
        self.widget = W.VBox(
            [
                W.HBox([self.recipe, self.fmt]),
                W.HBox([self.margin, self.spike]),
                self.stats,
                self.output,
            ]
        )
        self.update()

    def update(self) -> dict | None:
        """Replay the stream with the current controls, redraw, and return the replay's log."""
        fmt, margin = self.fmt.value, self.margin.value
        stream = [
            t.to(self.device).reshape(-1, self.row)
            for t in drifting_tensors(self.steps, self.numel, spike_at=self.spike.value)
        ]
        try:
            roundtrip = self.recipes[self.recipe.value](fmt, margin)
            start = time.perf_counter()
            log = replay(roundtrip, stream, fmt)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            per_tensor = (time.perf_counter() - start) / len(stream)
        except NotImplementedError:
            self.log = None
            self.stats.value = f"<b>{self.recipe.value}</b>: write its exercise above to see it."
            return None
        self.log = log
        spike = self.spike.value
        self.stats.value = (
            f"<b>{self.recipe.value}</b>, {str(fmt).removeprefix('torch.')}, margin {margin}: "
            f"median relative error {sorted(log['rel_error'])[len(stream) // 2]:.4f}; at the spike "
            f"(step {spike}) error {log['rel_error'][spike]:.4f}, saturated "
            f"{log['saturated'][spike]:.2%}; {per_tensor * 1e3:.2f} ms per {self.numel}-element "
            f"tensor (quantize, record and dequantize) on {self.device}"
        )
        ax_err, ax_sat = self.axes
        for ax in self.axes:
            ax.clear()
        ax_err.semilogy(log["rel_error"])
        ax_err.set_title("relative round-trip error")
        ax_err.set_ylabel("||dequantized - x|| / ||x||")
        ax_sat.plot(log["saturated"])
        ax_sat.set_title("fraction saturated")
        ax_sat.set_ylabel("fraction of elements beyond the max")
        for ax in self.axes:
            ax.set_xlabel("step")
            ax.axvline(spike, color="grey", lw=0.5)
        self.output.clear_output(wait=True)
        with self.output:
            display(self.figure)
        return log

    def _ipython_display_(self) -> None:
        display(self.widget)
