"""Step time, throughput and peak memory of one training step in each precision mode (lesson 09).

Run it as a script to measure the machine you are on::

    python -m course.benchmark --model gpt --gpt-size cpu --batch-size 16
    python -m course.benchmark --model gpt --gpt-size gpu --batch-size 32 --compile both
    python -m course.benchmark                       # MLP, widths 1020 and 1024, batch 256
    python -m course.benchmark --model cnn --modes fp32 bf16-amp bf16-amp+cl --sizes 32
    python -m course.benchmark --help

Modes: ``fp32`` (plain float32, TF32 off), ``tf32`` (float32 tensors, matrix multiplies and
convolutions in the TF32 math mode: CUDA only), ``fp16-amp`` (float16 autocast with a GradScaler),
``bf16-amp`` (bfloat16 autocast). A ``+cl`` suffix (``--model cnn`` only) runs the same mode with
channels-last memory format; a ``+compile`` suffix runs the model under ``torch.compile`` (the
first, compiling step is timed on its own and reported apart from the step time). The ``gpt`` model
(:mod:`course.gpt`) trains on real text with AdamW and reports tokens/s and MFU: FLOPs per step
(counted by ``torch.utils.flop_counter.FlopCounterMode`` on the meta device, or by a function you
pass) over the step time, against the datasheet peak of known GPUs and against a peak measured on
the spot with a large matmul in the mode's dtype. Every mode trains the same model from the same
initial weights (SGD for the mlp and cnn, AdamW for the gpt); all modes of a size are measured side
by side in one run, interleaved round by round, so their ratios are comparable. Step time comes
from ``torch.utils.benchmark.Timer``'s ``blocked_autorange`` (the fastest of the rounds); peak
memory from ``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats``, less
what was allocated before the mode's model was built (CUDA only: on the CPU it is not measured).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils import benchmark as tbench
from torch.utils.flop_counter import FlopCounterMode

from course.data import mlp
from course.device import (  # the datasheet tables live with the device profiles
    DATASHEET_TFLOPS,  # noqa: F401 - re-exported
    NO_DATASHEET,
    REPORTED_NAMES,  # noqa: F401 - re-exported
    DeviceProfile,
    compile_offered,
    cpu_has_amx,
    describe_device,
    pick_device,
    tf32_offered,
)
from course.gpt import CONFIGS, GPT, GPTConfig, build_gpt, lm_loss, random_batches, stdlib_corpus

#: The precision modes, in the order tables show them.
BASE_MODES: tuple[str, ...] = ("fp32", "tf32", "fp16-amp", "bf16-amp")
#: Suffix that adds channels-last memory format to a mode (convolutional model only).
CHANNELS_LAST = "+cl"
#: Suffix that runs a mode's model under ``torch.compile``.
COMPILED = "+compile"
MODELS: tuple[str, ...] = ("mlp", "cnn", "gpt")
#: Classes the benchmark models predict.
NUM_CLASSES = 10

TF32_NOTE = (
    "TF32 is a CUDA math mode, not a dtype (torch.set_float32_matmul_precision('high'), "
    "torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32): "
    "the course measures this mode on NVIDIA GPUs with compute capability 8.0 or newer only "
    "(on a CPU, lesson 09 measures what the setting changes in one matmul)"
)
#: Measurements whose median round is this much slower than their fastest are flagged as noisy.
NOISY_SPREAD = 1.5
CPU_MEMORY_NOTE = (
    "peak memory is measured only on CUDA (torch.cuda.max_memory_allocated); "
    "the CPU allocator keeps no such counter, so it is not measured here"
)


#: /proc/cpuinfo flags of CPU instructions that compute in 16-bit floats natively.
CPU_HALF_FLAGS: tuple[str, ...] = ("amx_bf16", "avx512_bf16", "amx_fp16", "avx512_fp16")


def cpu_half_precision_flags() -> dict[str, bool]:
    """Which of :data:`CPU_HALF_FLAGS` this CPU reports (all False where /proc/cpuinfo is
    missing) (lesson 09). AMX tiles (recent Xeons) and AVX-512 BF16 dot products (e.g. AMD Zen 4)
    both let bfloat16 autocast run faster than float32 on a CPU."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            flags = set(fh.read().split())
    except OSError:
        flags = set()
    return {flag: flag in flags for flag in CPU_HALF_FLAGS}


def describe_cpu_half_precision() -> str:
    """One line naming the CPU's 16-bit float instructions, present and absent (lesson 09)."""
    found = cpu_half_precision_flags()
    present = [f for f, ok in found.items() if ok]
    absent = [f for f, ok in found.items() if not ok]
    return (
        f"CPU 16-bit float instructions (/proc/cpuinfo): present: {', '.join(present) or 'none'}; "
        f"absent: {', '.join(absent) or 'none'}"
    )


def cpu_precision_implication() -> str:
    """What this CPU's 16-bit instructions mean for autocast's speed on it (lesson 09)."""
    found = cpu_half_precision_flags()
    if found["amx_bf16"] or found["avx512_bf16"]:
        bf16 = (
            "bfloat16 matmuls run natively (AMX tiles or AVX-512 BF16 dot products), so bf16 "
            "autocast can keep up with or beat fp32 once matmuls dominate"
        )
    else:
        bf16 = (
            "no native bfloat16 arithmetic: bfloat16 is converted to and from float32 around "
            "float32 arithmetic, so expect bf16 autocast to be slower than fp32"
        )
    if found["amx_fp16"] or found["avx512_fp16"]:
        fp16 = "float16 matmuls run natively"
    else:
        fp16 = "no native float16 arithmetic: expect fp16 autocast to be far slower than fp32"
    return f"{bf16}; {fp16}"


@dataclass(frozen=True)
class Mode:
    """One precision configuration of a training step (lesson 09)."""

    name: str
    amp_dtype: torch.dtype | None
    tf32: bool
    channels_last: bool
    compiled: bool = False

    @property
    def base(self) -> str:
        """The precision without suffixes: ``fp32``, ``tf32``, ``fp16-amp`` or ``bf16-amp``."""
        return self.name.split("+")[0]

    @property
    def uses_scaler(self) -> bool:
        """float16 autocast needs a GradScaler; bfloat16 and float32 do not."""
        return self.amp_dtype == torch.float16


def parse_mode(name: str) -> Mode:
    """The :class:`Mode` called ``name`` (e.g. ``"bf16-amp"``, ``"fp16-amp+cl"``,
    ``"bf16-amp+compile"``) (lesson 09)."""
    base, *suffixes = name.split("+")
    suffixes = ["+" + x for x in suffixes]
    if (
        base not in BASE_MODES
        or any(x not in (CHANNELS_LAST, COMPILED) for x in suffixes)
        or len(set(suffixes)) != len(suffixes)
    ):
        raise ValueError(
            f"unknown mode {name!r}: choose from {', '.join(BASE_MODES)}, optionally with "
            f"{CHANNELS_LAST!r} (channels-last, cnn model only) and/or {COMPILED!r}"
        )
    dtype = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}.get(base)
    return Mode(
        name=name,
        amp_dtype=dtype,
        tf32=base == "tf32",
        channels_last=CHANNELS_LAST in suffixes,
        compiled=COMPILED in suffixes,
    )


def unsupported_reason(
    mode: str | Mode, device: torch.device | str | DeviceProfile, model: str = "mlp"
) -> str:
    """Why ``mode`` cannot be measured on ``device`` for ``model``; ``""`` if it can (lesson 09)."""
    m = parse_mode(mode) if isinstance(mode, str) else mode
    profile = device if isinstance(device, DeviceProfile) else DeviceProfile.of(device)
    if m.channels_last and model != "cnn":
        return "channels-last only changes 4-D (image) tensors: use the cnn model"
    if m.tf32 and not tf32_offered(profile):
        if profile.kind != "cuda":
            return f"not measured on {profile.kind.upper()}: {TF32_NOTE}"
        return f"this GPU has no TF32 tensor cores: {TF32_NOTE}"
    if m.amp_dtype == torch.bfloat16 and profile.kind in ("cuda", "rocm"):
        if not profile.native_bf16:
            return (
                "this GPU has no bfloat16 tensor cores (NVIDIA's start at compute capability "
                "8.0): bfloat16 would only be emulated"
            )
    if m.compiled and profile.kind in ("cuda", "rocm", "mps", "xpu"):
        ok, why = compile_offered(profile)
        if not ok:
            return why
    return ""


class SmallConvNet(nn.Module):
    """Three 3x3 convolutions, global average pooling and a linear classifier (lesson 09)."""

    def __init__(self, channels: int = 32) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.head = nn.Linear(channels, NUM_CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_model(model: str, size: int, config: GPTConfig | str = "cpu") -> nn.Module:
    """The benchmark's model: ``mlp`` (3 layers of width ``size``), ``cnn`` (``size``
    channels) or ``gpt`` (:class:`course.gpt.GPT` of ``config``; ``size`` unused) (lesson 09)."""
    if model == "mlp":
        return mlp((size, size, size, NUM_CLASSES))
    if model == "cnn":
        return SmallConvNet(size)
    if model == "gpt":
        return build_gpt(config)
    raise ValueError(f"unknown model {model!r}: choose from {MODELS}")


@functools.lru_cache(maxsize=1)
def _text() -> torch.Tensor:
    """Real text for the gpt's batches: 1 MB of the standard library's source, read once."""
    return stdlib_corpus(max_bytes=1_000_000)[0]


def gpt_config(config: GPTConfig | str) -> GPTConfig:
    """``config`` itself, or the named size in :data:`course.gpt.CONFIGS` (lesson 09)."""
    return CONFIGS[config] if isinstance(config, str) else config


def make_batch(
    model: str,
    size: int,
    batch_size: int,
    device: torch.device,
    image_size: int = 32,
    seed: int = 0,
    config: GPTConfig | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and labels for one step of ``model`` (lesson 09): random for the mlp and cnn,
    windows of real text (the standard library's source) for the gpt."""
    if model == "gpt":
        block = gpt_config(config).block_size
        return next(random_batches(_text(), batch_size, block, seed, device))
    gen = torch.Generator().manual_seed(seed)
    if model == "mlp":
        x = torch.randn(batch_size, size, generator=gen)
    else:
        x = torch.randn(batch_size, 3, image_size, image_size, generator=gen)
    y = torch.randint(0, NUM_CLASSES, (batch_size,), generator=gen)
    return x.to(device), y.to(device)


@contextlib.contextmanager
def math_mode(tf32: bool) -> Iterator[None]:
    """Float32 matmuls and convolutions in TF32 (``tf32=True``) or in full float32, restoring the
    previous settings afterwards (lesson 09). CUDA reads them, and on a CPU oneDNN's matmul
    precision follows ``set_float32_matmul_precision`` too (torch 2.13: ``"high"`` sets
    ``torch.backends.mkldnn.matmul.fp32_precision`` to ``"tf32"``); what that changes on a CPU
    is measured by :func:`float32_precision_effect`."""
    old_precision = torch.get_float32_matmul_precision()
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old_precision)
        torch.backends.cudnn.allow_tf32 = old_cudnn


@dataclass(frozen=True)
class PrecisionEffect:
    """What ``set_float32_matmul_precision("high")`` changed for one float32 matmul here."""

    device: str
    size: int
    onednn_setting: str
    max_relative_difference: float
    speedup: float

    @property
    def identical(self) -> bool:
        return self.max_relative_difference == 0.0

    def sentence(self) -> str:
        """What was measured, in words (lesson 09 prints it)."""
        setting = (
            f"set_float32_matmul_precision('high') sets oneDNN's float32 matmul precision to "
            f"{self.onednn_setting!r} (torch.backends.mkldnn.matmul.fp32_precision)"
        )
        shape = f"a {self.size}x{self.size} float32 matmul on the {self.device}"
        if self.identical:
            return (
                f"{setting}; {shape} gave the same bits as under 'highest', at "
                f"{self.speedup:.2f}x its speed: on this CPU the setting changes nothing this "
                "matmul shows, so the benchmark's tf32 mode would be its fp32 mode again"
            )
        return (
            f"{setting}; {shape} moved by up to {self.max_relative_difference:.1e} of its largest "
            f"value against 'highest' and ran at {self.speedup:.2f}x its speed: on this CPU the "
            "setting lowers the matmul's internal precision"
        )


def float32_precision_effect(size: int = 512, device: str = "cpu") -> PrecisionEffect:
    """Measure one ``size`` x ``size`` float32 matmul under ``"highest"`` and ``"high"``:
    the largest difference (relative to the largest entry) and the speed ratio, each timed with
    ``torch.utils.benchmark`` (lesson 09: whether TF32 means anything on this device)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(device)
    b = torch.randn(size, size, generator=gen).to(device)
    results: dict[bool, torch.Tensor] = {}
    times: dict[bool, float] = {False: float("inf"), True: float("inf")}
    for _ in range(3):  # interleaved rounds, the fastest of each kept
        for tf32 in (False, True):
            with math_mode(tf32):
                if tf32:
                    setting = torch.backends.mkldnn.matmul.fp32_precision
                results[tf32] = a @ b
                timer = tbench.Timer("a @ b", globals={"a": a, "b": b})
                times[tf32] = min(times[tf32], timer.blocked_autorange(min_run_time=0.1).median)
    exact = results[False].abs().max()
    diff = (results[True] - results[False]).abs().max() / exact
    return PrecisionEffect(device, size, setting, float(diff), times[False] / times[True])


@dataclass
class StepSetup:
    """A model, optimizer, scaler and batch ready to take training steps in one mode."""

    mode: Mode
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    x: torch.Tensor
    y: torch.Tensor
    device_type: str
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None
    lm: bool = False

    def step(self) -> None:
        """One training step: forward (under autocast if the mode says so), backward, update."""
        m = self.mode
        forward = self.model if self.forward is None else self.forward
        with torch.autocast(
            self.device_type, dtype=m.amp_dtype or torch.bfloat16, enabled=m.amp_dtype is not None
        ):
            out = forward(self.x)
            loss = lm_loss(out, self.y) if self.lm else F.cross_entropy(out, self.y)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()


def make_setup(
    mode: Mode,
    model: str,
    size: int,
    batch_size: int,
    device: torch.device,
    image_size: int = 32,
    seed: int = 0,
    config: GPTConfig | str = "cpu",
) -> StepSetup:
    """A fresh :class:`StepSetup`; every mode starts from the same weights (lesson 09)."""
    torch.manual_seed(seed)
    net = build_model(model, size, config).to(device)
    x, y = make_batch(model, size, batch_size, device, image_size, seed, config)
    if mode.channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    if model == "gpt":
        opt: torch.optim.Optimizer = torch.optim.AdamW(net.parameters(), lr=1e-4)
    else:
        opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=mode.uses_scaler)
    forward = torch.compile(net) if mode.compiled else None
    return StepSetup(mode, net, opt, scaler, x, y, device.type, forward, lm=model == "gpt")


def device_sync(device: torch.device | str) -> Callable[[], None]:
    """What waits for ``device``'s queued work inside a timed statement (lesson 09):
    ``torch.mps.synchronize`` on MPS, nothing elsewhere (``torch.utils.benchmark`` synchronizes
    CUDA itself, and the CPU runs eagerly)."""
    if torch.device(device).type == "mps":
        return torch.mps.synchronize
    return _no_wait


def _no_wait() -> None:
    return None


def peak_dtype(mode: Mode) -> str:
    """The arithmetic a mode's matmuls run in: ``fp32``, ``tf32``, ``fp16`` or ``bf16``."""
    return {"fp32": "fp32", "tf32": "tf32", "fp16-amp": "fp16", "bf16-amp": "bf16"}[mode.base]


def datasheet_peak(device: torch.device | str | DeviceProfile, dtype: str) -> float | None:
    """The datasheet's dense peak FLOP/s of ``device`` for ``dtype`` (``fp32``, ``tf32``,
    ``fp16``, ``bf16``, ``fp8``), or None (lesson 09): for a CPU, and for any GPU whose whole
    reported name is not one of :data:`course.device.REPORTED_NAMES` (an L40S is not an L4; NVL
    boards and MIG slices run at other clocks)."""
    profile = device if isinstance(device, DeviceProfile) else DeviceProfile.of(device)
    return profile.peak_flops(dtype)


def measure_peak(
    device: torch.device | str, dtype: str, sizes: Sequence[int] | None = None
) -> float:
    """The best FLOP/s of square ``n`` x ``n`` matmuls in ``dtype`` on ``device`` over ``sizes``,
    each timed with ``torch.utils.benchmark`` (lesson 09): what the device does on the simplest
    large work. ``sizes`` defaults to 4096 and 8192 on a GPU; 256 to 1024 (fp32) or 128 to 512
    (16-bit, which can be very slow on a CPU without native instructions) on a CPU."""
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    if sizes is None:
        sizes = (4096, 8192) if on_gpu else (256, 1024) if dtype in ("fp32", "tf32") else (128, 512)
    torch_dtype = {"fp32": torch.float32, "tf32": torch.float32}.get(
        dtype, torch.float16 if dtype == "fp16" else torch.bfloat16
    )
    best = 0.0
    gen = torch.Generator().manual_seed(0)
    for n in sizes:
        a = torch.randn(n, n, generator=gen).to(device, torch_dtype)
        b = torch.randn(n, n, generator=gen).to(device, torch_dtype)
        with math_mode(dtype == "tf32"):
            timer = tbench.Timer(
                "a @ b; sync()",
                globals={"a": a, "b": b, "sync": device_sync(device)},
                num_threads=torch.get_num_threads(),
            )
            seconds = timer.blocked_autorange(min_run_time=0.2 if on_gpu else 0.05).median
        best = max(best, 2 * n**3 / seconds)
    return best


def count_gpt_flops(config: GPTConfig, batch_size: int) -> int:
    """FLOPs of one training step (forward and backward) of :class:`course.gpt.GPT` on
    ``batch_size`` sequences of ``config.block_size`` tokens, counted by ``FlopCounterMode``
    (2 FLOPs per multiply-add) on a copy of the model on the ``meta`` device (lesson 09).

    On ``meta`` nothing is computed or allocated, so even the GPU size counts in a moment, and
    attention takes the math path (matmuls for the scores and the values, over the full
    context, backward 2x forward); a real CPU or GPU kernel would be counted differently or,
    on the CPU, not at all.
    """
    with torch.device("meta"):
        model = GPT(config)
        idx = torch.zeros(batch_size, config.block_size, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        lm_loss(model(idx), idx).backward()
    return int(counter.get_total_flops())


@dataclass
class Result:
    """One row of the benchmark table (lesson 09). Times in seconds, memory in bytes, FLOPs per
    step; ``unit`` is what ``throughput`` counts (samples, or tokens for the gpt)."""

    mode: str
    model: str
    size: int
    batch_size: int
    device: str
    step_time: float | None = None
    peak_memory: int | None = None
    speedup: float | None = None
    memory_saving: float | None = None
    note: str = ""
    times: tuple[float, ...] = ()
    items_per_step: int | None = None
    unit: str = "samples"
    compile_time: float | None = None
    speedup_tf32: float | None = None
    flops: int | None = None
    peak_datasheet: float | None = None
    peak_measured: float | None = None

    @property
    def throughput(self) -> float | None:
        """Training samples (or tokens) per second."""
        items = self.items_per_step or self.batch_size
        return items / self.step_time if self.step_time else None

    @property
    def measured(self) -> bool:
        return self.step_time is not None

    @property
    def achieved(self) -> float | None:
        """FLOP/s achieved: FLOPs per step over the step time."""
        return self.flops / self.step_time if self.flops and self.step_time else None

    @property
    def mfu_datasheet(self) -> float | None:
        """Model FLOPs utilisation against the datasheet peak for the mode's dtype."""
        a = self.achieved
        return a / self.peak_datasheet if a and self.peak_datasheet else None

    @property
    def mfu_measured(self) -> float | None:
        """Model FLOPs utilisation against the matmul peak measured in this run."""
        a = self.achieved
        return a / self.peak_measured if a and self.peak_measured else None


def _peak_memory(setup: StepSetup, device: torch.device, baseline: int, steps: int = 2) -> int:
    """Peak bytes allocated on ``device`` above ``baseline`` (what was allocated before the
    setup was built) while ``setup`` takes ``steps`` steps (CUDA only)."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    for _ in range(steps):
        setup.step()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - baseline


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(setup: StepSetup, device: torch.device) -> float:
    """Seconds one step takes, synchronised before and after (used for the compiling step)."""
    _sync(device)
    start = time.perf_counter()
    setup.step()
    _sync(device)
    return time.perf_counter() - start


@dataclass(frozen=True)
class _Work:
    """What every mode of one table block trains: the model, its size and the batch."""

    model: str
    size: int
    batch_size: int
    device: torch.device
    image_size: int = 32
    config: GPTConfig | str = "cpu"

    def setup(self, mode: Mode) -> StepSetup:
        return make_setup(
            mode, self.model, self.size, self.batch_size, self.device, self.image_size,
            config=self.config,
        )  # fmt: skip


def _warm_up(mode: Mode, work: _Work) -> float:
    """One step of a freshly built (mode, size), so that its one-time allocations (and, for a
    compiled mode, the compilation) are made; returns how long that step took."""
    setup = work.setup(mode)
    with math_mode(mode.tf32):
        return _timed_step(setup, work.device)


def _measure(
    mode: Mode, work: _Work, warmup: int, min_run_time: float, memory: bool
) -> tuple[float, int | None]:
    """Median step time of one freshly built (mode, size), and its peak memory if ``memory``.

    A function of its own so that nothing of the setup (the timer holds its ``step``) is alive
    when the next one is built: the next mode's peak memory must not include this one's model.
    """
    device = work.device
    _free(device)
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    setup = work.setup(mode)
    peak = None
    with math_mode(mode.tf32):
        for _ in range(warmup):
            setup.step()
        if memory:
            peak = _peak_memory(setup, device, baseline)
        timer = tbench.Timer(
            stmt="step(); sync()",
            globals={"step": setup.step, "sync": device_sync(device)},
            num_threads=torch.get_num_threads(),
            label=f"{work.model} {work.size}",
            description=mode.name,
        )
        median = timer.blocked_autorange(min_run_time=min_run_time).median
    return median, peak


def run_benchmark(
    modes: Sequence[str] = BASE_MODES,
    model: str = "mlp",
    sizes: Sequence[int] = (1024,),
    batch_size: int = 256,
    repeats: int = 3,
    min_run_time: float = 0.2,
    device: torch.device | str | None = None,
    image_size: int = 32,
    warmup: int = 3,
    progress: Callable[[int, int, str], None] | None = None,
    config: GPTConfig | str = "cpu",
    flops_fn: Callable[[GPTConfig, int], int] | None = None,
    measure_peaks: bool = True,
) -> list[Result]:
    """Measure a training step in every mode, side by side, for each size (lesson 09).

    ``fp32`` is always measured (added if missing): speed-up and memory saving are relative to it
    (and, where ``tf32`` was measured, ``speedup_tf32`` to that). Each of ``repeats`` rounds builds
    every (size, mode) afresh and times it with
    ``torch.utils.benchmark.Timer.blocked_autorange(min_run_time=...)`` (the median of its blocks);
    a mode's step time is the fastest round, since a busy machine only ever adds time. Before the
    rounds every mode takes one step on a fresh model, timed on its own: for a ``+compile`` mode
    that step compiles, and its time is ``compile_time``. On CUDA the first round also records the
    peak memory of two steps, above what was allocated before the mode's model was built. Modes
    the device cannot run come back unmeasured with a ``note`` saying why.
    ``progress(done, total, label)`` is called after each measurement.

    For ``model="gpt"`` (``config`` a :class:`course.gpt.GPTConfig` or a name in
    :data:`course.gpt.CONFIGS`; ``sizes`` is then ignored) throughput counts tokens, and
    ``flops`` is ``flops_fn(config, tokens)`` if given, else :func:`count_gpt_flops`;
    with ``measure_peaks`` each dtype's matmul peak is measured once (:func:`measure_peak`).
    """
    if repeats < 1 or batch_size < 1 or not sizes:
        raise ValueError("need repeats >= 1, batch_size >= 1 and at least one size")
    dev = torch.device(device) if device is not None else pick_device()
    names = list(dict.fromkeys(["fp32", *modes]))
    parsed = [parse_mode(n) for n in names]
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: choose from {MODELS}")
    if model == "gpt":
        cfg = gpt_config(config)
        sizes = (cfg.d_model,)
    rows = {
        (size, m.name): Result(
            m.name, model, size, batch_size, str(dev), note=unsupported_reason(m, dev, model)
        )
        for size in sizes
        for m in parsed
    }
    runnable = [m for m in parsed if not unsupported_reason(m, dev, model)]
    works = {
        size: _Work(model, size, batch_size, dev, image_size, config if model == "gpt" else "cpu")
        for size in sizes
    }
    times: dict[tuple[int, str], list[float]] = {(s, m.name): [] for s in sizes for m in runnable}
    total, done = len(times) * repeats, 0
    # Every mode takes one step before anything is measured: a process's first cuBLAS/cuDNN
    # calls allocate workspaces that stay allocated, and they must sit in each mode's baseline
    # instead of in the first measured mode's peak; a compiled mode compiles in this step.
    first: dict[tuple[int, str], float] = {}
    for size in sizes:
        for m in runnable:
            if dev.type == "cuda" or m.compiled:
                first[(size, m.name)] = _warm_up(m, works[size])
    # Round after round, every (size, mode) once: a busy spell slows all of them alike.
    for round_ in range(repeats):
        for size in sizes:
            for m in runnable:
                memory = round_ == 0 and dev.type == "cuda"
                median, peak = _measure(m, works[size], warmup, min_run_time, memory)
                times[(size, m.name)].append(median)
                if memory:
                    rows[(size, m.name)].peak_memory = peak
                done += 1
                if progress is not None:
                    progress(done, total, f"{m.name} (size {size}, round {round_ + 1})")
    flops: dict[int, int | None] = {}
    if model == "gpt":
        tokens = batch_size * cfg.block_size
        if flops_fn is not None:
            flops[cfg.d_model] = int(flops_fn(cfg, tokens))
        else:
            flops[cfg.d_model] = count_gpt_flops(cfg, batch_size)
    peaks: dict[str, tuple[float | None, float | None]] = {}
    if model == "gpt":
        for m in runnable:
            key = peak_dtype(m)
            if key not in peaks:
                measured = measure_peak(dev, key) if measure_peaks else None
                peaks[key] = (datasheet_peak(dev, key), measured)
    results: list[Result] = []
    for size in sizes:
        base = rows[(size, "fp32")]
        for m in runnable:
            row = rows[(size, m.name)]
            row.times = tuple(times[(size, m.name)])
            row.step_time = min(row.times)
            if m.compiled:
                row.compile_time = first.get((size, m.name))
            if model == "gpt":
                row.items_per_step = batch_size * cfg.block_size
                row.unit = "tokens"
                row.flops = flops[size]
                row.peak_datasheet, row.peak_measured = peaks[peak_dtype(m)]
        tf32 = rows.get((size, "tf32"))
        for name in names:
            row = rows[(size, name)]
            if row.measured and base.measured:
                row.speedup = base.step_time / row.step_time
            if row.measured and tf32 is not None and tf32.measured:
                row.speedup_tf32 = tf32.step_time / row.step_time
            if row.peak_memory is not None and base.peak_memory:
                row.memory_saving = 1.0 - row.peak_memory / base.peak_memory
            if row.measured and dev.type != "cuda":
                row.note = "peak memory not measured on CPU"
            results.append(row)
    return results


def mfu_warnings(results: Sequence[Result]) -> list[str]:
    """A sentence for each MFU above 100%: more FLOP/s than the peak it is measured against
    cannot be, so the peak is wrong for this run (the measured peak's probe ran while the
    machine was busy, or the datasheet is not this device's). Said, never clamped (lesson 09)."""
    found = []
    for r in results:
        for share, peak, why in (
            (
                r.mfu_measured,
                "the matmul peak measured in this run",
                "the peak probe was disturbed (the machine was busy while it ran): rerun on a "
                "quiet machine",
            ),
            (r.mfu_datasheet, "the datasheet peak", "the datasheet entry is not this device's"),
        ):
            if share is not None and share > 1.0:
                found.append(
                    f"{r.mode}: MFU {share:.0%} is above {peak}, which no step can reach; {why}"
                )
    return found


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _fmt_rate(flops: float | None) -> str:
    return f"{flops / 1e12:.3g}" if flops else "-"


def _fmt_share(x: float | None) -> str:
    return f"{x:.1%}" if x is not None else "-"


def format_table(results: Sequence[Result], device_description: str = "") -> str:
    """The benchmark as a text table with notes on what was not measured (lesson 09).

    For the gpt the table adds the compiling step's time, TFLOP/s achieved and MFU against the
    datasheet and the measured matmul peak, and lists the peaks it used.
    """
    lm = any(r.unit == "tokens" for r in results)
    head = (
        f"{'mode':<18}{'model':>6}{'size':>6}{'batch':>7}{'step time':>12}{'throughput':>20}"
        f"{'peak memory':>13}{'speed-up':>10}{'vs tf32':>9}{'mem saving':>12}"
    )
    if lm:
        head += f"{'compile':>10}{'TFLOP/s':>9}{'MFU sheet':>11}{'MFU meas.':>11}"
    lines = []
    if device_description:
        lines.append(f"Measured on {device_description}")
    lines += [head, "-" * len(head)]
    notes: dict[str, str] = {}
    for r in results:
        thr = f"{r.throughput:,.0f} {r.unit}/s" if r.throughput else "-"
        mem = f"{r.peak_memory / 2**20:.1f} MiB" if r.peak_memory is not None else "n/a"
        spd = f"{r.speedup:.2f}x" if r.speedup is not None else "-"
        vtf = f"{r.speedup_tf32:.2f}x" if r.speedup_tf32 is not None else "-"
        sav = f"{r.memory_saving:+.1%}" if r.memory_saving is not None else "n/a"
        if not r.measured:
            thr = "not measured"
        line = (
            f"{r.mode:<18}{r.model:>6}{r.size:>6}{r.batch_size:>7}{_fmt_time(r.step_time):>12}"
            f"{thr:>20}{mem:>13}{spd:>10}{vtf:>9}{sav:>12}"
        )
        if lm:
            comp = _fmt_time(r.compile_time) if r.compile_time is not None else "-"
            line += (
                f"{comp:>10}{_fmt_rate(r.achieved):>9}{_fmt_share(r.mfu_datasheet):>11}"
                f"{_fmt_share(r.mfu_measured):>11}"
            )
        lines.append(line)
        if r.note:
            notes.setdefault(r.note, r.mode)
    if lm:
        peaks = {}
        for r in results:
            if r.measured:
                peaks.setdefault(
                    peak_dtype(parse_mode(r.mode)), (r.peak_datasheet, r.peak_measured)
                )
        flops = next((r.flops for r in results if r.flops), None)
        lines.append(
            f"FLOPs per step: {flops:,} (2 per multiply-add; MFU = FLOPs per step / step time / "
            "peak). Peaks in TFLOP/s, datasheet (dense) / measured with a large matmul here: "
            + "; ".join(f"{k} {_fmt_rate(d)} / {_fmt_rate(m)}" for k, (d, m) in peaks.items())
            + ". 'compile' is the first step of a +compile mode, compilation included; "
            "step times exclude it."
            + ("" if any(d for d, _ in peaks.values()) else f" Datasheet: {NO_DATASHEET}.")
        )
    if results and torch.device(results[0].device).type == "cpu":
        amx = "present" if cpu_has_amx() else "absent"
        lines.append(
            f"CPU AMX: {amx}. {describe_cpu_half_precision()}: {cpu_precision_implication()}. "
            "Speed-up = fp32 step time / mode step time, measured side by side in this run."
        )
    noisy = [(r, statistics.median(r.times) / min(r.times)) for r in results if len(r.times) > 1]
    noisy = [(r, spread) for r, spread in noisy if spread > NOISY_SPREAD]
    if noisy:
        worst, spread = max(noisy, key=lambda item: item[1])
        lines.append(
            f"warning: in {len(noisy)} measurement(s) the median round was more than "
            f"{NOISY_SPREAD:g}x the fastest (worst: {worst.mode}, size {worst.size}, "
            f"{spread:.1f}x): the machine was busy while measuring, so these ratios are "
            "unreliable; rerun when it is idle, or with more --repeats."
        )
    lines += [f"warning: {w}." for w in mfu_warnings(results)]
    for note, mode in notes.items():
        if note == "peak memory not measured on CPU":
            lines.append(f"note: {CPU_MEMORY_NOTE}.")
        else:
            lines.append(f"note ({mode}): {note}.")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``python -m course.benchmark`` (lesson 09)."""
    p = argparse.ArgumentParser(
        prog="python -m course.benchmark",
        description=(
            "Time one training step (forward, backward, SGD update) in fp32, TF32, fp16 autocast "
            "with a GradScaler and bf16 autocast, side by side, and print step time, throughput, "
            "peak memory (CUDA only) and the ratios to fp32."
        ),
    )
    p.add_argument(
        "--device", default=None, help="cpu, cuda, cuda:N or mps (default: course.pick_device())"
    )
    p.add_argument(
        "--model", choices=MODELS, default="mlp", help="mlp (default), cnn or gpt (real text)"
    )
    p.add_argument(
        "--gpt-size",
        choices=sorted(CONFIGS),
        default=None,
        help="gpt size from course.gpt.CONFIGS (default: gpu on CUDA, cpu elsewhere)",
    )
    p.add_argument(
        "--compile",
        choices=("off", "on", "both"),
        default="off",
        help="run each mode eager (off, default), under torch.compile (on) or both",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=None,
        metavar="MODE",
        help=f"any of {', '.join(BASE_MODES)}, with {CHANNELS_LAST} for channels-last (cnn only) "
        f"and/or {COMPILED}; "
        "fp32 is always added as the baseline (default: all four; with --model cnn also "
        "fp16-amp+cl and bf16-amp+cl)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="samples per step (default 256)")
    p.add_argument(
        "--sizes",
        nargs="+",
        type=int,
        default=None,
        metavar="N",
        help="MLP widths or CNN channel counts, one table block each (default: 1020 1024 for the "
        "mlp, a width that is not a multiple of 8 next to one that is; 60 64 for the cnn)",
    )
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument(
        "--min-run-time",
        type=float,
        default=0.2,
        help="seconds blocked_autorange measures each mode per round (default 0.2)",
    )
    p.add_argument("--image-size", type=int, default=32, help="cnn input height/width (default 32)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    return p


def run_from_args(argv: Sequence[str] | None = None) -> tuple[list[Result], torch.device]:
    """The measurements ``python -m course.benchmark ARGV`` prints, and the device they ran on.

    Bad arguments exit through argparse, as on the command line.
    """
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device) if args.device else pick_device()
    if device.type == "cuda" and not torch.cuda.is_available():
        build_parser().error(f"--device {args.device} asked for CUDA, but torch sees no GPU")
    modes = args.modes or (
        [*BASE_MODES, "fp16-amp+cl", "bf16-amp+cl"] if args.model == "cnn" else list(BASE_MODES)
    )
    if args.compile != "off":
        compiled = [m + COMPILED for m in modes if COMPILED not in m]
        modes = compiled if args.compile == "on" else [*modes, *compiled]
    sizes = args.sizes or ([1020, 1024] if args.model == "mlp" else [60, 64])
    config = args.gpt_size or ("gpu" if device.type == "cuda" else "cpu")
    try:
        for m in modes:
            parse_mode(m)
    except ValueError as exc:
        build_parser().error(str(exc))
    results = run_benchmark(
        modes,
        model=args.model,
        sizes=sizes,
        batch_size=args.batch_size,
        repeats=args.repeats,
        min_run_time=args.min_run_time,
        device=device,
        image_size=args.image_size,
        config=config,
    )
    return results, device


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m course.benchmark`` (lesson 09)."""
    results, device = run_from_args(argv)
    print(format_table(results, describe_device(device)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
