"""The GPU check runs on a CPU-only machine, saying what it skips; its rehearsal of an older
torch and of a machine without Jupyter runs here too."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import nbformat
import pytest
import torch

from grader import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.py"


#: What a GPU image lacks: Jupyter's packages (the carry bundle brings IPython and ipywidgets).
JUPYTER_ONLY = ("nbformat", "nbgrader", "nbclient", "jupyter_client", "jupyter_core", "ipykernel")
#: A ``sitecustomize`` that makes those packages fail to import in every Python process started
#: with it on ``PYTHONPATH`` (the check's lesson processes inherit it).
BLOCKER = f"""
import importlib.abc, sys
class _Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {JUPYTER_ONLY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (hidden by the test)")
sys.meta_path.insert(0, _Blocker())
"""


def run(*args: str, without_jupyter: Path | None = None) -> subprocess.CompletedProcess[str]:
    """The check as a command; with ``without_jupyter`` (an empty folder), in processes where
    Jupyter's packages cannot be imported, as on a GPU image."""
    env = dict(os.environ)
    if without_jupyter is not None:
        (without_jupyter / "sitecustomize.py").write_text(BLOCKER)
        env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(without_jupyter), env.get("PYTHONPATH")])
        )
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=900,
        env=env,
    )


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_runs_on_this_machine(tmp_path):
    kept = str(tmp_path / "kept")
    proc = run("--lessons", "01-number-formats", "--quick", "--skip-resume", "--save", kept)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr
    assert "[PASS] 01-number-formats autograde" in out
    kept = nbformat.read(Path(kept) / "01-number-formats.ipynb", as_version=4)
    outputs = [o for c in kept.cells if c.cell_type == "code" for o in c.outputs]
    assert any("Running on" in o.get("text", "") for o in outputs), (
        "the executed notebook was not kept"
    )
    assert "fp32" in out and "bf16-amp" in out, "the benchmark table was not printed"
    if not torch.cuda.is_available():
        assert "[SKIP] CUDA autocast op lists: needs a CUDA GPU" in out
        assert "torch sees no GPU" in out
    assert "[PASS] CPU autocast op lists (bfloat16)" in out
    assert "[PASS] lesson 03 documented CPU layer table (bfloat16)" in out


def test_gpu_check_can_insist_on_a_gpu():
    if torch.cuda.is_available():
        return
    proc = run("--require-gpu", "--lessons", "01-number-formats")
    assert proc.returncode == 1
    assert "[FAIL] CUDA" in proc.stdout


def test_rehearsal_of_an_older_torch_without_jupyter(tmp_path):
    """The device's path: no nbgrader (each notebook in a plain process), torch 2.13's newer
    APIs hidden, one archive holding the executed notebook and the log. (The benchmark's CPU
    path is run by test_gpu_check_runs_on_this_machine.)"""
    archive = tmp_path / "out" / "gpu_check.tar.gz"
    blocker = tmp_path / "no-jupyter"
    blocker.mkdir()
    proc = run(
        "--lessons", "02-loss-scaling", "--executor", "inprocess", "--hide-newer-apis",
        "--skip-benchmark", "--skip-resume", "--archive", str(archive), without_jupyter=blocker,
    )  # fmt: skip
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert "[PASS] 02-loss-scaling autograde: 10/10 points" in out
    assert "rehearsing torch 2.11" in out and "torch.nn.functional.scaled_mm on a CPU" in out
    with tarfile.open(archive) as tar:
        names = sorted(tar.getnames())
        assert names == ["gpu_check/02-loss-scaling.ipynb", "gpu_check/gpu_check.log"]
        log = tar.extractfile("gpu_check/gpu_check.log").read().decode()
        nb = json.loads(tar.extractfile("gpu_check/02-loss-scaling.ipynb").read())
    assert "[PASS] 02-loss-scaling autograde" in log and "all checks passed" in log
    assert (archive.parent / "gpu_check.log").read_text() == log, "no live log beside it"
    texts = [
        o.get("text", "") for c in nb["cells"] if c["cell_type"] == "code" for o in c["outputs"]
    ]
    assert any("Running on" in t for t in texts)


def test_the_plain_executor_grades_as_nbgrader_scores_a_solution(tmp_path):
    """A graded cell earns its points only when it runs without an error, and torch 2.11's
    missing CPU kernel for F.scaled_mm is really missing inside the lesson's process (its
    fp32_precision settings stay: 2.11 has them)."""
    nb = nbformat.v4.new_notebook()

    def graded(source, grade_id, points):
        cell = nbformat.v4.new_code_cell(source)
        cell.metadata["nbgrader"] = {"grade": True, "solution": False, "points": points,
                                     "grade_id": grade_id, "locked": True}  # fmt: skip
        return cell

    nb.cells = [
        nbformat.v4.new_code_cell("import torch, torch.nn.functional as F\nprint('hello')"),
        graded(
            "a, one = torch.ones(16, 16).to(torch.float8_e4m3fn), torch.ones(())\n"
            "tw = F.ScalingType.TensorWise\n"
            "try:\n"
            "    F.scaled_mm(a, a.t(), one, tw, one, tw, output_dtype=torch.float32)\n"
            "except NotImplementedError:\n"
            "    pass\n"
            "else:\n"
            "    raise AssertionError('F.scaled_mm ran on the CPU')",
            "hidden",
            2,
        ),
        graded("torch.backends.cuda.matmul.fp32_precision", "fp32_precision_kept", 1),
        graded("assert 1 + 1 == 2", "fine", 3),
        nbformat.v4.new_code_cell("def f():\n    return 1"),
        graded("import inspect\nassert inspect.getsource(f).startswith('def f')", "source", 1),
    ]
    source = tmp_path / "t.ipynb"
    nbformat.write(nb, source)
    scores = tmp_path / "scores.json"
    out = tmp_path / "run" / "t.ipynb"
    out.parent.mkdir()
    args = ["--run-notebook", str(source), "--out", str(out), "--scores", str(scores)]
    proc = run(*args, "--hide-newer-apis")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(scores.read_text()) == {
        "hidden": [2.0, 2.0], "fp32_precision_kept": [1.0, 1.0], "fine": [3.0, 3.0],
        "source": [1.0, 1.0],
    }  # fmt: skip
    executed = json.loads(out.read_text())
    assert executed["cells"][0]["outputs"][0]["text"] == "hello\n"
    assert not any(o["output_type"] == "error" for o in executed["cells"][2]["outputs"])
    proc = run(*args)  # without the rehearsal, torch 2.13 runs scaled_mm on the CPU
    assert json.loads(scores.read_text())["hidden"] == [0.0, 2.0]


def test_the_carry_bundle_is_pure_python_and_fits(tmp_path):
    gc = load_script()
    info = gc.build_bundle(tmp_path / "whl")
    assert info["fits"], info
    assert info["bytes"] + info["tree_bytes"] <= 64 * 2**20
    names = {w.split("-")[0].lower() for w in info["wheels"]}
    assert {"ipywidgets", "ipython", "traitlets", "comm"} <= names
    assert not names & {n.replace("-", "_") for n in gc.IMAGE_HAS}, "carries what the image has"
    for wheel in (tmp_path / "whl").glob("*.whl"):
        assert wheel.name.endswith("-py3-none-any.whl")
        with zipfile.ZipFile(wheel) as whl:
            assert whl.testzip() is None
            files = whl.namelist()
            assert not [f for f in files if f.endswith((".so", ".pyd"))], wheel.name
            assert any(f.endswith(".dist-info/RECORD") for f in files)
            wheel_meta = next(f for f in files if f.endswith(".dist-info/WHEEL"))
            assert "Tag: py3-none-any" in whl.read(wheel_meta).decode()
    command = run("--device-command").stdout.strip()
    assert len(command) <= 2000 and ".whl/*.whl" in command and "$OUT/gpu_check.tar.gz" in command


def test_a_lesson_past_the_deadline_is_stopped_and_keeps_what_it_ran(tmp_path, monkeypatch):
    gc = load_script()
    lesson = "99-slow"
    folder = tmp_path / "solutions" / lesson
    folder.mkdir(parents=True)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(s) for s in ("print('first cell ran')", "while True: pass")
    ]
    nbformat.write(nb, folder / f"{lesson}.ipynb")
    monkeypatch.setattr(gc, "ROOT", tmp_path)
    report = gc.Report()
    kept = gc.check_lessons(
        report, [lesson], 1, tmp_path / "work", "inprocess", False, deadline=time.monotonic()
    )
    assert report.failed == [f"{lesson} autograde"]
    assert re.search(r"stopped after 1\d s of cells", report.lines[-1]), report.lines[-1]
    assert kept and "first cell ran" in kept[0].read_text()


def test_the_step_check_starts_nothing_it_cannot_finish_before_the_deadline(tmp_path):
    gc = load_script()
    report = gc.Report()
    started = time.monotonic()
    gc.check_step_on_device(report, "cpu", tmp_path, deadline=time.monotonic() + 30)
    assert time.monotonic() - started < 20  # no rank was launched
    assert report.lines and all(line.startswith("[SKIP]") for line in report.lines), report.lines
    assert not report.failed


def test_the_resume_check_fails_a_checkpoint_without_the_generators(tmp_path):
    """Lesson 09's resume, checked on the device: the solution's functions resume bit for bit
    (on a CPU), and a ``load_checkpoint`` that forgets the generators' states fails (dropout
    draws other masks after the resume)."""
    check = load_script()
    good = check.solution_functions(tmp_path)
    bad = tmp_path / "forgets_rng.py"
    text = good.read_text()
    assert "torch.set_rng_state(" in text
    bad.write_text(text.replace("torch.set_rng_state(", "(lambda state: None)("))
    for functions, passed in ((good, True), (bad, False)):
        report = check.Report()
        check.check_resume(report, "cpu", tmp_path / functions.stem, ("bf16",), True, functions)
        assert (not report.failed) == passed, "\n".join(report.lines)
        assert len(report.lines) == 1 and "resumed at step 3" in report.lines[0], report.lines


def test_a_collective_on_a_cpu_tensor_is_refused_under_nccls_device_map(tmp_path):
    """What lesson 09 says of NCCL, shown with gloo given NCCL's device map ("cuda:gloo"): only
    CUDA tensors have a backend, so an all-reduce of a CPU tensor raises; "cpu:gloo" takes it."""
    import torch.distributed as dist

    gpu_check = load_script()
    for backend, refused in (("cuda:gloo", True), ("cpu:gloo", False)):
        store = tmp_path / f"store-{backend.replace(':', '-')}"
        dist.init_process_group(backend, init_method=store.as_uri(), rank=0, world_size=1)
        try:
            if refused:
                with pytest.raises(RuntimeError, match=gpu_check.NO_BACKEND):
                    dist.all_reduce(torch.ones(3))
            else:
                dist.all_reduce(torch.ones(3))
        finally:
            dist.destroy_process_group()


def test_step_check_runs_the_solution_on_ranks_and_fails_a_refused_collective(tmp_path):
    """The GPU check's run of lesson 09's distributed_step, on the CPU: the solution trains on
    2 ranks and on 1 under a group whose device map has the CPU; under one without it
    ("cuda:gloo", NCCL's, as on a GPU the CPU tensors of a wrong step are) the check fails and
    says why. Its control, the solution with its token count made on the CPU, is built from
    the solution: the solution makes that count on the model's device."""
    gpu_check = load_script()
    report = gpu_check.Report()
    runs = (("cpu:gloo", 2), ("cpu:gloo", 1))
    gpu_check.check_step_on_device(report, "cpu", tmp_path / "ok", runs=runs, control=False)
    assert not report.failed, report.lines
    assert sum(line.startswith("[PASS] lesson 09 distributed_step") for line in report.lines) == 2
    report = gpu_check.Report()
    runs = (("cuda:gloo", 2),)
    gpu_check.check_step_on_device(report, "cpu", tmp_path / "no", runs=runs, control=False)
    assert report.failed and gpu_check.NO_BACKEND in report.lines[-1], report.lines
    functions = gpu_check.solution_functions(tmp_path)
    control = gpu_check.cpu_count_control(functions, tmp_path)
    assert control is not None, "the solution makes its token count without device=device"
    assert (
        control.read_text().count("device=device")
        == functions.read_text().count("device=device") - 1
    )
