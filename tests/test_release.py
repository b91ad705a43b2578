"""The release pipeline: lessons/ comes from solutions/ through nbgrader, and bad input stops it
with a message naming the file and the cell, losing nothing already in lessons/."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from grader import REPO_ROOT
from grader.release import check_notebook, differences
from tests.conftest import LESSON_IDS


def test_committed_lessons_match_a_fresh_release():
    diffs = differences(REPO_ROOT)
    assert not diffs, "lessons/ is out of sync; run `python -m grader release`:\n" + "\n".join(
        diffs
    )


def test_every_lesson_has_a_released_twin():
    released = sorted(p.name for p in (REPO_ROOT / "lessons").iterdir() if p.is_dir())
    assert released == LESSON_IDS


def test_released_lessons_hide_solutions_and_hidden_tests():
    for lesson in LESSON_IDS:
        text = (REPO_ROOT / "lessons" / lesson / f"{lesson}.ipynb").read_text()
        for marker in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS", "_ref_"):
            assert marker not in text, f"lessons/{lesson} leaks {marker!r}"
        assert "raise NotImplementedError()" in text


@pytest.fixture()
def course(tmp_path: Path) -> Path:
    """A scratch course: config and lesson 01, released once."""
    root = tmp_path / "course"
    (root / "grader").mkdir(parents=True)
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", root)
    shutil.copy2(REPO_ROOT / "grader" / "nbgrader_config.py", root / "grader")
    shutil.copytree(
        REPO_ROOT / "solutions" / "01-number-formats", root / "solutions" / "01-number-formats"
    )
    shutil.copytree(
        REPO_ROOT / "lessons" / "01-number-formats", root / "lessons" / "01-number-formats"
    )
    (root / "lessons" / "01-number-formats" / "student-notes.txt").write_text("keep me")
    return root


def release(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "grader", "release", "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def assert_refused(root: Path, *needles: str) -> str:
    before = snapshot(root / "lessons")
    proc = release(root)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    for needle in needles:
        assert needle in proc.stderr, f"{needle!r} not in:\n{proc.stderr}"
    assert "left as it was" in proc.stderr
    assert snapshot(root / "lessons") == before, "a failed release changed lessons/"
    return proc.stderr


def test_release_regenerates_lessons(course):
    proc = release(course)
    assert proc.returncode == 0, proc.stderr
    nb = nbformat.read(course / "lessons" / "01-number-formats" / "01-number-formats.ipynb", 4)
    assert any("raise NotImplementedError()" in c.source for c in nb.cells)


def test_missing_notebook_is_named(course):
    (course / "solutions" / "02-empty").mkdir()
    assert_refused(course, "02-empty/02-empty.ipynb", "missing")


def test_extra_notebook_is_named(course):
    shutil.copy2(
        course / "solutions" / "01-number-formats" / "01-number-formats.ipynb",
        course / "solutions" / "01-number-formats" / "scratch.ipynb",
    )
    assert_refused(course, "scratch.ipynb", "extra notebook")


def test_broken_json_is_named(course):
    path = course / "solutions" / "01-number-formats" / "01-number-formats.ipynb"
    path.write_text(path.read_text()[:-200])
    assert_refused(course, "01-number-formats.ipynb", "broken JSON")


def test_cell_missing_nbgrader_metadata_is_named(course):
    path = course / "solutions" / "01-number-formats" / "01-number-formats.ipynb"
    nb = nbformat.read(path, 4)
    index = next(
        i
        for i, c in enumerate(nb.cells)
        if c.metadata.get("nbgrader", {}).get("grade_id") == "kahan_sum"
    )
    del nb.cells[index].metadata["nbgrader"]
    nbformat.write(nb, path)
    assert_refused(course, "01-number-formats.ipynb", f"cell {index}", "def kahan_sum")


def test_graded_cell_without_points_is_named(course):
    path = course / "solutions" / "01-number-formats" / "01-number-formats.ipynb"
    nb = nbformat.read(path, 4)
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "fp16_bits_tests"
    )
    del cell.metadata["nbgrader"]["points"]
    nbformat.write(nb, path)
    assert_refused(course, "fp16_bits_tests", "points")


def test_duplicate_grade_id_is_named(course):
    path = course / "solutions" / "01-number-formats" / "01-number-formats.ipynb"
    nb = nbformat.read(path, 4)
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "fp16_fate"
    )
    cell.metadata["nbgrader"]["grade_id"] = "fp16_bits"
    nbformat.write(nb, path)
    assert_refused(course, "repeats grade_id 'fp16_bits'")


def test_check_notebook_accepts_every_solution():
    for lesson in LESSON_IDS:
        assert check_notebook(REPO_ROOT / "solutions" / lesson / f"{lesson}.ipynb") == []


def test_check_mode_reports_drift(course):
    path = course / "lessons" / "01-number-formats" / "01-number-formats.ipynb"
    nb = nbformat.read(path, 4)
    nb.cells[0].source += "\nedited by hand"
    nbformat.write(nb, path)
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "release", "--check", "--root", str(course)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
    )
    assert proc.returncode == 1
    assert "01-number-formats.ipynb: differs" in proc.stderr
