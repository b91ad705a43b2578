"""Grades out of the gradebook: the per-exercise CSV, and the LMS's own import formats.

``exercises``: one row per student, per lesson a column per exercise, its total, max and status.
``canvas``: Canvas's gradebook import CSV (a column per lesson, ``Points Possible`` row).
``moodle``: the assignment's offline grading worksheet (one lesson; Moodle's importer reads
``Identifier`` as ``Participant <n>``, ``Grade``, ``Last modified (grade)``, ``Feedback
comments``: mod/assign/feedback/offline/importgradeslib.php). The LMS formats map students back
through the identities and roster kept at intake, never across LMSes, and scale totals to the LMS
assignment's maximum (given, or read from its download at intake; refused without one). Late
penalties are subtracted; written answers not graded yet stay blank. Both LMS formats are also
nbgrader export plugins (:class:`CanvasExportPlugin`, :class:`MoodleExportPlugin`).
"""

from __future__ import annotations

import csv
import json
import os
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from nbgrader.plugins import ExportPlugin
from traitlets import Dict, Unicode

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
    #: per student: ``{"scores": {grade id: points, or None when not graded yet}, "total" (after
    #: the late penalty), "penalty", "seconds_late", "status" (graded/rejected/failed),
    #: "reason", "flags", "ungraded" (written answers without a grade), "review" (graded cells
    #: nbgrader flags for a person to look at), "manual_sent" (manual
    #: points in the total), "timestamp", "messages" ({grade id: why the test failed})};
    #: absent: no submission
    students: dict[str, dict] = field(default_factory=dict)


def failure_messages(root: Path, lesson: str, student: str) -> dict[str, str]:
    """``{grade id: last line of the error}`` of each failed graded cell (autograded notebook)."""
    import nbformat

    out: dict[str, str] = {}
    for path in sorted((root / "autograded" / student / lesson).glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
            for o in cell.get("outputs", []) if gid else []:
                if o.get("output_type") == "error":
                    text = f"{o.get('ename', 'Error')}: {o.get('evalue', '')}".strip()
                    out[gid] = text.splitlines()[0][:300] if text else "error"
                    break
    return out


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
                scores: dict[str, float | None] = {}
                ungraded: list[str] = []
                review: list[str] = []
                manual_sent = False
                for nb_name, name, _ in cells:
                    grade = gb.find_grade(name, nb_name, lesson, sid)
                    if grade.manual_score is not None:
                        manual_sent = True
                    if (
                        grade.needs_manual_grade
                        and grade.manual_score is None
                        and grade.auto_score is None
                    ):
                        scores[name] = None  # not graded yet: no score, not zero
                        ungraded.append(name)
                    else:
                        if grade.needs_manual_grade:  # graded, and flagged for a person to look
                            review.append(name)
                        scores[name] = float(grade.score) if grade.score is not None else 0.0
                penalty = float(sub.late_submission_penalty or 0.0)
                info = {"status": "graded"}
                path = results / f"{sid}.json"
                if path.is_file():
                    info = json.loads(path.read_text())
                grades.students[sid] = {
                    "scores": scores,
                    "total": sum(v for v in scores.values() if v is not None) - penalty,
                    "penalty": penalty,
                    "seconds_late": float(sub.total_seconds_late),
                    "status": info.get("status", "graded"),
                    "reason": info.get("reason", ""),
                    "flags": list(info.get("flags", [])),
                    "ungraded": ungraded,
                    "review": review,
                    "manual_sent": manual_sent,
                    "timestamp": sub.timestamp,
                    "messages": failure_messages(root, lesson, sid),
                }
            out.append(grades)
    return students, out


def _status(entry: dict) -> str:
    parts = [entry["status"]]
    if entry["reason"]:
        parts.append(entry["reason"])
    if entry["flags"]:
        parts.append("flags: " + ",".join(entry["flags"]))
    if entry["penalty"]:
        parts.append(f"late penalty -{_points(entry['penalty'])}")
    if entry["ungraded"]:
        parts.append("needs manual grading: " + ",".join(entry["ungraded"]))
    if entry["review"]:
        parts.append("graded, flagged for review: " + ",".join(entry["review"]))
    return "; ".join(parts)


def _ungraded_warnings(grades: list[LessonGrades]) -> list[str]:
    return [
        f"{sid} {g.lesson}: written answers not graded yet ({', '.join(e['ungraded'])}): "
        "left blank, the total holds the graded part only"
        for g in grades
        for sid, e in sorted(g.students.items())
        if e["ungraded"]
    ]


def export_csv(
    root: Path,
    out: Path,
    lessons: list[str] | None = None,
    db_url: str | None = None,
    warnings: list[str] | None = None,
) -> int:
    """Write the per-exercise CSV to ``out``; returns the number of student rows.

    A written answer not graded yet is blank (not 0); ``warnings`` gets a line for each.
    """
    students, grades = collect(root, lessons, db_url)
    header = ["student_id"]
    rows: dict[str, dict[str, object]] = {
        sid: {"student_id": sid, "total": 0.0, "max": 0.0} for sid in students
    }
    for g in grades:
        header += [f"{g.lesson}/{_exercise(name)}" for _, name, _ in g.cells]
        header += [
            f"{g.lesson}/late_penalty",
            f"{g.lesson}/total",
            f"{g.lesson}/max",
            f"{g.lesson}/status",
        ]
        for sid in students:
            row = rows[sid]
            row[f"{g.lesson}/max"] = g.max_score
            row["max"] = float(row["max"]) + g.max_score
            entry = g.students.get(sid)
            if entry is None:
                row[f"{g.lesson}/status"] = "missing"
                continue
            for name, score in entry["scores"].items():
                row[f"{g.lesson}/{_exercise(name)}"] = "" if score is None else score
            row[f"{g.lesson}/late_penalty"] = entry["penalty"] or ""
            row[f"{g.lesson}/total"] = entry["total"]
            row["total"] = float(row["total"]) + entry["total"]
            row[f"{g.lesson}/status"] = _status(entry)
    header += ["total", "max"]
    _write(out, header, [rows[sid] for sid in sorted(rows)])
    if warnings is not None:
        warnings += _ungraded_warnings(grades)
    return len(rows)


def _write(out: Path, header: list[str], rows: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, restval="")
        writer.writeheader()
        writer.writerows(rows)


IDENTITY_KEYS = ("lms_id", "name", "email", "sis_user_id", "sis_login_id", "section")


@dataclass
class Identities:
    """Each student's identity in one LMS, and the students who have none there."""

    found: dict[str, dict[str, str]] = field(default_factory=dict)
    #: student: where they came from (``"moodle as Participant 202"``)
    foreign: dict[str, str] = field(default_factory=dict)


def lms_identities(root: Path, lesson: str, lms: str, roster: Path | None = None) -> Identities:
    """Each student's identity in ``lms`` (see the module docstring); never another LMS's id."""
    from grader.intake import identities_path, read_roster_rows, roster_copy_path

    result = Identities()
    seen_path = identities_path(root, lesson)
    seen = json.loads(seen_path.read_text(encoding="utf-8")) if seen_path.is_file() else {}
    intake_rows = (
        read_roster_rows(roster_copy_path(root, lesson))
        if roster_copy_path(root, lesson).is_file()
        else []
    )
    given_rows = read_roster_rows(roster) if roster is not None else []
    given = {r["student_id"]: r for r in given_rows if r["lms"] in ("", lms)}
    for sid, ident in seen.items():
        if ident.get("lms") == lms:
            result.found[sid] = {k: str(ident.get(k, "")) for k in IDENTITY_KEYS if ident.get(k)}
        elif sid not in given:
            shown = (
                f"Participant {ident.get('lms_id')}"
                if ident.get("lms") == "moodle"
                else (f"id {ident.get('lms_id')}")
            )
            result.foreign[sid] = f"came from {ident.get('lms')} as {shown}"
    for row in intake_rows:
        sid = row["student_id"]
        source = seen.get(sid, {}).get("lms")
        # a roster row without an lms column belongs to the LMS the student came from
        if row["lms"] == lms or (not row["lms"] and source in (None, lms)):
            entry = result.found.setdefault(sid, {})
            entry.update({k: row[k] for k in IDENTITY_KEYS if row.get(k)})
            result.foreign.pop(sid, None)
    for sid, row in given.items():  # the roster given now maps these students to this LMS
        entry = result.found.setdefault(sid, {})
        entry.update({k: row[k] for k in IDENTITY_KEYS if row.get(k)})
        result.foreign.pop(sid, None)
    return result


def identities(root: Path, lesson: str, roster: Path | None = None) -> dict[str, dict[str, str]]:
    """``{student_id: {"lms_id", "name", "email", ...}}`` whatever LMS each came from.

    For the LMS formats use :func:`lms_identities`, which never mixes LMSes.
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
            entry = found.setdefault(row["student_id"], {})
            entry.update({k: row[k] for k in IDENTITY_KEYS if row.get(k)})
    return found


def _lms_id(student: str, idents: dict[str, dict[str, str]]) -> str | None:
    got = idents.get(student, {}).get("lms_id")
    if got:
        return got
    return student if student.isdigit() else None  # intake without a roster: the LMS id


def _points(value: float) -> str:
    return f"{round(value, 2):g}"


@dataclass
class LmsExport:
    """What an LMS export wrote, and what the instructor should know about it."""

    rows: int = 0
    warnings: list[str] = field(default_factory=list)
    #: students left out because they have no identity in this LMS, with where they came from
    not_exported: dict[str, str] = field(default_factory=dict)


def lms_points(root: Path, lesson: str, lms: str, assignment_id: str | None = None) -> float | None:
    """The LMS assignment's maximum, from its own download kept at intake (or None)."""
    from grader.intake import read_lms_sheet, sheet_copy_path

    path = sheet_copy_path(root, lesson, lms)
    if not path.is_file():
        return None
    sheet = read_lms_sheet(path)
    if lms == "moodle":
        return sheet.points.get("")
    if assignment_id:  # Canvas titles a column "<name> (<assignment id>)"
        hits = [p for col, p in sheet.points.items() if col.endswith(f"({assignment_id})")]
    else:  # by name: only a column titled exactly the lesson, and only one
        hits = [
            p
            for col, p in sheet.points.items()
            if re.sub(r"\s*\(\d+\)$", "", col).strip() == lesson
        ]
    return hits[0] if len(hits) == 1 else None


def _scale(
    g: LessonGrades,
    lms: str,
    root: Path,
    given: dict[str, float],
    ids: dict[str, str],
    result: LmsExport,
) -> float:
    """The LMS maximum for ``g``'s lesson (refuses without one); warns when it scales."""
    top = given.get(g.lesson, given.get(""))
    if top is None:
        top = lms_points(root, g.lesson, lms, ids.get(g.lesson))
    if top is None:
        from grader.intake import sheet_copy_path

        kept = sheet_copy_path(root, g.lesson, lms)
        where = (
            f" ({kept} has no single column for {g.lesson}: give --lms-assignment "
            f"{g.lesson}=ID, the id in its column title)"
            if kept.is_file() and lms == "canvas"
            else ""
        )
        raise ValueError(
            f"{g.lesson}: the {lms.capitalize()} assignment's maximum is not known{where}: give "
            f"--points-possible {g.lesson}=N (N: the points it is worth in {lms.capitalize()}; "
            f"{_points(g.max_score)} sends the lesson's points unscaled), or the LMS's own "
            "download (Moodle grading worksheet / Canvas gradebook export) as --roster at intake"
        )
    if top <= 0:
        raise ValueError(f"{g.lesson}: points possible must be positive, not {top:g}")
    if abs(top - g.max_score) > 1e-9:
        result.warnings.append(
            f"{g.lesson}: scaled from {_points(g.max_score)} points to the "
            f"{lms.capitalize()} assignment's {_points(top)}"
        )
    return top


def _graded_total(
    entry: dict | None, lesson: str, student: str, result: LmsExport, factor: float
) -> str:
    """The scaled total to send, or ``""`` (no submission, or grading failed)."""
    if entry is None:
        return ""
    if entry["status"] == "failed":
        result.warnings.append(
            f"{student} {lesson}: grading failed ({entry['reason']}): left empty"
        )
        return ""
    if entry["ungraded"]:
        result.warnings.append(
            f"{student} {lesson}: written answers not graded yet ({', '.join(entry['ungraded'])}):"
            " sent the autograded part only"
            + (" and the manual points given so far" if entry["manual_sent"] else "")
        )
    return _points(entry["total"] * factor)


def _refuse_or_warn(lms: str, idents: Identities, submitted: set[str], result: LmsExport) -> None:
    foreign = {s: why for s, why in idents.foreign.items() if s in submitted}
    result.not_exported = foreign
    names = "; ".join(f"{s} ({why})" for s, why in sorted(foreign.items()))
    if foreign and not (submitted - set(foreign)):
        raise ValueError(
            f"no student of this export came from {lms.capitalize()}: {names}. Give a roster "
            f"(--roster CSV, columns student_id,lms_id with their {lms.capitalize()} ids) to "
            "export them there"
        )
    if foreign:
        result.warnings.append(
            f"not exported to {lms.capitalize()} (no {lms.capitalize()} identity; a roster "
            f"mapping them would): {names}"
        )


def _late_warning(grades: list[LessonGrades], result: LmsExport, lms: str) -> None:
    if any(e["penalty"] for g in grades for e in g.students.values()):
        policy = (
            "Late Policies" if lms == "canvas" else "penalties for late work (grade deductions)"
        )
        result.warnings.append(
            f"these totals already hold the course's late penalties: turn off {lms.capitalize()}"
            f"'s {policy} for the assignment, or it deducts again on import"
        )


def export_canvas(
    root: Path,
    out: Path,
    lessons: list[str] | None = None,
    db_url: str | None = None,
    assignment_ids: dict[str, str] | None = None,
    roster: Path | None = None,
    points_possible: dict[str, float] | None = None,
) -> LmsExport:
    """Write Canvas's gradebook import CSV (see the module docstring).

    ``points_possible``: ``{lesson: points}`` of the Canvas assignments (``""``: every lesson).
    """
    students, grades = collect(root, lessons, db_url)
    ids = assignment_ids or {}
    result = LmsExport()
    tops = {g.lesson: _scale(g, "canvas", root, points_possible or {}, ids, result) for g in grades}
    columns = {
        g.lesson: f"{g.lesson} ({ids[g.lesson]})" if g.lesson in ids else g.lesson for g in grades
    }
    for g in grades:
        if g.lesson not in ids:
            result.warnings.append(
                f"{g.lesson}: no Canvas assignment id (--lms-assignment {g.lesson}=ID): Canvas "
                "may create a new assignment from this column"
            )
    found: dict[str, dict[str, str]] = {}
    submitted: set[str] = set()
    foreign = Identities()
    for g in grades:
        got = lms_identities(root, g.lesson, "canvas", roster)
        for sid, ident in got.found.items():
            found.setdefault(sid, {}).update(ident)
        foreign.foreign.update(got.foreign)
        submitted |= set(g.students)
    for sid in found:
        foreign.foreign.pop(sid, None)
    _refuse_or_warn("canvas", foreign, submitted, result)
    header = CANVAS_COLUMNS + [columns[g.lesson] for g in grades]
    rows: list[dict] = [
        {
            "Student": "Points Possible",
            **{columns[g.lesson]: _points(tops[g.lesson]) for g in grades},
        }
    ]
    for sid in sorted((set(students) | set(found)) - set(result.not_exported)):
        lms_id = _lms_id(sid, found)
        if lms_id is None:
            result.warnings.append(f"{sid}: no Canvas user id in the roster: not exported")
            continue
        ident = found.get(sid, {})
        row = {
            "Student": ident.get("name") or sid,
            "ID": lms_id,
            "SIS User ID": ident.get("sis_user_id", ""),
            "SIS Login ID": ident.get("sis_login_id", ""),
            "Section": ident.get("section", ""),
        }
        for g in grades:
            factor = tops[g.lesson] / g.max_score if g.max_score else 1.0
            row[columns[g.lesson]] = _graded_total(
                g.students.get(sid), g.lesson, sid, result, factor
            )
        rows.append(row)
        result.rows += 1
    _late_warning(grades, result, "canvas")
    _write(out, header, rows)
    return result


def _moodle_date(when: datetime | None) -> str:
    """A date Moodle's importer reads back (PHP strtotime), in UTC."""
    if when is None:
        return ""
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # nbgrader keeps UTC timestamps without a zone
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def feedback_text(g: LessonGrades, entry: dict, top: float | None = None) -> str:
    """One student's points per exercise and why each failed test failed (one line)."""
    parts = []
    for _, name, cell_max in g.cells:
        score = entry["scores"].get(name)
        shown = "not graded yet" if score is None else _points(score)
        part = f"{_exercise(name)} {shown}/{_points(cell_max)}"
        if name in entry["messages"] and (score or 0) < cell_max:
            part += f" ({entry['messages'][name]})"
        parts.append(part)
    text = f"{_points(entry['total'] + entry['penalty'])}/{_points(g.max_score)}: " + ", ".join(
        parts
    )
    if entry["penalty"]:
        days = entry["seconds_late"] / 86400
        text += f"; late ({days:.1f} days): -{_points(entry['penalty'])}"
    if top is not None and abs(top - g.max_score) > 1e-9:
        text += f"; {_points(entry['total'])}/{_points(g.max_score)} scaled to "
        text += f"{_points(entry['total'] * top / g.max_score)}/{_points(top)}"
    if entry["reason"]:
        text += f" ({entry['status']}: {entry['reason']})"
    if entry["ungraded"]:
        text += " (written answers not graded yet)"
    return text


def export_moodle(
    root: Path,
    out: Path,
    lesson: str,
    db_url: str | None = None,
    roster: Path | None = None,
    now: datetime | None = None,
    points_possible: float | None = None,
) -> LmsExport:
    """Write the offline grading worksheet of one lesson (see the module docstring).

    ``now`` is the ``Last modified (grade)`` written (default: the time of export), so Moodle
    takes these grades over ones it had before. ``points_possible``: the Moodle assignment's
    maximum grade (default: the worksheet given at intake).
    """
    students, (g,) = collect(root, [lesson], db_url)
    result = LmsExport()
    given = {} if points_possible is None else {lesson: points_possible}
    top = _scale(g, "moodle", root, given, {}, result)
    factor = top / g.max_score if g.max_score else 1.0
    got = lms_identities(root, lesson, "moodle", roster)
    _refuse_or_warn("moodle", got, set(g.students), result)
    idents = got.found
    graded_at = _moodle_date(now or datetime.now(UTC))
    rows = []
    for sid in sorted((set(students) | set(idents)) - set(result.not_exported)):
        lms_id = _lms_id(sid, idents)
        if lms_id is None:
            result.warnings.append(f"{sid}: no Moodle participant number in the roster: skipped")
            continue
        ident = idents.get(sid, {})
        entry = g.students.get(sid)
        grade = _graded_total(entry, lesson, sid, result, factor)
        rows.append(
            {
                "Identifier": f"Participant {lms_id}",
                "Full name": ident.get("name") or sid,
                "Email address": ident.get("email", ""),
                "Status": "No submission"
                if entry is None
                else ("Submitted for grading - Graded" if grade else "Submitted for grading"),
                "Grade": f"{float(grade):.2f}" if grade else "",
                "Maximum Grade": f"{top:.2f}",
                "Grade can be changed": "Yes",
                "Last modified (submission)": _moodle_date(entry["timestamp"]) if entry else "",
                "Last modified (grade)": graded_at if grade else "",
                "Feedback comments": feedback_text(g, entry, top) if entry and grade else "",
            }
        )
        result.rows += 1
    _late_warning([g], result, "moodle")
    _write(out, MOODLE_COLUMNS, rows)
    return result


class _LmsExportPlugin(ExportPlugin):
    """Common settings of the course's LMS export plugins (``nbgrader export --exporter=...``)."""

    roster = Unicode("", help="roster CSV (default: the one used at intake)").tag(config=True)
    assignment_ids = Dict(
        {}, help="{lesson: LMS assignment id} (Canvas's column 'LESSON (ID)')"
    ).tag(config=True)
    points_possible = Dict({}, help="{lesson: the LMS assignment's maximum}").tag(config=True)

    def _args(self, gradebook) -> tuple[Path, str, Path | None]:
        db_url = gradebook.engine.url.render_as_string(hide_password=False)
        return Path.cwd(), db_url, Path(self.roster) if self.roster else None

    def _report(self, result: LmsExport) -> None:
        for line in result.warnings:
            self.log.warning(line)


class CanvasExportPlugin(_LmsExportPlugin):
    """nbgrader export plugin writing Canvas's gradebook import CSV (see the module docstring)."""

    def export(self, gradebook) -> None:
        """Write ``self.to`` (default ``canvas.csv``) for ``self.assignment`` (default: all)."""
        root, db_url, roster = self._args(gradebook)
        result = export_canvas(
            root,
            Path(self.to or "canvas.csv"),
            [str(a) for a in self.assignment] or None,
            db_url,
            {k: str(v) for k, v in self.assignment_ids.items()},
            roster,
            {k: float(v) for k, v in self.points_possible.items()},
        )
        self._report(result)


class MoodleExportPlugin(_LmsExportPlugin):
    """nbgrader export plugin writing one lesson's Moodle offline grading worksheet."""

    def export(self, gradebook) -> None:
        """Write ``self.to`` (default ``moodle.csv``) for the one lesson in ``self.assignment``."""
        if len(self.assignment) != 1:
            raise ValueError("a Moodle grading worksheet is per assignment: give one --assignment")
        root, db_url, roster = self._args(gradebook)
        lesson = str(self.assignment[0])
        top = self.points_possible.get(lesson)
        result = export_moodle(
            root,
            Path(self.to or "moodle.csv"),
            lesson,
            db_url,
            roster,
            points_possible=None if top is None else float(top),
        )
        self._report(result)
