"""Torch 2.11 inside torch 2.13: what the course uses that torch 2.11 lacks, taken away here.

Colab's GPU runtime (its published package list, August 2026) ships torch 2.11; the course is
written against 2.13. What torch 2.11.0 has was read from its wheel (the Python files, and the
CPU kernels registered in the symbol table of its ``libtorch_cpu``):

- every Python API the course or its lessons name exists in 2.11: ``F.scaled_mm`` with
  ``ScalingType`` and ``SwizzleType``, ``torch.backends.*.fp32_precision``,
  ``torch.accelerator``, ``torch.float8_e8m0fnu``, ``fully_shard`` and ``MixedPrecisionPolicy``,
  DTensor's ``found_inf_reduce_handler``, ``get_total_norm`` and ``clip_grads_with_norm_``;
- 2.11 registers no CPU kernel for ``aten::_scaled_mm_v2``, which ``F.scaled_mm`` calls, so on
  a CPU it raises ``NotImplementedError`` (2.13 runs tensor-wise and row-wise scales there);
- 2.11's CPU kernel for ``torch._scaled_mm`` takes tensor-wise scales only ("Now _scaled_mm only
  supports per-tensor scaling for CPU backend.");
- 2.11's ``DistributedDataParallel`` has no ``forward_sync_buffers`` argument (only the older
  ``broadcast_buffers``);
- 2.11's ``ATen/autocast_mode.h`` does not list ``rms_norm`` among CUDA's float32 ops (the
  lessons read the installed header, so they follow it; not changed here).

:func:`hide_newer_apis` makes this process behave so, for the rehearsals: ``scripts/gpu_check.py
--hide-newer-apis`` and the Colab-profile kernel of ``tests/test_hosted.py``. It imports torch
and nothing of the course, so it can run in a kernel where the course is not installed.
"""

from __future__ import annotations

import functools

import torch

#: The torch release this module rehearses.
RELEASE = "2.11"
#: What torch 2.11 says where ``F.scaled_mm`` runs on a CPU: the dispatcher's message, its first
#: sentence, then about 50 lines (the backends that have a kernel), shortened here to its shape.
NO_CPU_KERNEL = (
    "Could not run 'aten::_scaled_mm_v2' with arguments from the 'CPU' backend. This could be "
    "because the operator doesn't exist for this backend, or was omitted during the selective/"
    "custom build process (if using custom build). If you are a Facebook employee using PyTorch "
    "on mobile, please visit https://fburl.com/ptmfixes for possible resolutions. "
    f"(Rehearsed: torch {RELEASE} registers no CPU kernel for it.) 'aten::_scaled_mm_v2' is only "
    "available for these backends: [CUDA, Meta, BackendSelect, Python, ...].\n\n"
    + "\n".join(
        f"{key}: registered at /pytorch/build/aten/src/ATen/Register{key}.cpp:1 [kernel]"
        for key in ("CUDA", "Meta", "BackendSelect", "Python", "Functionalize", "Named")
    )
)
#: What torch 2.11 says where ``torch._scaled_mm`` gets row-wise scales on a CPU.
CPU_PER_TENSOR_ONLY = "Now _scaled_mm only supports per-tensor scaling for CPU backend."


def _no_cpu_scaled_mm(original):
    @functools.wraps(original)
    def scaled_mm(mat_a, *args, **kwargs):
        if mat_a.device.type == "cpu":
            raise NotImplementedError(NO_CPU_KERNEL)
        return original(mat_a, *args, **kwargs)

    scaled_mm.__course_older_torch__ = True
    return scaled_mm


def _per_tensor_cpu_scaled_mm(original):
    @functools.wraps(original)
    def _scaled_mm(mat_a, mat_b, *args, **kwargs):
        scales = list(args[:2]) + [kwargs.get("scale_a"), kwargs.get("scale_b")]
        if mat_a.device.type == "cpu" and any(
            isinstance(s, torch.Tensor) and s.numel() > 1 for s in scales
        ):
            raise RuntimeError(CPU_PER_TENSOR_ONLY)
        return original(mat_a, mat_b, *args, **kwargs)

    _scaled_mm.__course_older_torch__ = True
    return _scaled_mm


def _without_forward_sync_buffers(original):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        if "forward_sync_buffers" in kwargs:
            raise TypeError(
                "DistributedDataParallel.__init__() got an unexpected keyword argument "
                "'forward_sync_buffers'"
            )
        original(self, *args, **kwargs)

    __init__.__course_older_torch__ = True
    return __init__


def hide_newer_apis() -> list[str]:
    """Make this process's torch behave as torch 2.11 where the course can tell (see the
    module); returns what it changed. Calling it twice changes nothing more."""
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    changed = []
    for holder, name, wrap, what in (
        (F, "scaled_mm", _no_cpu_scaled_mm, "torch.nn.functional.scaled_mm on a CPU"),
        (torch, "_scaled_mm", _per_tensor_cpu_scaled_mm, "row-wise torch._scaled_mm on a CPU"),
        (DDP, "__init__", _without_forward_sync_buffers, "DDP's forward_sync_buffers"),
    ):
        current = getattr(holder, name, None)
        if current is None or getattr(current, "__course_older_torch__", False):
            continue
        setattr(holder, name, wrap(current))
        changed.append(what)
    return changed
