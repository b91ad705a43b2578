"""One scoring rule everywhere: a warning or a log line never costs a correct answer its points.

nbgrader's ``determine_grade`` (and its Validate button) scores a test cell with any stderr output
0, so an answer that makes torch or NumPy warn, or that logs, would lose its points while the
self-check said "passed". The course applies :func:`course.selfcheck.warnings_are_not_failures`
between execution and scoring in the sandboxed grader, plain ``nbgrader autograde``, Validate,
the suite's seam and ``check_my_work``: the text stays in the cell, a failing check still scores 0
with its message.
"""

from __future__ import annotations

import os
import subprocess
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_notebook

from course.selfcheck import check_notebook, failure_message, warnings_are_not_failures
from grader import REPO_ROOT
from grader.tests.conftest import make_course, need_bwrap

LESSON = "94-warnings"
SETUP = "import logging, warnings\nfrom course.checks import check\n"
#: grade_id: (test cell source, points it must earn)
TESTS = {
    "warns_tests": ("warnings.warn('a correct answer that warns')\ncheck(True, 'fine')", 1.0),
    "logs_tests": ("logging.warning('a correct answer that logs')\ncheck(True, 'fine')", 1.0),
    "fails_tests": ("warnings.warn('a wrong answer that warns')\ncheck(False, 'x is wrong')", 0.0),
}


def _notebook() -> nbformat.NotebookNode:
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [new_code_cell(SETUP)]
    for grade_id, (source, _) in TESTS.items():
        cell = new_code_cell(source)
        cell.metadata["nbgrader"] = {
            "grade": True,
            "solution": False,
            "locked": True,
            "grade_id": grade_id,
            "points": 1,
            "schema_version": 3,
        }
        nb.cells.append(cell)
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
    return nb


def _text(cell) -> str:
    return "".join("".join(o.get("text", "")) for o in cell.outputs if o.output_type == "stream")


def test_the_rule_keeps_stderr_as_output_and_only_errors_fail():
    cell, plain = _notebook().cells[1], new_code_cell("")
    for c in (cell, plain):
        c.outputs = [
            nbformat.v4.new_output("stream", name="stderr", text="UserWarning: careful\n"),
            nbformat.v4.new_output("stream", name="stdout", text="7\n"),
        ]
        warnings_are_not_failures(c)
    assert [o.name for o in cell.outputs] == ["stdout", "stdout"]
    assert [o.name for o in plain.outputs] == ["stderr", "stdout"]  # not a graded test cell
    assert "UserWarning: careful" in _text(cell)
    assert failure_message(cell) is None
    cell.outputs.append(
        nbformat.v4.new_output("error", ename="CheckFailed", evalue="x", traceback=[])
    )
    assert failure_message(cell) == "CheckFailed: x"


def _scores(course_root, student: str) -> tuple[dict[str, float], nbformat.NotebookNode]:
    from grader.gradebook import read_scores

    scores = {gid: c.score for gid, c in read_scores(course_root, LESSON)[student].items()}
    graded = course_root / "autograded" / student / LESSON / f"{LESSON}.ipynb"
    return scores, nbformat.read(graded, as_version=4)


def _assert_scored_by_the_rule(scores: dict[str, float], nb: nbformat.NotebookNode) -> None:
    assert scores == {gid: points for gid, (_, points) in TESTS.items()}, scores
    by_id = {c.metadata.get("nbgrader", {}).get("grade_id"): c for c in nb.cells}
    assert "a correct answer that warns" in _text(by_id["warns_tests"])
    assert "a correct answer that logs" in _text(by_id["logs_tests"])
    assert failure_message(by_id["fails_tests"]) == "CheckFailed: x is wrong"


def test_the_sandboxed_grader_scores_warnings_and_log_lines_as_output(tmp_path):
    from grader.autograde import autograde
    from grader.sandbox import Limits

    need_bwrap()
    root = make_course(tmp_path / "course")
    for folder in (root / "solutions" / LESSON, root / "submitted" / "ann" / LESSON):
        folder.mkdir(parents=True)
        nbformat.write(_notebook(), folder / f"{LESSON}.ipynb")
    limits = Limits(cell_timeout=60, notebook_timeout=180)
    [ann] = autograde(LESSON, root, workers=1, limits=limits, progress=False)
    assert (ann.status, ann.total) == ("graded", 2.0), ann
    _assert_scored_by_the_rule(*_scores(root, "ann"))


def test_plain_nbgrader_and_validate_apply_the_same_rule(tmp_path):
    """The course's nbgrader config: ``nbgrader autograde`` and the Validate button (the
    students' view, ``jupyter/common``) no longer fail a test cell for what it wrote to stderr."""
    from grader.gradebook import autograde_notebooks

    nb_path = tmp_path / f"{LESSON}.ipynb"
    nbformat.write(_notebook(), nb_path)
    source = make_course(tmp_path / "source")
    (source / "solutions" / LESSON).mkdir(parents=True)
    nbformat.write(_notebook(), source / "solutions" / LESSON / f"{LESSON}.ipynb")
    scratch = tmp_path / "scratch"
    autograde_notebooks(LESSON, {"bob": nb_path}, scratch, root=source)
    _assert_scored_by_the_rule(*_scores(scratch, "bob"))

    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(REPO_ROOT / "jupyter" / "common"))
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "validate", nb_path.name],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert "x is wrong" in out, out + done.stderr
    assert "a correct answer that warns" not in out and "a correct answer that logs" not in out, out


def test_check_my_work_applies_the_same_rule(tmp_path):
    nb_path = tmp_path / f"{LESSON}.ipynb"
    nbformat.write(_notebook(), nb_path)
    results = {r.exercise: r for r in check_notebook(nb_path, timeout=120)}
    assert results["warns"].status == results["logs"].status == "passed", results
    assert (results["fails"].status, results["fails"].message) == (
        "failed",
        "CheckFailed: x is wrong",
    )
