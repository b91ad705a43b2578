"""The sandbox: what student code can see and do, refusal without isolation, reply status."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader import REPO_ROOT, sandbox
from grader.execute import apply_answer, graded_test_cells
from grader.sandbox import Limits, SandboxUnavailable, Settings, require_isolation
from grader.tests.conftest import need_bwrap

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
    answer = _run(PROBE % {"repo": str(REPO_ROOT)}, limits)
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
    answer = {
        "cells": [
            {"index": 0, "outputs": [], "execution_count": 1, "status": "ok"},
            {
                "index": 1,
                "outputs": [],
                "execution_count": 2,
                "status": "error",
            },  # hidden traceback
        ],
        "events": ["boom"],
    }
    statuses = apply_answer(nb, answer)
    assert statuses == {0: "ok", 1: "error", 2: "missing"}
    assert nb.cells[1].outputs[-1]["output_type"] == "error"
    assert nb.cells[2].outputs[-1]["output_type"] == "error"  # never ran: an error, with why
    assert "boom" in nb.cells[2].outputs[-1]["evalue"]
    # Sources come from nbgrader, never from the sandbox's answer.
    assert nb.cells[1].source == "f()"
