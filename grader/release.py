"""Regenerate ``lessons/`` from ``solutions/`` through nbgrader, or check that they agree.

Before nbgrader runs, every lesson is validated (one notebook per lesson folder, named like the
folder; valid JSON; nbgrader metadata on every cell that needs it) and problems are reported by
file and cell. Generation happens in a scratch folder; ``lessons/`` is replaced only when every
lesson succeeded, so a failed release loses nothing.
"""

from __future__ import annotations

import filecmp
import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from grader import REPO_ROOT
from grader.nbtools import nbgrader

LESSON_ID = re.compile(r"^\d\d-[a-z0-9]+(?:-[a-z0-9]+)*$")
MARKERS = ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS", "### END SOLUTION")
#: Files nbgrader ignores, and so does the release check.
IGNORED = {".ipynb_checkpoints", "__pycache__", ".DS_Store"}


class ReleaseError(Exception):
    """The solutions cannot be released; the message names each file and cell at fault."""


@dataclass(frozen=True)
class Problem:
    path: Path
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}"


def _cell_name(index: int, cell: dict) -> str:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    first = next((ln.strip() for ln in cell.get("source", "").splitlines() if ln.strip()), "")
    label = f"cell {index}"
    if meta.get("grade_id"):
        label += f" ({meta['grade_id']})"
    elif first:
        label += f" ({first[:50]!r})"
    return label


def check_notebook(path: Path) -> list[Problem]:
    """The problems that would stop ``path`` from being released (empty when it is fine)."""
    problems: list[Problem] = []
    try:
        raw = path.read_text(encoding="utf-8")
        json.loads(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return [Problem(path, f"not a readable notebook (broken JSON?): {exc}")]
    try:
        nb = nbformat.reads(raw, as_version=4)
        nbformat.validate(nb)
    except Exception as exc:  # noqa: BLE001 - any reader error is reported with the file
        return [Problem(path, f"not a valid notebook: {str(exc).splitlines()[0]}")]
    seen: dict[str, int] = {}
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader")
        name = _cell_name(index, cell)
        source = cell.get("source", "")
        if meta is None:
            if any(marker in source for marker in MARKERS):
                problems.append(
                    Problem(
                        path,
                        f"{name} has solution or hidden-test markers but no nbgrader "
                        "metadata (mark it in JupyterLab's Create Assignment panel)",
                    )
                )
            continue
        if not (
            meta.get("grade") or meta.get("solution") or meta.get("task") or meta.get("locked")
        ):
            continue
        grade_id = meta.get("grade_id")
        if not grade_id:
            problems.append(Problem(path, f"{name} has nbgrader metadata without a grade_id"))
            continue
        if grade_id in seen:
            problems.append(
                Problem(path, f"{name} repeats grade_id {grade_id!r} of cell {seen[grade_id]}")
            )
        seen[grade_id] = index
        if meta.get("grade") or meta.get("task"):
            points = meta.get("points")
            if not isinstance(points, int | float) or isinstance(points, bool) or points < 0:
                problems.append(
                    Problem(path, f"{name} is graded but has no valid points: {points!r}")
                )
        if meta.get("solution") and cell.cell_type == "code" and "### BEGIN SOLUTION" not in source:
            problems.append(Problem(path, f"{name} is a solution cell without ### BEGIN SOLUTION"))
        if "### BEGIN HIDDEN TESTS" in source and not meta.get("grade"):
            problems.append(Problem(path, f"{name} hides tests but is not a graded test cell"))
    return problems


def lesson_ids(solutions: Path) -> list[str]:
    """The lesson ids under ``solutions/``, after checking the folder's shape."""
    if not solutions.is_dir():
        raise ReleaseError(f"{solutions}: no such folder")
    problems: list[Problem] = []
    ids: list[str] = []
    for entry in sorted(solutions.iterdir()):
        if entry.name in IGNORED or entry.name.startswith("."):
            continue
        if not entry.is_dir():
            problems.append(Problem(entry, "stray file: solutions/ holds only lesson folders"))
            continue
        if not LESSON_ID.match(entry.name):
            problems.append(
                Problem(entry, "lesson folders are named NN-topic (e.g. 01-number-formats)")
            )
            continue
        notebooks = sorted(p.name for p in entry.glob("*.ipynb"))
        expected = f"{entry.name}.ipynb"
        if expected not in notebooks:
            problems.append(
                Problem(
                    entry / expected,
                    "missing: each lesson folder holds one notebook named like the folder",
                )
            )
        for extra in notebooks:
            if extra != expected:
                problems.append(
                    Problem(
                        entry / extra,
                        f"extra notebook: only {expected} is released from this folder",
                    )
                )
        if expected in notebooks:
            problems.extend(check_notebook(entry / expected))
        ids.append(entry.name)
    if not ids and not problems:
        problems.append(Problem(solutions, "no lessons found"))
    if problems:
        raise ReleaseError("cannot release:\n" + "\n".join(f"  {p}" for p in problems))
    return ids


def generate(root: Path, out: Path, only: list[str] | None = None) -> list[str]:
    """Run nbgrader generate_assignment for the lessons of ``root/solutions`` into ``out``.

    ``only`` limits the release to those lesson ids (all are still validated).
    """
    ids = lesson_ids(root / "solutions")
    if only:
        unknown = sorted(set(only) - set(ids))
        if unknown:
            raise ReleaseError(f"no such lesson in {root / 'solutions'}: {', '.join(unknown)}")
        ids = [i for i in ids if i in only]
    out.mkdir(parents=True, exist_ok=True)
    # One nbgrader process for all of them (it globs the assignment id): each start costs
    # seconds of imports, nine of them most of a release's time.
    for pattern in ids if only else ["*"]:
        nbgrader(
            [
                "generate_assignment",
                pattern,
                "--force",
                "--no-db",
                f"--CourseDirectory.release_directory={out}",
            ],
            cwd=root,
        )
    for extra in out.iterdir():  # what the glob caught beside the lessons
        if extra.name not in ids:
            if extra.is_dir():
                shutil.rmtree(extra)
            else:
                extra.unlink()
    for lesson in ids:
        if not (out / lesson / f"{lesson}.ipynb").is_file():
            raise ReleaseError(f"nbgrader produced no {out / lesson / lesson}.ipynb")
    return ids


def release(root: Path = REPO_ROOT, only: list[str] | None = None) -> list[str]:
    """Regenerate ``root/lessons`` from ``root/solutions``; nothing changes if anything fails.

    With ``only``, just those lessons' folders are replaced and the rest of ``lessons/`` stays.
    """
    lessons = root / "lessons"
    with tempfile.TemporaryDirectory(prefix=".release-", dir=root) as tmp:
        fresh = Path(tmp) / "lessons"
        ids = generate(root, fresh, only)
        if only and lessons.is_dir():
            # Keep the lessons not being released: copy them beside the fresh ones.
            for entry in lessons.iterdir():
                if entry.is_dir() and not (fresh / entry.name).exists():
                    shutil.copytree(entry, fresh / entry.name)
        old = Path(tmp) / "previous"
        if lessons.exists():
            lessons.rename(old)
        try:
            fresh.rename(lessons)
        except OSError:
            if old.exists():
                old.rename(lessons)
            raise
    return ids


def _tree(folder: Path) -> set[Path]:
    return {
        p.relative_to(folder)
        for p in folder.rglob("*")
        if p.is_file() and not IGNORED.intersection(p.relative_to(folder).parts)
    }


def differences(root: Path = REPO_ROOT) -> list[str]:
    """How the committed ``lessons/`` differs from a fresh release (empty when in sync)."""
    lessons = root / "lessons"
    with tempfile.TemporaryDirectory(prefix="release-check-") as tmp:
        fresh = Path(tmp) / "lessons"
        generate(root, fresh)
        have = _tree(lessons) if lessons.is_dir() else set()
        want = _tree(fresh)
        diffs = [f"lessons/{p}: missing" for p in sorted(want - have)]
        diffs += [f"lessons/{p}: not produced by the release" for p in sorted(have - want)]
        for rel in sorted(want & have):
            if not filecmp.cmp(lessons / rel, fresh / rel, shallow=False):
                diffs.append(f"lessons/{rel}: differs from what solutions/ releases")
        return diffs


def copy_course_skeleton(root: Path, dest: Path) -> None:
    """Copy what nbgrader needs of a course (config, solutions) to ``dest``, for scratch work."""
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copy2(root / "nbgrader_config.py", dest / "nbgrader_config.py")
    (dest / "grader").mkdir(exist_ok=True)
    shutil.copy2(root / "grader" / "nbgrader_config.py", dest / "grader" / "nbgrader_config.py")
    shutil.copytree(root / "solutions", dest / "solutions", dirs_exist_ok=True)
