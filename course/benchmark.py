"""Step time, throughput and peak memory of one training step in each precision mode (lesson 09).

Run it as a script to measure the machine you are on::

    python -m course.benchmark                       # MLP, widths 1020 and 1024, batch 256
    python -m course.benchmark --model cnn --modes fp32 bf16-amp bf16-amp+cl --sizes 32
    python -m course.benchmark --help

Modes: ``fp32`` (plain float32, TF32 off), ``tf32`` (float32 tensors, matrix multiplies and
convolutions in the TF32 math mode: CUDA only), ``fp16-amp`` (float16 autocast with a GradScaler),
``bf16-amp`` (bfloat16 autocast). A ``+cl`` suffix (``--model cnn`` only) runs the same mode with
channels-last memory format. Every mode trains the same model from the same initial weights with
SGD; all modes of a size are measured side by side in one run, interleaved round by round, so
their ratios are comparable. Step time comes from ``torch.utils.benchmark.Timer``'s
``blocked_autorange`` (the fastest of the rounds); peak memory from
``torch.cuda.max_memory_allocated`` after ``torch.cuda.reset_peak_memory_stats``, less what was
allocated before the mode's model was built (CUDA only: on
the CPU it is not measured).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils import benchmark as tbench

from course.data import mlp
from course.device import cpu_has_amx, describe_device

#: The precision modes, in the order tables show them.
BASE_MODES: tuple[str, ...] = ("fp32", "tf32", "fp16-amp", "bf16-amp")
#: Suffix that adds channels-last memory format to a mode (convolutional model only).
CHANNELS_LAST = "+cl"
MODELS: tuple[str, ...] = ("mlp", "cnn")
#: Classes the benchmark models predict.
NUM_CLASSES = 10

TF32_NOTE = (
    "TF32 is a CUDA math mode, not a dtype (torch.set_float32_matmul_precision('high'), "
    "torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32): "
    "it needs an NVIDIA GPU with compute capability 8.0 or newer"
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


@dataclass(frozen=True)
class Mode:
    """One precision configuration of a training step (lesson 09)."""

    name: str
    amp_dtype: torch.dtype | None
    tf32: bool
    channels_last: bool

    @property
    def uses_scaler(self) -> bool:
        """float16 autocast needs a GradScaler; bfloat16 and float32 do not."""
        return self.amp_dtype == torch.float16


def parse_mode(name: str) -> Mode:
    """The :class:`Mode` called ``name`` (e.g. ``"bf16-amp"``, ``"fp16-amp+cl"``) (lesson 09)."""
    base, cl = (
        (name[: -len(CHANNELS_LAST)], True) if name.endswith(CHANNELS_LAST) else (name, False)
    )
    if base not in BASE_MODES:
        raise ValueError(
            f"unknown mode {name!r}: choose from {', '.join(BASE_MODES)}, optionally with "
            f"{CHANNELS_LAST!r} (channels-last, cnn model only)"
        )
    dtype = {"fp16-amp": torch.float16, "bf16-amp": torch.bfloat16}.get(base)
    return Mode(name=name, amp_dtype=dtype, tf32=base == "tf32", channels_last=cl)


def unsupported_reason(mode: str | Mode, device: torch.device | str, model: str = "mlp") -> str:
    """Why ``mode`` cannot be measured on ``device`` for ``model``; ``""`` if it can (lesson 09)."""
    m = parse_mode(mode) if isinstance(mode, str) else mode
    device = torch.device(device)
    if m.channels_last and model != "cnn":
        return "channels-last only changes 4-D (image) tensors: use the cnn model"
    if m.tf32:
        if device.type != "cuda":
            return f"not measured on {device.type.upper()}: {TF32_NOTE}"
        if torch.cuda.get_device_capability(device)[0] < 8:
            return f"this GPU has no TF32 tensor cores: {TF32_NOTE}"
    if (
        m.amp_dtype == torch.bfloat16
        and device.type == "cuda"
        and not torch.cuda.is_bf16_supported()
    ):
        return "this GPU does not support bfloat16"
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


def build_model(model: str, size: int) -> nn.Module:
    """The benchmark's model: ``mlp`` (3 layers of width ``size``) or ``cnn`` (``size``
    channels) (lesson 09)."""
    if model == "mlp":
        return mlp((size, size, size, NUM_CLASSES))
    if model == "cnn":
        return SmallConvNet(size)
    raise ValueError(f"unknown model {model!r}: choose from {MODELS}")


def make_batch(
    model: str,
    size: int,
    batch_size: int,
    device: torch.device,
    image_size: int = 32,
    seed: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random inputs and labels for one step of ``model`` (lesson 09)."""
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
    previous settings afterwards (lesson 09). Only CUDA reads these settings."""
    old_precision = torch.get_float32_matmul_precision()
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if tf32 else "highest")
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old_precision)
        torch.backends.cudnn.allow_tf32 = old_cudnn


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

    def step(self) -> None:
        """One training step: forward (under autocast if the mode says so), backward, update."""
        m = self.mode
        with torch.autocast(
            self.device_type, dtype=m.amp_dtype or torch.bfloat16, enabled=m.amp_dtype is not None
        ):
            loss = F.cross_entropy(self.model(self.x), self.y)
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
) -> StepSetup:
    """A fresh :class:`StepSetup`; every mode starts from the same weights (lesson 09)."""
    torch.manual_seed(seed)
    net = build_model(model, size).to(device)
    x, y = make_batch(model, size, batch_size, device, image_size, seed)
    if mode.channels_last:
        net = net.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    opt = torch.optim.SGD(net.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler(device.type, enabled=mode.uses_scaler)
    return StepSetup(mode, net, opt, scaler, x, y, device.type)


@dataclass
class Result:
    """One row of the benchmark table (lesson 09). Times in seconds, memory in bytes."""

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

    @property
    def throughput(self) -> float | None:
        """Training samples per second."""
        return self.batch_size / self.step_time if self.step_time else None

    @property
    def measured(self) -> bool:
        return self.step_time is not None


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


def _warm_up(
    mode: Mode, model: str, size: int, batch_size: int, device: torch.device, image_size: int
) -> None:
    """One step of a freshly built (mode, size), so that its one-time allocations are made."""
    setup = make_setup(mode, model, size, batch_size, device, image_size)
    with math_mode(mode.tf32):
        setup.step()


def _measure(
    mode: Mode,
    model: str,
    size: int,
    batch_size: int,
    device: torch.device,
    image_size: int,
    warmup: int,
    min_run_time: float,
    memory: bool,
) -> tuple[float, int | None]:
    """Median step time of one freshly built (mode, size), and its peak memory if ``memory``.

    A function of its own so that nothing of the setup (the timer holds its ``step``) is alive
    when the next one is built: the next mode's peak memory must not include this one's model.
    """
    _free(device)
    baseline = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    setup = make_setup(mode, model, size, batch_size, device, image_size)
    peak = None
    with math_mode(mode.tf32):
        for _ in range(warmup):
            setup.step()
        if memory:
            peak = _peak_memory(setup, device, baseline)
        timer = tbench.Timer(
            stmt="step()",
            globals={"step": setup.step},
            num_threads=torch.get_num_threads(),
            label=f"{model} {size}",
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
) -> list[Result]:
    """Measure a training step in every mode, side by side, for each size (lesson 09).

    ``fp32`` is always measured (added if missing): speed-up and memory saving are relative to it.
    Each of ``repeats`` rounds builds every (size, mode) afresh and times it with
    ``torch.utils.benchmark.Timer.blocked_autorange(min_run_time=...)`` (the median of its blocks);
    a mode's step time is the fastest round, since a busy machine only ever adds time. On CUDA the
    first round also records the peak memory of two steps, above what was allocated before the
    mode's model was built (every mode takes one warm-up step beforehand, so that one-time
    cuBLAS/cuDNN workspaces are in every baseline). Modes the device cannot run come back
    unmeasured with a ``note`` saying why. ``progress(done, total, label)`` is called after each
    measurement.
    """
    if repeats < 1 or batch_size < 1 or not sizes:
        raise ValueError("need repeats >= 1, batch_size >= 1 and at least one size")
    dev = (
        torch.device(device)
        if device is not None
        else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    )
    names = list(dict.fromkeys(["fp32", *modes]))
    parsed = [parse_mode(n) for n in names]
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}: choose from {MODELS}")
    rows = {
        (size, m.name): Result(
            m.name, model, size, batch_size, str(dev), note=unsupported_reason(m, dev, model)
        )
        for size in sizes
        for m in parsed
    }
    runnable = [m for m in parsed if not unsupported_reason(m, dev, model)]
    times: dict[tuple[int, str], list[float]] = {(s, m.name): [] for s in sizes for m in runnable}
    total, done = len(times) * repeats, 0
    if dev.type == "cuda":
        # A process's first cuBLAS/cuDNN calls allocate workspaces that stay allocated (tens of
        # MiB on recent GPUs). Let every mode make them before anything is measured, so they sit
        # in each mode's baseline instead of in the first measured mode's peak.
        for size in sizes:
            for m in runnable:
                _warm_up(m, model, size, batch_size, dev, image_size)
    # Round after round, every (size, mode) once: a busy spell slows all of them alike.
    for round_ in range(repeats):
        for size in sizes:
            for m in runnable:
                memory = round_ == 0 and dev.type == "cuda"
                median, peak = _measure(
                    m, model, size, batch_size, dev, image_size, warmup, min_run_time, memory
                )
                times[(size, m.name)].append(median)
                if memory:
                    rows[(size, m.name)].peak_memory = peak
                done += 1
                if progress is not None:
                    progress(done, total, f"{m.name} (size {size}, round {round_ + 1})")
    results: list[Result] = []
    for size in sizes:
        base = rows[(size, "fp32")]
        for m in runnable:
            row = rows[(size, m.name)]
            row.times = tuple(times[(size, m.name)])
            row.step_time = min(row.times)
        for name in names:
            row = rows[(size, name)]
            if row.measured and base.measured:
                row.speedup = base.step_time / row.step_time
            if row.peak_memory is not None and base.peak_memory:
                row.memory_saving = 1.0 - row.peak_memory / base.peak_memory
            if row.measured and dev.type != "cuda":
                row.note = "peak memory not measured on CPU"
            results.append(row)
    return results


def _fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.2f} ms" if seconds < 10 else f"{seconds:.1f} s"


def format_table(results: Sequence[Result], device_description: str = "") -> str:
    """The benchmark as a text table with notes on what was not measured (lesson 09)."""
    head = (
        f"{'mode':<13}{'model':>6}{'size':>6}{'batch':>7}{'step time':>12}{'throughput':>19}"
        f"{'peak memory':>14}{'speed-up':>10}{'mem saving':>12}"
    )
    lines = []
    if device_description:
        lines.append(f"Measured on {device_description}")
    lines += [head, "-" * len(head)]
    notes: dict[str, str] = {}
    for r in results:
        thr = f"{r.throughput:,.0f} samples/s" if r.throughput else "-"
        mem = f"{r.peak_memory / 2**20:.1f} MiB" if r.peak_memory is not None else "n/a"
        spd = f"{r.speedup:.2f}x" if r.speedup is not None else "-"
        sav = f"{r.memory_saving:+.1%}" if r.memory_saving is not None else "n/a"
        if not r.measured:
            thr = "not measured"
        lines.append(
            f"{r.mode:<13}{r.model:>6}{r.size:>6}{r.batch_size:>7}{_fmt_time(r.step_time):>12}"
            f"{thr:>19}{mem:>14}{spd:>10}{sav:>12}"
        )
        if r.note:
            notes.setdefault(r.note, r.mode)
    if results and torch.device(results[0].device).type == "cpu":
        amx = "present" if cpu_has_amx() else "absent"
        lines.append(
            f"CPU AMX: {amx}. {describe_cpu_half_precision()}. Speed-up = fp32 step time / "
            "mode step time, measured side by side in this run."
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
    p.add_argument("--device", default=None, help="cpu, cuda or cuda:N (default: cuda if present)")
    p.add_argument("--model", choices=MODELS, default="mlp", help="mlp (default) or cnn")
    p.add_argument(
        "--modes",
        nargs="+",
        default=None,
        metavar="MODE",
        help=f"any of {', '.join(BASE_MODES)}, with {CHANNELS_LAST} for channels-last (cnn only); "
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
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        build_parser().error(f"--device {args.device} asked for CUDA, but torch sees no GPU")
    modes = args.modes or (
        [*BASE_MODES, "fp16-amp+cl", "bf16-amp+cl"] if args.model == "cnn" else list(BASE_MODES)
    )
    sizes = args.sizes or ([1020, 1024] if args.model == "mlp" else [60, 64])
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
    )
    return results, device


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``python -m course.benchmark`` (lesson 09)."""
    results, device = run_from_args(argv)
    print(format_table(results, describe_device(device)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
