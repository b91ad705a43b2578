"""Everything the course claims about CUDA, checked on a machine with an NVIDIA GPU, in one command.

    .venv/bin/python scripts/gpu_check.py            # or: python3 run.py gpu-check

1. executes every solution notebook (on CUDA when present: ``course.setup`` picks it) and
   autogrades it with nbgrader: every autograded cell must earn full marks;
2. confirms lesson 03's CUDA float16 autocast lists (read from torch's header) against what CUDA
   autocast really does, op by op and layer by layer (lesson 03's hidden tests confirm its answer
   key the same way while step 1 grades it);
3. runs lesson 09's benchmark on its GPT (fp32, TF32, fp16-AMP with GradScaler, bf16-AMP, eager
   and under ``torch.compile`` on CUDA) and prints its table: step time, tokens/s, peak memory,
   speed-ups over fp32 and TF32 and MFU, with the lesson's performance targets beside them.
   Lessons 07 and 08 run their own GPU paths (nccl where there are 2+ GPUs; float8 matmuls on
   compute capability 8.9+) inside step 1.

Exits non-zero on any failure. On a machine without CUDA it runs what it can on the CPU and says
what it skipped; ``--require-gpu`` makes a missing GPU a failure.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course.device import describe_device  # noqa: E402
from grader.gradebook import autograde_notebooks  # noqa: E402
from grader.release import lesson_ids  # noqa: E402


class Report:
    """PASS / FAIL / SKIP lines, and the exit code they add up to."""

    def __init__(self) -> None:
        self.failed: list[str] = []

    def line(self, status: str, what: str, detail: str = "") -> None:
        print(f"[{status}] {what}" + (f": {detail}" if detail else ""), flush=True)
        if status == "FAIL":
            self.failed.append(what)


def grade_lesson(lesson: str, work: Path, save: Path | None) -> tuple[str, dict, float]:
    started = time.monotonic()
    nb = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    scores = autograde_notebooks(lesson, {"gpu-check": nb}, work / lesson)["gpu-check"]
    if save is not None:
        # The executed notebook, outputs and all: the figures it measured on this device.
        graded = work / lesson / "autograded" / "gpu-check" / lesson / f"{lesson}.ipynb"
        shutil.copy2(graded, save / f"{lesson}.ipynb")
    return lesson, scores, time.monotonic() - started


def check_lessons(report: Report, lessons: list[str], jobs: int, save: Path | None) -> None:
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp, ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(grade_lesson, lesson, Path(tmp), save) for lesson in lessons]
        for future in futures:
            try:
                lesson, scores, seconds = future.result()
            except Exception as exc:  # noqa: BLE001 - reported, and the run goes on
                report.line("FAIL", "autograde", f"{exc}")
                continue
            tests = {k: v for k, v in scores.items() if v.auto}
            lost = {
                k: f"{v.score:g}/{v.max_score:g}"
                for k, v in tests.items()
                if v.score != v.max_score
            }
            total = sum(v.score for v in tests.values())
            best = sum(v.max_score for v in tests.values())
            if lost or not tests:
                report.line("FAIL", f"{lesson} autograde", f"lost points on {lost or 'no cells'}")
            else:
                report.line(
                    "PASS", f"{lesson} autograde", f"{total:g}/{best:g} points, {seconds:.0f} s"
                )


#: One call per op, on float32 tensors, to read the dtype autocast gives it (lesson 03's lists:
#: the CUDA ones read from torch's header, the CPU ones measured).
def _op_calls(x: torch.Tensor, w: torch.Tensor) -> dict:
    return {
        "linear": lambda: F.linear(x, w),
        "matmul": lambda: x @ w,
        "conv2d": lambda: F.conv2d(x.view(1, 1, 8, 8), w.view(1, 1, 8, 8)[:, :, :3, :3]),
        "softmax": lambda: torch.softmax(x, -1),
        "log_softmax": lambda: F.log_softmax(x, -1),
        "layer_norm": lambda: F.layer_norm(x, (8,)),
        "exp": lambda: x.exp(),
        "sum": lambda: x.sum(),
        "relu": lambda: F.relu(x),
        "gelu": lambda: F.gelu(x),
        "mse_loss": lambda: F.mse_loss(x, w),
        "batch_norm": lambda: F.batch_norm(x, None, None, training=True),
        "binary_cross_entropy_with_logits": lambda: F.binary_cross_entropy_with_logits(x, w),
        "einsum": lambda: torch.einsum("ij,jk->ik", x, w),
        "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(
            x.view(1, 1, 8, 8), w.view(1, 1, 8, 8), w.view(1, 1, 8, 8)
        ),
        "logsumexp": lambda: torch.logsumexp(x, -1),
        "huber_loss": lambda: F.huber_loss(x, w),
        "nll_loss2d": lambda: F.nll_loss(
            x.view(1, 8, 8, 1), torch.zeros(1, 8, 1, dtype=torch.long, device=x.device)
        ),
        "cross_entropy": lambda: F.cross_entropy(x, torch.arange(8, device=x.device)),
        "mean": lambda: x.mean(),
        "cumsum": lambda: x.cumsum(-1),
    }


def check_autocast_lists(report: Report, device: str, dtype: torch.dtype) -> None:
    """Lesson 03's documented autocast lists against what autocast does on ``device``."""
    from course import autocast as ac

    where = device.upper()
    x = torch.randn(8, 8, device=device)
    w = torch.randn(8, 8, device=device)
    wrong = []
    calls = _op_calls(x, w)
    for op, call in calls.items():
        with torch.amp.autocast(device, dtype=dtype):
            got = call().dtype
        want = ac.documented_dtype(op, (torch.float32,), device, dtype)
        if got != want:
            wrong.append(f"{op}: documented {want}, measured {got}")
    checked = len(calls)
    if device == "cuda" and dtype == torch.float16:
        checked += 1
        with torch.amp.autocast(device, dtype=dtype):
            try:
                F.binary_cross_entropy(torch.sigmoid(x), torch.rand_like(x))
                wrong.append("binary_cross_entropy: documented as refused, but it ran")
            except RuntimeError:
                pass
    name = f"{where} autocast op lists ({ac.short(dtype)})"
    if wrong:
        report.line("FAIL", name, "; ".join(wrong))
    else:
        report.line("PASS", name, f"{checked} ops behave as documented")

    model = ac.row_attention(device=device)
    measured: dict[str, torch.dtype] = {}
    hooks = [
        module.register_forward_hook(
            lambda m, i, o, name=name: measured.__setitem__(
                name, (o[0] if isinstance(o, tuple) else o).dtype
            )
        )
        for name, module in model.named_modules()
        if name
    ]
    try:
        with torch.amp.autocast(device, dtype=dtype):
            model(ac.digit_images(4, device=device))
    finally:
        for h in hooks:
            h.remove()
    documented = ac.documented_layer_dtypes(ac.ROW_ATTENTION_OPS, device, dtype)
    diff = {k: (v, measured.get(k)) for k, v in documented.items() if measured.get(k) != v}
    name = f"lesson 03 documented {where} layer table ({ac.short(dtype)})"
    if not measured or diff:
        report.line("FAIL", name, f"documented vs measured: {diff or 'no layer ran'}")
    else:
        report.line("PASS", name, f"{len(documented)} layers match autocast")


def check_benchmark(report: Report, device: str, quick: bool) -> None:
    from course import benchmark

    args = ["--model", "gpt", "--device", device, "--modes", "fp32", "tf32", "fp16-amp", "bf16-amp"]
    if quick:
        args += ["--gpt-size", "cpu", "--repeats", "1", "--min-run-time", "0.05"]
        args += ["--batch-size", "2"]
    elif device == "cuda":
        # The ~100M-parameter GPT at a realistic batch, eager and compiled.
        args += ["--gpt-size", "gpu", "--batch-size", "32", "--repeats", "3", "--compile", "both"]
    print("$ python -m course.benchmark " + " ".join(args), flush=True)
    try:
        rows, dev = benchmark.run_from_args(args)
    except SystemExit as exc:
        report.line("FAIL", "lesson 09 benchmark", f"exit {exc.code}")
        return
    except Exception as exc:  # noqa: BLE001 - reported
        report.line("FAIL", "lesson 09 benchmark", repr(exc))
        return
    print(benchmark.format_table(rows, describe_device(dev)), flush=True)
    report.line("PASS", "lesson 09 benchmark", f"{sum(r.measured for r in rows)} modes measured")
    if device == "cuda":
        # TF32 changes the math, not what is stored: its peak memory must match fp32's. A gap
        # means one mode's peak includes something else (a workspace, a previous mode's model).
        peaks = {(r.size, r.mode): r.peak_memory for r in rows}
        for size in sorted({r.size for r in rows}):
            fp32, tf32 = peaks[(size, "fp32")], peaks[(size, "tf32")]
            if tf32 is None:  # a GPU older than Ampere has no TF32
                report.line("SKIP", "benchmark peak memory fp32 = tf32", "TF32 not measured")
                continue
            detail = f"size {size}: fp32 {fp32 / 2**20:.1f} MiB, tf32 {tf32 / 2**20:.1f} MiB"
            same = abs(fp32 - tf32) <= 0.02 * fp32
            report.line("PASS" if same else "FAIL", "benchmark peak memory fp32 = tf32", detail)
        # The lesson's performance targets for a large GPU: printed, not failed (a benchmark).
        by = {r.mode: r for r in rows if r.measured}
        if {"fp32", "tf32", "bf16-amp"} <= set(by):
            bf16 = by["bf16-amp"]
            print(
                f"targets: bf16-amp {bf16.speedup:.2f}x fp32 (target >= 3), "
                f"{bf16.speedup_tf32:.2f}x tf32 (>= 1.5), peak memory "
                f"{bf16.peak_memory / by['fp32'].peak_memory:.0%} of fp32's (<= 60%)",
                flush=True,
            )
        compiled = by.get("bf16-amp+compile")
        if compiled is not None and compiled.mfu_datasheet is not None:
            print(
                f"targets: bf16-amp+compile MFU {compiled.mfu_datasheet:.1%} (>= 35%)", flush=True
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--require-gpu", action="store_true", help="fail if torch sees no GPU")
    parser.add_argument("--lessons", nargs="*", metavar="ID", help="lessons to grade (default all)")
    parser.add_argument("--jobs", type=int, default=4, help="lessons graded at once (default 4)")
    parser.add_argument("--quick", action="store_true", help="a short benchmark (for smoke tests)")
    parser.add_argument("--skip-benchmark", action="store_true", help="do not run the benchmark")
    parser.add_argument(
        "--save", type=Path, metavar="DIR", help="keep each executed, graded notebook in DIR"
    )
    args = parser.parse_args(argv)

    report = Report()
    started = time.monotonic()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    print(f"gpu_check on {describe_device(device)}", flush=True)
    if not cuda and args.require_gpu:
        report.line("FAIL", "CUDA", "torch sees no GPU and --require-gpu was given")
        return 1
    if not cuda:
        report.line(
            "SKIP",
            "CUDA",
            "torch sees no GPU: notebooks run on the CPU, CUDA-only "
            "checks (autocast lists, TF32, fp16/bf16 speed and peak memory) are skipped",
        )
    lessons = args.lessons or lesson_ids(ROOT / "solutions")
    check_lessons(report, lessons, args.jobs, args.save)
    if cuda:
        check_autocast_lists(report, "cuda", torch.float16)
        check_autocast_lists(report, "cuda", torch.bfloat16)
    else:
        report.line("SKIP", "CUDA autocast op lists", "needs a CUDA GPU")
    check_autocast_lists(report, "cpu", torch.bfloat16)
    if not args.skip_benchmark:
        check_benchmark(report, device.type, args.quick)
    verdict = "FAILED: " + ", ".join(report.failed) if report.failed else "all checks passed"
    print(f"gpu_check: {verdict} ({time.monotonic() - started:.0f} s)", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
