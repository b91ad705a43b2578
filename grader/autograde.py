"""Parallel, sandboxed, resumable autograding of one lesson's submissions.

For each submission a worker copies a template course (config and a gradebook holding only this
lesson) into a scratch folder with only the student's ``.ipynb``, rejects what cannot be graded
(with the reason, zero points), runs ``nbgrader autograde`` there with
:class:`grader.execute.SandboxedExecute` and writes the result atomically to
``.grader/<lesson>/results/``, keyed by hashes of the submission and the lesson. The parent alone
merges results into the real gradebook (``db_url``: SQLite or PostgreSQL) and ``autograded/``. A
re-run grades only what has no result for its key and merges what was written but not merged;
``submitted/`` is only read. ``shard=(i, n)`` grades share ``i`` of ``n`` of the students.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from grader import REPO_ROOT
from grader.cells import describe_timeout, lesson_key
from grader.keys import ensure_key, kernel_env
from grader.nbtools import nbgrader, tool_env
from grader.release import copy_course_skeleton
from grader.sandbox import Limits, Settings, course_dir
from grader.settings import CELL_LIMITS_ENV, EVENTS_ENV, SANDBOX_ENV, configured

#: Student ids that are safe as folder names (no path characters, no leading dot).
STUDENT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,99}$")

SCRATCH_CONFIG = """
from nbconvert.preprocessors import ClearMetadataPreprocessor
from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, IgnorePattern,
                                    LimitOutput, SaveAutoGrades)
from grader.execute import SandboxedExecute

c.Autograde.autograde_preprocessors = [
    SandboxedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput, SaveAutoGrades,
    AssignLatePenalties, CheckCellMetadata,
]
c.OverwriteCells.add_missing_cells = True
"""


@dataclass
class Outcome:
    """One submission's result (what the report and the CSV show)."""

    student: str
    status: str  # graded | rejected | failed
    reason: str = ""
    scores: dict[str, float] = field(default_factory=dict)
    max_scores: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0
    flags: list[str] = field(default_factory=list)
    #: not graded in this run: an earlier result for the same submission and lesson holds
    skipped: bool = False
    #: the gradebook's total and maximum after the run (manual grades included)
    total: float | None = None
    max_total: float | None = None
    #: points of written answers that still wait for a manual grade
    ungraded: float = 0.0


def valid_student_id(student: str) -> bool:
    return bool(STUDENT_ID.match(student)) and ".." not in student


def shard_of(student: str, n: int) -> int:
    """The 1-based share of ``n`` that ``student`` belongs to (stable across machines)."""
    digest = hashlib.sha256(student.encode()).digest()
    return int.from_bytes(digest[:8], "big") % n + 1


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _atomic_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class Template:
    """A scratch course with only ``lesson`` in its gradebook, copied for each submission."""

    def __init__(self, root: Path, lesson: str, work: Path) -> None:
        self.root = root
        self.lesson = lesson
        self.dir = work / "template"
        if self.dir.exists():
            shutil.rmtree(self.dir)
        copy_course_skeleton(root, self.dir)
        nbgrader(["generate_assignment", lesson, "--force", "--create"], cwd=self.dir)
        with open(self.dir / "nbgrader_config.py", "a", encoding="utf-8") as fh:
            fh.write(SCRATCH_CONFIG)
        # Only the lesson's extra files go to the sandbox (never a notebook with solutions).
        self.lesson_files = work / "lesson-files"
        if self.lesson_files.exists():
            shutil.rmtree(self.lesson_files)
        self.lesson_files.mkdir(parents=True)
        for entry in (self.dir / "lessons" / lesson).iterdir():
            if entry.suffix != ".ipynb" and entry.name not in {".ipynb_checkpoints"}:
                (shutil.copytree if entry.is_dir() else shutil.copy2)(
                    entry, self.lesson_files / entry.name
                )
        for other in (self.dir / "solutions").iterdir():
            if other.name != lesson:
                shutil.rmtree(other)
        for nb in (self.dir / "solutions" / lesson).glob("*.ipynb"):
            nb.unlink()
        self.release = nbformat.read(
            self.dir / "lessons" / lesson / f"{lesson}.ipynb", as_version=4
        )
        self.source = nbformat.read(root / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
        self.grade_ids = {
            c.metadata["nbgrader"]["grade_id"]
            for c in self.source.cells
            if c.metadata.get("nbgrader", {}).get("grade_id")
        }
        self.known_lines = frozenset(
            ln.strip() for c in self.source.cells for ln in c.source.splitlines()
        )
        self.key = lesson_key(root, lesson)

    def scratch(self, student: str) -> Path:
        dest = Path(tempfile.mkdtemp(prefix=f"{student[:20]}-", dir=self.dir.parent / "scratch"))
        for name in ("nbgrader_config.py", "gradebook.db"):
            shutil.copy2(self.dir / name, dest / name)
        shutil.copytree(self.dir / "grader", dest / "grader")
        shutil.copytree(self.dir / "solutions", dest / "solutions")
        return dest


def normalize(nb: nbformat.NotebookNode, release: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Put back the released nbgrader metadata on the cells of ``nb`` (a copy of a submission).

    nbgrader restores the source of locked cells, but a submission whose metadata was edited
    (points, the ``grade`` flag, a solution cell marked as graded) makes it stop with
    "Inconsistent checksums" or a missing gradebook entry. Here every cell whose ``grade_id`` is
    the lesson's gets exactly its released metadata, and nbgrader metadata naming no exercise of
    the lesson is dropped (the cell becomes an ordinary cell), as is the metadata of every copy
    of a cell after the first (nbgrader's own de-duplication leaves cells it then fails on).
    Deleted test cells are re-added by nbgrader (``add_missing_cells``).
    """
    released = {
        c.metadata["nbgrader"]["grade_id"]: c.metadata["nbgrader"]
        for c in release.cells
        if isinstance(c.metadata.get("nbgrader"), dict) and c.metadata["nbgrader"].get("grade_id")
    }
    seen: set[str] = set()
    for cell in nb.cells:
        meta = cell.get("metadata", {}).get("nbgrader")
        if meta is None:
            continue
        gid = meta.get("grade_id") if isinstance(meta, dict) else None
        if gid in released and gid not in seen:
            cell.metadata["nbgrader"] = json.loads(json.dumps(released[gid]))
            seen.add(gid)
        else:  # not an exercise of this lesson, or a later copy of one (the first one counts)
            del cell.metadata["nbgrader"]
    return nb


def check_submission(path: Path, template: Template) -> str | None:
    """Why the notebook at ``path`` cannot be graded (``None`` if it can)."""
    try:
        raw = path.read_bytes()
        data = json.loads(raw)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"not a readable notebook (broken JSON): {str(exc)[:120]}"
    try:
        nb = nbformat.from_dict(data)
        nbformat.validate(nb)
    except Exception as exc:  # noqa: BLE001 - any reader error rejects the file
        return f"not a valid notebook: {str(exc).splitlines()[0][:120]}"
    if not nb.get("cells"):
        return "empty notebook: it has no cells"
    ids = {
        c.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        for c in nb.cells
        if isinstance(c.get("metadata", {}).get("nbgrader"), dict)
    } - {None}
    if not ids & template.grade_ids:
        theirs = ", ".join(sorted(map(str, ids))[:5]) or "none"
        return (
            f"not a notebook of {template.lesson}: none of its exercise ids ({theirs}) belong to "
            "this lesson (another lesson's notebook?)"
        )
    return None


def _read_scratch(scratch: Path, lesson: str, student: str) -> dict:
    from nbgrader.api import Gradebook

    grades = []
    with Gradebook(f"sqlite:///{scratch / 'gradebook.db'}") as gb:
        sub = gb.find_submission(lesson, student)
        timestamp = sub.timestamp.isoformat() if sub.timestamp else None
        for nb in sub.notebooks:
            for grade in nb.grades:
                grades.append(
                    {
                        "notebook": nb.name,
                        "grade_id": grade.name,
                        "auto_score": grade.auto_score,
                        "max_score": grade.max_score,
                        "needs_manual_grade": grade.needs_manual_grade,
                    }
                )
            comments = [
                {"notebook": nb.name, "grade_id": c.name, "auto_comment": c.auto_comment}
                for c in nb.comments
            ]
            penalty = nb.late_submission_penalty
    return {"grades": grades, "comments": comments, "timestamp": timestamp, "penalty": penalty}


def grade_one(
    template: Template,
    student: str,
    notebook: Path,
    settings: Settings,
    work: Path,
    calibration: dict | None = None,
) -> dict:
    """Grade one submission in a scratch course; returns the result record (not merged).

    ``calibration`` (from :func:`grader.calibrate.load`) gives each cell its own time limit.
    """
    start = time.monotonic()
    result: dict = {
        "student": student,
        "key": None,
        "status": "graded",
        "reason": "",
        "events": [],
        "cells": {},
    }
    result["key"] = f"{template.key}-{_sha(notebook)}"
    problem = check_submission(notebook, template)
    if problem:
        result.update(status="rejected", reason=problem, grades=[], comments=[])
        result["seconds"] = time.monotonic() - start
        return result
    from grader.scan import scan_notebook

    result["flags"] = scan_notebook(notebook, template.known_lines)
    phases: dict[str, float] = {}
    scratch = template.scratch(student)
    try:
        dest = scratch / "submitted" / student / template.lesson
        dest.mkdir(parents=True)
        # Only the notebook, with its nbgrader metadata put back as released (see normalize).
        nb = normalize(nbformat.read(notebook, as_version=4), template.release)
        nbformat.write(nb, dest / f"{template.lesson}.ipynb")
        stamp = notebook.parent / "timestamp.txt"
        if stamp.is_file():
            shutil.copy2(stamp, dest / "timestamp.txt")
        events = scratch / "events.json"
        env = tool_env({SANDBOX_ENV: settings.to_env(), EVENTS_ENV: str(events)})
        if calibration:
            env[CELL_LIMITS_ENV] = json.dumps(calibration)
        argv = ["autograde", template.lesson, f"--student={student}", "--create", "--force"]
        timeout = settings.limits.notebook_timeout + 600
        launched = time.monotonic()
        phases["before nbgrader"] = launched - start
        proc = run_nbgrader(argv, scratch, env, timeout)
        phases["nbgrader"] = time.monotonic() - launched
        autograded = scratch / "autograded" / student / template.lesson / f"{template.lesson}.ipynb"
        if proc.returncode != 0 or not autograded.is_file():
            log = (proc.stdout + proc.stderr).strip().splitlines()
            errors = [ln for ln in log if "[ERROR]" in ln or "Error" in ln][-3:] or log[-3:]
            result.update(
                status="failed",
                reason="nbgrader could not grade it: " + " | ".join(errors)[:400],
                grades=[],
                comments=[],
            )
        else:
            result.update(_read_scratch(scratch, template.lesson, student))
            if events.is_file():
                info = json.loads(events.read_text())
                result["events"] = info.get("events", [])
                result["cells"] = info.get("cells", {})
                result["timeouts"] = info.get("timeouts", [])
                if result["timeouts"]:
                    result["reason"] = "; ".join(map(describe_timeout, result["timeouts"]))
            keep = work / "autograded" / student
            if keep.exists():
                shutil.rmtree(keep)
            shutil.copytree(autograded.parent, keep)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    result["seconds"] = time.monotonic() - start
    phases["after nbgrader"] = result["seconds"] - sum(phases.values())
    result["phases"] = phases  # where the worker's time went (grader.benchmark prints it)
    return result


#: nbgrader runs in a child of multiprocessing's fork server, which imports nbgrader, its
#: executor and torch (the judges') once: their seconds of imports are paid once per run, not once
#: per submission. Each child is a fresh process (its own traitlets singletons) that runs
#: nbgrader's command line in the scratch course.
NBGRADER = multiprocessing.get_context("forkserver")
NBGRADER.set_forkserver_preload(
    [
        "nbgrader.apps.nbgraderapp",
        "nbgrader.converters",
        "nbgrader.preprocessors",
        "nbclient",
        "jupyter_client",
        "sqlalchemy",
        "torch",
    ]
)


def _nbgrader_child(argv: list[str], cwd: str, env: dict[str, str], log: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    # As ``python -m nbgrader`` in ``cwd``: its folder first, its ``grader`` package the one used.
    for name in [m for m in sys.modules if m == "grader" or m.startswith("grader.")]:
        del sys.modules[name]
    sys.path.insert(0, cwd)
    sys.argv = ["nbgrader", *argv]
    from nbgrader.apps.nbgraderapp import main

    code: int | str | None = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code
    finally:
        atexit._run_exitfuncs()  # a forked child skips them; nbgrader's and the timing stamps
    sys.exit(code)


def run_nbgrader(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    """``nbgrader ARGV`` in ``cwd`` with exactly ``env``, in a fresh child of the fork server;
    killed (:class:`subprocess.TimeoutExpired`) past ``timeout`` seconds."""
    log = cwd.parent / f"{cwd.name}.nbgrader.log"
    child = NBGRADER.Process(target=_nbgrader_child, args=(argv, str(cwd), env, str(log)))
    child.start()
    child.join(timeout)
    if child.is_alive():
        child.kill()
        child.join()
    output = log.read_text(errors="replace") if log.is_file() else ""
    log.unlink(missing_ok=True)
    if child.exitcode == -9:
        raise subprocess.TimeoutExpired(argv, timeout, output=output)
    return subprocess.CompletedProcess(argv, int(child.exitcode or 0), output, "")


def ensure_assignment(root: Path, lesson: str, db_url: str) -> None:
    """Put ``lesson`` into the real gradebook if it is not there yet."""
    from nbgrader.api import Gradebook, MissingEntry

    os.environ["PATH"] = tool_env()["PATH"]  # nbgrader runs alembic from PATH
    with Gradebook(db_url) as gb:
        try:
            gb.find_assignment(lesson)
            return
        except MissingEntry:
            pass
    with tempfile.TemporaryDirectory(prefix="grader-release-") as tmp:
        nbgrader(
            [
                "generate_assignment",
                lesson,
                "--force",
                "--create",
                f"--CourseDirectory.release_directory={tmp}",
                f"--CourseDirectory.db_url={db_url}",
            ],
            cwd=root,
        )


def _answer_checksums(notebook: Path) -> dict[str, str] | None:
    """nbgrader's checksum of every graded cell of an autograded notebook (``None``: no file)."""
    from nbgrader.utils import compute_checksum, is_grade

    if not notebook.is_file():
        return None
    try:
        nb = nbformat.read(notebook, as_version=4)
    except Exception:  # noqa: BLE001 - an unreadable earlier copy compares as unknown
        return None
    return {
        c.metadata["nbgrader"]["grade_id"]: compute_checksum(c)
        for c in nb.cells
        if is_grade(c) and c.metadata["nbgrader"].get("grade_id")
    }


def regrade_log_path(root: Path, lesson: str) -> Path:
    """The regrade log of ``lesson``: ``.grader/<lesson>/regrades.jsonl``, a line per regrade."""
    return root / ".grader" / lesson / "regrades.jsonl"


def _append_jsonl(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record, sort_keys=True) + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def _keep_manual(grade, new: dict, before: str | None, after: str | None) -> dict:
    """Decide what becomes of ``grade``'s manual score when ``new`` (a result's grade) replaces
    its autograde; updates ``grade`` and returns the regrade log's entry.

    A written answer (a cell nbgrader grades by hand) keeps its manual score while nbgrader's
    checksum of the cell is the one graded by hand (``before``), and is then not flagged for
    manual grading again; a changed answer loses it and is flagged. A manual score given to an
    autograded cell is kept and flagged for review (the autograde under it may have changed).
    """
    entry = {
        "notebook": new["notebook"],
        "grade_id": new["grade_id"],
        "manual_score": grade.manual_score,
        "extra_credit": grade.extra_credit,
    }
    if new["auto_score"] is not None:
        grade.needs_manual_grade = True
        return entry | {
            "action": "kept",
            "why": "a manual score of an autograded cell: flagged for review (its autograde "
            f"is now {new['auto_score']:g})",
        }
    if before is not None and before == after:
        grade.needs_manual_grade = False
        return entry | {"action": "kept", "why": "the written answer is unchanged"}
    if before is None:
        grade.needs_manual_grade = True
        return entry | {
            "action": "kept",
            "why": "the answer graded by hand is not in autograded/ to compare with: flagged "
            "for manual grading",
        }
    grade.manual_score = None
    grade.extra_credit = None
    grade.needs_manual_grade = True
    return entry | {
        "action": "cleared",
        "why": "the written answer changed since it was graded by hand: grade it again",
    }


def merge(root: Path, lesson: str, db_url: str, result: dict, work: Path) -> None:
    """Write one result into the real gradebook and ``autograded/`` (the parent only).

    Manual grades (formgrader) survive a regrade unless the written answer changed (see
    :func:`_keep_manual`); every regrade of a submission already in the gradebook appends a line
    to :func:`regrade_log_path` with the scores before and after and what became of each manual
    grade.
    """
    from datetime import UTC, datetime

    from nbgrader.api import Gradebook, MissingEntry

    student = result["student"]
    src = work / "autograded" / student
    dest = root / "autograded" / student / lesson
    graded_by_hand = _answer_checksums(dest / f"{lesson}.ipynb")
    now_graded = _answer_checksums(src / f"{lesson}.ipynb") or {}
    record = None
    with warnings.catch_warnings(), Gradebook(db_url) as gb:
        # nbgrader's own update_or_create_submission trips SQLAlchemy's autoflush warnings.
        warnings.simplefilter("ignore")
        gb.update_or_create_student(student)
        try:
            previous = gb.find_submission(lesson, student)
            record = {
                "time": datetime.now(UTC).isoformat(timespec="seconds"),
                "student": student,
                "lesson": lesson,
                "status": result["status"],
                "key": result.get("key"),
                "score_before": float(previous.score),
                "max_score": float(previous.max_score),
                "manual_grades": [],
            }
        except MissingEntry:
            pass
        ts = result.get("timestamp")
        kwargs = {"timestamp": datetime.fromisoformat(ts)} if ts else {}
        sub = gb.update_or_create_submission(lesson, student, **kwargs)
        manual = record["manual_grades"] if record else []
        if result["status"] == "graded":
            for g in result["grades"]:
                grade = gb.find_grade(g["grade_id"], g["notebook"], lesson, student)
                grade.auto_score = g["auto_score"]
                if grade.manual_score is None:
                    grade.needs_manual_grade = g["needs_manual_grade"]
                    continue
                old = (graded_by_hand or {}).get(g["grade_id"]) if graded_by_hand else None
                manual.append(_keep_manual(grade, g, old, now_graded.get(g["grade_id"])))
            for c in result.get("comments", []):
                comment = gb.find_comment(c["grade_id"], c["notebook"], lesson, student)
                comment.auto_comment = c["auto_comment"]
        else:  # rejected or failed: zero everywhere, nothing left to grade by hand
            for nb in sub.notebooks:
                for grade in nb.grades:
                    grade.auto_score = 0
                    grade.needs_manual_grade = False
                    if grade.manual_score is None:
                        continue
                    entry = {
                        "notebook": nb.name,
                        "grade_id": grade.name,
                        "manual_score": grade.manual_score,
                        "extra_credit": grade.extra_credit,
                    }
                    if result["status"] == "rejected":
                        grade.manual_score = grade.extra_credit = None
                        why = "the submission cannot be graded: " + result.get("reason", "")
                        manual.append(entry | {"action": "cleared", "why": why[:300]})
                    else:
                        why = "the grader failed (a re-run grades it again)"
                        manual.append(entry | {"action": "kept", "why": why})
        gb.db.commit()
        if record is not None:
            sub = gb.find_submission(lesson, student)
            record["score_after"] = float(sub.score)
            record["max_score"] = float(sub.max_score)
            record["needs_manual_grade"] = bool(sub.needs_manual_grade)
    if dest.exists():
        shutil.rmtree(dest)
    if src.is_dir() and result["status"] == "graded":
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dest)
    if record is not None:
        _append_jsonl(regrade_log_path(root, lesson), record)


def find_submissions(root: Path, lesson: str) -> tuple[dict[str, Path], list[Outcome]]:
    """``{student: notebook}`` from ``submitted/``, and rows for folders that cannot be graded."""
    found: dict[str, Path] = {}
    bad: list[Outcome] = []
    base = root / "submitted"
    if not base.is_dir():
        return found, bad
    for entry in sorted(base.iterdir()):
        folder = entry / lesson
        if not folder.is_dir():
            continue
        if not valid_student_id(entry.name):
            bad.append(
                Outcome(
                    entry.name,
                    "rejected",
                    "student id has characters not allowed "
                    "in an id (letters, digits, _ . @ + - only)",
                )
            )
            continue
        nb = folder / f"{lesson}.ipynb"
        if not nb.is_file():
            others = sorted(p.name for p in folder.glob("*.ipynb"))
            bad.append(
                Outcome(
                    entry.name,
                    "rejected",
                    f"no {lesson}.ipynb in the submission"
                    + (f" (found {', '.join(others)})" if others else ""),
                )
            )
            continue
        found[entry.name] = nb
    return found, bad


def _outcome(result: dict, skipped: bool = False) -> Outcome:
    scores = {g["grade_id"]: float(g["auto_score"] or 0) for g in result.get("grades", [])}
    maxes = {g["grade_id"]: float(g["max_score"]) for g in result.get("grades", [])}
    reason = result.get("reason", "")
    bad = {k: v for k, v in result.get("cells", {}).items() if v not in ("ok", "error")}
    if bad and not reason:
        reason = "; ".join(f"{k}: {v}" for k, v in sorted(bad.items()))
    return Outcome(
        result["student"],
        result["status"],
        reason,
        scores,
        maxes,
        float(result.get("seconds", 0.0)),
        list(result.get("flags", [])),
        skipped,
    )


def gradebook_totals(lesson: str, db_url: str, outcomes: list[Outcome]) -> list[Outcome]:
    """Fill each outcome's total, maximum and ungraded points from the gradebook (what formgrader,
    feedback and export see, manual grades included); returns ``outcomes`` sorted by student."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url) as gb:
        for o in outcomes:
            try:
                sub = gb.find_submission(lesson, o.student)
            except MissingEntry:
                continue
            o.total, o.max_total = float(sub.score), float(sub.max_score)
            o.ungraded = float(
                sum(
                    float(g.max_score)
                    for nb in sub.notebooks
                    for g in nb.grades
                    if g.needs_manual_grade and g.manual_score is None and g.auto_score is None
                )
            )
    return sorted(outcomes, key=lambda o: o.student)


def autograde(
    lesson: str,
    root: Path = REPO_ROOT,
    db_url: str | None = None,
    workers: int | None = None,
    limits: Limits | None = None,
    mode: str = "bwrap",
    shard: tuple[int, int] = (1, 1),
    students: list[str] | None = None,
    force: bool = False,
    progress: bool = True,
    calibration: dict | None = None,
) -> list[Outcome]:
    """Grade every submission of ``lesson`` in ``root/submitted``; see the module docstring.

    ``calibration`` (:func:`grader.calibrate.load`) sets per-cell limits in place of
    ``limits.cell_timeout``; the caller decides whether to use one (the CLI does by default).
    """
    root = root.resolve()
    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    workers = max(1, workers or os.cpu_count() or 1)
    limits = limits or Limits()
    limits.threads = max(1, (os.cpu_count() or 1) // workers)
    work = root / ".grader" / lesson
    (work / "scratch").mkdir(parents=True, exist_ok=True)
    (work / "results").mkdir(parents=True, exist_ok=True)
    for stale in (work / "scratch").iterdir():  # left by an interrupted run
        shutil.rmtree(stale, ignore_errors=True)

    submissions, outcomes = find_submissions(root, lesson)
    if students:
        submissions = {s: p for s, p in submissions.items() if s in students}
    i, n = shard
    submissions = {s: p for s, p in submissions.items() if shard_of(s, n) == i}
    lkey = lesson_key(root, lesson)
    ensure_assignment(root, lesson, db_url)  # cheap when the gradebook already has it
    course_key = ensure_key(root)  # hidden tests' seeds: see grader/keys.py
    course_code = str(course_dir(root))  # the course's own package, not another checkout's
    uid_base = configured(root).uid_base

    todo: dict[str, Path] = {}
    for student, nb in sorted(submissions.items()):
        path = work / "results" / f"{student}.json"
        key = f"{lkey}-{_sha(nb)}"
        if path.is_file() and not force:
            old = json.loads(path.read_text())
            # "failed" means the grader itself failed (or was interrupted): try again.
            if old.get("key") == key and old.get("status") in ("graded", "rejected"):
                if not old.get("merged"):
                    merge(root, lesson, db_url, old, work)
                    old["merged"] = True
                    _atomic_json(path, old)
                outcomes.append(_outcome(old, skipped=True))
                continue
        todo[student] = nb

    if not todo:
        return gradebook_totals(lesson, db_url, outcomes)
    lock = threading.Lock()
    slots = list(range(workers))

    def job(student: str, nb: Path) -> dict:
        with lock:
            slot = slots.pop()
        try:
            settings = Settings(
                limits=limits,
                mode=mode,
                slot=slot,
                lesson_files=str(template.lesson_files),
                kernel_env=kernel_env(course_key, student),
                course_dir=course_code,
                uid_base=uid_base,
            )
            return grade_one(template, student, nb, settings, work, calibration)
        finally:
            with lock:
                slots.append(slot)

    bar = None
    if progress and todo:
        from tqdm import tqdm

        bar = tqdm(total=len(todo), desc=f"grading {lesson}", unit="nb", dynamic_ncols=True)
    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        template = Template(root, lesson, work)
        futures = {pool.submit(job, s, p): s for s, p in todo.items()}
        for future in as_completed(futures):
            student = futures[future]
            try:
                result = future.result()
            except Exception as exc:  # noqa: BLE001 - one failure never stops the batch
                result = {
                    "student": student,
                    "status": "failed",
                    "key": None,
                    "reason": f"grader error: {type(exc).__name__}: {exc}"[:400],
                    "grades": [],
                    "comments": [],
                }
            path = work / "results" / f"{student}.json"
            _atomic_json(path, result)
            merge(root, lesson, db_url, result, work)
            result["merged"] = True
            _atomic_json(path, result)
            outcomes.append(_outcome(result))
            if bar:
                bar.update(1)
                bar.set_postfix_str(f"last: {student} {result['status']}")
    finally:
        # On Ctrl-C: start nothing new; running jobs die with their nbgrader child and their
        # results are not recorded, so a re-run grades them again.
        pool.shutdown(wait=True, cancel_futures=True)
        if bar:
            bar.close()
    return gradebook_totals(lesson, db_url, outcomes)
