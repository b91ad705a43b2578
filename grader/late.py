"""Due dates, extensions and late penalties, with nbgrader's own machinery.

The due date is the gradebook assignment's ``duedate``, an extension the submission's
``extension`` (from the roster), the submission time the gradebook's ``timestamp`` (Canvas's
``_LATE`` mark counts as :attr:`CanvasLateMark.seconds` late when no time is known). The penalty
is an nbgrader ``LateSubmissionPlugin``, :class:`PenaltyPerDay` (set in
``grader/nbgrader_config.py``), stored as the notebook's ``late_submission_penalty``.
:func:`apply_late_penalties` recomputes every submission's penalty (``feedback`` and ``export``
run it first, so a regrade or a new extension always counts).
"""

from __future__ import annotations

import json
import math
import os
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from nbgrader.plugins import LateSubmissionPlugin
from traitlets import Float
from traitlets.config import Configurable

DAY = 86400.0


class PenaltyPerDay(LateSubmissionPlugin):
    """``per_day`` of the score per day or part of a day late, at most ``cap`` of the score."""

    per_day = Float(0.1, help="fraction of the score lost per (started) day late").tag(config=True)
    cap = Float(0.5, help="largest fraction of the score lost").tag(config=True)
    grace_minutes = Float(0.0, help="minutes after the due date that are not late").tag(config=True)

    def late_submission_penalty(
        self, student_id: str, score: float, total_seconds_late: float
    ) -> float | None:
        """The points to take off ``score`` for ``total_seconds_late`` seconds late."""
        late = total_seconds_late - 60.0 * self.grace_minutes
        if late <= 0:
            return None
        days = math.ceil(late / DAY)
        return round(score * min(self.cap, self.per_day * days), 4)


class CanvasLateMark(Configurable):
    """How late a submission Canvas marks ``_LATE`` without a time counts."""

    seconds = Float(1.0, help="seconds late assumed for a Canvas _LATE mark with no time").tag(
        config=True
    )


def parse_when(text: str) -> datetime:
    """An ISO 8601 date (``2026-11-20T23:59``, ``... +01:00``, ``... UTC``) as a UTC datetime."""
    text = text.strip().removesuffix("UTC").removesuffix("Z").strip()
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"date {text!r}: expected ISO 8601, e.g. 2026-11-20T23:59+00:00") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).astimezone(UTC)


def _naive_utc(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(tzinfo=None)  # nbgrader stores UTC without a zone


def _gradebook(db_url: str):
    from nbgrader.api import Gradebook

    from grader.nbtools import tool_env

    os.environ["PATH"] = tool_env()["PATH"]  # nbgrader runs alembic from PATH
    return Gradebook(db_url)


def set_duedate(root: Path, lesson: str, due: datetime, db_url: str | None = None) -> None:
    """Put ``lesson`` into the gradebook (as autograde would) and set its ``duedate``."""
    from grader.autograde import ensure_assignment

    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    ensure_assignment(root, lesson, db_url)
    with warnings.catch_warnings(), _gradebook(db_url) as gb:
        warnings.simplefilter("ignore")  # nbgrader's own SQLAlchemy autoflush warnings
        gb.update_or_create_assignment(lesson, duedate=_naive_utc(due))


def extensions(rows: list[dict[str, str]]) -> dict[str, timedelta]:
    """``{student: extension}`` from roster rows' ``extension_days`` / ``extension_hours``."""
    out = {}
    for row in rows:
        try:
            days = float(row.get("extension_days") or 0)
            days += float(row.get("extension_hours") or 0) / 24
        except ValueError:
            raise ValueError(
                f"student {row['student_id']}: extension_days / extension_hours must be numbers "
                f"(got {row.get('extension_days')!r}, {row.get('extension_hours')!r})"
            ) from None
        if days < 0:
            raise ValueError(f"student {row['student_id']}: a negative extension")
        if days:
            out[row["student_id"]] = timedelta(days=days)
    return out


@dataclass
class LateReport:
    """Each late student's lateness and penalty, and what the instructor should know."""

    late: dict[str, tuple[float, float]] = field(default_factory=dict)  # (seconds, points)
    marked: set[str] = field(default_factory=set)  # late by Canvas's mark, time unknown
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """One line per late student, then the warnings."""
        out = []
        for s, (seconds, points) in sorted(self.late.items()):
            how = (
                "marked late by Canvas (no time)"
                if s in self.marked
                else (f"{seconds / 3600:.1f} h late")
            )
            out.append(f"late: {s} {how}: -{points:g} points (late penalty)")
        return out + [f"WARNING: {w}" for w in self.warnings]


def _plugin(root: Path) -> tuple[LateSubmissionPlugin, float]:
    from nbgrader.preprocessors import AssignLatePenalties

    from grader.courseconfig import course_config

    config = course_config(root)
    assigner = AssignLatePenalties(config=config)
    assigner.init_plugin()
    return assigner.plugin_inst, CanvasLateMark(config=config).seconds


def apply_late_penalties(
    root: Path, lesson: str, db_url: str | None = None, roster: Path | None = None
) -> LateReport:
    """Set every submission's extension and late penalty of ``lesson`` in the gradebook."""
    from nbgrader.api import MissingEntry

    from grader.intake import identities_path, read_roster_rows, roster_copy_path

    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    report = LateReport()
    path = roster or roster_copy_path(root, lesson)
    extra = extensions(read_roster_rows(path)) if path.is_file() else {}
    seen = identities_path(root, lesson)
    idents = json.loads(seen.read_text(encoding="utf-8")) if seen.is_file() else {}
    plugin, mark_seconds = _plugin(root)
    with warnings.catch_warnings(), _gradebook(db_url) as gb:
        warnings.simplefilter("ignore")
        try:
            assignment = gb.find_assignment(lesson)
        except MissingEntry:
            return report
        marked = [s for s, i in idents.items() if i.get("late") == "yes"]
        if assignment.duedate is None:
            if marked:
                report.warnings.append(
                    f"{lesson} has no due date in the gradebook (intake --due): Canvas marked "
                    f"{', '.join(sorted(marked))} late, no penalty applied"
                )
            return report
        for sub in assignment.submissions:
            sid = sub.student.id
            sub.extension = extra.get(sid)
            ident = idents.get(sid, {})
            if ident.get("lms") == "canvas" and ident.get("time_source", "").startswith("zip"):
                seconds = mark_seconds if ident.get("late") == "yes" else 0.0
                if seconds:
                    report.marked.add(sid)
                if seconds and sid in extra:  # Canvas's mark is against its own due date
                    seconds = 0.0
                    report.marked.discard(sid)
                    report.warnings.append(
                        f"{sid}: Canvas marked the submission late, but the roster gives an "
                        "extension and no submitted_at: not counted late (give submitted_at)"
                    )
            else:
                seconds = sub.total_seconds_late
            total = 0.0
            for nb in sub.notebooks:
                nb.late_submission_penalty = None
                if seconds > 0:
                    penalty = plugin.late_submission_penalty(sid, nb.score, seconds)
                    if penalty is not None:  # nbgrader's own bounds (AssignLatePenalties)
                        penalty = min(max(penalty, 0.0), nb.score)
                        nb.late_submission_penalty = penalty
                        total += penalty
            if seconds > 0:
                report.late[sid] = (seconds, total)
        gb.db.commit()
    return report
