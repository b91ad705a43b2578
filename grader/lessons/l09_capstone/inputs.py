"""Lesson 09's hidden tests: the configurations and data built from a seed, and the drivers that
feed them to the student's FLOP count, training comparison and distributed step.

The judges (``judge.py``) build the same inputs with the same functions and read the drivers'
observations in the order the drivers made them. See :mod:`grader.lessons.drive`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import tempfile
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from course import gpt_train as T
from course.capstone import probed_gpt
from course.gpt import GPTConfig
from course.launch import launch
from grader.lessons.drive import observer

#: GPT-2 small's sizes (124M parameters, a vocabulary of 50257), asked for two sequences.
GPT2 = GPTConfig(vocab_size=50257, block_size=1024, n_layer=12, n_head=12, d_model=768, d_ff=3072)


def flops_inputs(seed: int) -> list[tuple[GPTConfig, int]]:
    """The (config, tokens) pairs the driver asks about, as it builds them."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for _ in range(6):
        v = torch.randint(0, 10**6, (7,), generator=gen).tolist()
        heads = 1 + v[0] % 4
        cfg = GPTConfig(
            vocab_size=16 + v[1] % 285,
            block_size=2 + v[2] % 39,
            n_layer=1 + v[3] % 4,
            n_head=heads,
            d_model=heads * (1 + v[4] % 24),
            d_ff=1 + v[5] % 96,
        )
        cases.append((cfg, (1 + v[6] % 5) * cfg.block_size))
    cases.append((GPT2, 2 * GPT2.block_size))
    return cases


INIT_STD = 1e-4
LR = 1e-2


def compare_inputs(seed: int) -> list[tuple[GPTConfig, tuple, tuple]]:
    """(config, data, (steps, device_type, amp_dtype, seed, lr, batch_size)) per driver call."""
    gen = torch.Generator().manual_seed(seed)
    cases = []
    for dtype in (torch.float16, torch.bfloat16):
        v = torch.randint(0, 10**6, (8,), generator=gen).tolist()
        heads = 1 + v[0] % 2
        cfg = GPTConfig(
            vocab_size=256,
            block_size=8 + v[1] % 17,
            n_layer=1 + v[2] % 2,
            n_head=heads,
            d_model=heads * (8 + v[3] % 9),
            d_ff=16 + v[4] % 49,
            init_std=INIT_STD,
        )
        data = (
            torch.randint(0, 256, (20_000,), generator=gen, dtype=torch.uint8),
            torch.randint(0, 256, (3_000,), generator=gen, dtype=torch.uint8),
        )
        cases.append((cfg, data, (3 + v[5] % 4, "cpu", dtype, v[6], LR, 2 + v[7] % 5)))
    return cases


class _MetaValues(TorchFunctionMode):
    """``.item()``, ``float()`` and ``.tolist()`` of a meta tensor give zeros (it holds no
    values), and so does a copy of one to the CPU (``.cpu()``, ``.to("cpu")``)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        on_meta = bool(args) and isinstance(args[0], torch.Tensor) and args[0].is_meta
        if on_meta and func in (torch.Tensor.item, torch.Tensor.__float__):
            return 0.0
        if on_meta and func is torch.Tensor.tolist:
            return torch.zeros(args[0].shape).tolist()
        try:
            return func(*args, **kwargs)
        except NotImplementedError:
            if not (on_meta and func in (torch.Tensor.to, torch.Tensor.cpu)):
                raise
            zeros = torch.zeros(args[0].shape, dtype=args[0].dtype)
            return func(zeros, *args[1:], **kwargs)


@contextlib.contextmanager
def meta_stand_in(device_type: str = "cpu"):
    """For a run on data on the ``meta`` device, a GPU's stand-in (lesson 09's tests of
    ``train_compare``): reading a meta tensor's value gives 0.0, so the run goes on past its
    first ``.item()``, and ``torch.autocast("meta", ...)`` (a device type taken from the data)
    runs as autocast on ``device_type``, as autocast knows no meta device."""
    autocast = torch.amp.autocast_mode.autocast
    init = autocast.__init__

    def patched(self, *args, **kwargs):
        if args and args[0] == "meta":
            args = (device_type, *args[1:])
        if kwargs.get("device_type") == "meta":
            kwargs["device_type"] = device_type
        init(self, *args, **kwargs)

    autocast.__init__ = patched
    try:
        with _MetaValues():
            yield
    finally:
        autocast.__init__ = init


def drive_transformer_flops(namespace: dict[str, Any], transformer_flops: Callable) -> None:
    """What transformer_flops returns for each (config, tokens)."""
    obs, seed = observer("transformer_flops", namespace)
    for cfg, tokens in flops_inputs(seed):
        obs.call("flops", transformer_flops, cfg, tokens)
    obs.done()


def drive_train_compare(namespace: dict[str, Any], train_compare: Callable) -> None:
    """Fresh sizes, seeds and random bytes; float16 at tiny initial weights (where its gradients
    underflow without a scaler) and bfloat16. The probes record where autocast was on. Last, the
    bfloat16 case's data on the meta device, a GPU's stand-in: its values read as 0.0, and
    autocast on "meta" runs as on the CPU."""
    obs, seed = observer("train_compare", namespace)
    cases = compare_inputs(seed)
    for cfg, data, args in cases:
        built: list = []
        obs.call("result", train_compare, functools.partial(probed_gpt, cfg, built), data, *args)
        obs.record("probes", [m.flags() for m in built])
    cfg, data, args = cases[-1]
    built = []
    with meta_stand_in("cpu"):
        model = functools.partial(probed_gpt, cfg, built)
        meta = tuple(t.to("meta") for t in data)
        obs.raises("off_cpu", train_compare, model, meta, 3, "cpu", torch.bfloat16, args[3], LR, 2)
    obs.record("placement", [m.placement() for m in built])
    obs.done()


def drive_distributed_step(
    namespace: dict[str, Any], functions: tuple[Callable, Callable, Callable]
) -> None:
    """``functions``: the student's ``(distributed_step, save_checkpoint, load_checkpoint)``.
    The run of the seed's sizes, unbroken and resumed, on 2 gloo ranks; rank 0's checkpoint
    loaded off the CPU; a run without a process group; a checkpoint's round trip of a GPU's
    generators."""
    obs, seed = observer("distributed_step", namespace)
    with tempfile.TemporaryDirectory(prefix="l09_hidden_") as scratch:
        spec = T.graded_spec(seed, scratch + "/run.pt")
        obs.call("unbroken", launch, T.train_rank, 2, (spec, functions))
        resumed = dataclasses.replace(spec, resume=True)
        obs.call("resumed", launch, T.train_rank, 2, (resumed, functions))
        obs.call("off_cpu", T.load_off_cpu, spec, functions)
        alone = dataclasses.replace(spec, checkpoint=scratch + "/alone.pt")
        obs.raises("alone", T.train, alone, torch.device("cpu"), functions)
        trip = T.cuda_generators_round_trip
        obs.call("cuda_generators", trip, spec, functions, scratch + "/gpu.pt")
    obs.done()
