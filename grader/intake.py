"""Intake: put submissions into ``submitted/<student>/<lesson>/`` from an LMS zip or nbgrader's
exchange, keeping every file received and never overwriting a submission.

LMS zips
--------
Accepted entry names (the folder part of an entry is ignored, so Moodle's per-student folders
work too):

* Canvas: ``<name>[_LATE]_<userid>_<submissionid>_<filename>`` e.g.
  ``doejane_12345_67890_02-loss-scaling.ipynb`` (Canvas may append ``-1``, ``-2`` to a re-upload's
  file name: ``02-loss-scaling-1.ipynb``);
* Moodle: ``<Full Name>_<userid>_assignsubmission_file_<filename>`` (as a file name or as the
  folder holding the file).

``<userid>`` is mapped to a student id through the roster CSV if one is given (columns
``student_id`` and ``lms_id``), else it is the student id itself. The roster's optional columns
``name, email, sis_user_id, sis_login_id, section`` are what ``export --format canvas|moodle``
writes back; intake keeps a copy of the roster it used as ``intake/<lesson>/roster.csv`` and each
placed student's LMS identity read from the file name (``canvas`` or ``moodle``, the LMS id, the
name) in ``intake/<lesson>/identities.json``, so grades go back to the LMS they came from.
A file is *unmapped* (reported, not used) when its name matches neither pattern, its user id is
not in the roster, the resulting id has path characters, or it is not a notebook. When a student
has several notebooks in one zip, the one with the highest submission id (Canvas) or the latest
date in the zip wins and the others are reported as superseded.

Safety
------
Every entry is first copied, as received, into ``intake/<lesson>/<timestamp>/`` (names are
sanitised; nothing is ever extracted by the name the zip gives). ``submitted/`` gets only the
notebook, as ``<lesson>.ipynb`` with a ``timestamp.txt``. An existing, different submission is
not overwritten unless ``replace=True``, and then it is first moved to
``intake/<lesson>/replaced/``.
"""

from __future__ import annotations

import csv
import hashlib
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath

from grader.autograde import valid_student_id

CANVAS = re.compile(
    r"^(?P<name>[^_/]+?)(?:_LATE)?_(?P<user>\d+)_(?P<sub>\d+)_(?P<file>.+)$", re.IGNORECASE
)
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<user>\d+)_assignsubmission_file_(?P<file>.*)$")


@dataclass
class IntakeReport:
    """What an intake did, file by file."""

    placed: list[tuple[str, str]] = field(default_factory=list)  # (student, source file)
    unchanged: list[tuple[str, str]] = field(default_factory=list)
    kept_existing: list[tuple[str, str]] = field(default_factory=list)
    superseded: list[tuple[str, str]] = field(default_factory=list)
    unmapped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    archive: Path | None = None

    def lines(self) -> list[str]:
        out = [
            f"placed {len(self.placed)} submission(s); archive of everything received: "
            f"{self.archive}"
        ]
        for student, src in self.placed:
            out.append(f"  placed      {student:<20} <- {src}")
        for student, src in self.unchanged:
            out.append(f"  unchanged   {student:<20} <- {src} (same file already submitted)")
        for student, src in self.kept_existing:
            out.append(
                f"  NOT placed  {student:<20} <- {src}: a different submission exists "
                "(use --replace to replace it; the old one is archived)"
            )
        for student, src in self.superseded:
            out.append(
                f"  superseded  {student:<20} <- {src} (a later file of the same student was used)"
            )
        for src, why in self.unmapped:
            out.append(f"  UNMAPPED    {src}: {why}")
        return out


#: Roster columns beyond ``student_id, lms_id`` that the LMS exports use.
ROSTER_EXTRA = ("name", "email", "sis_user_id", "sis_login_id", "section")


def read_roster_rows(path: Path) -> list[dict[str, str]]:
    """The roster's rows (stripped values); needs the columns ``student_id`` and ``lms_id``."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.DictReader(fh))
    if rows and not {"student_id", "lms_id"} <= set(rows[0]):
        raise ValueError(f"{path}: the roster needs the columns student_id and lms_id")
    return [
        {k.strip(): (v or "").strip() for k, v in r.items() if k}
        for r in rows
        if (r.get("student_id") or "").strip()
    ]


def read_roster(path: Path | None) -> dict[str, str] | None:
    """``{lms_id: student_id}`` from a CSV with ``student_id`` and ``lms_id`` columns."""
    if path is None:
        return None
    return {r["lms_id"]: r["student_id"] for r in read_roster_rows(path) if r.get("lms_id")}


def roster_copy_path(root: Path, lesson: str) -> Path:
    """Where intake keeps the roster it used for ``lesson`` (read by the LMS exports)."""
    return root / "intake" / lesson / "roster.csv"


def identities_path(root: Path, lesson: str) -> Path:
    """Where intake keeps ``{student: {"lms", "lms_id", "name"}}`` read from LMS file names."""
    return root / "intake" / lesson / "identities.json"


def lms_identity(entry: str) -> dict[str, str] | None:
    """``{"lms": "canvas"|"moodle", "lms_id", "name"}`` from a zip entry name, or None."""
    parts = PurePosixPath(entry.replace("\\", "/")).parts
    name = parts[-1] if parts else ""
    m = CANVAS.match(name)
    if m:
        return {"lms": "canvas", "lms_id": m["user"], "name": m["name"]}
    for part in reversed(parts):
        m = MOODLE.match(part)
        if m:
            return {"lms": "moodle", "lms_id": m["user"], "name": m["name"]}
    return None


def parse_lms_name(entry: str) -> tuple[str, int, str] | None:
    """``(lms user id, submission order key, file name)`` from a zip entry name, or None."""
    parts = PurePosixPath(entry.replace("\\", "/")).parts
    name = parts[-1] if parts else ""
    m = CANVAS.match(name)
    if m:
        return m["user"], int(m["sub"]), m["file"]
    m = MOODLE.match(name)
    if m and m["file"]:
        return m["user"], 0, m["file"]
    for folder in reversed(parts[:-1]):
        m = MOODLE.match(folder)
        if m:
            return m["user"], 0, name
    return None


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.@+-]", "_", text).lstrip(".")[:150] or "file"


def place(
    root: Path,
    lesson: str,
    student: str,
    data: bytes,
    when: datetime,
    source: str,
    report: IntakeReport,
    replace: bool,
    archive: Path,
) -> None:
    """Put one notebook into ``submitted/`` (or report why not)."""
    folder = root / "submitted" / student / lesson
    target = folder / f"{lesson}.ipynb"
    if target.is_file():
        if hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest():
            report.unchanged.append((student, source))
            return
        if not replace:
            report.kept_existing.append((student, source))
            return
        old = archive.parent / "replaced" / f"{student}-{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
        old.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(folder), str(old))
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{lesson}.ipynb.part"
    tmp.write_bytes(data)
    tmp.replace(target)
    (folder / "timestamp.txt").write_text(when.strftime("%Y-%m-%d %H:%M:%S.%f %Z").strip())
    report.placed.append((student, source))


def intake_zip(
    root: Path, lesson: str, zip_path: Path, roster: Path | None = None, replace: bool = False
) -> IntakeReport:
    """Intake an LMS zip download for ``lesson``; see the module docstring."""
    mapping = read_roster(roster)
    report = IntakeReport()
    archive = root / "intake" / lesson / f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    archive.mkdir(parents=True)
    report.archive = archive
    shutil.copy2(zip_path, archive / _safe_name(zip_path.name))
    best: dict[str, tuple[tuple[int, datetime], str, bytes, datetime]] = {}
    with zipfile.ZipFile(zip_path) as zf:
        for n, info in enumerate(zf.infolist()):
            if info.is_dir():
                continue
            data = zf.read(info)
            (archive / f"{n:04d}-{_safe_name(info.filename)}").write_bytes(data)
            when = datetime(*info.date_time, tzinfo=UTC)
            parsed = parse_lms_name(info.filename)
            if parsed is None:
                report.unmapped.append(
                    (info.filename, "name matches neither the Canvas nor the Moodle pattern")
                )
                continue
            user, order, fname = parsed
            if mapping is not None:
                if user not in mapping:
                    report.unmapped.append((info.filename, f"LMS id {user} is not in the roster"))
                    continue
                student = mapping[user]
            else:
                student = user
            if not valid_student_id(student):
                report.unmapped.append(
                    (info.filename, f"student id {student!r} has characters not allowed in an id")
                )
                continue
            if not fname.lower().endswith(".ipynb"):
                report.unmapped.append(
                    (
                        info.filename,
                        "not a notebook: only the .ipynb is "
                        "graded (files beside it are kept in the archive only)",
                    )
                )
                continue
            key = (order, when)
            if student in best:
                if key > best[student][0]:
                    report.superseded.append((student, best[student][1]))
                else:
                    report.superseded.append((student, info.filename))
                    continue
            best[student] = (key, info.filename, data, when)
    for student, (_, source, data, when) in sorted(best.items()):
        place(root, lesson, student, data, when, source, report, replace, archive)
    _keep_identities(root, lesson, roster, best, report)
    return report


def _keep_identities(
    root: Path, lesson: str, roster: Path | None, best: dict, report: IntakeReport
) -> None:
    """Keep the roster used and the LMS identity of each student whose file is in submitted/."""
    import json

    dest = roster_copy_path(root, lesson)
    if roster is not None and roster.resolve() != dest.resolve():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(roster, dest)
    path = identities_path(root, lesson)
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    current = {s for s, _ in report.placed + report.unchanged}
    for student, (_, source, _, _) in best.items():
        ident = lms_identity(source)
        if student in current and ident:
            known[student] = ident
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


def intake_exchange(
    root: Path,
    lesson: str,
    exchange: Path | None = None,
    replace: bool = False,
    course_id: str = "mixed-precision",
) -> IntakeReport:
    """Intake from nbgrader's exchange (``inbound/``) without nbgrader collect's overwrites.

    The exchange holds ``<course>/inbound/<student>+<lesson>+<timestamp>[+random]/``; for each
    student the latest is taken.
    """
    report = IntakeReport()
    archive = root / "intake" / lesson / f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    archive.mkdir(parents=True)
    report.archive = archive
    base = exchange or Path("/srv/nbgrader/exchange")
    inbound = base / course_id / "inbound"
    if not inbound.is_dir():
        report.unmapped.append((str(inbound), "no such exchange inbound folder"))
        return report
    latest: dict[str, tuple[str, Path]] = {}
    for entry in sorted(inbound.iterdir()):
        parts = entry.name.split("+")
        if len(parts) < 3 or parts[1] != lesson:
            continue
        student, stamp = parts[0], parts[2]
        if not valid_student_id(student):
            report.unmapped.append((entry.name, f"student id {student!r} is not allowed"))
            continue
        nb = entry / f"{lesson}.ipynb"
        if not nb.is_file():
            report.unmapped.append((entry.name, f"no {lesson}.ipynb inside"))
            continue
        if student in latest and latest[student][0] >= stamp:
            report.superseded.append((student, entry.name))
            continue
        if student in latest:
            report.superseded.append((student, latest[student][1].name))
        latest[student] = (stamp, entry)
    for student, (stamp, entry) in sorted(latest.items()):
        shutil.copytree(entry, archive / _safe_name(entry.name))
        data = (entry / f"{lesson}.ipynb").read_bytes()
        try:
            when = datetime.fromisoformat(stamp.removesuffix(" UTC").replace(" ", "T"))
            when = when.replace(tzinfo=UTC)
        except ValueError:
            when = datetime.now(UTC)
        place(root, lesson, student, data, when, entry.name, report, replace, archive)
    return report
