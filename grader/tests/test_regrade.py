"""Manual grades of written answers (as formgrader gives them) through regrades, the regrade log,
and what a re-run that grades nothing reports."""

from __future__ import annotations

import json
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from grader.autograde import regrade_log_path
from grader.cli import main
from grader.sandbox import bwrap_problem
from grader.tests.conftest import make_course

LESSON = "92-regrade"


def _meta(grade_id: str, **flags: object) -> dict:
    return {"nbgrader": {"grade_id": grade_id, "schema_version": 3, "task": False, **flags}}


def _lesson(answer: str = "Because the exponent moves.") -> nbformat.NotebookNode:
    """One autograded exercise (1 point) and one written answer graded by hand (2 points)."""
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [
        new_code_cell(
            "def one():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
            metadata=_meta("one", grade=False, solution=True, locked=False),
        ),
        new_code_cell(
            "assert one() == 1",
            metadata=_meta("one_tests", grade=True, solution=False, locked=True, points=1),
        ),
        new_markdown_cell("Why?"),
        new_markdown_cell(
            answer, metadata=_meta("why", grade=True, solution=True, locked=False, points=2)
        ),
    ]
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
    return nb


def _submit(root: Path, student: str, answer: str) -> None:
    dest = root / "submitted" / student / LESSON
    dest.mkdir(parents=True, exist_ok=True)
    nbformat.write(_lesson(answer), dest / f"{LESSON}.ipynb")


def _autograde(root: Path, capsys, *extra: str) -> str:
    sandbox = ["--unsandboxed"] if bwrap_problem() else []
    argv = ["autograde", LESSON, "--root", str(root), "--no-progress", "--workers", "2"]
    argv += ["--cell-timeout", "60", "--notebook-timeout", "300", *sandbox, *extra]
    assert main(argv) == 0
    return capsys.readouterr().out


def _grade_by_hand(db: str, student: str, score: float) -> None:
    """What formgrader's grade API does when an instructor types a score."""
    from nbgrader.api import Gradebook

    with Gradebook(db) as gb:
        grade = gb.find_grade("why", LESSON, LESSON, student)
        grade.manual_score = score
        grade.needs_manual_grade = False
        gb.db.commit()


def _state(db: str, student: str) -> tuple[float | None, bool, bool, float]:
    """The written answer's manual score and flag, the submission's flag and its total."""
    from nbgrader.api import Gradebook

    with Gradebook(db) as gb:
        grade = gb.find_grade("why", LESSON, LESSON, student)
        sub = gb.find_submission(LESSON, student)
        return grade.manual_score, grade.needs_manual_grade, sub.needs_manual_grade, sub.score


def test_manual_grades_survive_a_regrade_unless_the_answer_changed(tmp_path, capsys):
    root = make_course(tmp_path / "course")
    source = root / "solutions" / LESSON / f"{LESSON}.ipynb"
    source.parent.mkdir(parents=True)
    nbformat.write(_lesson(), source)
    db = f"sqlite:///{root / 'gradebook.db'}"
    _submit(root, "ann", "Only the exponent changes.")
    _submit(root, "bob", "No idea.")

    out = _autograde(root, capsys)
    assert "2 point(s) of written answers not graded yet" in out, out
    assert _state(db, "ann") == (None, True, True, 1.0)
    assert not regrade_log_path(root, LESSON).exists(), "a first grading is not a regrade"

    _grade_by_hand(db, "ann", 2.0)
    _grade_by_hand(db, "bob", 0.5)
    # A re-run that grades nothing says so and prints the gradebook's totals, not stale ones.
    out = _autograde(root, capsys)
    ann = next(ln for ln in out.splitlines() if ln.startswith("ann"))
    assert "3/3" in ann and "skipped" in ann, out
    assert "nothing was graded in this run" in out, out

    # A forced regrade of one student keeps the manual grade of the unchanged answer.
    out = _autograde(root, capsys, "--force", "--student", "ann")
    assert _state(db, "ann") == (2.0, False, False, 3.0), out
    assert next(ln for ln in out.splitlines() if ln.startswith("ann")).split()[2] == "3/3"

    # A resubmission with another written answer loses its manual grade and is flagged.
    _submit(root, "bob", "The mantissa is unchanged, only the exponent moves.")
    _autograde(root, capsys)
    assert _state(db, "bob") == (None, True, True, 1.0)
    assert _state(db, "ann") == (2.0, False, False, 3.0), "bob's regrade touched ann"

    log = [json.loads(ln) for ln in regrade_log_path(root, LESSON).read_text().splitlines()]
    assert [r["student"] for r in log] == ["ann", "bob"], log
    kept, cleared = log
    assert (kept["score_before"], kept["score_after"], kept["max_score"]) == (3.0, 3.0, 3.0)
    assert kept["needs_manual_grade"] is False and kept["time"]
    [entry] = kept["manual_grades"]
    assert (entry["grade_id"], entry["manual_score"], entry["action"]) == ("why", 2.0, "kept")
    assert "unchanged" in entry["why"]
    assert (cleared["score_before"], cleared["score_after"]) == (1.5, 1.0)
    [entry] = cleared["manual_grades"]
    assert (entry["manual_score"], entry["action"]) == (0.5, "cleared")
    assert "changed" in entry["why"] and cleared["needs_manual_grade"] is True
