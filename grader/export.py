"""Grades out of the gradebook: the per-exercise CSV, and the LMS's own import formats.

``exercises`` (the default): one row per student; for each lesson (in id order) one column per
graded cell named ``<lesson>/<exercise>`` (an autograded test cell ``fp16_bits_tests`` is the
exercise ``fp16_bits``; a written answer keeps its id), then ``<lesson>/total``, ``<lesson>/max``
and ``<lesson>/status`` (graded, rejected or failed with the reason, ``needs manual grading``, the
scan's flags); then ``total`` and ``max`` over the lessons exported. A student without a
submission gets empty cells and ``missing``.

``canvas``: Canvas's gradebook import CSV. Columns ``Student, ID, SIS User ID, SIS Login ID,
Section`` and one column per lesson titled ``<lesson> (<Canvas assignment id>)``, then a
``Points Possible`` row; each student's cell is the lesson's total (empty when there is no
submission or grading failed: there is nothing to send). Format: Canvas Instructor Guide,
"How do I import grades in the Gradebook?" (community.canvaslms.com), summarised with the same
columns at https://teaching.resources.osu.edu/toolsets/carmencanvas/guides/calculating-final-
grades/import-csv-file-carmen-grades, and the gradebook export it mirrors (its second row is
``Points Possible``, as here): Canvas finds the student by ``ID`` (the Canvas user id, the number
in Canvas's submission file names) and the assignment by the id in parentheses.

``moodle``: the assignment's offline grading worksheet (Moodle assignment, feedback type "Offline
grading worksheet"; one lesson per file). Columns ``Identifier, Full name, Email address, Status,
Grade, Maximum Grade, Grade can be changed, Last modified (submission), Last modified (grade),
Feedback comments``. Moodle's importer (https://github.com/moodle/moodle, files
mod/assign/feedback/offline/importgradeslib.php and locallib.php, strings in
mod/assign/lang/en/assign.php) reads ``Identifier`` as ``Participant <n>``, where ``<n>`` is
the participant number that also names the files of Moodle's submission download; ``Grade``;
``Last modified (grade)`` (strtotime; a grade changed in Moodle more than 60 s after it is kept);
and the feedback plugins' columns (``Feedback comments``). The other columns are informative.

Both LMS formats need each student's LMS identity: the roster used at intake (kept as
``intake/<lesson>/roster.csv``, columns ``student_id, lms_id`` and optionally ``name, email,
sis_user_id, sis_login_id, section``), else what intake read from the LMS file names
(``intake/<lesson>/identities.json``), else the student id itself when it is a number (intake
without a roster).
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

FORMATS = ("exercises", "canvas", "moodle")
#: Canvas's identity columns, in its order.
CANVAS_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
#: The offline grading worksheet's columns, in Moodle's order.
MOODLE_COLUMNS = [
    "Identifier",
    "Full name",
    "Email address",
    "Status",
    "Grade",
    "Maximum Grade",
    "Grade can be changed",
    "Last modified (submission)",
    "Last modified (grade)",
    "Feedback comments",
]


def _exercise(grade_id: str) -> str:
    return grade_id.removesuffix("_tests")


@dataclass
class LessonGrades:
    """One lesson's grades as the gradebook and the results hold them."""

    lesson: str
    cells: list[tuple[str, str, float]]  # (notebook, grade id, max score)
    max_score: float
    #: per student: ``{"scores": {grade id: points}, "total", "status" (graded/rejected/failed),
    #: "reason", "flags", "manual" (needs manual grading), "timestamp"}``; absent: no submission
    students: dict[str, dict] = field(default_factory=dict)


def collect(root: Path, lessons: list[str] | None, db_url: str | None) -> tuple[list[str], list]:
    """All students of the gradebook and each wanted lesson's grades (see :class:`LessonGrades`)."""
    from nbgrader.api import Gradebook, MissingEntry

    from grader.nbtools import tool_env

    os.environ["PATH"] = tool_env()["PATH"]  # nbgrader runs alembic from PATH
    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    out: list[LessonGrades] = []
    with Gradebook(db_url) as gb:
        wanted = lessons or sorted(a.name for a in gb.assignments)
        students = sorted(s.id for s in gb.students)
        for lesson in wanted:
            try:
                assignment = gb.find_assignment(lesson)
            except MissingEntry:
                raise ValueError(f"no lesson {lesson!r} in the gradebook") from None
            cells = [
                (nb.name, c.name, float(c.max_score))
                for nb in assignment.notebooks
                for c in nb.grade_cells
            ]
            grades = LessonGrades(lesson, cells, sum(m for _, _, m in cells))
            results = root / ".grader" / lesson / "results"
            for sid in students:
                try:
                    sub = gb.find_submission(lesson, sid)
                except MissingEntry:
                    continue
                scores: dict[str, float] = {}
                manual = False
                for nb_name, name, _ in cells:
                    grade = gb.find_grade(name, nb_name, lesson, sid)
                    scores[name] = float(grade.score) if grade.score is not None else 0.0
                    manual = manual or bool(grade.needs_manual_grade)
                info = {"status": "graded"}
                path = results / f"{sid}.json"
                if path.is_file():
                    info = json.loads(path.read_text())
                grades.students[sid] = {
                    "scores": scores,
                    "total": sum(scores.values()),
                    "status": info.get("status", "graded"),
                    "reason": info.get("reason", ""),
                    "flags": list(info.get("flags", [])),
                    "manual": manual,
                    "timestamp": sub.timestamp,
                }
            out.append(grades)
    return students, out


def _status(entry: dict) -> str:
    parts = [entry["status"]]
    if entry["reason"]:
        parts.append(entry["reason"])
    if entry["flags"]:
        parts.append("flags: " + ",".join(entry["flags"]))
    if entry["manual"]:
        parts.append("needs manual grading")
    return "; ".join(parts)


def export_csv(
    root: Path, out: Path, lessons: list[str] | None = None, db_url: str | None = None
) -> int:
    """Write the per-exercise CSV to ``out``; returns the number of student rows."""
    students, grades = collect(root, lessons, db_url)
    header = ["student_id"]
    rows: dict[str, dict[str, object]] = {
        sid: {"student_id": sid, "total": 0.0, "max": 0.0} for sid in students
    }
    for g in grades:
        header += [f"{g.lesson}/{_exercise(name)}" for _, name, _ in g.cells]
        header += [f"{g.lesson}/total", f"{g.lesson}/max", f"{g.lesson}/status"]
        for sid in students:
            row = rows[sid]
            row[f"{g.lesson}/max"] = g.max_score
            row["max"] = float(row["max"]) + g.max_score
            entry = g.students.get(sid)
            if entry is None:
                row[f"{g.lesson}/status"] = "missing"
                continue
            for name, score in entry["scores"].items():
                row[f"{g.lesson}/{_exercise(name)}"] = score
            row[f"{g.lesson}/total"] = entry["total"]
            row["total"] = float(row["total"]) + entry["total"]
            row[f"{g.lesson}/status"] = _status(entry)
    header += ["total", "max"]
    _write(out, header, [rows[sid] for sid in sorted(rows)])
    return len(rows)


def _write(out: Path, header: list[str], rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, restval="")
        writer.writeheader()
        writer.writerows(rows)


def identities(root: Path, lesson: str, roster: Path | None = None) -> dict[str, dict[str, str]]:
    """``{student_id: {"lms_id", "name", "email", "sis_user_id", "sis_login_id", "section"}}``.

    From ``roster`` (default: the roster used at intake of ``lesson``), completed by the
    identities intake read from the LMS file names.
    """
    from grader.intake import identities_path, read_roster_rows, roster_copy_path

    found: dict[str, dict[str, str]] = {}
    seen = identities_path(root, lesson)
    if seen.is_file():
        for sid, ident in json.loads(seen.read_text(encoding="utf-8")).items():
            found[sid] = {"lms_id": str(ident.get("lms_id", "")), "name": ident.get("name", "")}
    path = roster or roster_copy_path(root, lesson)
    if path.is_file():
        for row in read_roster_rows(path):
            sid = row["student_id"]
            entry = found.setdefault(sid, {})
            for key in ("lms_id", "name", "email", "sis_user_id", "sis_login_id", "section"):
                if row.get(key):
                    entry[key] = row[key]
    return found


def _lms_id(student: str, idents: dict[str, dict[str, str]]) -> str | None:
    got = idents.get(student, {}).get("lms_id")
    if got:
        return got
    return student if student.isdigit() else None  # intake without a roster: the LMS id


def _points(value: float) -> str:
    return f"{value:g}"


@dataclass
class LmsExport:
    """What an LMS export wrote, and what the instructor should know about it."""

    rows: int = 0
    warnings: list[str] = field(default_factory=list)


def _graded_total(entry: dict | None, lesson: str, student: str, result: LmsExport) -> str:
    """The total to send, or ``""`` (no submission, or grading failed: the LMS keeps its grade)."""
    if entry is None:
        return ""
    if entry["status"] == "failed":
        result.warnings.append(
            f"{student} {lesson}: grading failed ({entry['reason']}): left empty"
        )
        return ""
    if entry["manual"]:
        result.warnings.append(
            f"{student} {lesson}: written answers not graded yet: sent the autograded part only"
        )
    return _points(entry["total"])


def export_canvas(
    root: Path,
    out: Path,
    lessons: list[str] | None = None,
    db_url: str | None = None,
    assignment_ids: dict[str, str] | None = None,
    roster: Path | None = None,
) -> LmsExport:
    """Write Canvas's gradebook import CSV (see the module docstring)."""
    students, grades = collect(root, lessons, db_url)
    ids = assignment_ids or {}
    result = LmsExport()
    columns = {
        g.lesson: f"{g.lesson} ({ids[g.lesson]})" if g.lesson in ids else g.lesson for g in grades
    }
    for g in grades:
        if g.lesson not in ids:
            result.warnings.append(
                f"{g.lesson}: no Canvas assignment id (--lms-assignment {g.lesson}=ID): Canvas "
                "may create a new assignment from this column"
            )
    idents: dict[str, dict[str, str]] = {}
    for g in grades:
        for sid, ident in identities(root, g.lesson, roster).items():
            idents.setdefault(sid, {}).update({k: v for k, v in ident.items() if v})
    header = CANVAS_COLUMNS + [columns[g.lesson] for g in grades]
    rows: list[dict] = [
        {"Student": "Points Possible", **{columns[g.lesson]: _points(g.max_score) for g in grades}}
    ]
    for sid in sorted(set(students) | set(idents)):
        lms_id = _lms_id(sid, idents)
        if lms_id is None:
            result.warnings.append(f"{sid}: no Canvas user id in the roster: not exported")
            continue
        ident = idents.get(sid, {})
        row = {
            "Student": ident.get("name") or sid,
            "ID": lms_id,
            "SIS User ID": ident.get("sis_user_id", ""),
            "SIS Login ID": ident.get("sis_login_id", ""),
            "Section": ident.get("section", ""),
        }
        for g in grades:
            row[columns[g.lesson]] = _graded_total(g.students.get(sid), g.lesson, sid, result)
        rows.append(row)
        result.rows += 1
    _write(out, header, rows)
    return result


def _moodle_date(when: datetime | None) -> str:
    """A date Moodle's importer reads back (PHP strtotime), in UTC."""
    if when is None:
        return ""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # nbgrader keeps UTC timestamps without a zone
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _feedback(g: LessonGrades, entry: dict) -> str:
    parts = [
        f"{_exercise(name)} {_points(entry['scores'].get(name, 0.0))}/{_points(top)}"
        for _, name, top in g.cells
    ]
    text = f"{_points(entry['total'])}/{_points(g.max_score)}: " + ", ".join(parts)
    if entry["reason"]:
        text += f" ({entry['status']}: {entry['reason']})"
    if entry["manual"]:
        text += " (written answers not graded yet)"
    return text


def export_moodle(
    root: Path,
    out: Path,
    lesson: str,
    db_url: str | None = None,
    roster: Path | None = None,
    now: datetime | None = None,
) -> LmsExport:
    """Write the offline grading worksheet of one lesson (see the module docstring).

    ``now`` is the ``Last modified (grade)`` written (default: the time of export), so Moodle
    takes these grades over ones it had before.
    """
    students, (g,) = collect(root, [lesson], db_url)
    idents = identities(root, lesson, roster)
    graded_at = _moodle_date(now or datetime.now(UTC))
    result = LmsExport()
    rows = []
    for sid in sorted(set(students) | set(idents)):
        lms_id = _lms_id(sid, idents)
        if lms_id is None:
            result.warnings.append(f"{sid}: no Moodle participant number in the roster: skipped")
            continue
        ident = idents.get(sid, {})
        entry = g.students.get(sid)
        grade = _graded_total(entry, lesson, sid, result)
        rows.append(
            {
                "Identifier": f"Participant {lms_id}",
                "Full name": ident.get("name") or sid,
                "Email address": ident.get("email", ""),
                "Status": "No submission"
                if entry is None
                else ("Submitted for grading - Graded" if grade else "Submitted for grading"),
                "Grade": f"{float(grade):.2f}" if grade else "",
                "Maximum Grade": f"{g.max_score:.2f}",
                "Grade can be changed": "Yes",
                "Last modified (submission)": _moodle_date(entry["timestamp"]) if entry else "",
                "Last modified (grade)": graded_at if grade else "",
                "Feedback comments": _feedback(g, entry) if entry and grade else "",
            }
        )
        result.rows += 1
    _write(out, MOODLE_COLUMNS, rows)
    return result
