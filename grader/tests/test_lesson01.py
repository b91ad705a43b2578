"""Two corpus cases on the real lesson 01 (slow: marked ``lesson``): the solution earns exactly
what plain nbgrader gives it, and a wrong exercise hidden behind patched check helpers earns
nothing on that exercise and everything elsewhere."""

from __future__ import annotations

import nbformat
import pytest

from grader import REPO_ROOT
from grader.autograde import autograde
from grader.lessons.l01_number_formats.variants import VARIANTS
from grader.release import copy_course_skeleton
from grader.sandbox import Limits
from grader.tests.conftest import need_bwrap

pytestmark = [pytest.mark.lesson, pytest.mark.xdist_group(name="grader-lesson01")]
LESSON = "01-number-formats"

CHEAT = """import course.checks
course.checks.check_tensor_equal = lambda *a, **k: None
course.checks.check_dtype = lambda *a, **k: None
check_tensor_equal = course.checks.check_tensor_equal
check_dtype = course.checks.check_dtype
torch.equal = lambda *a, **k: True
"""


def test_lesson01_solution_and_patched_checks(tmp_path):
    need_bwrap()
    root = tmp_path / "course"
    copy_course_skeleton(REPO_ROOT, root)
    source = REPO_ROOT / "solutions" / LESSON / f"{LESSON}.ipynb"
    grade_id, wrong = VARIANTS["fate_decided_before_cast"]
    for student, patch in [("solution", None), ("cheater", CHEAT + wrong)]:
        nb = nbformat.read(source, as_version=4)
        if patch:
            cell = next(
                c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
            )
            cell.source = patch
        dest = root / "submitted" / student / LESSON
        dest.mkdir(parents=True)
        nbformat.write(nb, dest / f"{LESSON}.ipynb")
    outcomes = {
        o.student: o
        for o in autograde(
            LESSON,
            root,
            workers=2,
            limits=Limits(cell_timeout=600, notebook_timeout=1500),
            progress=False,
        )
    }
    tests = [g for g in outcomes["solution"].max_scores if g.endswith("_tests")]
    assert len(tests) == 5
    for gid in tests:
        assert outcomes["solution"].scores[gid] == outcomes["solution"].max_scores[gid], gid
        expected = 0.0 if gid == f"{grade_id}_tests" else outcomes["solution"].max_scores[gid]
        assert outcomes["cheater"].scores[gid] == expected, (gid, outcomes["cheater"].reason)
    assert "patches-checks" in outcomes["cheater"].flags
