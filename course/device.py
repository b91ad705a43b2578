"""Device, dtype and seed selection (lesson 01).

Every lesson opens with ``env = course.setup()``: it picks CUDA when present and the CPU
otherwise, seeds every generator, and says which device the lesson's numbers come from.
"""

from __future__ import annotations

import os
import platform
import random
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class CourseEnv:
    """What a lesson runs on: the device, the autocast device type and its preferred dtype."""

    device: torch.device
    device_type: str
    amp_dtype: torch.dtype
    description: str

    def __str__(self) -> str:
        return self.description


def pick_device(prefer: str | None = None) -> torch.device:
    """The device a lesson runs on: ``prefer`` (or $COURSE_DEVICE) if given, else CUDA, else CPU.

    Introduced in lesson 01.
    """
    choice = prefer or os.environ.get("COURSE_DEVICE") or ""
    if choice:
        device = torch.device(choice)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError(
                f"device {choice!r} was asked for, but torch sees no CUDA GPU "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda is not None})"
            )
        return device
    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def amp_dtype_for(device: torch.device) -> torch.dtype:
    """The reduced precision dtype autocast should use on ``device`` (lesson 01).

    CUDA GPUs that support bfloat16 get bfloat16, older ones float16; CPUs get bfloat16, the
    dtype their autocast is made for.
    """
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles, which make bfloat16 matrix work fast (lesson 01)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            return "amx_bf16" in fh.read()
    except OSError:
        return False


def describe_device(device: torch.device) -> str:
    """A one-line description of ``device``, printed beside every measured number (lesson 01)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        return (
            f"CUDA GPU {props.name} (compute capability {props.major}.{props.minor}, "
            f"{props.total_memory / 2**30:.0f} GiB), torch {torch.__version__}"
        )
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    amx = "with AMX" if cpu_has_amx() else "without AMX"
    return f"CPU {cpu} ({torch.get_num_threads()} threads, {amx}), torch {torch.__version__}"


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


def setup(seed: int = 0, device: str | None = None, quiet: bool = False) -> CourseEnv:
    """The first call of every lesson: seed, pick the device, and print what was picked.

    Also turns torch's deprecation warnings into errors, so the lessons stay on current APIs
    (``torch.amp.*`` rather than the old ``torch.cuda.amp.*`` spelling). Introduced in lesson 01.
    """
    for category in (FutureWarning, DeprecationWarning):
        warnings.filterwarnings("error", message=r"(?s).*torch\..*deprecated", category=category)
    seed_everything(seed)
    dev = pick_device(device)
    env = CourseEnv(
        device=dev,
        device_type=dev.type,
        amp_dtype=amp_dtype_for(dev),
        description=describe_device(dev),
    )
    if not quiet:
        print(f"Running on {env.description}; seed {seed}.")
    return env
