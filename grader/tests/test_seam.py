"""The seam that re-grades one exercise in a kernel that ran the lesson once (grader.seam)."""

from __future__ import annotations

import shutil

import pytest

from grader.seam import LessonKernel, SeamError, defined_names
from grader.tests.conftest import FIXTURES

LESSON = "90-fixture"


@pytest.fixture(scope="module")
def kernel(tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("seam") / LESSON
    shutil.copytree(FIXTURES / "solutions" / LESSON, work)
    with LessonKernel(work / f"{LESSON}.ipynb", timeout=120) as k:
        yield k


def test_full_run_is_scored_as_nbgrader_scores_it(kernel):
    assert kernel.exercises() == ["double", "halve", "triple"]
    scores = kernel.scores()
    assert scores["double_tests"] == (1.0, 1.0, True)
    assert scores["why_exact"] == (0.0, 1.0, False)  # written answers are left for a person


def test_wrong_and_valid_versions_of_one_exercise(kernel):
    wrong = kernel.run_exercise("double", "def double(x):\n    return x + x + 1\n")
    assert wrong.score == 0 and "CheckFailed" in wrong.error
    valid = kernel.run_exercise("double", "def double(x):\n    return x + x\n")
    assert valid.passed, valid.error
    # The reference is back afterwards: the solution passes again.
    assert kernel.run_exercise("double").passed


def test_a_cell_that_raises_does_not_leave_the_reference_defined(kernel):
    # The release replaces a whole top-level region with `raise NotImplementedError()`; the
    # reference's definition from the full run must not answer the test in its place.
    run = kernel.run_exercise("triple", "raise NotImplementedError()\n")
    assert run.score == 0 and "NameError" in run.error
    assert "the solution cell itself raised" in run.error
    assert kernel.run_exercise("triple").passed


def test_stderr_is_shown_but_never_scored(kernel):
    """The course's rule (course.selfcheck.warnings_are_not_failures), not nbgrader's own
    determine_grade, which scores any stderr 0: a correct answer that writes there keeps its
    points, a wrong one still loses them."""
    right = "import sys\n\ndef halve(x):\n    print('hm', file=sys.stderr)\n    return x / 2\n"
    run = kernel.run_exercise("halve", right)
    assert run.passed and "hm\n" in run.stderr and not run.error, run
    wrong = right.replace("x / 2", "x / 3")
    run = kernel.run_exercise("halve", wrong)
    assert run.score == 0 and "Not equal" in run.error and "hm\n" in run.stderr, run


def test_grading_key_makes_the_hidden_seed_reproducible(kernel):
    code = "import course.checks as c\nprint(c.hidden_seed('double'))\n"
    kernel.set_grading_key("k1", "alice")
    first = kernel.run_code(code)
    again = kernel.run_code(code)
    kernel.set_grading_key("k1", "bob")
    other = kernel.run_code(code)
    kernel.set_grading_key(None)
    assert first == again != other


def test_unknown_exercise_and_failing_code_are_clear_errors(kernel):
    with pytest.raises(SeamError, match="no single cell with grade_id 'nope'"):
        kernel.run_exercise("nope")
    with pytest.raises(SeamError, match="ZeroDivisionError"):
        kernel.run_code("1 / 0")


def test_defined_names():
    source = (
        "import torch as t\nfrom a import b\nx, (y, z) = 1, (2, 3)\nclass K: pass\ndef f(): pass\n"
    )
    assert defined_names(source) == ["K", "b", "f", "t", "x", "y", "z"]
    assert defined_names("def broken(:\n") == []
