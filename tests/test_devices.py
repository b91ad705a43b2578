"""Every device decision the lessons make, for real devices nobody here has to own.

The table below is written from the vendors' datasheets and torch's documentation, not from
course.device: each row is a real machine, each column a decision a lesson makes. Every cell is
its own test case (``test_decision[T4-amp]``...), so changing any one expected value, or any
one rule in course.device, fails exactly the cells it touches. Pure functions of a profile: no
lesson runs, and the whole matrix takes milliseconds.

Sources for the expected values:
- Compute capabilities: NVIDIA's "CUDA GPUs" table (developer.nvidia.com/cuda-gpus): T4 7.5,
  V100 7.0, A10G 8.6, A100 8.0, L4 / L40S / RTX 4090 8.9, H100 / H200 9.0, B200 10.0.
- Tensor-core dtypes and dense peaks (TFLOP/s, sparsity halved): NVIDIA datasheets for T4
  (fp16 65, no bf16, no TF32), V100 (SXM2 fp16 125), A100 (bf16 / fp16 312, TF32 156, no FP8),
  L4 (bf16 121, FP8 242.5), L40S (bf16 362.05, FP8 733), H100 (SXM bf16 989.4, PCIe 756),
  H200 (SXM bf16 989.4); the Ada Lovelace whitepaper, appendix A (RTX 4090: bf16 / fp16 with
  FP32 accumulate 165.2, FP8 330.3); NVIDIA HGX B200 specifications (8 GPUs, bf16 36 PFLOPS with
  sparsity: 2250 per GPU dense); AMD Instinct MI300X datasheet (bf16 1307.4, FP8 2614.9, CDNA3
  "gfx942"). NVIDIA publishes no datasheet for AWS's A10G: no peak.
- Float8 formats: NVIDIA's FP8 (Hopper/Ada, sm89+) is OCP E4M3 / E5M2, torch's float8_e4m3fn /
  float8_e5m2; AMD's CDNA3 ISA (MI300) uses the FNUZ variants, torch's float8_e4m3fnuz /
  float8_e5m2fnuz (torch's "float8 dtypes" note).
- Autocast on MPS: torch.get_autocast_dtype("mps") is float16 (measured with torch 2.13);
  torch/amp/grad_scaler.py special-cases "mps:0" in unscale_ (GradScaler handles MPS); bfloat16
  on MPS needs macOS 14 (pytorch/pytorch#119641, "Enable bfloat16 support on MacOS 14"; the
  autocast follow-up #139390 gates bfloat16 autocast the same way).
- Triton (torch.compile's GPU code) needs compute capability 7.0+ (torch/_inductor/exc.py's
  GPUTooOldForTriton).
- NCCL: Linux only (torch.distributed docs, "Backends": Windows has gloo); gloo carries CPU
  tensors (and CUDA ones), not MPS tensors. Python's multiprocessing has no fork on Windows
  (docs: "Contexts and start methods"); CUDA cannot be used across fork (torch's
  "multiprocessing best practices").
- CPU bfloat16 instructions: Intel Sapphire Rapids (AMX-BF16, AVX512-BF16, AVX512-FP16),
  AMD Zen 4 (AVX512-BF16, no AVX512-FP16), Zen 3 (AVX2 only), Arm Neoverse V1 / AWS Graviton3
  (FEAT_BF16), Apple M1 (Armv8.5, no FEAT_BF16) and M2+ (FEAT_BF16).
- SDPA: torch's scaled_dot_product_attention docs: FlashAttention-2 and cuDNN attention need
  sm80+ and 16-bit inputs; memory-efficient attention runs on older GPUs, bfloat16 from sm80
  only (the wheel's include/ATen/native/transformers/cuda/mem_eff_attention/kernels/cutlassF.h
  holds f16 / f32 kernels for sm50, sm70, sm75, sm80 and bf16 kernels for sm80 alone). The CPU's
  flash kernel runs float32, bfloat16 and float16 (measured with torch 2.13 under
  sdpa_kernel(SDPBackend.FLASH_ATTENTION)).
"""

from __future__ import annotations

import sys
import time

import pytest
import torch

import course.benchmark as B
import course.device as D
from course.device import DeviceProfile

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
FNUZ = (torch.float8_e4m3fnuz, torch.float8_e5m2fnuz)
BF16, FP16 = torch.bfloat16, torch.float16
X86_AVX2 = frozenset({"avx2"})
ZEN4 = frozenset({"avx2", "avx512f", "avx512_bf16"})
SPR = frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16"})


def gpu(name, cc, count=1, **kw):
    """A Linux machine with ``count`` NVIDIA GPUs and a torch built with NCCL."""
    kw = {"nccl": True, "cpu_flags": SPR, **kw}
    return DeviceProfile(kind="cuda", name=name, capability=cc, gpu_count=count, **kw)


PROFILES: dict[str, DeviceProfile] = {
    "cpu-avx2": DeviceProfile(kind="cpu", name="AMD Ryzen 7 5800X", cpu_flags=X86_AVX2),
    "cpu-avx512bf16": DeviceProfile(kind="cpu", name="AMD EPYC 9654", cpu_flags=ZEN4),
    "cpu-amx": DeviceProfile(kind="cpu", name="Intel Xeon Platinum 8480+", cpu_flags=SPR),
    "cpu-arm-linux": DeviceProfile(
        kind="cpu", name="AWS Graviton3", machine="arm64", cpu_flags=frozenset({"bf16"})
    ),
    "windows-4090": gpu("NVIDIA GeForce RTX 4090", (8, 9), os="windows", fork=False, nccl=False),
    "mac-m1-14": DeviceProfile(
        kind="mps",
        name="Apple M1",
        arch="M1",
        os="darwin",
        os_version=(14, 0),
        gpu_count=1,
        machine="arm64",
    ),
    "mac-m3-15": DeviceProfile(
        kind="mps",
        name="Apple M3 Pro",
        arch="M3",
        os="darwin",
        os_version=(15, 1),
        gpu_count=1,
        machine="arm64",
        cpu_flags=frozenset({"bf16"}),
    ),
    "T4": gpu("Tesla T4", (7, 5)),
    "V100x8": gpu("Tesla V100-SXM2-16GB", (7, 0), count=8),
    "A10G": gpu("NVIDIA A10G", (8, 6)),
    "A100-40GB": gpu("NVIDIA A100-SXM4-40GB", (8, 0)),
    "A100-80GBx8": gpu("NVIDIA A100-SXM4-80GB", (8, 0), count=8),
    "L4": gpu("NVIDIA L4", (8, 9)),
    "L40S": gpu("NVIDIA L40S", (8, 9)),
    "RTX4090": gpu("NVIDIA GeForce RTX 4090", (8, 9)),
    "H100-PCIe": gpu("NVIDIA H100 PCIe", (9, 0)),
    "H100-SXMx8": gpu("NVIDIA H100 80GB HBM3", (9, 0), count=8),
    "H200": gpu("NVIDIA H200", (9, 0)),
    "B200x8": gpu("NVIDIA B200", (10, 0), count=8),
    "MI300Xx8": DeviceProfile(
        kind="rocm",
        name="AMD Instinct MI300X",
        arch="gfx942:sramecc+:xnack-",
        gpu_count=8,
        nccl=True,
    ),
}

# Columns: amp = autocast dtype (lessons 03-09), scaler = GradScaler in the default recipe,
# fp8 = float8 formats of the matrix cores, fp8mm = lesson 08 times scaled_mm on tensor cores,
# compile = lesson 09 measures +compile modes, tf32 = the benchmark's tf32 mode runs,
# ranks2 = backend of lessons 06/07's 2-rank experiments, torchrun = processes per machine,
# start = the launcher's start method, bf16pk / fp8pk = dense datasheet TFLOP/s behind MFU,
# l01 = device of a lesson that declares no needs (01), l02 = of one that needs nothing
# beyond float16 (02), l08 = of lesson 08 (float8 tensors), flash = FlashAttention for bf16.
COLUMNS = (
    "amp", "scaler", "fp8", "fp8mm", "compile", "tf32", "ranks2", "torchrun", "start",
    "bf16pk", "fp8pk", "l01", "l02", "l08", "flash",
)  # fmt: skip
EXPECTED: dict[str, tuple] = {
    # name            amp   scaler fp8          fp8mm  compile tf32  ranks2  trun start
    #                 bf16pk   fp8pk   l01    l02    l08    flash
    "cpu-avx2":       (BF16, False, (),          False, False, False, "gloo", 2, "fork",
                       None,    None,   "cpu", "cpu", "cpu", True),
    "cpu-avx512bf16": (BF16, False, (),          False, False, False, "gloo", 2, "fork",
                       None,    None,   "cpu", "cpu", "cpu", True),
    "cpu-amx":        (BF16, False, (),          False, False, False, "gloo", 2, "fork",
                       None,    None,   "cpu", "cpu", "cpu", True),
    "cpu-arm-linux":  (BF16, False, (),          False, False, False, "gloo", 2, "fork",
                       None,    None,   "cpu", "cpu", "cpu", True),
    "windows-4090":   (BF16, False, (E4M3, E5M2), True, False, True,  "gloo", 2, "spawn",
                       165.2,   330.3,  "cuda", "cuda", "cuda", True),
    "mac-m1-14":      (FP16, True,  (),          False, False, False, "gloo", 2, "spawn",
                       None,    None,   "cpu", "mps", "cpu", False),
    "mac-m3-15":      (FP16, True,  (),          False, False, False, "gloo", 2, "spawn",
                       None,    None,   "cpu", "mps", "cpu", False),
    "T4":             (FP16, True,  (),          False, True,  False, "gloo", 2, "forkserver",
                       None,    None,   "cuda", "cuda", "cuda", False),
    "V100x8":         (FP16, True,  (),          False, True,  False, "nccl", 8, "forkserver",
                       None,    None,   "cuda", "cuda", "cuda", False),
    "A10G":           (BF16, False, (),          False, True,  True,  "gloo", 2, "forkserver",
                       None,    None,   "cuda", "cuda", "cuda", True),
    "A100-40GB":      (BF16, False, (),          False, True,  True,  "gloo", 2, "forkserver",
                       312.0,   None,   "cuda", "cuda", "cuda", True),
    "A100-80GBx8":    (BF16, False, (),          False, True,  True,  "nccl", 8, "forkserver",
                       312.0,   None,   "cuda", "cuda", "cuda", True),
    "L4":             (BF16, False, (E4M3, E5M2), True, True,  True,  "gloo", 2, "forkserver",
                       121.0,   242.5,  "cuda", "cuda", "cuda", True),
    "L40S":           (BF16, False, (E4M3, E5M2), True, True,  True,  "gloo", 2, "forkserver",
                       362.05,  733.0,  "cuda", "cuda", "cuda", True),
    "RTX4090":        (BF16, False, (E4M3, E5M2), True, True,  True,  "gloo", 2, "forkserver",
                       165.2,   330.3,  "cuda", "cuda", "cuda", True),
    "H100-PCIe":      (BF16, False, (E4M3, E5M2), True, True,  True,  "gloo", 2, "forkserver",
                       756.0,   1513.0, "cuda", "cuda", "cuda", True),
    "H100-SXMx8":     (BF16, False, (E4M3, E5M2), True, True,  True,  "nccl", 8, "forkserver",
                       989.4,   1978.9, "cuda", "cuda", "cuda", True),
    "H200":           (BF16, False, (E4M3, E5M2), True, True,  True,  "gloo", 2, "forkserver",
                       989.4,   1978.9, "cuda", "cuda", "cuda", True),
    "B200x8":         (BF16, False, (E4M3, E5M2), True, True,  True,  "nccl", 8, "forkserver",
                       2250.0,  4500.0, "cuda", "cuda", "cuda", True),
    "MI300Xx8":       (BF16, False, FNUZ,        False, True,  False, "nccl", 8, "forkserver",
                       1307.4,  2614.9, "cuda", "cuda", "cuda", True),
}  # fmt: skip

#: (native bfloat16 arithmetic, float16 tensor/matrix cores): the facts behind "amp" above.
NATIVE: dict[str, tuple[bool, bool]] = {
    "cpu-avx2": (False, False), "cpu-avx512bf16": (True, False), "cpu-amx": (True, False),
    "cpu-arm-linux": (True, False), "windows-4090": (True, True), "mac-m1-14": (True, False),
    "mac-m3-15": (True, False), "T4": (False, True), "V100x8": (False, True),
    "A10G": (True, True), "A100-40GB": (True, True), "A100-80GBx8": (True, True),
    "L4": (True, True), "L40S": (True, True), "RTX4090": (True, True),
    "H100-PCIe": (True, True), "H100-SXMx8": (True, True), "H200": (True, True),
    "B200x8": (True, True), "MI300Xx8": (True, True),
}  # fmt: skip

#: Lesson 02 needs only float16 tensors and a GradScaler; lesson 08 float8 tensors.
NEEDS = {"l01": None, "l02": (), "l08": ("float8",)}


def tflops(value: float | None) -> float | None:
    return None if value is None else round(value / 1e12, 3)


def decisions(p: DeviceProfile) -> dict:
    """What course.device decides for ``p``, one entry per column."""
    return {
        "amp": D.amp_dtype(p),
        "scaler": D.needs_scaler(p),
        "fp8": p.fp8_formats,
        "fp8mm": D.float8_gemm(p)[0],
        "compile": D.capstone_plan(p)["compile"],
        "tf32": "tf32" in D.capstone_plan(p)["modes"] and D.tf32_offered(p),
        "ranks2": D.dist_backend(p, 2),
        "torchrun": D.torchrun_ranks(p),
        "start": D.start_method(p, "gloo"),
        "bf16pk": tflops(B.datasheet_peak(p, "bf16")),
        "fp8pk": tflops(p.peak_flops("fp8")),
        **{col: D.lesson_device(p, needs) for col, needs in NEEDS.items()},
        "flash": "flash" in p.sdpa_backends(torch.bfloat16),
    }


CASES = [(name, col) for name in EXPECTED for col in COLUMNS]


def test_the_matrix_covers_what_it_claims():
    assert len(PROFILES) >= 16 and set(PROFILES) == set(EXPECTED) == set(NATIVE)
    assert all(len(row) == len(COLUMNS) for row in EXPECTED.values())
    kinds = {p.kind for p in PROFILES.values()}
    assert {"cpu", "cuda", "rocm", "mps"} <= kinds
    assert {p.gpu_count for p in PROFILES.values() if p.is_gpu} >= {1, 8}


@pytest.mark.parametrize(("profile", "column"), CASES, ids=[f"{n}-{c}" for n, c in CASES])
def test_decision(profile, column):
    want = EXPECTED[profile][COLUMNS.index(column)]
    got = decisions(PROFILES[profile])[column]
    assert got == want, f"{profile}: {column} should be {want!r}, course.device says {got!r}"


@pytest.mark.parametrize("profile", list(NATIVE))
def test_native_arithmetic(profile):
    p = PROFILES[profile]
    assert (p.native_bf16, p.fp16_tensor_cores) == NATIVE[profile]


@pytest.mark.parametrize(
    ("profile", "dtype", "backends"),
    [
        ("T4", torch.float16, ("efficient", "math")),
        ("T4", torch.bfloat16, ("math",)),
        ("A100-40GB", torch.bfloat16, ("flash", "cudnn", "efficient", "math")),
        ("H200", torch.float32, ("efficient", "math")),
        ("MI300Xx8", torch.bfloat16, ("flash", "efficient", "math")),
        ("mac-m3-15", torch.float16, ("math",)),
        ("cpu-avx2", torch.float32, ("flash", "math")),
    ],
)
def test_sdpa_backends(profile, dtype, backends):
    assert PROFILES[profile].sdpa_backends(dtype) == backends


def test_the_whole_matrix_is_fast():
    start = time.perf_counter()
    for p in PROFILES.values():
        decisions(p)
        D.amp_sentence(p), D.ranks_sentence(p), D.float8_sentence(p), p.describe()
    assert time.perf_counter() - start < 5.0


# ---------------------------------------------------------------------------------------------
# The sentences the lessons print read right on each device


@pytest.mark.parametrize(
    ("profile", "words"),
    [
        ("T4", ("float16", "GradScaler", "no bfloat16", "7.5")),
        ("V100x8", ("float16", "GradScaler", "7.0")),
        ("A100-40GB", ("bfloat16", "no GradScaler")),
        ("mac-m1-14", ("float16", "GradScaler", "bfloat16 also works")),
        ("mac-m3-15", ("float16", "bfloat16 also works")),
        ("cpu-avx2", ("bfloat16", "no native bfloat16", "slower")),
        ("cpu-amx", ("bfloat16", "natively")),
    ],
)
def test_amp_sentence(profile, words):
    text = D.amp_sentence(PROFILES[profile])
    assert all(w in text for w in words), text


@pytest.mark.parametrize(
    ("profile", "words"),
    [
        ("L4", ("yes", "8.9")),
        ("RTX4090", ("yes",)),
        ("A100-40GB", ("no", "8.0", "8.9 or newer")),
        ("T4", ("no", "7.5")),
        ("MI300Xx8", ("no", "ROCm", "float8_e4m3fnuz")),
        ("mac-m3-15", ("no", "mps")),
    ],
)
def test_float8_sentence(profile, words):
    text = D.float8_sentence(PROFILES[profile])
    assert all(w in text for w in words), text


@pytest.mark.parametrize(
    ("profile", "words"),
    [
        ("mac-m3-15", ("gloo", "MPS tensors")),
        ("windows-4090", ("gloo", "no NCCL")),
        ("H200", ("gloo", "one GPU per rank", "1 is visible")),
        ("H100-SXMx8", ("nccl", "2 GPUs")),
        ("cpu-amx", ("gloo", "no GPU")),
    ],
)
def test_ranks_sentence(profile, words):
    text = D.ranks_sentence(PROFILES[profile])
    assert all(w in text for w in words), text


def test_lesson_device_sentence_says_what_mps_lacks():
    mac = PROFILES["mac-m3-15"]
    assert "float8" in D.lesson_device_sentence(mac, ("float8",))
    assert D.lesson_device_sentence(mac, ()) == ""
    assert "float64" in D.lesson_device_sentence(PROFILES["mac-m1-14"], None)
    assert D.lesson_device_sentence(PROFILES["T4"], None) == ""


# ---------------------------------------------------------------------------------------------
# The two bugs, through the live-torch paths


def fake_cuda(monkeypatch, name: str, capability: tuple[int, int]) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    monkeypatch.setattr(torch.version, "hip", None)


def test_a_t4_trains_in_float16_although_torch_says_bf16_is_supported(monkeypatch):
    fake_cuda(monkeypatch, "Tesla T4", (7, 5))
    # what torch.cuda.is_bf16_supported() returns on a T4 (including_emulation=True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert D.amp_dtype_for(torch.device("cuda")) == torch.float16
    assert "no bfloat16 tensor cores" in B.unsupported_reason("bf16-amp", "cuda")
    fake_cuda(monkeypatch, "NVIDIA A100-SXM4-40GB", (8, 0))
    assert D.amp_dtype_for(torch.device("cuda")) == torch.bfloat16


def test_an_l40s_is_not_an_l4(monkeypatch):
    fake_cuda(monkeypatch, "NVIDIA L40S", (8, 9))
    assert B.datasheet_peak("cuda", "bf16") == pytest.approx(362.05e12)
    for name in ("NVIDIA A10G", "NVIDIA H100 NVL", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", "L4"):
        fake_cuda(monkeypatch, name, (8, 9))
        assert B.datasheet_peak("cuda", "bf16") is None, name
    fake_cuda(monkeypatch, "NVIDIA L4", (8, 9))
    assert B.datasheet_peak("cuda", "bf16") == pytest.approx(121e12)


def test_every_reported_name_matches_only_its_own_product():
    for product, names in D.REPORTED_NAMES.items():
        for name in names:
            assert D.datasheet_product(name) == product
            assert D.datasheet_product(name + " X") is None


# ---------------------------------------------------------------------------------------------
# MPS, simulated


@pytest.fixture
def fake_mac(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "get_name", lambda: "Apple M3 Pro")
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(D.platform, "mac_ver", lambda: ("15.1", ("", "", ""), "arm64"))
    monkeypatch.setattr(D.subprocess, "run", lambda *a, **k: type("R", (), {"stdout": ""})())
    monkeypatch.delenv("COURSE_DEVICE", raising=False)


def test_pick_device_picks_mps_on_a_mac(fake_mac):
    assert D.pick_device() == torch.device("mps")
    profile = D.DeviceProfile.current()
    assert profile.kind == "mps" and profile.os_version == (15, 1) and profile.arch == "M3"
    assert profile.native_bf16 and D.amp_dtype(profile) == torch.float16


def test_setup_runs_a_lesson_on_mps_only_where_it_has_what_the_lesson_needs(fake_mac, capsys):
    env = D.setup(needs=())
    assert env.device == torch.device("mps") and env.amp_dtype == torch.float16
    env = D.setup(needs=("float8",))
    assert env.device == torch.device("cpu")
    assert "float8" in capsys.readouterr().out
    from course.launch import fork_is_safe, pick_backend

    ranks = pick_backend(2)
    assert ranks.name == "gloo" and ranks.device_type == "cpu"
    assert isinstance(fork_is_safe(), bool)


def test_the_live_profile_of_this_machine():
    p = D.DeviceProfile.current()
    assert p.kind in D.KINDS and p.describe()
    assert D.amp_dtype(p) in (torch.float16, torch.bfloat16)
    with pytest.raises(ValueError, match="kind"):
        DeviceProfile(kind="tpu", name="x")


def test_a_cpu_names_its_thread_count_in_words(monkeypatch):
    """The CPU's description counts its threads in English: '1 thread', '2 threads'."""
    cpu = DeviceProfile(kind="cpu", name="Test CPU")
    for threads, words in ((1, "(1 thread, "), (2, "(2 threads, ")):
        monkeypatch.setattr(torch, "get_num_threads", lambda n=threads: n)
        assert words in cpu.describe()


def test_no_mps_profile_below_macos_14():
    """torch 2.10 and newer have no MPS below macOS 14 (``torch.backends.mps.is_available()``
    is False there; pytorch/pytorch#163515, #177819): such a Mac is a CPU to the course."""
    with pytest.raises(ValueError, match="macOS 14.0 or newer"):
        DeviceProfile(kind="mps", name="Apple M1", os="darwin", os_version=(13, 6))
    assert DeviceProfile(kind="mps", name="Apple M1", os="darwin", os_version=(14, 0)).native_bf16


def test_capstone_plan_steps_and_the_quick_smoke_run(monkeypatch):
    """300 parity steps on a GPU, 200 for a format the CPU has natively, 20 for one it emulates;
    COURSE_QUICK gives every format QUICK_STEPS and leaves what is native as it is."""
    monkeypatch.delenv("COURSE_QUICK", raising=False)
    full = {
        name: D.capstone_plan(PROFILES[name])
        for name in ("cpu-avx2", "cpu-avx512bf16", "H100-PCIe")
    }
    assert full["H100-PCIe"]["steps"] == {"bf16": 300, "fp16": 300}
    assert full["cpu-avx512bf16"]["steps"] == {"bf16": 200, "fp16": 20}
    assert full["cpu-avx2"]["steps"] == {"bf16": 20, "fp16": 20}
    assert full["cpu-avx512bf16"]["native"] == {"bf16": True, "fp16": False}
    assert not any(plan["quick"] for plan in full.values())
    monkeypatch.setenv("COURSE_QUICK", "1")
    for name, plan in full.items():
        quick = D.capstone_plan(PROFILES[name])
        assert quick["quick"] and quick["steps"] == dict.fromkeys(("bf16", "fp16"), D.QUICK_STEPS)
        assert plan["val_tokens"] is None and quick["val_tokens"] == D.QUICK_VAL_TOKENS
        smoke = ("steps", "quick", "val_tokens")
        assert {k: v for k, v in quick.items() if k not in smoke} == {
            k: v for k, v in plan.items() if k not in smoke
        }
    monkeypatch.setenv("COURSE_QUICK", "0")
    assert not D.capstone_plan(PROFILES["H100-PCIe"])["quick"]
