"""The judges of hidden tests: they run in the grader's own process, never in a kernel.

A lesson's ``judge`` module (its grading package, :mod:`grader.lessons`) defines
``JUDGES = {grade_id: (exercise, judge)}``;
``judge(observations)`` builds the driver's inputs from ``observations.seed``, runs the
reference, compares with what the driver observed, in its order, and raises
``course.checks.CheckFailed`` (the student's message) when the answer is wrong.
:func:`apply_judges` takes each graded test cell's observations out of an executed notebook; a
judge's failure, missing or duplicated observations, or observations without a judge become an
error output, which nbgrader scores 0. Of ``grader/`` the sandbox mounts only the harness, the
observer, the drivers and their inputs (:func:`grader.lessons.kernel_files`), never a judge.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grader.lessons
from grader.lessons import LESSONS
from grader.lessons import lesson as find_lesson
from grader.observations import MIME, ObservationError, Observations, decode

if TYPE_CHECKING:  # nbformat is the grader's; a plain Python process (the GPU check) lacks it
    from nbformat import NotebookNode


@dataclass(frozen=True)
class Judge:
    """One converted hidden test's judge."""

    grade_id: str
    exercise: str
    judge: Callable[[Observations], None]


@functools.cache
def judges(lesson: str | None = None) -> dict[str, Judge]:
    """The judges of ``lesson`` (every lesson's when None), by the grade id of the test cell.

    Only the lesson's own module is imported: a lesson without judges imports nothing (torch
    stays out of the nbgrader process).
    """
    found: dict[str, Judge] = {}
    if lesson is None:
        chosen = list(LESSONS.values())
    else:
        chosen = [entry] if (entry := find_lesson(lesson)) else []
    for entry in chosen:
        for grade_id, (exercise, fn) in entry.judge().JUDGES.items():
            if grade_id in found:
                raise RuntimeError(f"two judges for {grade_id!r}")
            found[grade_id] = Judge(grade_id, exercise, fn)
    return found


def exposed() -> str | None:
    """Why the judges could be read from inside the sandbox (None: they cannot).

    The sandbox mounts the Python installation and the virtual environment: a grader installed
    into the venv (not editable) would put its judges there.
    """
    where = Path(grader.lessons.__file__).parent.resolve()  # every lesson's grading package
    for mounted in {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}:
        if where.is_relative_to(mounted):
            return (
                f"the hidden tests' judges ({where}) lie in {mounted}, which the sandbox mounts: "
                "install the course editable (pip install -e .) so that they stay outside it"
            )
    return None


def judged_exercise(grade_id: str) -> str | None:
    """The exercise (``hidden_seed`` name) of ``grade_id``'s judge; None when it has none."""
    judge = judges().get(grade_id)
    return judge.exercise if judge else None


def judge_bundle(lesson: str | None, grade_id: str, text: str, seed: int | None) -> None:
    """Judge one test cell's observations; raises when the student's code fails the test.

    ``seed`` is the exercise's seed as the grader knows it (from the grading key); when given,
    observations made with any other seed are refused. ``lesson`` names the judges' module
    (None: every lesson's).
    """
    judge = judges(lesson).get(grade_id)
    if judge is None:
        raise ObservationError(f"{grade_id} has observations but no judge")
    observations = decode(text)
    if observations.exercise != judge.exercise:
        raise ObservationError(f"observations of {observations.exercise!r} for {grade_id}")
    if seed is not None and observations.seed != seed:
        raise ObservationError(f"{grade_id}'s observations were made with another seed")
    judge.judge(observations)
    observations.finish()


def _error(exc: BaseException) -> NotebookNode:
    from nbformat import NotebookNode

    name = type(exc).__name__
    text = str(exc)
    return NotebookNode(output_type="error", ename=name, evalue=text, traceback=[f"{name}: {text}"])


def judge_cell(
    cell: NotebookNode, lesson: str | None, seed_of: Callable[[str], int | None] | None = None
) -> str | None:
    """Judge one executed graded test cell in place: its observations output is taken out and,
    when the judge fails it, an error output added. Returns ``"ok"`` or ``"failed"`` (None: the
    cell has no judge and no observations).

    ``seed_of(exercise)`` gives the seed the grader expects (None: take the driver's).
    ``lesson`` names the judges' module (None: every lesson's).
    """
    meta = cell.get("metadata", {}).get("nbgrader", {})
    grade_id = str(meta.get("grade_id", ""))
    bundles = [o for o in cell.outputs if MIME in (o.get("data") or {})]
    if bundles:
        cell.outputs = [o for o in cell.outputs if MIME not in (o.get("data") or {})]
    judge = judges(lesson).get(grade_id)
    if judge is None and not bundles:
        return None
    if any(o.get("output_type") == "error" for o in cell.outputs):
        return "failed"  # it failed in the kernel already
    try:
        if judge is None:
            raise ObservationError(f"{grade_id} has observations but no judge")
        if len(bundles) != 1:
            raise ObservationError(
                f"{grade_id}'s test cell gave {len(bundles)} sets of observations, not one"
            )
        text = bundles[0]["data"][MIME]
        if type(text) is not str:
            raise ObservationError(f"{grade_id}'s observations are not text")
        judge_bundle(lesson, grade_id, text, seed_of(judge.exercise) if seed_of else None)
    except Exception as exc:  # noqa: BLE001 - every failure of the judge fails the cell
        cell.outputs.append(_error(exc))
        return "failed"
    return "ok"


def apply_judges(
    nb: NotebookNode, lesson: str | None, seed_of: Callable[[str], int | None] | None = None
) -> dict[int, str]:
    """:func:`judge_cell` on every graded test cell of the executed ``nb``; ``{index: verdict}``
    for the cells that were judged."""
    verdicts: dict[int, str] = {}
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type != "code" or not meta.get("grade") or meta.get("solution"):
            continue
        verdict = judge_cell(cell, lesson, seed_of)
        if verdict is not None:
            verdicts[index] = verdict
    return verdicts
