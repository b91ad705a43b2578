"""Plain nbgrader autograding of a set of notebooks in a scratch course (serial, unsandboxed).

This is the reference path: what ``nbgrader autograde`` itself decides. Tests use it to check
that solutions earn full marks and unfilled lessons earn zero, and the grader's benchmark uses it
as the serial baseline.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from grader import REPO_ROOT
from grader.nbtools import nbgrader
from grader.release import copy_course_skeleton


@dataclass(frozen=True)
class CellScore:
    """One graded cell of one submission."""

    grade_id: str
    score: float
    max_score: float
    auto: bool


def read_scores(course: Path, lesson: str) -> dict[str, dict[str, CellScore]]:
    """Every student's graded cells for ``lesson`` from ``course/gradebook.db``."""
    from nbgrader.api import Gradebook

    scores: dict[str, dict[str, CellScore]] = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assignment = gb.find_assignment(lesson)
        for submission in assignment.submissions:
            cells: dict[str, CellScore] = {}
            for notebook in submission.notebooks:
                for grade in notebook.grades:
                    auto = grade.auto_score is not None
                    score = grade.score if grade.score is not None else 0.0
                    cells[grade.name] = CellScore(
                        grade.name, float(score), float(grade.max_score), auto
                    )
            scores[submission.student.id] = cells
    return scores


def autograde_notebooks(
    lesson: str, notebooks: dict[str, Path], course: Path, root: Path = REPO_ROOT
) -> dict[str, dict[str, CellScore]]:
    """Autograde ``{student_id: notebook_path}`` for ``lesson`` with plain nbgrader in ``course``.

    ``course`` is a scratch folder: the course's config and solutions are copied there, the
    assignment is generated into its gradebook, the notebooks are placed as submissions and
    ``nbgrader autograde`` runs once over all of them.
    """
    copy_course_skeleton(root, course)
    nbgrader(["generate_assignment", lesson, "--force", "--create"], cwd=course)
    for student, path in notebooks.items():
        dest = course / "submitted" / student / lesson
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / f"{lesson}.ipynb")
    nbgrader(["autograde", lesson, "--force"], cwd=course)
    return read_scores(course, lesson)
