"""Devices, dtypes and seeds: what a lesson runs on, and every decision that depends on it.

Every lesson opens with ``env = course.setup()``: it picks the device (a CUDA or ROCm GPU, an
Intel XPU, Apple's MPS, else the CPU), seeds every generator, and says which device the lesson's
numbers come from. :class:`DeviceProfile` describes a device: read from torch on this machine
(:meth:`DeviceProfile.current`) or written by hand for a device this machine does not have. Each
decision the lessons make about a device is a function of a profile alone (the autocast dtype and
whether a GradScaler is needed, whether float8 matrix multiplies and ``torch.compile`` are run,
nccl or gloo, fork, forkserver or spawn, the datasheet peak behind an MFU, and the sentences
that say what the device can or cannot show), so they can be checked for devices nobody here
owns.
Introduced in lesson 01.
"""

from __future__ import annotations

import contextlib
import os
import platform
import random
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import numpy as np
import torch

#: The kinds of device a profile describes.
KINDS: tuple[str, ...] = ("cpu", "cuda", "rocm", "mps", "xpu")
#: /proc/cpuinfo flags (x86 ``flags``, Arm ``Features``) the decisions read.
CPU_FLAGS: tuple[str, ...] = (
    "avx2",
    "avx512f",
    "avx512_bf16",
    "avx512_fp16",
    "amx_bf16",
    "amx_fp16",
    "bf16",  # Arm FEAT_BF16 (Linux's name; macOS: hw.optional.arm.FEAT_BF16)
)
#: What a lesson may need of its device beyond float32 and float16 (see :func:`lesson_device`).
#: ``rng-state``: the lesson checkpoints the device's generator (the CPU's and CUDA's are saved).
NEEDS: tuple[str, ...] = ("float64", "float8", "bfloat16", "autocast-lists", "rng-state")
#: ROCm architectures with bfloat16 matrix instructions: CDNA1-4 (MI100, MI200, MI300, MI350)
#: and RDNA3 / RDNA4 (WMMA).
ROCM_BF16_ARCHES: tuple[str, ...] = (
    "gfx908", "gfx90a", "gfx942", "gfx950", "gfx1100", "gfx1101", "gfx1102", "gfx1200", "gfx1201"
)  # fmt: skip
#: ROCm architectures the course expects fused (flash, memory-efficient) attention on: CDNA2+.
ROCM_FLASH_ARCHES: tuple[str, ...] = ("gfx90a", "gfx942", "gfx950")
#: ROCm architectures whose float8 matrix cores use the FNUZ formats (CDNA3, MI300).
ROCM_FNUZ_ARCHES: tuple[str, ...] = ("gfx942",)
#: ROCm architectures whose float8 matrix cores use the OCP formats (CDNA4, MI350).
ROCM_OCP_FP8_ARCHES: tuple[str, ...] = ("gfx950",)
#: The macOS version from which MPS holds bfloat16 tensors (MPSGraph's bfloat16 is Sonoma's).
MPS_BF16_MACOS: tuple[int, int] = (14, 0)
#: The oldest macOS on which this torch's MPS backend is available at all: since torch 2.10
#: ``torch.backends.mps.is_available()`` is False below macOS 14, so such a Mac is a CPU here.
MPS_MIN_MACOS: tuple[int, int] = (14, 0)


# --------------------------------------------------------------------------------------------
# Datasheet peaks


#: Dense (no sparsity) peak TFLOP/s from the vendors' datasheets, by product. ``fp16`` and
#: ``bf16`` are tensor-core (matrix-core) figures with float32 accumulation, as autocast's
#: matmuls use; ``fp32`` is plain (non-tensor) float32; ``None`` where the device has no such
#: arithmetic. Sources: NVIDIA's T4, V100, A10, A100, L4, L40S, H100, H200 datasheets; the
#: NVIDIA Ada Lovelace architecture whitepaper (GeForce RTX 4090, FP32 accumulate); NVIDIA's HGX
#: B200 specifications (8 GPUs, with sparsity: divided by 16); AMD's Instinct MI300X datasheet.
DATASHEET_TFLOPS: dict[str, dict[str, float | None]] = {
    "T4": {"fp32": 8.1, "tf32": None, "fp16": 65.0, "bf16": None, "fp8": None},
    "V100 SXM2": {"fp32": 15.7, "tf32": None, "fp16": 125.0, "bf16": None, "fp8": None},
    "V100 PCIe": {"fp32": 14.0, "tf32": None, "fp16": 112.0, "bf16": None, "fp8": None},
    "A10": {"fp32": 31.2, "tf32": 62.5, "fp16": 125.0, "bf16": 125.0, "fp8": None},
    "A100": {"fp32": 19.5, "tf32": 156.0, "fp16": 312.0, "bf16": 312.0, "fp8": None},
    "L4": {"fp32": 30.3, "tf32": 60.0, "fp16": 121.0, "bf16": 121.0, "fp8": 242.5},
    "L40S": {"fp32": 91.6, "tf32": 183.0, "fp16": 362.05, "bf16": 362.05, "fp8": 733.0},
    "RTX 4090": {"fp32": 82.6, "tf32": 82.6, "fp16": 165.2, "bf16": 165.2, "fp8": 330.3},
    "H100 SXM": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
    "H100 PCIe": {"fp32": 51.0, "tf32": 378.0, "fp16": 756.0, "bf16": 756.0, "fp8": 1513.0},
    "H200 SXM": {"fp32": 67.0, "tf32": 494.7, "fp16": 989.4, "bf16": 989.4, "fp8": 1978.9},
    "B200": {"fp32": 75.0, "tf32": 1125.0, "fp16": 2250.0, "bf16": 2250.0, "fp8": 4500.0},
    "MI300X": {"fp32": 163.4, "tf32": 653.7, "fp16": 1307.4, "bf16": 1307.4, "fp8": 2614.9},
}

#: The names torch reports (``torch.cuda.get_device_name``) for each product above. A device
#: gets a datasheet peak only when its whole name, compared word by word, is one of these: an
#: "NVIDIA L40S" is not an "NVIDIA L4", an A10G (no NVIDIA datasheet) is not an A10, and an NVL
#: board or a MIG slice (other clocks, other peaks) matches nothing.
REPORTED_NAMES: dict[str, tuple[str, ...]] = {
    "T4": ("Tesla T4",),
    "V100 SXM2": ("Tesla V100-SXM2-16GB", "Tesla V100-SXM2-32GB"),
    "V100 PCIe": ("Tesla V100-PCIE-16GB", "Tesla V100-PCIE-32GB"),
    "A10": ("NVIDIA A10",),
    "A100": (
        "NVIDIA A100-SXM4-40GB",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA A100-PCIE-40GB",
        "NVIDIA A100 80GB PCIe",
    ),
    "L4": ("NVIDIA L4",),
    "L40S": ("NVIDIA L40S",),
    "RTX 4090": ("NVIDIA GeForce RTX 4090",),
    "H100 SXM": ("NVIDIA H100 80GB HBM3",),
    "H100 PCIe": ("NVIDIA H100 PCIe",),
    "H200 SXM": ("NVIDIA H200",),
    "B200": ("NVIDIA B200",),
    "MI300X": ("AMD Instinct MI300X",),
}

NO_DATASHEET = "no datasheet peak for this device"


def name_words(name: str) -> tuple[str, ...]:
    """A device name as upper-case words of letters and digits: ``"Tesla V100-SXM2-16GB"`` ->
    ``("TESLA", "V100", "SXM2", "16GB")`` (lesson 09)."""
    return tuple(re.findall(r"[A-Z0-9]+", name.upper()))


def datasheet_product(name: str) -> str | None:
    """The product in :data:`DATASHEET_TFLOPS` whose reported name is ``name`` word for word,
    or None (lesson 09)."""
    words = name_words(name)
    for product, names in REPORTED_NAMES.items():
        if any(name_words(n) == words for n in names):
            return product
    return None


# --------------------------------------------------------------------------------------------
# The profile


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError:
        return ""


def _cpu_flags_here() -> frozenset[str]:
    """:data:`CPU_FLAGS` this CPU reports (/proc/cpuinfo on Linux, sysctl on macOS)."""
    found: set[str] = set()
    for line in _read("/proc/cpuinfo").splitlines():
        key = line.split(":", 1)[0].strip().lower()
        if key in ("flags", "features"):
            found.update(line.split(":", 1)[1].split())
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "hw.optional.arm.FEAT_BF16"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            if out.stdout.strip() == "1":
                found.add("bf16")
    return frozenset(f for f in CPU_FLAGS if f in found)


def _cpu_name_here() -> str:
    for line in _read("/proc/cpuinfo").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    if sys.platform == "darwin":
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                ["sysctl", "-n", "machdep.cpu.brand_string"],
                capture_output=True,
                text=True,
                timeout=5,
            )
            if out.stdout.strip():
                return out.stdout.strip()
    return platform.processor() or platform.machine()


def _os_here() -> tuple[str, tuple[int, ...]]:
    if sys.platform == "darwin":
        version = platform.mac_ver()[0]
        return "darwin", tuple(int(p) for p in version.split(".") if p.isdigit())
    if sys.platform == "win32":
        return "windows", ()
    return "linux", ()


def _nccl_here() -> bool:
    with contextlib.suppress(Exception):
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_nccl_available())
    return False


@dataclass(frozen=True)
class DeviceProfile:
    """What the course needs to know about a device, read from torch or written by hand.

    ``kind`` is one of :data:`KINDS` (``rocm`` for an AMD GPU, which torch addresses as
    ``cuda``); ``capability`` the CUDA compute capability; ``arch`` the ROCm architecture
    (``gfx942``), the Apple chip (``M3``) or empty; ``os_version`` the macOS version on a Mac;
    ``gpu_count`` the GPUs of this kind torch sees; ``cpu_flags`` the host CPU's entries of
    :data:`CPU_FLAGS`; ``fork`` whether the OS can fork; ``nccl`` whether this torch build
    has NCCL (RCCL on ROCm). Introduced in lesson 01.
    """

    kind: str
    name: str
    capability: tuple[int, int] | None = None
    arch: str = ""
    os: str = "linux"
    os_version: tuple[int, ...] = ()
    memory_gib: float | None = None
    gpu_count: int = 0
    cpu_flags: frozenset[str] = field(default_factory=frozenset)
    machine: str = "x86_64"
    fork: bool = True
    nccl: bool = False
    cpu_name: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "mps" and self.os_version and self.os_version < MPS_MIN_MACOS:
            raise ValueError(
                f"torch {torch.__version__.split('+')[0]}'s MPS backend needs macOS "
                f"{'.'.join(map(str, MPS_MIN_MACOS))} or newer (this profile says macOS "
                f"{'.'.join(map(str, self.os_version))}): on that Mac torch sees only the CPU, "
                'so describe it as kind="cpu"'
            )

    @property
    def device_type(self) -> str:
        """The ``torch.device`` type of this device (``cuda`` for ROCm too)."""
        return "cuda" if self.kind == "rocm" else self.kind

    @property
    def is_gpu(self) -> bool:
        """Whether this is an accelerator rather than the CPU."""
        return self.kind != "cpu"

    @property
    def native_bf16(self) -> bool:
        """Whether bfloat16 arithmetic is native here (not emulated through float32).

        NVIDIA: compute capability 8.0+ (Ampere; ``torch.cuda.is_bf16_supported()`` is True on
        older GPUs too, through emulation); ROCm: :data:`ROCM_BF16_ARCHES`; MPS: macOS 14+;
        XPU: yes; CPU: AVX-512 BF16, AMX or Arm's BF16 instructions.
        """
        if self.kind == "cuda":
            return self.capability is not None and self.capability >= (8, 0)
        if self.kind == "rocm":
            return self.arch.split(":")[0] in ROCM_BF16_ARCHES
        if self.kind == "mps":
            return self.os_version >= MPS_BF16_MACOS
        if self.kind == "xpu":
            return True
        return bool({"avx512_bf16", "amx_bf16", "bf16"} & self.cpu_flags)

    @property
    def fp16_tensor_cores(self) -> bool:
        """Whether float16 matmuls run on tensor (matrix) cores: NVIDIA 7.0+ (Volta), ROCm."""
        if self.kind == "cuda":
            return self.capability is not None and self.capability >= (7, 0)
        return self.kind == "rocm"

    @property
    def fp8_formats(self) -> tuple[torch.dtype, ...]:
        """The float8 formats this device's matrix cores multiply, ``()`` if none.

        NVIDIA 8.9+ (Ada, Hopper, Blackwell): e4m3fn and e5m2; MI300 (gfx942): the FNUZ
        variants e4m3fnuz and e5m2fnuz; MI350 (gfx950): the OCP e4m3fn and e5m2.
        """
        ocp = (torch.float8_e4m3fn, torch.float8_e5m2)
        if self.kind == "cuda" and self.capability is not None and self.capability >= (8, 9):
            return ocp
        arch = self.arch.split(":")[0]
        if self.kind == "rocm" and arch in ROCM_FNUZ_ARCHES:
            return (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
        if self.kind == "rocm" and arch in ROCM_OCP_FP8_ARCHES:
            return ocp
        return ()

    @property
    def tf32(self) -> bool:
        """Whether the course measures float32 matmuls in the TF32 math mode here: NVIDIA 8.0+.
        (ROCm's MI300 has TF32 too, ``torch.cuda.is_tf32_supported()``; the course does not
        measure it there.)"""
        return self.kind == "cuda" and self.capability is not None and self.capability >= (8, 0)

    @property
    def supports(self) -> frozenset[str]:
        """Which of :data:`NEEDS` this device provides (see :func:`lesson_device`).

        MPS holds no float64 and no float8 tensors, bfloat16 only from macOS 14, its autocast
        lists are neither CUDA's nor the CPU's (which lesson 03 tabulates), and the lessons'
        checkpoints save the CPU's and CUDA's generators, not its own.
        """
        if self.kind == "mps":
            return frozenset({"bfloat16"} if self.native_bf16 else set())
        if self.kind == "xpu":
            return frozenset({"float64", "float8", "bfloat16"})
        return frozenset(NEEDS)

    def sdpa_backends(self, dtype: torch.dtype) -> tuple[str, ...]:
        """The ``scaled_dot_product_attention`` kernels torch has here for ``dtype``, ending
        with ``math`` (always there). Not an order of preference: which one runs follows torch's
        priority order (``torch._C._get_sdp_priority_order()``; by default cuDNN attention
        only where torch prefers it, on Hopper and Blackwell with a recent cuDNN). Flash and
        cuDNN attention need NVIDIA 8.0+ and a 16-bit dtype; memory-efficient attention takes
        float32 and float16 from 5.0 and bfloat16 from 8.0; the CPU has its own flash kernel for
        every float dtype."""
        half = dtype in (torch.float16, torch.bfloat16)
        found: list[str] = []
        if self.kind == "cuda" and self.capability is not None:
            if half and self.capability >= (8, 0):
                found += ["flash", "cudnn"]
            if dtype != torch.bfloat16 or self.capability >= (8, 0):
                found.append("efficient")
        elif self.kind == "rocm" and self.arch.split(":")[0] in ROCM_FLASH_ARCHES:
            found += ["flash", "efficient"] if half else ["efficient"]
        elif self.kind == "cpu":
            found.append("flash")
        return (*found, "math")

    @property
    def datasheet(self) -> dict[str, float | None] | None:
        """This device's row of :data:`DATASHEET_TFLOPS`, or None (CPUs, MPS, unlisted GPUs)."""
        if self.kind not in ("cuda", "rocm"):
            return None
        product = datasheet_product(self.name)
        return None if product is None else DATASHEET_TFLOPS[product]

    def peak_flops(self, dtype: str) -> float | None:
        """The datasheet's dense peak FLOP/s for ``dtype`` (``fp32``, ``tf32``, ``fp16``,
        ``bf16``, ``fp8``), or None where there is none (:data:`NO_DATASHEET`)."""
        row = self.datasheet
        value = None if row is None else row.get(dtype)
        return None if value is None else value * 1e12

    def describe(self) -> str:
        """One line naming the device, printed beside every measured number."""
        if self.kind in ("cuda", "rocm"):
            what = (
                f"compute capability {self.capability[0]}.{self.capability[1]}"
                if self.kind == "cuda" and self.capability
                else f"ROCm {self.arch or 'GPU'}"
            )
            memory = f", {self.memory_gib:.0f} GiB" if self.memory_gib else ""
            count = f", {self.gpu_count} GPUs" if self.gpu_count > 1 else ""
            label = "CUDA" if self.kind == "cuda" else "ROCm"
            return f"{label} GPU {self.name} ({what}{memory}{count})"
        if self.kind == "mps":
            macos = ".".join(map(str, self.os_version)) or "unknown"
            return f"Apple GPU (MPS) {self.name} (macOS {macos})"
        if self.kind == "xpu":
            return f"Intel GPU (XPU) {self.name}"
        fast = ("amx_bf16", "avx512_bf16", "bf16", "avx512_fp16")
        native = [f for f in fast if f in self.cpu_flags]
        threads = torch.get_num_threads()
        return (
            f"CPU {self.name} ({threads} thread{'s' if threads != 1 else ''}, "
            f"{'with ' + ', '.join(native) if native else 'no native 16-bit float arithmetic'})"
        )

    @classmethod
    def of(cls, device: torch.device | str) -> DeviceProfile:
        """The profile of ``device`` on this machine, read from torch (and /proc/cpuinfo)."""
        device = torch.device(device)
        os_name, os_version = _os_here()
        host = dict(
            os=os_name,
            os_version=os_version,
            cpu_flags=_cpu_flags_here(),
            machine={"aarch64": "arm64", "amd64": "x86_64"}.get(
                platform.machine().lower(), platform.machine().lower()
            ),
            fork="fork" in _start_methods(),
            nccl=_nccl_here(),
            cpu_name=_cpu_name_here(),
        )
        if device.type == "cuda":
            rocm = torch.version.hip is not None
            index = device.index if device.index is not None else 0
            name, capability, memory, arch = "unknown GPU", None, None, ""
            with contextlib.suppress(Exception):
                name = torch.cuda.get_device_name(index)
            with contextlib.suppress(Exception):
                capability = tuple(torch.cuda.get_device_capability(index))
            with contextlib.suppress(Exception):
                props = torch.cuda.get_device_properties(index)
                memory = props.total_memory / 2**30
                arch = getattr(props, "gcnArchName", "") if rocm else ""
            count = 0
            with contextlib.suppress(Exception):
                count = torch.cuda.device_count()
            return cls(
                kind="rocm" if rocm else "cuda",
                name=name,
                capability=None if rocm else capability,
                arch=arch,
                memory_gib=memory,
                gpu_count=count,
                **host,
            )
        if device.type == "mps":
            name = "Apple GPU"
            with contextlib.suppress(Exception):
                name = torch.backends.mps.get_name()
            chip = re.search(r"\bM\d+\b", host["cpu_name"] + " " + name)
            arch = chip.group(0) if chip else ""
            return cls(kind="mps", name=name, arch=arch, gpu_count=1, **host)
        if device.type == "xpu":
            name = "Intel GPU"
            with contextlib.suppress(Exception):
                name = torch.xpu.get_device_name(device.index or 0)
            return cls(kind="xpu", name=name, gpu_count=torch.xpu.device_count(), **host)
        return cls(kind="cpu", name=host["cpu_name"], **host)

    @classmethod
    def current(cls, prefer: str | None = None) -> DeviceProfile:
        """The profile of the device :func:`pick_device` picks on this machine."""
        return cls.of(pick_device(prefer))

    def with_(self, **changes) -> DeviceProfile:
        """A copy with ``changes`` (e.g. ``gpu_count=8``): profiles are immutable."""
        return replace(self, **changes)


def _start_methods() -> list[str]:
    import multiprocessing as mp

    return mp.get_all_start_methods()


# --------------------------------------------------------------------------------------------
# The decisions, each a function of a profile


def amp_dtype(profile: DeviceProfile) -> torch.dtype:
    """The dtype autocast uses in the lessons: bfloat16 where it is native, else float16
    (with a GradScaler). On MPS float16, torch's default there. Introduced in lesson 01."""
    if profile.kind == "mps":
        return torch.float16
    if profile.kind in ("cuda", "rocm"):
        return torch.bfloat16 if profile.native_bf16 else torch.float16
    return torch.bfloat16


def needs_scaler(profile: DeviceProfile) -> bool:
    """Whether the lessons' default AMP recipe needs a GradScaler (float16 does) (lesson 01)."""
    return amp_dtype(profile) == torch.float16


def amp_sentence(profile: DeviceProfile) -> str:
    """What autocast dtype the course uses here and why, in one sentence (lesson 01)."""
    if profile.kind == "cuda" and not profile.native_bf16:
        cc = ".".join(map(str, profile.capability or ()))
        return (
            f"float16 autocast with a GradScaler: this GPU (compute capability {cc}) has float16 "
            "tensor cores but no bfloat16 ones (they start at 8.0), so bfloat16 would only be "
            "emulated"
        )
    if profile.kind == "mps":
        return (
            "float16 autocast with a GradScaler (torch's default on MPS); bfloat16 also works "
            "here (MPS needs macOS 14 or newer, which has it)"
        )
    if profile.kind == "cpu":
        why = (
            "this CPU computes bfloat16 natively"
            if profile.native_bf16
            else "this CPU has no native bfloat16 arithmetic, so it is converted around float32 "
            "and often runs slower than float32"
        )
        return f"bfloat16 autocast, no GradScaler: the dtype CPU autocast is made for; {why}"
    if profile.native_bf16:
        return "bfloat16 autocast, no GradScaler: this GPU computes bfloat16 natively"
    return "float16 autocast with a GradScaler: this GPU has no native bfloat16 arithmetic"


def limits_sentence(profile: DeviceProfile) -> str:
    """What the lessons can and cannot show on this NVIDIA GPU, in one sentence; ``""`` on a GPU
    that lacks nothing the course measures, and off NVIDIA GPUs (lesson 01).

    A T4 (compute capability 7.5, Colab's and Kaggle's free GPU) has float16 tensor cores and
    nothing newer: bfloat16 runs there only emulated, although ``torch.cuda.is_bf16_supported()``
    answers True (it counts emulation: a bfloat16 tensor can be made; its
    ``including_emulation=False`` answers False below 8.0); TF32 needs 8.0, float8 matrix
    multiplies 8.9.
    """
    if profile.kind != "cuda" or profile.capability is None:
        return ""
    cannot = []
    if not profile.native_bf16:
        cannot.append(
            "bfloat16 at bfloat16's speed (it runs emulated: bfloat16 tensor cores start at "
            "compute capability 8.0, though torch.cuda.is_bf16_supported() says True, counting "
            "emulation)"
        )
    if not profile.tf32:
        cannot.append("TF32 float32 matmuls (8.0+)")
    if not profile.fp8_formats:
        cannot.append("float8 matrix multiplies (8.9+): lesson 08 shows float8's numerics only")
    if not cannot:
        return ""
    cc = f"{profile.capability[0]}.{profile.capability[1]}"
    if profile.native_bf16:
        can = "bfloat16 and float16 autocast on tensor cores"
    else:
        can = "float16 autocast with a GradScaler" + (
            " on float16 tensor cores" if profile.fp16_tensor_cores else ""
        )
    return f"On this GPU (compute capability {cc}) the lessons show {can}; they cannot show " + (
        "; ".join(cannot)
    )


def float8_gemm(profile: DeviceProfile) -> tuple[bool, str]:
    """Whether lesson 08 times real float8 matrix multiplies (``scaled_mm``) here, and why.

    Only on NVIDIA GPUs of compute capability 8.9+; elsewhere the lesson runs the same calls for
    their numerics only. Introduced in lesson 08.
    """
    name = profile.name
    if profile.kind == "rocm":
        formats = ", ".join(str(f).removeprefix("torch.") for f in profile.fp8_formats)
        has = f"its float8 matrix cores take {formats}" if formats else "no float8 matrix cores"
        return False, (
            f"{name} is a ROCm GPU ({has}): this lesson's float8 timing is written for NVIDIA "
            "GPUs of compute capability 8.9 or newer"
        )
    if profile.kind != "cuda":
        return False, (
            f"this lesson runs on {profile.device_type}, not a CUDA GPU: float8 matrix multiplies "
            "need tensor cores of compute capability 8.9 or newer (Ada, Hopper, Blackwell)"
        )
    cc = profile.capability or (0, 0)
    if not profile.fp8_formats:
        return False, (
            f"{name} has compute capability {cc[0]}.{cc[1]}; float8 matrix multiplies need 8.9 "
            "or newer"
        )
    return True, f"compute capability {cc[0]}.{cc[1]}"


def compile_offered(profile: DeviceProfile) -> tuple[bool, str]:
    """Whether lesson 09 measures ``+compile`` modes here, and why not (lesson 09).

    Inductor's GPU code needs Triton, which needs compute capability 7.0+ (torch's
    ``GPUTooOldForTriton``); on a CPU its first step compiles C++ first (tens of seconds for the
    lesson's CPU model on 2 cores), more than the lesson's time budget allows, and its MPS
    backend is not one the lesson relies on; Triton ships no Windows wheels.
    """
    if profile.os == "windows" and profile.is_gpu:
        return False, "Triton, which torch.compile's GPU code needs, publishes no Windows wheels"
    if profile.kind == "cuda":
        cc = profile.capability or (0, 0)
        if cc < (7, 0):
            return False, f"Triton needs compute capability 7.0+, this GPU has {cc[0]}.{cc[1]}"
        return True, "torch.compile (Inductor, Triton kernels)"
    if profile.kind == "rocm":
        return True, "torch.compile (Inductor, Triton kernels for ROCm)"
    if profile.kind == "cpu":
        return False, (
            "on a CPU the first compiled step builds C++ before it runs, more than this lesson's "
            "time budget allows: left out here"
        )
    return False, f"torch.compile's {profile.device_type} backend is not one this lesson relies on"


def tf32_offered(profile: DeviceProfile) -> bool:
    """Whether the benchmark's ``tf32`` mode is measured here: NVIDIA 8.0+ (lesson 09); not on
    ROCm, although MI300 has TF32, nor elsewhere."""
    return profile.tf32


def dist_backend(profile: DeviceProfile, world_size: int) -> str:
    """``nccl`` when this torch build has it and there is a GPU per rank, else ``gloo`` on CPU
    ranks (MPS tensors cannot travel through gloo, so a Mac's ranks are CPU processes)
    (lesson 06)."""
    enough = profile.kind in ("cuda", "rocm") and profile.gpu_count >= world_size
    return "nccl" if enough and profile.nccl else "gloo"


def torchrun_ranks(profile: DeviceProfile) -> int:
    """Processes per machine for the lessons' ``torchrun`` scripts: one per GPU where nccl can
    join them all, else 2 CPU processes (lesson 06)."""
    if profile.gpu_count >= 2 and dist_backend(profile, profile.gpu_count) == "nccl":
        return profile.gpu_count
    return 2


def start_method(profile: DeviceProfile, backend: str = "gloo") -> str:
    """How the launcher starts ranks here (lesson 06): ``fork`` where the OS forks and no
    accelerator is in the process (autograd's device threads and CUDA do not survive fork);
    else ``forkserver`` where the OS forks and the machine is not a Mac (each rank is forked
    from a server process that imported torch and nothing else, so it starts in a fraction of a
    second with no CUDA or autograd state in it); else ``spawn`` (a fresh interpreter per rank:
    Windows has no fork, and macOS's system frameworks are not safe to fork)."""
    if backend == "gloo" and profile.fork and not profile.is_gpu:
        return "fork"
    return "forkserver" if profile.fork and profile.kind != "mps" else "spawn"


def lesson_device(profile: DeviceProfile, needs: frozenset[str] | set[str] | tuple | None) -> str:
    """The device type a lesson computes on: the profile's own, unless the lesson needs
    something it lacks (:data:`NEEDS`; ``None`` = not declared, assumed to need everything),
    then the CPU (lesson 01)."""
    wanted = frozenset(NEEDS) if needs is None else frozenset(needs)
    return profile.device_type if wanted <= profile.supports else "cpu"


def lesson_device_sentence(profile: DeviceProfile, needs) -> str:
    """Why a lesson runs on the CPU although the machine has an accelerator; ``""`` if it
    does not (lesson 01)."""
    if lesson_device(profile, needs) == profile.device_type:
        return ""
    wanted = frozenset(NEEDS) if needs is None else frozenset(needs)
    missing = ", ".join(sorted(wanted - profile.supports))
    return (
        f"this lesson needs {missing}, which {profile.device_type.upper()} does not provide: it "
        "runs on the CPU"
    )


def ranks_sentence(profile: DeviceProfile, world_size: int = 2) -> str:
    """Where a lesson's distributed experiments run and why, in one sentence (lessons 06, 07)."""
    if dist_backend(profile, world_size) == "nccl":
        return f"{world_size} ranks on {world_size} GPUs, backend nccl"
    if profile.kind == "mps":
        why = "gloo cannot carry MPS tensors and there is no NCCL on a Mac"
    elif profile.kind in ("cuda", "rocm") and not profile.nccl:
        why = f"this torch build has no NCCL ({profile.os})"
    elif profile.kind in ("cuda", "rocm"):
        why = f"nccl needs one GPU per rank and {profile.gpu_count} is visible"
    else:
        why = "no GPU here"
    return f"{world_size} CPU processes, backend gloo: {why}"


def float8_sentence(profile: DeviceProfile) -> str:
    """Lesson 08's line on whether float8 matrix multiplies run on tensor cores here."""
    ok, reason = float8_gemm(profile)
    answer = "yes" if ok else "no"
    return (
        f"float8 matrix multiplies on tensor cores, timed by this lesson here: {answer} ({reason})"
    )


#: Parity steps per run, and held-out tokens they are judged on, when ``COURSE_QUICK`` is set
#: (see :func:`capstone_plan`).
QUICK_STEPS, QUICK_VAL_TOKENS = 4, 4096


def capstone_plan(profile: DeviceProfile) -> dict:
    """Lesson 09's choices for this device: model size, benchmark modes and batch, whether
    compile runs, and how many parity steps each 16-bit format gets (300 on a GPU; 200 where
    the CPU or Apple GPU has it natively, 20 where it is emulated).

    ``COURSE_QUICK`` set to anything but 0 (``quick``) gives every format
    :data:`QUICK_STEPS` steps judged on the first :data:`QUICK_VAL_TOKENS` held-out tokens
    (``val_tokens``; None: all of them): a smoke run that shows the lesson works end to end, not
    what it teaches (the tests' browser and hosted-notebook runs use it; the lesson says so)."""
    quick = os.environ.get("COURSE_QUICK", "0") not in ("", "0")
    gpu = profile.kind in ("cuda", "rocm")
    compiled, _ = compile_offered(profile)
    # On a GPU every mode is listed (the benchmark says why one it cannot run is not
    # measured); elsewhere the slow ones are left out: no TF32, and no compile.
    modes = ["fp32", "tf32", "fp16-amp", "bf16-amp"] if gpu else ["fp32", "bf16-amp", "fp16-amp"]
    if compiled:
        modes += [m + "+compile" for m in modes]
    native_fp16 = (
        gpu
        or profile.kind in ("mps", "xpu")
        or bool({"avx512_fp16", "amx_fp16"} & profile.cpu_flags)
    )
    return {
        "size": "gpu" if gpu else "cpu",
        "modes": modes,
        "compile": compiled,
        "steps": {
            "bf16": QUICK_STEPS if quick else 300 if gpu else 200 if profile.native_bf16 else 20,
            "fp16": QUICK_STEPS if quick else 300 if gpu else 200 if native_fp16 else 20,
        },
        "native": {"bf16": gpu or profile.native_bf16, "fp16": native_fp16},
        "val_tokens": QUICK_VAL_TOKENS if quick else None,
        "quick": quick,
        "batch": 32 if gpu else 8,
    }


# --------------------------------------------------------------------------------------------
# The live machine


@dataclass(frozen=True)
class CourseEnv:
    """What a lesson runs on: the device, the autocast device type and its preferred dtype."""

    device: torch.device
    device_type: str
    amp_dtype: torch.dtype
    description: str
    profile: DeviceProfile | None = None

    def __str__(self) -> str:
        return self.description


_WHAT = {"cuda": "CUDA GPU", "mps": "MPS device (Apple GPU)", "xpu": "XPU (Intel GPU)"}


def pick_device(prefer: str | None = None) -> torch.device:
    """The device a lesson runs on: ``prefer`` (or $COURSE_DEVICE) if given, else a CUDA or
    ROCm GPU, else an Intel XPU, else Apple's MPS, else the CPU. Introduced in lesson 01."""
    choice = prefer or os.environ.get("COURSE_DEVICE") or ""
    if choice:
        device = torch.device(choice)
        available = {
            "cuda": torch.cuda.is_available,
            "mps": torch.backends.mps.is_available,
            "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
        }.get(device.type)
        if available is not None and not available():
            raise RuntimeError(
                f"device {choice!r} was asked for, but torch sees no {_WHAT[device.type]} "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None})"
            )
        return device
    if torch.cuda.is_available():
        return torch.device("cuda")
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return torch.device("xpu")
    if torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def amp_dtype_for(device: torch.device | str | DeviceProfile) -> torch.dtype:
    """The reduced precision dtype autocast should use on ``device`` (lesson 01): see
    :func:`amp_dtype`. Decided from the compute capability, not from
    ``torch.cuda.is_bf16_supported()`` (True on a T4 or V100, through emulation)."""
    profile = device if isinstance(device, DeviceProfile) else DeviceProfile.of(device)
    return amp_dtype(profile)


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles, which make bfloat16 matrix work fast (lesson 01)."""
    return "amx_bf16" in _cpu_flags_here()


def describe_device(device: torch.device | str) -> str:
    """A one-line description of ``device``, printed beside every measured number (lesson 01)."""
    return f"{DeviceProfile.of(device).describe()}, torch {torch.__version__}"


@contextmanager
def one_cpu_thread(device: torch.device | str = "cpu") -> Iterator[None]:
    """Run torch's CPU ops on one thread inside the block, then restore the count (lesson 01).

    Lessons that train tiny models run thousands of small ops one after another; waking several
    threads for each costs far more than the op itself, above all on a busy machine. Does
    nothing when ``device`` is a GPU.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def seed_everything(seed: int = 0) -> None:
    """Seed Python, NumPy and torch (every device) so a lesson's numbers repeat (lesson 01)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup(
    seed: int = 0,
    device: str | None = None,
    quiet: bool = False,
    needs: tuple[str, ...] | None = None,
) -> CourseEnv:
    """The first call of every lesson: seed, pick the device, and print what was picked.

    ``needs`` names what the lesson needs of its device (:data:`NEEDS`); on a device that lacks
    one (MPS has no float64 or float8) the lesson runs on the CPU and says so. A lesson that
    declares nothing is assumed to need everything. Also turns torch's deprecation warnings into
    errors where the notebook's own code or the course's calls a deprecated API, so the lessons
    stay on current APIs (``torch.amp.*`` rather than the old ``torch.cuda.amp.*`` spelling);
    torch's warnings about its own internals (``torch.compile`` imports modules that use the
    deprecated ``torch.jit.script_method``) stay warnings. Introduced in lesson 01.
    """
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings(
            "error",
            message=r"(?s).*torch\..*deprecated",
            category=category,
            module=r"__main__|course(\..*)?",
        )
    seed_everything(seed)
    found = pick_device(device)
    machine = DeviceProfile.of(found)
    why = "" if device else lesson_device_sentence(machine, needs)
    dev = found if device or not why else torch.device("cpu")
    profile = machine if dev == found else DeviceProfile.of(dev)
    env = CourseEnv(
        device=dev,
        device_type=dev.type,
        amp_dtype=amp_dtype(profile),
        description=f"{profile.describe()}, torch {torch.__version__}",
        profile=profile,
    )
    if not quiet:
        print(f"Running on {env.description}; seed {seed}.")
        if why:
            print(f"({machine.describe()} found, but {why}.)")
        limits = limits_sentence(profile)
        if limits:
            print(f"{limits}.")
    return env
