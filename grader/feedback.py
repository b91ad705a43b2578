"""Feedback HTML for students, through ``nbgrader generate_feedback``, without hidden tests.

nbgrader's feedback shows each test cell as it ran, hidden tests included, and hidden tests hold
the reference implementations. :class:`StripHiddenTests` (registered in
``grader/nbgrader_config.py`` for every ``generate_feedback`` of this course) replaces each
``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` region with one comment line, and shortens
error tracebacks of graded cells to their last line (``CheckFailed: <the teaching message>``),
since a traceback quotes the code around the failing line.

:class:`MarkUngraded` and the course's template show written answers not graded yet as such.
:func:`generate` applies late penalties and writes the feedback; :func:`deliver` returns it the
way submissions came in: Moodle's feedback zip, Canvas's re-upload zip, or nbgrader's
``release_feedback`` to the exchange.
"""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

HIDDEN = re.compile(
    r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.S | re.M
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_hidden(source: str) -> str:
    """``source`` with every hidden-test region replaced by a one-line note."""
    return HIDDEN.sub("# (hidden tests ran here; their code is not shown)\n", source)


class StripHiddenTests(Preprocessor):
    """Remove hidden test code and tracebacks that could quote it from graded cells."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and (meta.get("grade") or "### BEGIN HIDDEN" in cell.source):
            cell.source = strip_hidden(cell.source)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
        return cell, resources


class MarkUngraded(Preprocessor):
    """Mark graded cells that still wait for a manual grade (after nbgrader's ``GetGrades``).

    nbgrader's feedback shows such a written answer as ``0.0 / 2.0``; the course's feedback
    template (``grader/templates/course_feedback``, which extends nbgrader's) shows it as not
    graded yet, and the page's score as not final.
    """

    enabled = Bool(True).tag(config=True)

    def preprocess(self, nb, resources):
        from nbgrader.api import Gradebook

        info = resources["nbgrader"]
        ungraded = []
        with Gradebook(info["db_url"]) as gb:
            for cell in nb.cells:
                meta = cell.get("metadata", {}).get("nbgrader", {})
                if not meta.get("grade"):
                    continue
                grade = gb.find_grade(
                    meta["grade_id"], info["notebook"], info["assignment"], info["student"]
                )
                if _ungraded(grade):
                    meta["ungraded"] = True
                    ungraded.append(meta["grade_id"])
        info["ungraded"] = ungraded
        return nb, resources


def _ungraded(grade) -> bool:
    return bool(
        grade.needs_manual_grade and grade.manual_score is None and grade.auto_score is None
    )


TEMPLATES = Path(__file__).parent / "templates"


@dataclass
class FeedbackReport:
    """What ``feedback`` wrote and delivered, and what the instructor should know."""

    files: list[Path] = field(default_factory=list)
    delivered: dict[str, list[str]] = field(default_factory=dict)  # channel: lines
    late: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        """The report, a line per file written and per delivery."""
        out = [*self.late, f"wrote {len(self.files)} feedback file(s) (hidden tests are not shown)"]
        for channel, lines in self.delivered.items():
            out += [f"{channel}: {line}" for line in lines]
        return out + [f"WARNING: {w}" for w in self.warnings]


def generate(
    root: Path, lesson: str, db_url: str | None = None, student: str | None = None
) -> FeedbackReport:
    """Late penalties, then ``nbgrader generate_feedback`` with the course's template.

    Each exchange student's ``submission_secret.txt`` is put beside the feedback, as
    ``nbgrader release_feedback`` needs it.
    """
    import nbgrader

    from grader.late import apply_late_penalties
    from grader.nbtools import nbgrader as run_nbgrader

    report = FeedbackReport()
    late = apply_late_penalties(root, lesson, db_url)
    report.late = late.lines()
    if late.late:
        report.warnings.append(
            "the feedback shows the course's late penalties: switch off the LMS's own late "
            "policy for this assignment (Canvas: Late Policies; Moodle: penalties for late "
            "work), or it deducts again when the grades are imported"
        )
    nbgrader_templates = Path(nbgrader.__file__).parent / "server_extensions/formgrader/templates"
    cmd = [
        "generate_feedback",
        lesson,
        "--force",
        # the course's page extends nbgrader's feedback template (conf.json: base_template)
        "--HTMLExporter.template_name=course_feedback",
        "--HTMLExporter.template_file=course_index.html.j2",
        f"--HTMLExporter.extra_template_basedirs={TEMPLATES}",
        f"--HTMLExporter.extra_template_basedirs={nbgrader_templates}",
    ]
    if db_url:
        cmd.append(f"--CourseDirectory.db_url={db_url}")
    if student:
        cmd.append(f"--student={student}")
    run_nbgrader(cmd, cwd=root)
    base = root / "feedback"
    report.files = sorted(base.glob(f"*/{lesson}/*.html"))
    for html in report.files:
        sid = html.parent.parent.name
        secret = root / "submitted" / sid / lesson / "submission_secret.txt"
        if secret.is_file():
            shutil.copy2(secret, html.parent / "submission_secret.txt")
        if "not graded yet" in html.read_text(encoding="utf-8"):
            report.warnings.append(
                f"{sid}: written answers not graded yet: the feedback says so (grade them in "
                "formgrader and run feedback again)"
            )
    return report


def _feedback_html(root: Path, lesson: str, student: str) -> list[Path]:
    return sorted((root / "feedback" / student / lesson).glob("*.html"))


def lms_feedback_zip(root: Path, lesson: str, lms: str, out: Path) -> list[str]:
    """Zip each ``lms`` student's feedback the way that LMS takes it back; returns the names.

    Moodle ("Upload multiple feedback files in a zip"): one folder per student named as in its
    submission download, ``<Full Name>_<participant>_assignsubmission_file/<file>.html``
    (Moodle's importer matches the participant number in the folder name; feedback type
    "Feedback files" must be on). Canvas ("Re-upload submissions" in the assignment's
    gradebook menu): files named with the prefix of the student's download,
    ``<name>[_LATE]_<userid>_<submissionid>_<file>.html``; Canvas attaches each one to that
    student's submission as a comment.
    """
    from grader.intake import identities_path

    seen = identities_path(root, lesson)
    idents = json.loads(seen.read_text(encoding="utf-8")) if seen.is_file() else {}
    names: list[str] = []
    missing: list[str] = []
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".part")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for sid, ident in sorted(idents.items()):
            if ident.get("lms") != lms:
                continue
            if not ident.get("prefix"):  # taken in before intake kept the download's names
                missing.append(sid)
                continue
            for html in _feedback_html(root, lesson, sid):
                if lms == "moodle":
                    name = f"{ident['prefix']}assignsubmission_file/{html.stem}-feedback.html"
                else:
                    name = f"{ident['prefix']}{html.stem}-feedback.html"
                zf.write(html, name)
                names.append(name)
    tmp.replace(out)
    if missing:
        raise LookupError(
            f"{', '.join(missing)}: no {lms} file-name prefix in {seen} (run intake of their "
            f"zip again); {out} holds the others"
        )
    return names


def release_to_exchange(root: Path, lesson: str) -> list[str]:
    """``nbgrader release_feedback`` for the students who submitted through the exchange."""
    from grader.intake import identities_path
    from grader.nbtools import nbgrader as run_nbgrader

    seen = identities_path(root, lesson)
    idents = json.loads(seen.read_text(encoding="utf-8")) if seen.is_file() else {}
    base = root / "feedback"
    have = {p.parent.name for p in base.glob(f"*/{lesson}")} if base.is_dir() else set()
    ready = {
        s
        for s in have
        if idents.get(s, {}).get("lms") == "exchange"
        and (base / s / lesson / "submission_secret.txt").is_file()
    }
    if not ready:
        return []
    others = sorted(have - ready)
    cmd = ["release_feedback", lesson]
    if others:
        cmd.append(f"--CourseDirectory.student_id_exclude={','.join(others)}")
    run_nbgrader(cmd, cwd=root)
    return sorted(ready)


def deliver(root: Path, lesson: str, report: FeedbackReport, channels: list[str]) -> None:
    """Deliver the feedback through ``channels`` (``moodle``, ``canvas``, ``exchange``)."""
    out_dir = root / "lms-feedback" / lesson
    for channel in channels:
        if channel == "exchange":
            released = release_to_exchange(root, lesson)
            report.delivered[channel] = [
                f"released to nbgrader's exchange (nbgrader release_feedback): "
                f"{', '.join(released) or 'nobody'}"
            ]
            continue
        out = out_dir / f"{channel}-feedback.zip"
        try:
            names = lms_feedback_zip(root, lesson, channel, out)
        except LookupError as exc:
            report.warnings.append(str(exc))
            with zipfile.ZipFile(out) as zf:
                names = zf.namelist()
        how = (
            "Moodle: assignment > View all submissions > Grading action 'Upload multiple "
            "feedback files in a zip'"
            if channel == "moodle"
            else "Canvas: assignment > Gradebook column menu > 'Re-upload Submissions'"
        )
        report.delivered[channel] = [f"wrote {out} ({len(names)} file(s)); upload it in {how}"]


def channels_of(root: Path, lesson: str) -> list[str]:
    """The channels the class's submissions came through (from ``identities.json``)."""
    from grader.intake import identities_path

    seen = identities_path(root, lesson)
    idents = json.loads(seen.read_text(encoding="utf-8")) if seen.is_file() else {}
    return sorted({i.get("lms", "") for i in idents.values()} & {"canvas", "moodle", "exchange"})
