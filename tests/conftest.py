"""Shared fixtures: each lesson is autograded once per test run and the result reused."""

from __future__ import annotations

import importlib
import json
import os
import shutil
from pathlib import Path

import nbformat
import pytest

from grader import REPO_ROOT
from grader.gradebook import CellScore, autograde_notebooks
from grader.release import lesson_ids

SOLUTIONS = REPO_ROOT / "solutions"
LESSONS = REPO_ROOT / "lessons"
LESSON_IDS = lesson_ids(SOLUTIONS)


def _load_variants() -> dict[str, dict[str, tuple[str, str]]]:
    """Wrong versions of exercises, from ``tests/variants/l<NN>_*.py`` (one module per lesson).

    Each module defines ``LESSON`` (the lesson id) and ``VARIANTS``, a dict
    ``{variant_name: (grade_id, source of the wrong solution cell)}``. Every variant must lose
    exactly the points of that exercise's test cell (``<grade_id>_tests``) and nothing else.
    """
    found: dict[str, dict[str, tuple[str, str]]] = {}
    for path in sorted((Path(__file__).parent / "variants").glob("l[0-9][0-9]_*.py")):
        module = importlib.import_module(f"tests.variants.{path.stem}")
        found[module.LESSON] = dict(module.VARIANTS)
    return found


WRONG_VARIANTS = _load_variants()


def lesson_notebook(folder: Path, lesson: str) -> Path:
    return folder / lesson / f"{lesson}.ipynb"


def replace_solutions(nb_path: Path, replacements: dict[str, str], dest: Path) -> Path:
    """Copy a notebook with each solution cell ``grade_id`` replaced by the given source."""
    nb = nbformat.read(nb_path, as_version=4)
    for grade_id, source in replacements.items():
        cells = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
        assert len(cells) == 1, f"{nb_path} has no single solution cell {grade_id!r}"
        cells[0].source = source
    dest.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, dest)
    return dest


def variant_rounds(lesson: str) -> list[dict[str, str]]:
    """Wrong variants packed into as few notebooks as possible: at most one per exercise.

    Each round is ``{grade_id: variant_name}``. Exercises' test cells are independent, so a
    notebook with two different exercises wrong must lose exactly those two exercises' points;
    packing saves executing the whole lesson once per variant.
    """
    rounds: list[dict[str, str]] = []
    for name, (grade_id, _source) in WRONG_VARIANTS.get(lesson, {}).items():
        for packed in rounds:
            if grade_id not in packed:
                packed[grade_id] = name
                break
        else:
            rounds.append({grade_id: name})
    return rounds


def round_student(index: int) -> str:
    return f"wrong-{index + 1}"


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where executed notebooks are kept for inspection ($COURSE_TEST_ARTIFACTS or a temp dir)."""
    override = os.environ.get("COURSE_TEST_ARTIFACTS")
    path = Path(override) if override else tmp_path_factory.mktemp("artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


class GradedLessons:
    """Autogrades each lesson's solution, unfilled release and wrong variants once per session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._scores: dict[str, dict[str, dict[str, CellScore]]] = {}

    def scores(self, lesson: str) -> dict[str, dict[str, CellScore]]:
        """``{variant: {grade_id: CellScore}}`` for ``lesson``."""
        if lesson not in self._scores:
            work = self.root / lesson
            variants = {
                "solution": lesson_notebook(SOLUTIONS, lesson),
                "unfilled": lesson_notebook(LESSONS, lesson),
            }
            wrong = WRONG_VARIANTS.get(lesson, {})
            for index, packed in enumerate(variant_rounds(lesson)):
                student = round_student(index)
                variants[student] = replace_solutions(
                    lesson_notebook(SOLUTIONS, lesson),
                    {gid: wrong[name][1] for gid, name in packed.items()},
                    work / "variants" / student / f"{lesson}.ipynb",
                )
            self._scores[lesson] = autograde_notebooks(lesson, variants, work / "course")
            keep = os.environ.get("COURSE_TEST_ARTIFACTS")
            if keep:
                shutil.copytree(
                    work / "course" / "autograded", Path(keep) / lesson, dirs_exist_ok=True
                )
        return self._scores[lesson]

    def executed(self, lesson: str, variant: str) -> dict:
        """The notebook as nbgrader executed it for ``variant`` (JSON)."""
        self.scores(lesson)
        path = self.root / lesson / "course" / "autograded" / variant / lesson / f"{lesson}.ipynb"
        return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def graded(tmp_path_factory: pytest.TempPathFactory) -> GradedLessons:
    """The session's :class:`GradedLessons`."""
    return GradedLessons(tmp_path_factory.mktemp("graded"))


def outputs_text(nb: dict) -> str:
    """All stream and error text a notebook's cells printed."""
    parts = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append("".join(out.get("text", "")))
            elif out.get("output_type") == "error":
                parts.append(out.get("ename", "") + ": " + out.get("evalue", ""))
    return "\n".join(parts)
