"""The sandbox: what student code can see and do, refusal without isolation, reply status."""

from __future__ import annotations

import json
import time

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader import REPO_ROOT, sandbox
from grader.execute import fail_unfinished, graded_test_cells
from grader.lessons import kernel_files
from grader.sandbox import Limits, SandboxUnavailable, Settings, require_isolation
from grader.tests.conftest import LOSE_REPLY, need_bwrap

PROBE = r"""
import json, os, socket, resource, subprocess
report = {"uid": os.getuid(), "cwd": os.getcwd(), "cwd_files": sorted(os.listdir("."))}
report["root"] = sorted(os.listdir("/"))
report["repo_visible"] = sorted(os.listdir(%(repo)r)) if os.path.isdir(%(repo)r) else None
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2)
    report["network"] = True
except OSError:
    report["network"] = False
try:
    with open("big.bin", "wb") as f:
        f.write(b"0" * (3 * 2**20))
    report["big_write"] = "ok"
except OSError as exc:
    report["big_write"] = type(exc).__name__
try:
    bytearray(3 * 2**30)
    report["alloc"] = "ok"
except MemoryError:
    report["alloc"] = "MemoryError"
report["nproc"] = resource.getrlimit(resource.RLIMIT_NPROC)[0]
report["pids"] = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
import sys
report["path_has_cwd"] = "" in sys.path or os.getcwd() in sys.path
report["grader_files"] = sorted(
    os.path.relpath(os.path.join(d, f), "/opt/course")
    for d, _, fs in os.walk("/opt/course/grader") for f in fs)
import importlib
for name in %(drivers)r:
    importlib.import_module(name)
print(json.dumps(report))
"""


def _run(code: str, limits: Limits, mode: str = "bwrap") -> dict:
    nb = new_notebook()
    nb.cells = [new_code_cell(code)]
    answer = sandbox.execute(json.loads(json.dumps(nb)), [], Settings(limits=limits, mode=mode))
    return answer


def test_student_code_sees_only_its_own_folder_and_no_network():
    need_bwrap()
    limits = Limits(cell_timeout=60, notebook_timeout=120, memory_mb=2048, fsize_mb=1)
    drivers = [rel.removesuffix(".py").replace("/", ".") for _, rel in kernel_files()]
    answer = _run(PROBE % {"repo": str(REPO_ROOT), "drivers": drivers}, limits)
    assert answer["events"] == [], answer
    text = "".join(o.get("text", "") for o in answer["cells"][0]["outputs"])
    report = json.loads(text)
    assert report["network"] is False
    assert report["uid"] != 0
    assert report["cwd_files"] == []
    # Only the interpreter, the venv and the course package are there, not the repository.
    assert set(report["repo_visible"] or []) <= {".venv", "course"}
    assert "solutions" not in (report["repo_visible"] or [])
    assert report["big_write"] == "OSError"  # 1 MB file size limit, no SIGXFSZ death
    assert report["alloc"] == "MemoryError"
    assert report["nproc"] == limits.nproc
    assert max(report["pids"]) < 50  # its own PID namespace
    assert report["path_has_cwd"] is False
    # Of the grader, only the drivers and their inputs (every one imported above), never a judge.
    assert report["grader_files"] == sorted(rel for _, rel in kernel_files())
    assert not any("judge" in rel or "variants" in rel for rel in report["grader_files"])


def test_refuses_to_run_unsandboxed_unless_told(monkeypatch):
    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    with pytest.raises(SandboxUnavailable, match="--unsandboxed"):
        require_isolation(False)
    assert require_isolation(True) == "unsandboxed"


def test_autograde_command_says_why_it_refuses(monkeypatch, capsys, tmp_path):
    from grader.cli import main

    monkeypatch.setattr(sandbox, "bwrap_problem", lambda: "bubblewrap (bwrap) is not installed")
    assert main(["autograde", "90-fixture", "--root", str(tmp_path)]) == 3
    err = capsys.readouterr().err
    assert "bubblewrap" in err and "--unsandboxed" in err


def test_a_graded_cell_fails_when_the_reply_was_not_ok_even_without_error_output():
    nb = nbformat.v4.new_notebook()
    solution = new_code_cell("def f(): pass")
    test = new_code_cell("f()")
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "grade_id": "f_tests",
        "points": 1,
        "locked": True,
    }
    plain = new_code_cell("print(1)")
    nb.cells = [solution, test, plain]
    assert graded_test_cells(nb) == [1]
    for cell in nb.cells:
        cell.outputs = []
    statuses = fail_unfinished(nb, {0: "ok", 1: "error"}, "boom")  # a traceback kept hidden
    assert statuses == {0: "ok", 1: "error", 2: "missing"}
    assert nb.cells[1].outputs[-1]["output_type"] == "error"
    assert "boom" in nb.cells[1].outputs[-1]["evalue"]
    assert nb.cells[2].outputs == []  # an ungraded cell that never ran costs nothing itself


def _graded_notebook(*sources: str):
    """A notebook of code cells whose last one is a graded test cell."""
    nb = new_notebook()
    nb.cells = [new_code_cell(s) for s in sources]
    nb.cells[-1].metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "t_tests"}
    return nb


THREAD = (
    "import threading, time\nthreading.Thread(target=time.sleep, args=(600,), daemon=True).start()"
)


def test_a_thread_left_running_costs_an_honest_test_nothing():
    """A thread the notebook left (an open progress bar's monitor) runs on beside the test, which
    still passes: only the judges decide what a hidden test earns."""
    need_bwrap()
    nb = _graded_notebook(THREAD, "from course.checks import check\ncheck(True, 'fine')\nprint(7)")
    limits = Limits(cell_timeout=60, notebook_timeout=180)
    answer = sandbox.execute(json.loads(json.dumps(nb)), [1], Settings(limits=limits))
    test = answer["cells"][1]
    assert test["status"] == "ok", answer
    assert "7" in "".join(o.get("text", "") for o in test["outputs"])


def test_a_failing_test_shows_its_own_traceback_and_a_passing_one_its_value():
    need_bwrap()
    nb = _graded_notebook(
        "x = 3", "from course.checks import check\ncheck(x == 4, 'x should be 4')"
    )
    nb.cells.append(new_code_cell("0.5 * x"))
    nb.cells[-1].metadata["nbgrader"] = {"grade": True, "solution": False, "grade_id": "u_tests"}
    limits = Limits(cell_timeout=60, notebook_timeout=180)
    answer = sandbox.execute(json.loads(json.dumps(nb)), [1, 2], Settings(limits=limits))
    failed, valued = answer["cells"][1], answer["cells"][2]
    assert failed["status"] == "error"
    error = next(o for o in failed["outputs"] if o.get("output_type") == "error")
    assert error["ename"] == "CheckFailed" and error["evalue"] == "x should be 4"
    assert any("<test cell 1>" in line for line in error["traceback"])
    assert (
        valued["status"] == "ok"
    )  # the last expression's value, as nbgrader's partial credit reads
    result = next(o for o in valued["outputs"] if o.get("output_type") == "execute_result")
    assert result["data"]["text/plain"] == "1.5"


def _course_copy(dest, checks_tail: str = "") -> str:
    """A copy of the course package with a marker module (and ``checks_tail`` in checks.py)."""
    import shutil

    shutil.copytree(
        REPO_ROOT / "course", dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    (dest / "_where.py").write_text(f"WHERE = {str(dest)!r}\n")
    if checks_tail:
        with open(dest / "checks.py", "a", encoding="utf-8") as fh:
            fh.write(checks_tail)
    return str(dest)


@pytest.mark.parametrize("mode", ["bwrap", "unsandboxed"])
def test_autograde_grades_with_the_course_package_under_its_root(tmp_path, mode):
    """The course under --root is the one the kernel imports, not the installed checkout."""
    from grader.autograde import autograde
    from grader.tests.conftest import make_course

    if mode == "bwrap":
        need_bwrap()
    root = make_course(tmp_path / "course")
    where = _course_copy(root / "course")
    lesson = "93-course"
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [
        new_code_cell("import course._where\nimport course.checks"),
        new_code_cell(f"assert course._where.WHERE == {where!r}, course.__file__"),
    ]
    nb.cells[1].metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": "where_tests",
        "points": 1,
        "schema_version": 3,
    }
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
    for folder in (root / "solutions" / lesson, root / "submitted" / "ann" / lesson):
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{lesson}.ipynb")
    limits = Limits(cell_timeout=60, notebook_timeout=180)
    [ann] = autograde(lesson, root, workers=1, limits=limits, mode=mode, progress=False)
    assert (ann.status, ann.total) == ("graded", 1.0), ann


def test_a_failing_prelude_names_its_exception(tmp_path):
    need_bwrap()
    broken = _course_copy(tmp_path / "course", "\nraise RuntimeError('checks are broken')\n")
    nb = new_notebook()
    nb.cells = [new_code_cell("print(1)")]
    limits = Limits(cell_timeout=60, notebook_timeout=120)
    settings = Settings(limits=limits, course_dir=broken)
    answer = sandbox.execute(json.loads(json.dumps(nb)), [], settings)
    said = [e for e in answer["events"] if "prelude failed" in e]
    assert said and "RuntimeError: checks are broken" in said[0], answer["events"]


def test_a_venv_that_is_a_symbolic_link_still_runs_the_sandbox(tmp_path):
    """The grader started through a linked .venv (a course whose .venv lives elsewhere)."""
    import subprocess
    import sys
    from pathlib import Path

    need_bwrap()
    venv = Path(sys.prefix)
    link = tmp_path / "course" / ".venv"
    link.parent.mkdir()
    link.symlink_to(venv.resolve(), target_is_directory=True)
    python = link / Path(sys.executable).relative_to(venv)
    code = (
        "import json, sys\n"
        "from grader import sandbox\n"
        "nb = {'nbformat': 4, 'nbformat_minor': 5, 'metadata': {}, 'cells': [\n"
        " {'cell_type': 'code', 'id': 'a', 'metadata': {}, 'outputs': [],\n"
        "  'execution_count': None, 'source': 'print(6 * 7)'}]}\n"
        "limits = sandbox.Limits(cell_timeout=60, notebook_timeout=120)\n"
        "print(json.dumps(sandbox.execute(nb, [], sandbox.Settings(limits=limits))))\n"
    )
    proc = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    answer = json.loads(proc.stdout)
    cell = answer["cells"][0] if answer["cells"] else {}
    assert cell.get("status") == "ok", answer["events"]
    assert "42" in "".join(o.get("text", "") for o in cell["outputs"])


def test_a_kernel_that_stops_answering_or_dies_is_restarted_and_the_cells_before_run_again():
    """A cell whose loop swallows the interrupt keeps the kernel busy past its limit, a test cell
    ends its kernel: each time the kernel is restarted, the cells before that ended are run again
    (the name ``x`` is back; a cell that ran past its limit is not run again) and the rest of the
    notebook runs; a cell that obeys the interrupt leaves the kernel answering. After
    ``MAX_RESTARTS`` restarts the rest is not run, and says why."""
    from grader.kernel import MAX_RESTARTS

    need_bwrap()
    obeys = "import time\ntime.sleep(60)"
    swallows = (
        "import time\nwhile True:\n    try:\n        time.sleep(60)\n"
        "    except KeyboardInterrupt:\n        pass"
    )
    dies = "import os\nos._exit(0)"
    cells = [obeys, "x = 41", swallows, "x + 1", dies, "x + 1", *[dies] * (MAX_RESTARTS - 1), "x"]
    nb = new_notebook(cells=[new_code_cell(c) for c in cells])
    answer = sandbox.execute(
        json.loads(json.dumps(nb)),
        [4],
        Settings(limits=Limits(cell_timeout=3, notebook_timeout=120)),
    )
    statuses = [c["status"] for c in answer["cells"]]
    said = (statuses, answer["events"])
    assert statuses[:6] == ["timeout", "ok", "timeout", "ok", "dead", "ok"], said
    assert statuses[6:] == ["dead"] * (MAX_RESTARTS - 1) + ["not-run"], said
    for index in (3, 5):
        assert "42" in json.dumps(answer["cells"][index]["outputs"]), answer["cells"][index]
    said = answer["cells"][-1]["outputs"][0]["evalue"]
    assert f"the kernel stopped {MAX_RESTARTS + 1} times" in said, said
    assert any(e.startswith("cell 2: the kernel stopped answering") for e in answer["events"])
    assert any(e.startswith("cell 4: the kernel stopped; restarted") for e in answer["events"])
    assert not any("cell 0: the kernel stopped" in e for e in answer["events"])


@pytest.mark.parametrize("mode", ["bwrap", "unsandboxed"])
def test_a_restart_follows_no_link_the_notebook_planted_and_the_kernels_folder_goes(
    tmp_path, monkeypatch, mode
):
    """A cell replaces the kernel's connection file (in the folder the sandbox may write: its
    sockets) with a link to a file of the grader's, then ends its kernel: the restart writes a
    new file and changes nothing through the link (as root it would chown the file to the
    sandbox's uid), the next cell runs in the restarted kernel, and the kernel's folder is gone
    after the notebook (nbclient leaves a kernel it was given running)."""
    import os
    import tempfile

    if mode == "bwrap":
        need_bwrap()
    victim = tmp_path / "grader-secret"
    victim.write_text("secret")
    victim.chmod(0o600)
    owner = victim.stat().st_uid
    made: list[str] = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args: object, **kwargs: object) -> str:
        made.append(real_mkdtemp(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    plant = (
        "import os\nfrom ipykernel.connect import get_connection_file\n"
        f"path = get_connection_file()\nos.remove(path)\nos.symlink({str(victim)!r}, path)\n"
        "os._exit(0)"
    )
    nb = new_notebook(cells=[new_code_cell("x = 41"), new_code_cell(plant), new_code_cell("x + 1")])
    settings = Settings(limits=Limits(cell_timeout=30, notebook_timeout=120), mode=mode)
    answer = sandbox.execute(json.loads(json.dumps(nb)), [], settings)
    statuses = [c["status"] for c in answer["cells"]]
    assert statuses == ["ok", "dead", "ok"], (statuses, answer["events"])
    assert "42" in json.dumps(answer["cells"][2]["outputs"])
    assert victim.stat().st_uid == owner and victim.read_text() == "secret"
    assert made and not any(os.path.exists(folder) for folder in made), made


def _graded(source: str, grade_id: str):
    cell = new_code_cell(source)
    cell.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "grade_id": grade_id,
        "points": 1,
        "locked": True,
    }
    return cell


@pytest.mark.parametrize("nudged", [True, False], ids=["reply-after-nudge", "reply-never"])
def test_a_cell_whose_reply_is_lost_after_idle_is_completed_without_waiting_its_limit(nudged):
    """The kernel goes idle for a cell and its execute_reply never comes: the client nudges the
    shell channel (a reply stuck in the kernel then comes) or completes the cell from iopub, in
    seconds instead of the cell's limit."""
    need_bwrap()
    if nudged:  # the patch cell's own reply, held until a kernel_info_request arrives
        patch = LOSE_REPLY.replace("MATCH(parent)", "True").replace("HELD_UNTIL_NUDGED", "True")
        cells = [new_code_cell(patch), new_code_cell("print(6 * 7)")]
    else:  # the graded test's reply (the one with the verdict), dropped for good
        patch = LOSE_REPLY.replace(
            "MATCH(parent)", "'f()' + ' == 1' in parent['content'].get('code', '')"
        ).replace("HELD_UNTIL_NUDGED", "False")
        cells = [
            new_code_cell(patch),
            new_code_cell("def f():\n    return 1"),
            _graded("assert f() == 1", "f_tests"),
            _graded("assert f() == 2", "g_tests"),
            new_code_cell("print(6 * 7)"),
        ]
    nb = json.loads(json.dumps(new_notebook(cells=cells)))
    started = time.monotonic()
    answer = sandbox.execute(
        nb,
        graded_test_cells(nbformat.from_dict(nb)),
        Settings(limits=Limits(cell_timeout=120, notebook_timeout=240)),
    )
    took = time.monotonic() - started
    statuses = [c["status"] for c in answer["cells"]]
    events = "\n".join(answer["events"])
    if nudged:
        assert statuses == ["ok", "ok"], (statuses, events)
        assert "cell 0: its execute_reply came only after the shell channel was nudged" in events
    else:
        # The lost reply was the passing test's: completed from iopub (no error there); the
        # failing test (whose reply came) still fails.
        assert statuses == ["ok", "ok", "ok", "error", "ok"], (statuses, events)
        assert "cell 2: the kernel went idle" in events and "completed from its iopub" in events
    assert "42" in "".join(o.get("text", "") for o in answer["cells"][-1]["outputs"])
    assert took < 60, f"{took:.0f} s: the lost reply was waited for"


def test_output_is_capped_in_bytes_while_the_cell_runs():
    """What a cell prints past the cap is dropped as it arrives, in the grader's process (the
    kernel's memory limit does not hold there), and the notebook goes on."""
    need_bwrap()
    flood = "for _ in range(2000):\n    print('x' * 5000)"
    nb = new_notebook(cells=[new_code_cell(flood), new_code_cell("print(6 * 7)")])
    limits = Limits(cell_timeout=60, notebook_timeout=120, max_output=100_000)
    answer = sandbox.execute(json.loads(json.dumps(nb)), [], Settings(limits=limits))
    flooded, after = answer["cells"]
    assert flooded["status"] == "ok" and after["status"] == "ok", answer["events"]
    assert len(json.dumps(flooded["outputs"])) < 2 * limits.max_output
    assert "[grader: output cut here]" in json.dumps(flooded["outputs"])
    assert "cell 0: output cut at 100000 bytes" in answer["events"]
    assert "42" in "".join(o.get("text", "") for o in after["outputs"])


def test_a_timeout_kills_the_processes_the_cell_started_and_the_kernel_goes_on():
    """At a cell's limit the kernel is interrupted by message (it lives on: a SIGINT to
    bubblewrap would end it) and every process the cell started is killed."""
    need_bwrap()
    start = "import subprocess, time\nchild = subprocess.Popen(['sleep', '600'])\ntime.sleep(60)"
    nb = new_notebook(cells=[new_code_cell(start), new_code_cell("print(child.wait(timeout=5))")])
    limits = Limits(cell_timeout=3, notebook_timeout=120)
    answer = sandbox.execute(json.loads(json.dumps(nb)), [], Settings(limits=limits))
    hung, after = answer["cells"]
    assert hung["status"] == "timeout", answer
    assert any(e.startswith("cell 0: timed out after 3 s; 1 process") for e in answer["events"])
    assert after["status"] == "ok", answer
    assert "-9" in "".join(o.get("text", "") for o in after["outputs"])  # killed by SIGKILL
