"""Calibrated time limits: limits from the solution's measured cells, which cell gets which limit,
the report's wording, stale calibrations, and a batch with hanging submissions that ends in a
time set by the calibrated limits instead of 300 s per cell."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path

import nbformat

from grader import REPO_ROOT
from grader.calibrate import (
    calibration_path,
    cell_key,
    cell_limits,
    describe_timeout,
    limits_from,
    load,
    timeouts_from_answer,
)
from grader.cli import main
from grader.tests.conftest import need_bwrap

LESSON = "90-fixture"
SOURCE = REPO_ROOT / "grader" / "tests" / "fixtures" / "solutions" / LESSON / f"{LESSON}.ipynb"


def _code(source: str, grade_id: str | None = None) -> dict:
    meta = {"nbgrader": {"grade_id": grade_id}} if grade_id else {}
    return {"cell_type": "code", "source": source, "metadata": meta}


def test_limit_is_factor_times_measured_with_a_floor_rounded_up():
    measured = [
        {"key": "fast", "label": "fast", "seconds": 0.3},
        {"key": "slow", "label": "slow", "seconds": 4.21},
        {"key": "src:a", "label": "cell 1", "seconds": 1.0},
        {"key": "src:a", "label": "cell 7", "seconds": 2.5},  # same source twice: the slower
    ]
    data = limits_from(measured, factor=10, floor=20)
    cells = data["cells"]
    assert cells["fast"]["limit_s"] == 20  # 3 s measured x 10 is under the floor
    assert cells["slow"]["limit_s"] == 43  # 42.1 rounded up
    assert cells["src:a"] == {"label": "cell 7", "solution_s": 2.5, "limit_s": 25}
    assert data["other_limit_s"] == 25
    assert data["notebook_limit_s"] == 20 + 43 + 25
    assert limits_from(measured, factor=2, floor=1)["cells"]["slow"]["limit_s"] == 9


def test_each_submission_cell_gets_its_limit_and_unknown_cells_the_largest_other():
    solution = {
        "cells": [
            _code("import torch"),
            {"cell_type": "markdown", "source": "# text", "metadata": {}},
            _code("def f(x):\n    return x", "f"),
            _code("check(f(1) == 1)", "f_tests"),
            _code("plot()"),
        ]
    }
    measured = [
        {"key": cell_key(c), "label": str(i), "seconds": s}
        for i, (c, s) in enumerate(zip(solution["cells"], [0.5, 0, 0.1, 3.0, 6.0], strict=True))
        if c["cell_type"] == "code"
    ]
    calibration = limits_from(measured, factor=10, floor=20)
    submission = {
        "cells": [
            _code("import torch  "),  # same source (surrounding blanks do not count)
            _code("def f(x):\n    while True:\n        pass", "f"),  # the student's own code
            _code("print('my own experiment')"),  # not in the solution
            _code("check(f(1) == 1)", "f_tests"),
            {"cell_type": "markdown", "source": "# text", "metadata": {}},
        ]
    }
    assert cell_limits(submission, calibration) == {0: 20.0, 1: 20.0, 2: 60.0, 3: 30.0}


def test_timeouts_are_reported_with_the_limit_and_the_solution_time():
    nb = {"cells": [_code("x = 1"), _code("def f(): ...", "f"), _code("f()", "f_tests")]}
    calibration = limits_from(
        [
            {"key": cell_key(nb["cells"][1]), "label": "f", "seconds": 0.02},
            {"key": cell_key(nb["cells"][2]), "label": "f_tests", "seconds": 0.41},
        ]
    )
    answer = {
        "cells": [
            {"index": 0, "status": "error", "seconds": 25.0, "limit": 20.0},  # interrupted
            {"index": 1, "status": "ok", "seconds": 0.1, "limit": 20.0},
            {"index": 2, "status": "error", "seconds": 0.2, "limit": 20.0},  # failed, in time
        ]
    }
    found = timeouts_from_answer(nb, answer, calibration)
    assert found == [{"cell": "cell 0", "limit": 20.0, "solution": None}]
    answer["cells"][2].update(status="timeout", seconds=20.0)
    found = timeouts_from_answer(nb, answer, calibration)
    assert [describe_timeout(t) for t in found] == [
        "cell 0: timed out after 20 s (not a cell of the solution)",
        "f_tests: timed out after 20 s (solution: 0.4 s)",
    ]


def test_a_calibration_of_another_solution_is_not_used(tmp_path):
    from grader.autograde import lesson_key
    from grader.tests.conftest import make_course

    root = make_course(tmp_path / "course")
    assert load(root, LESSON) == (None, None)
    path = calibration_path(root, LESSON)
    path.parent.mkdir(parents=True)
    data = {"version": 1, "lesson_key": lesson_key(root, LESSON), **limits_from([])}
    path.write_text(json.dumps(data))
    assert load(root, LESSON) == (data, None)
    path.write_text(json.dumps({**data, "lesson_key": "0" * 16}))
    got, warning = load(root, LESSON)
    assert got is None and "changed since it was measured" in warning
    path.write_text(json.dumps({**data, "version": 0}))
    assert load(root, LESSON)[0] is None


def _submission(root: Path, student: str, sources: dict[str, str]) -> None:
    nb = nbformat.read(SOURCE, as_version=4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in sources:
            cell.source = sources[gid]
    folder = root / "submitted" / student / LESSON
    folder.mkdir(parents=True)
    nbformat.write(nb, folder / f"{LESSON}.ipynb")


HANG_IN_CALL = "def double(x):\n    while True:\n        pass\n"
HANG_AT_DEFINITION = "import time\ntime.sleep(3600)\n\ndef halve(x):\n    return x / 2\n"


def test_hanging_submissions_end_within_the_calibrated_limits(tmp_path, capsys):
    need_bwrap()
    from grader.tests.conftest import make_course

    root = make_course(tmp_path / "course")
    floor = 4.0
    assert main(["calibrate", LESSON, "--root", str(root), "--floor", str(floor)]) == 0
    assert not (root / "lessons").exists(), "calibration wrote into lessons/"
    data = json.loads(calibration_path(root, LESSON).read_text())
    solution = nbformat.read(SOURCE, as_version=4)
    code = [c for c in solution.cells if c.cell_type == "code"]
    assert {cell_key(c) for c in code} == set(data["cells"]), "a code cell was not timed"
    for entry in data["cells"].values():
        assert entry["limit_s"] >= floor and entry["limit_s"] >= 10 * entry["solution_s"]

    _submission(root, "honest", {})
    _submission(root, "hangs-in-call", {"double": HANG_IN_CALL})
    _submission(root, "hangs-at-definition", {"halve": HANG_AT_DEFINITION})
    _submission(root, "hangs-twice", {"double": HANG_IN_CALL, "halve": HANG_AT_DEFINITION})
    capsys.readouterr()
    start = time.monotonic()
    args = ["autograde", LESSON, "--root", str(root), "--workers", "2", "--no-progress"]
    assert main(args) == 0
    elapsed = time.monotonic() - start
    out = capsys.readouterr()
    print(out.out, out.err, f"batch: {elapsed:.0f} s")
    assert "calibrated limits" in out.err

    limit = {e["label"]: e["limit_s"] for e in data["cells"].values()}
    # Each hanging submission loses its hanging cells' calibrated limits (checked below in the
    # CSV's wording), two submissions at a time, plus kernel starts and nbgrader on a loaded
    # machine. With the default 300 s per cell the four hanging cells would cost over 600 s.
    hung = limit["double_tests"] + limit["halve"]
    bound = min(290.0, 2 * hung + 180)
    assert elapsed < bound, f"the batch took {elapsed:.0f} s, over {bound:.0f} s"

    out_csv = tmp_path / "grades.csv"
    assert main(["export", "--root", str(root), "--out", str(out_csv)]) == 0
    rows = {r["student_id"]: r for r in csv.DictReader(out_csv.open())}
    assert float(rows["honest"][f"{LESSON}/total"]) == 3
    status = {s: rows[s][f"{LESSON}/status"] for s in rows}
    solution_s = {e["label"]: e["solution_s"] for e in data["cells"].values()}
    for student, cells in {
        "hangs-in-call": ["double_tests"],
        "hangs-at-definition": ["halve"],
        "hangs-twice": ["double_tests", "halve"],
    }.items():
        for cell in cells:
            said = describe_timeout(
                {"cell": cell, "limit": limit[cell], "solution": solution_s[cell]}
            )
            assert said in status[student], status[student]
    assert "timed out" not in status["honest"]
    assert float(rows["hangs-in-call"][f"{LESSON}/double"]) == 0
    assert float(rows["hangs-in-call"][f"{LESSON}/halve"]) == 1
    assert float(rows["hangs-at-definition"][f"{LESSON}/triple"]) == 1


def test_calibrate_refuses_a_solution_that_fails(tmp_path, capsys):
    need_bwrap()
    from grader.tests.conftest import make_course

    root = make_course(tmp_path / "course")
    path = root / "solutions" / LESSON / f"{LESSON}.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source = "def double(x):\n    return x * 3\n"
    nbformat.write(nb, path)
    assert main(["calibrate", LESSON, "--root", str(root)]) == 2
    assert "double_tests: error" in capsys.readouterr().err
    assert not calibration_path(root, LESSON).exists()


def test_calibrate_measures_under_the_courses_limits(tmp_path, monkeypatch):
    """A course's ``c.GraderSettings`` (here less memory and fewer processes) is what the solution
    is timed under, as autograde would run it, not the built-in defaults."""
    import os

    import grader.calibrate
    from grader.sandbox import sandbox_uid
    from grader.tests.conftest import make_course

    root = make_course(tmp_path / "course")
    with (root / "nbgrader_config.py").open("a") as config:
        config.write(
            "c.GraderSettings.memory_mb = 3000\nc.GraderSettings.nproc = 77\n"
            "c.GraderSettings.uid_base = 300000\n"
        )
    seen = []

    def execute(nb, graded, settings):
        seen.append(settings)
        raise OSError("measured nothing")

    monkeypatch.setattr(grader.calibrate, "execute", execute)
    monkeypatch.delenv("GRADER_UID_BASE", raising=False)
    assert main(["calibrate", LESSON, "--root", str(root), "--unsandboxed"]) == 2
    limits = seen[0].limits
    assert (limits.memory_mb, limits.nproc, seen[0].uid_base) == (3000, 77, 300000)
    seen[0].mode, seen[0].slot = "bwrap", 2
    if os.geteuid() == 0:  # the sandbox takes a uid of its own only when the grader is root
        assert sandbox_uid(seen[0]) == 300002


def _grader_imports(module: str) -> tuple[set[str], set[str]]:
    """The grader modules ``module`` imports: at module top, and inside functions."""
    import ast

    tree = ast.parse((REPO_ROOT / "grader" / f"{module}.py").read_text(encoding="utf-8"))
    top = {n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))}
    found: tuple[set[str], set[str]] = (set(), set())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("grader."):
            name = node.module.split(".")[1]
        elif isinstance(node, ast.Import):
            names = [a.name.split(".")[1] for a in node.names if a.name.startswith("grader.")]
            if not names:
                continue
            name = names[0]
        else:
            continue
        found[0 if node in top else 1].add(name)
    return found


def test_calibrate_autograde_and_execute_import_each_other_without_a_circle():
    modules = ("autograde", "calibrate", "execute")
    graph = {}
    for module in modules:
        top, inner = _grader_imports(module)
        assert not inner & set(modules), f"{module} imports {inner & set(modules)} in a function"
        graph[module] = (top | inner) & set(modules)

    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(
            n == goal or (n not in seen and reaches(n, goal, seen | {n})) for n in graph[start]
        )

    assert not [m for m in modules if reaches(m, m)], graph
    from grader import autograde, calibrate, execute  # each imports at module top

    assert calibrate.lesson_key is autograde.lesson_key
    assert calibrate.cell_limits is not None and execute.graded_test_cells is not None
