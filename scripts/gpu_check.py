"""Everything the course claims about GPUs, checked on a machine with one, in one command.

    .venv/bin/python scripts/gpu_check.py            # or: python3 run.py gpu-check

1. says which torch it runs under and which of the APIs the course reads (written against torch
   2.13) that torch has (an older torch, such as a GPU image's, may lack some);
2. executes every solution notebook (on the GPU when present: ``course.setup`` picks it) and
   grades it: every autograded cell must earn full marks. With nbgrader installed it grades with
   nbgrader; without it (a GPU image holds no Jupyter) each notebook runs in a fresh Python
   process, cell by cell, and an autograded cell earns its points when it runs without an error,
   as nbgrader scores a solution;
3. confirms lesson 03's CUDA float16 autocast lists (read from torch's header) against what CUDA
   autocast really does, op by op and layer by layer;
4. runs lesson 09's solution of ``distributed_step`` on the GPU: 2 ranks sharing it through gloo
   with NCCL's device map (``"cuda:gloo"``), 1 rank under NCCL, and a control (its token count
   on the CPU) that must fail there;
5. runs lesson 09's benchmark on its GPT (fp32, TF32, fp16-AMP with GradScaler, bf16-AMP, eager,
   and bf16-AMP under ``torch.compile``) and prints its table with the lesson's targets beside it.
   Lessons 07 and 08 run their own GPU paths (nccl where there are 2+ GPUs; float8 matmuls on
   compute capability 8.9+) inside step 2.

``--archive FILE.tar.gz`` bundles every executed notebook and this run's log into one file.
``--bundle DIR`` builds what a machine without the course's Python packages needs carried: the
pure-Python wheels (``py3-none-any``) of the packages the course imports that such an image lacks,
made from this environment's installed copies, and checks their size; ``--device-command``
prints the command that installs them there and runs this check.

Exits non-zero on any failure. On a machine without CUDA it runs what it can on the CPU and says
what it skipped; ``--require-gpu`` makes a missing GPU a failure.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import csv
import hashlib
import importlib.metadata as md
import io
import json
import linecache
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from course.device import DeviceProfile, describe_device  # noqa: E402

#: APIs of torch 2.13 that the course or its prose names, each with what the course does where
#: torch lacks it. Probed by :func:`torch_features`. Torch 2.11 has every one (read from its
#: wheel); what 2.11 lacks is listed in ``scripts/older_torch.py``.
FEATURES: tuple[tuple[str, str], ...] = (
    ("torch.nn.functional.scaled_mm", "lesson 08 calls torch._scaled_mm, which older torch has"),
    ("torch.nn.functional.ScalingType", "named in lesson 08's prose only"),
    (
        "torch.backends.cuda.matmul.fp32_precision",
        "the benchmark sets TF32 through set_float32_matmul_precision and cudnn.allow_tf32 instead",
    ),
    ("torch.backends.cudnn.conv.fp32_precision", "named in lesson 01's prose only"),
    ("torch.accelerator.is_available", "the launcher would need torch.cuda.is_available"),
    ("torch.float8_e8m0fnu", "lesson 08's MX scales are kept as integer exponents"),
    ("torch.distributed.fsdp.fully_shard", "lessons 05 and 07 need FSDP2"),
    (
        "torch.distributed.tensor._dispatch.found_inf_reduce_handler",
        "lesson 07's claim that the plain GradScaler all-reduces FSDP2's inf check rests on it",
    ),
    ("torch.amp.GradScaler", "every loss-scaling lesson"),
)
#: The packages the course imports on top of torch, numpy, matplotlib, scikit-learn, cloudpickle
#: and psutil (which a GPU image holds): the roots of what ``--bundle`` carries.
CARRY_ROOTS: tuple[str, ...] = ("ipywidgets", "ipython")
#: Distributions a GPU machine's image already holds (its ``pip list``): never carried.
IMAGE_HAS: frozenset[str] = frozenset(
    "pygments typing-extensions typing_extensions psutil cloudpickle numpy matplotlib "
    "scikit-learn pandas torch packaging jinja2 markupsafe six python-dateutil setuptools "
    "pip wheel pyyaml tqdm requests idna urllib3 certifi filelock fsspec sympy mpmath "
    "networkx triton attrs".split()
)
#: Distributions whose compiled part is optional (a pure-Python fallback is imported when it is
#: missing): carried without it.
OPTIONAL_COMPILED: frozenset[str] = frozenset({"wcwidth"})
#: What a device run may carry and bring back: the working tree plus carried paths, in bytes.
CARRY_LIMIT = 64 * 2**20


def _probe(dotted: str) -> bool:
    """Whether ``dotted`` (``torch.x.y``) resolves: modules imported, attributes read."""
    parts = dotted.split(".")
    obj = None
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        if obj is not None:
            try:
                obj = getattr(obj, parts[i - 1])
                continue
            except AttributeError:
                pass
        try:
            obj = __import__(name, fromlist=["_"])
        except ImportError:
            return False
    return obj is not None


def torch_features() -> dict[str, bool]:
    """Which of :data:`FEATURES` this torch has."""
    return {name: _probe(name) for name, _ in FEATURES}


def hide_newer_apis() -> list[str]:
    """Make this process's torch behave as torch 2.11, the oldest the course runs on, where the
    course can tell (``scripts/older_torch.py``: what 2.11 lacks, read from its wheel): the
    rehearsal of a run under it, ``--hide-newer-apis``. Returns what it changed."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("older_torch", ROOT / "scripts/older_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.hide_newer_apis()


class Report:
    """PASS / FAIL / SKIP / INFO lines, kept for the log, and the exit code they add up to."""

    def __init__(self) -> None:
        self.failed: list[str] = []
        self.lines: list[str] = []

    def say(self, text: str) -> None:
        print(text, flush=True)
        self.lines.append(text)

    def line(self, status: str, what: str, detail: str = "") -> None:
        self.say(f"[{status}] {what}" + (f": {detail}" if detail else ""))
        if status == "FAIL":
            self.failed.append(what)


def solution_lessons() -> list[str]:
    """The lesson ids under solutions/ (``NN-topic`` folders holding ``NN-topic.ipynb``)."""
    return sorted(
        p.name
        for p in (ROOT / "solutions").iterdir()
        if re.fullmatch(r"\d\d-[a-z0-9-]+", p.name) and (p / f"{p.name}.ipynb").is_file()
    )


# --------------------------------------------------------------------------------------------
# Executing a notebook without Jupyter


def _text_output(name: str, text: str) -> dict:
    return {"output_type": "stream", "name": name, "text": text}


def run_notebook(source: Path, dest: Path, hide: bool = False) -> dict[str, list[float]]:
    """Execute ``source``'s code cells in order in this process and write the executed notebook
    (outputs, errors) to ``dest``; return ``{grade_id: [score, max_score]}`` of its autograded
    cells. A cell that raises is recorded and the next one runs, as nbgrader does."""
    if hide:
        hide_newer_apis()
    os.environ.setdefault("MPLBACKEND", "Agg")
    nb = json.loads(source.read_text(encoding="utf-8"))
    namespace: dict = {"__name__": "__main__", "__builtins__": __builtins__}
    scores: dict[str, list[float]] = {}
    os.chdir(dest.parent)
    Path(f"{dest}.started").touch()  # the parent's time limit counts from here
    for count, cell in enumerate((c for c in nb["cells"] if c["cell_type"] == "code"), 1):
        code = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        out, err = io.StringIO(), io.StringIO()
        outputs: list[dict] = []
        failed = False
        # As IPython does, the cell's source goes into linecache, so `inspect.getsource` finds
        # the functions it defines (lessons 06 and 09 write a learner's function to a script).
        filename = f"<cell {count}>"
        linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                exec(compile(code, filename, "exec"), namespace)
            except BaseException as exc:  # noqa: BLE001 - recorded in the notebook, as Jupyter does
                failed = True
                error = {
                    "output_type": "error",
                    "ename": type(exc).__name__,
                    "evalue": str(exc),
                    "traceback": traceback.format_exc().splitlines(),
                }
            with contextlib.suppress(Exception):
                import matplotlib.pyplot as plt

                plt.close("all")
        for name, buffer in (("stdout", out), ("stderr", err)):
            if buffer.getvalue():
                outputs.append(_text_output(name, buffer.getvalue()))
        if failed:
            outputs.append(error)
        cell["outputs"], cell["execution_count"] = outputs, count
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if meta.get("grade") and not meta.get("solution"):
            points = float(meta.get("points") or 0)
            scores[meta.get("grade_id", f"cell-{count}")] = [0.0 if failed else points, points]
        # after every cell, so a run stopped by a time limit keeps what it ran
        dest.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return scores


#: Seconds of cells a lesson gets even when it starts at ``--deadline``, and how long its
#: process may take to import torch before the first cell.
FIRST_CELLS_S, IMPORT_GRACE_S = 10.0, 120.0


def grade_in_process(
    lesson: str, work: Path, hide: bool, timeout: float = 3600.0, deadline: float | None = None
) -> dict[str, list[float]]:
    """Run :func:`run_notebook` for ``lesson`` in a fresh Python process (its own GPU context,
    its own working folder); the executed notebook lands in ``work/lesson/``. It is stopped
    ``timeout`` seconds after its first cell, and at ``deadline`` (a ``time.monotonic()`` value)
    once it has run :data:`FIRST_CELLS_S` of cells: the time a busy machine spends importing
    torch (up to :data:`IMPORT_GRACE_S` past the deadline) does not count against its cells."""
    folder = work / lesson
    folder.mkdir(parents=True, exist_ok=True)
    source = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    scores_file = folder / "scores.json"
    command = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--run-notebook",
        str(source),
        "--out",
        str(folder / f"{lesson}.ipynb"),
        "--scores",
        str(scores_file),
    ]
    if hide:
        command.append("--hide-newer-apis")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
    }
    started = folder / f"{lesson}.ipynb.started"
    started.unlink(missing_ok=True)
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    launched, begun = time.monotonic(), None
    while True:
        try:
            _, stderr = proc.communicate(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            now = time.monotonic()
            if begun is None and started.exists():
                begun = now
            if begun is None:
                stop = launched + timeout + IMPORT_GRACE_S
                if deadline is not None:
                    stop = min(stop, deadline + IMPORT_GRACE_S)
            else:
                stop = begun + timeout
                if deadline is not None:
                    stop = min(stop, max(deadline, begun + FIRST_CELLS_S))
            if now > stop:
                proc.kill()
                proc.communicate()
                ran = 0.0 if begun is None else now - begun
                raise RuntimeError(
                    f"{lesson} was stopped after {ran:.0f} s of cells (--deadline)"
                ) from None
    if proc.returncode != 0 or not scores_file.exists():
        raise RuntimeError(f"{lesson} did not run: {stderr[-2000:]}")
    return json.loads(scores_file.read_text())


def grade_with_nbgrader(lesson: str, work: Path) -> dict[str, list[float]]:
    """nbgrader's autograde of ``lesson``'s solution; the executed notebook lands in
    ``work/lesson/``."""
    from grader.gradebook import autograde_notebooks

    nb = ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    scores = autograde_notebooks(lesson, {"gpu-check": nb}, work / lesson / "course")["gpu-check"]
    graded = work / lesson / "course" / "autograded" / "gpu-check" / lesson / f"{lesson}.ipynb"
    shutil.copy2(graded, work / lesson / f"{lesson}.ipynb")
    return {k: [v.score, v.max_score] for k, v in scores.items() if v.auto}


def pick_executor(choice: str) -> str:
    """``nbgrader`` where it is installed (or asked for), else ``inprocess``."""
    if choice != "auto":
        return choice
    try:
        import nbgrader  # noqa: F401
    except ImportError:
        return "inprocess"
    return "nbgrader"


#: Lessons started first, because they take longest on a GPU (the pool finishes sooner).
SLOWEST_FIRST: tuple[str, ...] = ("09-capstone", "07-sharded", "06-multi-gpu", "08-float8")


def check_lessons(
    report: Report,
    lessons: list[str],
    jobs: int,
    work: Path,
    executor: str,
    hide: bool,
    deadline: float | None = None,
) -> list[Path]:
    """Grade every lesson, ``jobs`` at a time, none past ``deadline`` (a ``time.monotonic()``
    value); returns the executed notebooks."""
    report.say(f"grading {len(lessons)} lesson(s) with {executor}, {jobs} at a time")

    def one(lesson: str) -> tuple[str, dict, float]:
        started = time.monotonic()
        if executor == "nbgrader":
            scores = grade_with_nbgrader(lesson, work)
        else:
            scores = grade_in_process(lesson, work, hide, deadline=deadline)
        return lesson, scores, time.monotonic() - started

    kept = []
    order = sorted(lessons, key=lambda x: SLOWEST_FIRST.index(x) if x in SLOWEST_FIRST else 99)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        started = {lesson: pool.submit(one, lesson) for lesson in order}
        futures = [started[lesson] for lesson in lessons]
        for lesson, future in zip(lessons, futures, strict=True):
            try:
                _, scores, seconds = future.result()
            except Exception as exc:  # noqa: BLE001 - reported, and the run goes on
                report.line("FAIL", f"{lesson} autograde", f"{exc}")
                continue
            finally:
                if (work / lesson / f"{lesson}.ipynb").exists():
                    kept.append(work / lesson / f"{lesson}.ipynb")
            lost = {k: f"{a:g}/{b:g}" for k, (a, b) in scores.items() if a != b}
            total, best = sum(a for a, _ in scores.values()), sum(b for _, b in scores.values())
            if lost or not scores:
                report.line("FAIL", f"{lesson} autograde", f"lost points on {lost or 'no cells'}")
            else:
                report.line(
                    "PASS", f"{lesson} autograde", f"{total:g}/{best:g} points, {seconds:.0f} s"
                )
    return kept


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
        # The ~100M-parameter GPT at a realistic batch, eager, and bf16-AMP compiled (the MFU
        # target; compiling every mode would take minutes more).
        args += ["bf16-amp+compile", "--gpt-size", "gpu", "--batch-size", "32", "--repeats", "2"]
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


def solution_functions(folder: Path) -> Path:
    """Lesson 09's solution of ``distributed_step`` (its step, ``save_checkpoint`` and
    ``load_checkpoint``) written out as the notebook writes a learner's: a script file for
    ``course.gpt_train --functions``."""
    from course.gpt_train import FUNCTIONS_HEADER

    nb = json.loads((ROOT / "solutions" / "09-capstone" / "09-capstone.ipynb").read_text())
    for cell in nb["cells"]:
        if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == "distributed_step":
            source = "".join(cell["source"])
            break
    else:
        raise RuntimeError("lesson 09 has no distributed_step cell")
    code = "\n".join(
        line
        for line in source.splitlines()
        if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line
    )
    path = folder / "solution_step.py"
    path.write_text(FUNCTIONS_HEADER + "\n\n" + code + "\n")
    return path


def check_resume(
    report: Report,
    device: str,
    work: Path,
    dtypes: tuple[str, ...] = ("fp16", "bf16"),
    quick: bool = False,
    functions: Path | None = None,
) -> None:
    """Lesson 09's checkpoint and resume on ``device`` (one process, ``course.gpt_train``): a
    run stopped after step 3 and resumed from its checkpoint against one that never stopped,
    in float16 (with the GradScaler's state) and bfloat16, with dropout (the generators' states
    matter). Fails if the resume raises; says whether the weights came out bit for bit equal
    (the lesson's tests check that on a CPU; on a GPU non-deterministic kernels may differ).
    ``quick``: a one-block model of width 64 (for tests); ``functions``: another script file
    than the solution's."""
    folder = work / "resume"
    folder.mkdir(parents=True, exist_ok=True)
    functions = functions or solution_functions(folder)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    small = ["--d-model", "64", "--n-layer", "1", "--block-size", "64"] if quick else []
    for dtype in dtypes:
        common = [
            sys.executable, "-m", "course.gpt_train", *small, "--functions", str(functions),
            "--steps", "6", "--batch-size", "4", "--accum", "2", "--dropout", "0.1",
            "--dtype", dtype, "--corpus-bytes", "200000",
            "--backend", "auto" if device == "cuda" else "gloo",
            "--checkpoint", str(folder / f"{dtype}.pt"),
        ]  # fmt: skip
        results = {}
        for name, extra in (("unbroken", ["--save-at", "3"]), ("resumed", ["--resume"])):
            out = folder / f"{dtype}-{name}.json"
            done = subprocess.run(
                [*common, *extra, "--out", str(out)], capture_output=True, text=True, env=env,
                timeout=600, cwd=folder,
            )  # fmt: skip
            if done.returncode != 0 or not out.exists():
                report.line("FAIL", f"lesson 09 resume on {device} ({dtype})",
                            f"the {name} run failed: {done.stderr[-1500:]}")  # fmt: skip
                break
            results[name] = json.loads(out.read_text())
        else:
            a, b = results["unbroken"], results["resumed"]
            same = a["digest"] == b["digest"]
            tail = a["losses"][-len(b["losses"]) :]
            worst = max((abs(x - y) for x, y in zip(tail, b["losses"], strict=True)), default=0.0)
            detail = (
                f"resumed at step {b['start_step']}: weights "
                f"{'bit for bit equal' if same else 'differ'} to the unbroken run's, "
                f"largest loss difference {worst:.3g}"
            )
            ok = same or device != "cpu"
            report.line("PASS" if ok else "FAIL", f"lesson 09 resume on {device} ({dtype})", detail)


#: Lesson 09's ``distributed_step`` on the GPU, as (backend, ranks): NCCL refuses two ranks on
#: one GPU, so two ranks share it through gloo given NCCL's device map (``"cuda:gloo"``: only
#: CUDA tensors have a backend, so a collective on a CPU tensor raises as it does under NCCL),
#: and one rank runs under NCCL itself, joined as ``course.launch.init_torchrun`` joins it.
STEP_RUNS: tuple[tuple[str, int], ...] = (("cuda:gloo", 2), ("nccl", 1))
#: What a collective on a tensor of a device type without a backend raises (torch 2.13's
#: ``ProcessGroup::getBackend``).
NO_BACKEND = "No backend type associated with device type"


def cpu_count_control(functions: Path, folder: Path) -> Path | None:
    """The solution's step file with its token count made on the CPU (the all-reduce of a CPU
    tensor), a control the GPU runs must refuse; None if the line is not found."""
    source = functions.read_text()
    line = "dtype=torch.float64, device=device)"
    if source.count(line) < 1:
        return None
    path = folder / "control_cpu_count.py"
    path.write_text(source.replace(line, "dtype=torch.float64)", 1))
    return path


def step_rank(rank: int, world: int, backend: str, device_type: str, functions: Path,
              folder: Path) -> int:  # fmt: skip
    """One rank of :func:`run_step_ranks`: join ``backend``'s group, train lesson 09's graded run
    (seed 0) on ``device_type`` with the step in ``functions``, write ``rank<r>.json``."""
    import torch.distributed as dist

    from course import gpt_train as T

    device = torch.device(device_type, 0) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    extra = {"device_id": device} if backend == "nccl" else {}
    out: dict = {"ok": False}
    try:
        dist.init_process_group(
            backend,
            init_method=(folder / "store").as_uri(),
            rank=rank,
            world_size=world,
            **extra,
        )
        spec = T.graded_spec(0, str(folder / "run.pt"))
        got = T.train(spec, device, T.load_functions(functions))
        out = {"ok": True, **{k: got[k] for k in ("losses", "stepped", "allreduces", "digest")}}
    except Exception as exc:  # noqa: BLE001 - reported by the parent
        out = {"ok": False, "error": f"{type(exc).__name__}: {exc}"[:1500]}
    finally:
        (folder / f"rank{rank}.json").write_text(json.dumps(out))
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
    return 0


def run_step_ranks(backend: str, world: int, device_type: str, functions: Path, folder: Path,
                   timeout: float = 300) -> list[dict]:  # fmt: skip
    """Lesson 09's graded run on ``world`` processes (each a :func:`step_rank`) in a process
    group of ``backend``; each rank's result, or ``{"ok": False, "error": ...}``."""
    folder.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve()),
                "--step-rank",
                str(rank),
                "--step-world",
                str(world),
                "--step-backend",
                backend,
                "--step-device",
                device_type,
                "--step-functions",
                str(functions),
                "--step-folder",
                str(folder),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=folder,
        )  # fmt: skip
        for rank in range(world)
    ]
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            proc.kill()
            logs.append(proc.communicate()[0] + f"\n(killed after {timeout:g} s)")
    results = []
    for rank, log in enumerate(logs):
        path = folder / f"rank{rank}.json"
        results.append(
            json.loads(path.read_text()) if path.exists() else {"ok": False, "error": log[-1500:]}
        )
    return results


def check_step_on_device(
    report: Report,
    device_type: str,
    work: Path,
    runs: tuple[tuple[str, int], ...] = STEP_RUNS,
    functions: Path | None = None,
    control: bool = True,
    deadline: float | None = None,
) -> None:
    """Lesson 09's solution of ``distributed_step`` on ``device_type`` in each of ``runs``: it
    must train on every rank, with the same losses on all. With ``control``, the first
    multi-rank run also gets the step with its token count on the CPU, which must fail with
    :data:`NO_BACKEND` (else this check could not see that mistake). No launch starts with
    less than a minute left before ``deadline``, and none runs past it."""

    def seconds_left(what: str) -> float | None:
        left = 300.0 if deadline is None else min(300.0, deadline - time.monotonic())
        if left < 60:
            report.line("SKIP", what, "less than 60 s left before --deadline")
            return None
        return left

    folder = work / "step"
    folder.mkdir(parents=True, exist_ok=True)
    functions = functions or solution_functions(folder)
    for i, (backend, world) in enumerate(runs):
        what = f"lesson 09 distributed_step on {device_type}, {world} rank(s), {backend}"
        left = seconds_left(what)
        if left is None:
            continue
        ranks = run_step_ranks(
            backend, world, device_type, functions, folder / f"run{i}", timeout=left
        )
        errors = [f"rank {r}: {got['error']}" for r, got in enumerate(ranks) if not got["ok"]]
        if errors:
            report.line("FAIL", what, "; ".join(errors))
            continue
        same = all(got["losses"] == ranks[0]["losses"] for got in ranks)
        report.line(
            "PASS" if same else "FAIL",
            what,
            f"losses {[round(v, 4) for v in ranks[0]['losses']]}, stepped "
            f"{ranks[0]['stepped']}" + ("" if same else "; the ranks' losses differ"),
        )
    multi = next(((b, w) for b, w in runs if w > 1), None)
    if not control or multi is None:
        return
    backend, world = multi
    what = f"lesson 09 control: a token count on the CPU fails under {backend}"
    wrong = cpu_count_control(functions, folder)
    if wrong is None:
        report.line("FAIL", what, "the solution's count line was not found")
        return
    left = seconds_left(what)
    if left is None:
        return
    ranks = run_step_ranks(backend, world, device_type, wrong, folder / "control", timeout=left)
    errors = [got.get("error", "") for got in ranks if not got["ok"]]
    refused = any(NO_BACKEND in e for e in errors)
    report.line(
        "PASS" if refused else "FAIL",
        what,
        errors[0][:300] if refused else f"it did not ({errors or 'every rank trained'})",
    )


class Tee(io.TextIOBase):
    """A stream that writes to several streams (the terminal and the log)."""

    def __init__(self, *streams) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
            stream.flush()
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


def write_archive(path: Path, notebooks: list[Path], log: Path) -> int:
    """Every executed notebook and the log in one ``.tar.gz`` (one file to bring back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w:gz") as tar:
        for nb in notebooks:
            tar.add(nb, arcname=f"gpu_check/{nb.name}")
        tar.add(log, arcname="gpu_check/gpu_check.log")
    return path.stat().st_size


# --------------------------------------------------------------------------------------------
# What a machine without the course's packages needs carried


def _requirement_names(dist: md.Distribution) -> list[str]:
    """The distributions ``dist`` needs on Linux under Python 3.12 (no extras)."""
    from packaging.requirements import Requirement

    names = []
    for text in dist.requires or []:
        req = Requirement(text)
        env = {
            "python_version": "3.12",
            "sys_platform": "linux",
            "platform_system": "Linux",
            "implementation_name": "cpython",
            "platform_python_implementation": "CPython",
            "os_name": "posix",
            "extra": "",
        }
        if req.marker is None or req.marker.evaluate(env):
            names.append(req.name)
    return names


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carry_closure(roots: tuple[str, ...] = CARRY_ROOTS) -> list[md.Distribution]:
    """The installed distributions ``roots`` need, transitively, less :data:`IMAGE_HAS`."""
    has = {_norm(n) for n in IMAGE_HAS}
    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = _norm(todo.pop())
        if name in seen or name in has:
            continue
        dist = md.distribution(name)
        seen[name] = dist
        todo.extend(_requirement_names(dist))
    return [seen[k] for k in sorted(seen)]


def _is_pure(dist: md.Distribution) -> bool:
    if _norm(dist.metadata["Name"]) in OPTIONAL_COMPILED:
        return True
    wheel = dist.read_text("WHEEL") or ""
    tags = [line.split(":", 1)[1].strip() for line in wheel.splitlines() if line.startswith("Tag:")]
    return bool(tags) and all(t.endswith("-none-any") for t in tags)


PURE_WHEEL = "Wheel-Version: 1.0\nGenerator: gpu_check\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def build_wheel(dist: md.Distribution, folder: Path) -> Path:
    """A ``py3-none-any`` wheel of the installed pure-Python ``dist``, rebuilt from its files
    (RECORD), so nothing has to be downloaded."""
    name = dist.metadata["Name"].replace("-", "_")
    path = folder / f"{name}-{dist.version}-py3-none-any.whl"
    base = Path(dist.locate_file(""))
    records = []
    info_dir = None
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as whl:
        for file in dist.files or []:
            rel = file.as_posix()
            if rel.endswith(".pyc") or "__pycache__" in rel or rel.startswith(".."):
                continue
            if rel.endswith(".dist-info/RECORD"):
                info_dir = rel.rsplit("/", 1)[0]
                continue
            if rel.endswith((".dist-info/INSTALLER", ".dist-info/REQUESTED", "direct_url.json")):
                continue
            if rel.endswith((".so", ".pyd", ".dylib")):  # only in OPTIONAL_COMPILED ones
                continue
            data = (base / rel).read_bytes()
            if rel.endswith(".dist-info/WHEEL"):
                data = PURE_WHEEL.encode()
            whl.writestr(rel, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
            records.append([rel, f"sha256={digest.decode()}", str(len(data))])
        if info_dir is not None:
            out = io.StringIO()
            csv.writer(out).writerows([*records, [f"{info_dir}/RECORD", "", ""]])
            whl.writestr(f"{info_dir}/RECORD", out.getvalue())
    return path


def tree_bytes() -> int:
    """Bytes of the files git would send: tracked and untracked-but-not-ignored."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    return sum(
        (ROOT / p.decode()).stat().st_size for p in listed if p and (ROOT / p.decode()).is_file()
    )


def build_bundle(folder: Path) -> dict:
    """Write the carry wheels into ``folder``; say what they hold and whether they fit."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.whl"):
        old.unlink()
    dists = carry_closure()
    impure = [d.metadata["Name"] for d in dists if not _is_pure(d)]
    if impure:
        raise SystemExit(f"not pure-Python, cannot be carried as built here: {impure}")
    wheels = [build_wheel(d, folder) for d in dists]
    size = sum(w.stat().st_size for w in wheels)
    tree = tree_bytes()
    return {
        "wheels": [w.name for w in wheels],
        "bytes": size,
        "tree_bytes": tree,
        "fits": size + tree <= CARRY_LIMIT,
    }


DEVICE_COMMAND = (
    "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "
    "/tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 && "
    "python3 scripts/gpu_check.py --require-gpu --jobs 8 --deadline 500 "
    "--archive $OUT/gpu_check.tar.gz"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--require-gpu", action="store_true", help="fail if torch sees no GPU")
    parser.add_argument("--lessons", nargs="*", metavar="ID", help="lessons to grade (default all)")
    parser.add_argument("--jobs", type=int, default=4, help="lessons graded at once (default 4)")
    parser.add_argument("--quick", action="store_true", help="a short benchmark (for smoke tests)")
    parser.add_argument("--skip-benchmark", action="store_true", help="do not run the benchmark")
    parser.add_argument(
        "--skip-resume", action="store_true", help="do not check lesson 09's resume"
    )
    parser.add_argument(
        "--save", type=Path, metavar="DIR", help="keep each executed, graded notebook in DIR"
    )
    parser.add_argument(
        "--archive",
        type=Path,
        metavar="FILE",
        help="write the executed notebooks and the log to FILE (.tar.gz)",
    )
    parser.add_argument(
        "--executor",
        choices=("auto", "nbgrader", "inprocess"),
        default="auto",
        help="grade with nbgrader, or run each notebook in a plain Python "
        "process (default: nbgrader where it is installed)",
    )
    parser.add_argument(
        "--hide-newer-apis",
        action="store_true",
        help="rehearse torch 2.11: take away what it lacks (scripts/older_torch.py)",
    )
    parser.add_argument(
        "--bundle",
        type=Path,
        metavar="DIR",
        help="only build the wheels a machine without Jupyter needs, into DIR",
    )
    parser.add_argument(
        "--device-command",
        action="store_true",
        help="only print the command that runs this check on such a machine",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        help="stop lessons still running after S seconds, and skip the "
        "benchmark when less than 90 s are left (a time-limited machine)",
    )
    parser.add_argument(
        "--skip-step",
        action="store_true",
        help="do not run lesson 09's distributed_step on the GPU",
    )
    parser.add_argument("--run-notebook", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--step-rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--step-world", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--step-backend", help=argparse.SUPPRESS)
    parser.add_argument("--step-device", help=argparse.SUPPRESS)
    parser.add_argument("--step-functions", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--step-folder", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--scores", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.step_rank is not None:  # one rank of run_step_ranks
        return step_rank(
            args.step_rank,
            args.step_world,
            args.step_backend,
            args.step_device,
            args.step_functions,
            args.step_folder,
        )
    if args.run_notebook is not None:  # one lesson, in this (fresh) process
        scores = run_notebook(args.run_notebook, args.out.resolve(), args.hide_newer_apis)
        args.scores.write_text(json.dumps(scores))
        return 0
    if args.device_command:
        print(DEVICE_COMMAND)
        return 0
    if args.bundle is not None:
        info = build_bundle(args.bundle)
        print(
            f"{len(info['wheels'])} wheels, {info['bytes'] / 2**20:.1f} MiB, beside a working "
            f"tree of {info['tree_bytes'] / 2**20:.1f} MiB: "
            f"{'fits' if info['fits'] else 'DOES NOT FIT'} in {CARRY_LIMIT / 2**20:.0f} MiB"
        )
        print("\n".join(info["wheels"]))
        return 0 if info["fits"] else 1

    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    # Beside the archive the log is written as the run goes, so a run stopped from outside
    # still leaves it.
    log_path = (
        work / "gpu_check.log" if args.archive is None else args.archive.parent / "gpu_check.log"
    )
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log = log_path.open("w", encoding="utf-8", buffering=1)
    stdout = sys.stdout
    sys.stdout = Tee(stdout, log)
    try:
        code = _check(args, work)
    finally:
        sys.stdout = stdout
        log.close()
    notebooks = sorted(work.glob("*/*.ipynb"))
    if args.save is not None:
        args.save.mkdir(parents=True, exist_ok=True)
        for nb in notebooks:
            shutil.copy2(nb, args.save / nb.name)
    if args.archive is not None:
        size = write_archive(args.archive, notebooks, log_path)
        print(
            f"archive: {args.archive} ({len(notebooks)} notebooks and the log, "
            f"{size / 2**20:.1f} MiB)"
        )
    shutil.rmtree(work, ignore_errors=True)
    return code


def _check(args: argparse.Namespace, work: Path) -> int:
    report = Report()
    started = time.monotonic()
    deadline = None if args.deadline is None else started + args.deadline
    hidden = hide_newer_apis() if args.hide_newer_apis else []
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    print(f"gpu_check on {describe_device(device)}, Python {sys.version.split()[0]}", flush=True)
    if hidden:
        report.line("INFO", "rehearsing torch 2.11", "taken away: " + ", ".join(hidden))
    features = torch_features()
    lacks = [f"{n} ({why})" for n, why in FEATURES if not features[n]]
    report.line(
        "INFO",
        f"torch {torch.__version__} APIs",
        f"{sum(features.values())}/{len(features)} present"
        + (f"; lacks {'; '.join(lacks)}" if lacks else ""),
    )
    if not features["torch.distributed.fsdp.fully_shard"] or not features["torch.amp.GradScaler"]:
        report.line("FAIL", "torch APIs", "the course needs FSDP2 and torch.amp.GradScaler")
    profile = DeviceProfile.of(device)
    report.line(
        "INFO",
        "device profile",
        f"{profile.describe()}; bf16 native "
        f"{profile.native_bf16}, fp8 {[str(f) for f in profile.fp8_formats]}",
    )
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
    lessons = args.lessons or solution_lessons()
    executor = pick_executor(args.executor)
    check_lessons(report, lessons, args.jobs, work, executor, args.hide_newer_apis, deadline)
    report.say(f"lessons done after {time.monotonic() - started:.0f} s")
    if cuda:
        check_autocast_lists(report, "cuda", torch.float16)
        check_autocast_lists(report, "cuda", torch.bfloat16)
    else:
        report.line("SKIP", "CUDA autocast op lists", "needs a CUDA GPU")
    check_autocast_lists(report, "cpu", torch.bfloat16)
    if not args.skip_resume:
        check_resume(report, device.type, work)
    if cuda and not args.skip_step:
        check_step_on_device(report, "cuda", work, deadline=deadline)
    elif not args.skip_step:
        report.line("SKIP", "lesson 09 distributed_step on a GPU", "needs a CUDA GPU")
    if deadline is not None and deadline - time.monotonic() < 90 and not args.skip_benchmark:
        report.line("SKIP", "lesson 09 benchmark", "less than 90 s left before --deadline")
    elif not args.skip_benchmark:
        check_benchmark(report, device.type, args.quick)
    verdict = "FAILED: " + ", ".join(report.failed) if report.failed else "all checks passed"
    print(f"gpu_check: {verdict} ({time.monotonic() - started:.0f} s)", flush=True)
    return 1 if report.failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
