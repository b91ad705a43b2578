"""The grading key: a regrade sees the same hidden inputs, two students different ones."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader.autograde import autograde
from grader.keys import KEY_FILE, ensure_key, kernel_env, seed_for, student_key
from grader.sandbox import Limits, bwrap_problem
from grader.tests.conftest import make_course

LESSON = "91-seeds"
LIMITS = dict(cell_timeout=60, notebook_timeout=300, memory_mb=4096, nproc=128, fsize_mb=64)


def _meta(grade_id: str, **flags: object) -> dict:
    meta = {"grade_id": grade_id, "schema_version": 3, "task": False, **flags}
    return {"nbgrader": meta}


def _seed_lesson() -> nbformat.NotebookNode:
    """One exercise whose hidden test prints the seed ``course.checks.hidden_seed`` gives it."""
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [
        new_code_cell("import course\nimport course.checks"),
        new_code_cell(
            "def one():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
            metadata=_meta("one", grade=False, solution=True, locked=False),
        ),
        new_code_cell(
            "assert one() == 1\n"
            "### BEGIN HIDDEN TESTS\n"
            "print('SEED', course.checks.hidden_seed('one'), course.checks.hidden_seed('two'))\n"
            "### END HIDDEN TESTS",
            metadata=_meta("one_tests", grade=True, solution=False, locked=True, points=1),
        ),
    ]
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
    return nb


def _seeds(root: Path, student: str) -> tuple[int, int]:
    path = root / "autograded" / student / LESSON / f"{LESSON}.ipynb"
    text = json.dumps(json.loads(path.read_text())["cells"])
    found = re.search(r"SEED (\d+) (\d+)", text)
    assert found, f"{student}: the hidden test printed no seed"
    return int(found[1]), int(found[2])


def test_key_file_is_private_and_kept(tmp_path):
    key = ensure_key(tmp_path)
    assert len(key) == 64 and ensure_key(tmp_path) == key
    assert stat.S_IMODE((tmp_path / KEY_FILE).stat().st_mode) == 0o600
    assert student_key(key, "ann") != student_key(key, "bob")
    assert kernel_env(None, "ann") == {}
    assert kernel_env(key, "ann")["COURSE_STUDENT_ID"] == "ann"
    assert key not in kernel_env(key, "ann").values()


def test_regrade_sees_the_same_seeds_and_students_differ(tmp_path):
    root = make_course(tmp_path / "course")
    source = root / "solutions" / LESSON / f"{LESSON}.ipynb"
    source.parent.mkdir(parents=True)
    nbformat.write(_seed_lesson(), source)
    for student in ("ann", "bob"):
        dest = root / "submitted" / student / LESSON
        dest.mkdir(parents=True)
        nbformat.write(_seed_lesson(), dest / f"{LESSON}.ipynb")
    mode = "unsandboxed" if bwrap_problem() else "bwrap"
    kwargs = dict(workers=2, limits=Limits(**LIMITS), mode=mode, progress=False)
    first = autograde(LESSON, root, **kwargs)
    assert [o.status for o in first] == ["graded", "graded"], first
    seeds = {s: _seeds(root, s) for s in ("ann", "bob")}
    again = autograde(LESSON, root, force=True, **kwargs)
    assert [o.status for o in again] == ["graded", "graded"], again
    assert {s: _seeds(root, s) for s in ("ann", "bob")} == seeds, "a regrade changed the seeds"
    assert seeds["ann"] != seeds["bob"], "two students got the same hidden inputs"
    assert seeds["ann"][0] != seeds["ann"][1], "two exercises got the same seed"
    key = (root / KEY_FILE).read_text().strip()
    for student in ("ann", "bob"):
        expected = seed_for(student_key(key, student), student, "one")
        assert seeds[student][0] == expected, "the kernel's key is not the student's key"


@pytest.mark.parametrize("student", ["", "ann"])
def test_seed_for_uses_course_checks(student):
    assert seed_for("k", student, "x") == seed_for("k", student, "x")
    assert seed_for("k", student, "x") != seed_for("k2", student, "x")
