"""Intake: submissions from an LMS zip or nbgrader's exchange into ``submitted/``.

Each lands in ``submitted/<student>/<lesson>/``. Canvas
(``<name>[_LATE]_<userid>_<submissionid>_<file>``) and Moodle
(``<Full Name>_<id>_assignsubmission_file_<file>``, both folder layouts) names are mapped through
an optional roster (:func:`read_roster`); the LMS's own download (Moodle's worksheet, Canvas's
gradebook export) may give submission times and maximum points. Everything received is
first archived as-is in ``intake/<lesson>/<timestamp>/``; a different existing submission is
replaced only with ``replace=True`` (the old one archived). ``timestamp.txt`` is written in UTC,
from the best source known (reported per student); the LMS identities go to
``intake/<lesson>/identities.json`` for feedback and export. Formats and the reasons for each
rule: docs/grading-a-class.md, "Intake".
"""

from __future__ import annotations

import csv
import hashlib
import json
import re
import shutil
import zipfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from zoneinfo import ZoneInfo

from grader.autograde import valid_student_id

CANVAS = re.compile(
    r"^(?P<name>[^_/]+?)(?P<late>_LATE)?_(?P<user>\d+)_(?P<sub>\d+)_(?P<file>.+)$", re.IGNORECASE
)
#: Moodle: ``<Full Name>_<id>_assignsubmission_file_<file>`` (a file, or before 4.1 a folder
#: ``..._file_/``), or since 4.1 the folder ``<Full Name>_<id>_assignsubmission_file/``.
MOODLE = re.compile(r"^(?P<name>.+?)_(?P<user>\d+)_assignsubmission_file(?:_(?P<file>.*))?$")
#: The English titles of the Moodle worksheet's columns that intake reads.
MOODLE_SHEET = ("Identifier", "Full name", "Last modified (submission)", "Maximum Grade")
#: Moodle's English date formats (langconfig ``strftimedaydatetime`` and relatives).
MOODLE_DATES = (
    "%A, %d %B %Y, %I:%M %p",
    "%A, %d %B %Y, %H:%M",
    "%d %B %Y, %I:%M %p",
    "%d/%m/%Y, %H:%M",
)


@dataclass
class IntakeReport:
    """What an intake did, file by file."""

    placed: list[tuple[str, str]] = field(default_factory=list)  # (student, source file)
    unchanged: list[tuple[str, str]] = field(default_factory=list)
    kept_existing: list[tuple[str, str]] = field(default_factory=list)
    superseded: list[tuple[str, str]] = field(default_factory=list)
    unmapped: list[tuple[str, str]] = field(default_factory=list)  # (file, reason)
    times: dict[str, str] = field(default_factory=dict)  # student: "<UTC time> (source)"
    warnings: list[str] = field(default_factory=list)
    archive: Path | None = None

    def lines(self) -> list[str]:
        """The report, one line per file (and a line per warning)."""
        out = [
            f"placed {len(self.placed)} submission(s); archive of everything received: "
            f"{self.archive}"
        ]
        for student, src in self.placed:
            when = f"  [{self.times[student]}]" if student in self.times else ""
            out.append(f"  placed      {student:<20} <- {src}{when}")
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
        out += [f"WARNING: {w}" for w in self.warnings]
        return out


#: Roster columns beyond ``student_id, lms_id`` that the LMS exports use.
ROSTER_EXTRA = ("name", "email", "sis_user_id", "sis_login_id", "section")


def read_csv(path: Path) -> list[dict[str, str]]:
    """A CSV's rows, keys and values stripped (a byte-order mark, as Excel writes it, ignored)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return [
            {(k or "").strip(): (v or "").strip() for k, v in row.items() if k}
            for row in csv.DictReader(fh)
        ]


def read_roster_rows(path: Path) -> list[dict[str, str]]:
    """The roster's rows (stripped values); needs the columns ``student_id`` and ``lms_id``."""
    rows = read_csv(path)
    if rows and not {"student_id", "lms_id"} <= set(rows[0]):
        raise ValueError(f"{path}: the roster needs the columns student_id and lms_id")
    for row in rows:
        lms = row.get("lms", "").lower()
        if lms not in ("", "canvas", "moodle"):
            raise ValueError(
                f"{path}: lms {row['lms']!r} (student {row['student_id']}) is not canvas or moodle"
            )
        row["lms"] = lms
    return [r for r in rows if r.get("student_id")]


def read_roster(path: Path | None, lms: str | None = None) -> dict[str, str] | None:
    """``{lms_id: student_id}`` from a roster CSV (rows of ``lms``, or with no ``lms`` column)."""
    if path is None:
        return None
    return {
        r["lms_id"]: r["student_id"]
        for r in read_roster_rows(path)
        if r.get("lms_id") and r.get("lms", "") in ("", lms or "")
    }


def sheet_kind(path: Path) -> str:
    """``roster``, ``moodle`` (offline grading worksheet) or ``canvas`` (gradebook export)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        header = [h.strip() for h in next(csv.reader(fh), [])]
    if {"student_id", "lms_id"} <= set(header):
        return "roster"
    if set(MOODLE_SHEET) <= set(header):
        return "moodle"
    if header[:2] == ["Student", "ID"]:
        return "canvas"
    raise ValueError(
        f"{path}: neither a roster (columns student_id, lms_id), Moodle's offline grading "
        "worksheet (columns " + ", ".join(MOODLE_SHEET) + ") nor Canvas's gradebook export "
        "(columns Student, ID, ...). Moodle titles the worksheet's columns in the interface "
        "language of whoever downloads it: download it with Moodle set to English."
    )


@dataclass
class LmsSheet:
    """What the LMS's own download says: identities, submission times, points possible."""

    lms: str
    rows: dict[str, dict[str, str]] = field(default_factory=dict)  # lms id: row
    #: Moodle: ``{"": maximum grade}``; Canvas: ``{assignment column: points possible}``
    points: dict[str, float] = field(default_factory=dict)
    submitted: dict[str, datetime] = field(default_factory=dict)  # lms id: UTC time


def _moodle_time(text: str, zone: ZoneInfo) -> datetime | None:
    text = text.strip()
    if not text or text == "-":
        return None
    for fmt in MOODLE_DATES:
        try:
            return datetime.strptime(text, fmt).replace(tzinfo=zone).astimezone(UTC)
        except ValueError:
            continue
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"Moodle date {text!r} not understood: download the worksheet with Moodle's "
            "interface in English (it writes dates in the downloader's language)"
        ) from None
    return (when if when.tzinfo else when.replace(tzinfo=zone)).astimezone(UTC)


def read_lms_sheet(path: Path, timezone: str = "UTC") -> LmsSheet:
    """Read Moodle's offline grading worksheet or Canvas's gradebook export (see module doc)."""
    kind = sheet_kind(path)
    zone = ZoneInfo(timezone)
    if kind == "moodle":
        sheet = LmsSheet("moodle")
        for row in read_csv(path):
            m = re.fullmatch(r"Participant (\d+)", row.get("Identifier", ""))
            if not m:
                continue
            sheet.rows[m[1]] = {
                "name": row.get("Full name", ""),
                "email": row.get("Email address", ""),
            }
            when = _moodle_time(row.get("Last modified (submission)", ""), zone)
            if when is not None:
                sheet.submitted[m[1]] = when
            if row.get("Maximum Grade"):
                sheet.points[""] = float(row["Maximum Grade"].replace(",", "."))
        return sheet
    if kind == "canvas":
        sheet = LmsSheet("canvas")
        fixed = {
            "Student",
            "ID",
            "SIS User ID",
            "SIS Login ID",
            "Integration ID",
            "Section",
            "Root Account",
        }
        for row in read_csv(path):
            if row.get("Student") == "Points Possible":
                for col, value in row.items():
                    if col not in fixed and value:
                        try:
                            sheet.points[col] = float(value)
                        except ValueError:
                            continue
            elif row.get("ID", "").isdigit():
                sheet.rows[row["ID"]] = {
                    "name": row.get("Student", ""),
                    "sis_user_id": row.get("SIS User ID", ""),
                    "sis_login_id": row.get("SIS Login ID", ""),
                    "section": row.get("Section", ""),
                }
        return sheet
    raise ValueError(f"{path} is a roster, not an LMS download")


def roster_copy_path(root: Path, lesson: str) -> Path:
    """Where intake keeps the roster it used for ``lesson`` (read by the LMS exports)."""
    return root / "intake" / lesson / "roster.csv"


def sheet_copy_path(root: Path, lesson: str, lms: str) -> Path:
    """Where intake keeps the LMS's own download (worksheet / gradebook export) for ``lesson``."""
    return root / "intake" / lesson / f"lms-{lms}.csv"


def identities_path(root: Path, lesson: str) -> Path:
    """Where intake keeps ``{student: {"lms", "lms_id", "name", ...}}`` read at intake."""
    return root / "intake" / lesson / "identities.json"


def lms_identity(entry: str) -> dict[str, str] | None:
    """``{"lms": "canvas"|"moodle", "lms_id", "name"}`` from a zip entry name, or None.

    Canvas entries also get ``"late": "yes"|"no"`` (Canvas's ``_LATE`` mark).
    """
    parts = PurePosixPath(entry.replace("\\", "/")).parts
    name = parts[-1] if parts else ""
    m = CANVAS.match(name)
    if m:
        late = "yes" if m["late"] else "no"
        prefix = name[: m.start("file")]  # <name>[_LATE]_<userid>_<submissionid>_
        return {
            "lms": "canvas",
            "lms_id": m["user"],
            "name": m["name"],
            "late": late,
            "prefix": prefix,
        }
    for part in reversed(parts):
        m = MOODLE.match(part)
        if m:
            prefix = f"{m['name']}_{m['user']}_"  # Moodle's folder: <prefix>assignsubmission_file
            return {"lms": "moodle", "lms_id": m["user"], "name": m["name"], "prefix": prefix}
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


def utc_stamp(when: datetime) -> str:
    """A ``timestamp.txt`` line nbgrader reads back (``YYYY-MM-DD HH:MM:SS.ffffff UTC``)."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")


def place(
    root: Path,
    lesson: str,
    student: str,
    data: bytes,
    when: datetime | str,
    source: str,
    report: IntakeReport,
    replace: bool,
    archive: Path,
    extra: dict[str, bytes] | None = None,
) -> None:
    """Put one notebook into ``submitted/`` (or report why not).

    ``when`` is the submission time (or ``timestamp.txt``'s text, kept verbatim); ``extra`` are
    files placed beside the notebook as received (the exchange's ``submission_secret.txt``).
    """
    folder = root / "submitted" / student / lesson
    target = folder / f"{lesson}.ipynb"
    stamp = when if isinstance(when, str) else utc_stamp(when)
    if target.is_file():
        if hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(data).digest():
            report.unchanged.append((student, source))
            old = folder / "timestamp.txt"
            if not old.is_file() or old.read_text() != stamp:  # a better-known time (worksheet)
                old.write_text(stamp)
            for name, content in (extra or {}).items():  # each exchange submission's own secret
                (folder / name).write_bytes(content)
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
    (folder / "timestamp.txt").write_text(stamp)
    for name, content in (extra or {}).items():
        (folder / name).write_bytes(content)
    report.placed.append((student, source))


def intake_zip(
    root: Path,
    lesson: str,
    zip_path: Path,
    roster: Path | None = None,
    replace: bool = False,
    sheet: Path | None = None,
    timezone: str = "UTC",
) -> IntakeReport:
    """Intake an LMS zip download for ``lesson``; see the module docstring.

    ``sheet`` is the LMS's own download (Moodle's grading worksheet, Canvas's gradebook export);
    ``timezone`` the zone the LMS wrote local times in (zip entries, Moodle's dates).
    """
    rows = read_roster_rows(roster) if roster is not None else None
    lms_sheet = read_lms_sheet(sheet, timezone) if sheet is not None else None
    zone = ZoneInfo(timezone)
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
            when = datetime(*info.date_time, tzinfo=zone).astimezone(UTC)
            parsed = parse_lms_name(info.filename)
            ident = lms_identity(info.filename)
            if parsed is None or ident is None:
                report.unmapped.append(
                    (info.filename, "name matches neither the Canvas nor the Moodle pattern")
                )
                continue
            user, order, fname = parsed
            if rows is not None:
                mapping = {
                    r["lms_id"]: r["student_id"]
                    for r in rows
                    if r.get("lms_id") and r["lms"] in ("", ident["lms"])
                }
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
    by_student = {r["student_id"]: r for r in rows or []}
    sources: dict[str, str] = {}
    for student, (_, source, data, when) in sorted(best.items()):
        ident = lms_identity(source) or {}
        given = by_student.get(student, {}).get("submitted_at")
        if ident.get("lms") == "moodle" and lms_sheet and ident["lms_id"] in lms_sheet.submitted:
            when, sources[student] = lms_sheet.submitted[ident["lms_id"]], "Moodle worksheet"
        elif given:
            try:
                bare = given.removesuffix("UTC").strip()
                parsed_at = datetime.fromisoformat(bare)
                if bare != given and parsed_at.tzinfo is None:
                    parsed_at = parsed_at.replace(tzinfo=UTC)
            except ValueError:
                raise ValueError(
                    f"roster: student {student}: submitted_at {given!r} is not ISO 8601 "
                    "(e.g. 2026-11-20T23:59+01:00; no zone: --lms-timezone)"
                ) from None
            when = (parsed_at if parsed_at.tzinfo else parsed_at.replace(tzinfo=zone)).astimezone(
                UTC
            )
            sources[student] = "roster submitted_at"
        else:
            sources[student] = f"zip entry time read in {timezone}"
            if ident.get("lms") == "moodle":
                report.warnings.append(
                    f"{student}: Moodle's zip has no submission time: give its grading worksheet "
                    "(--roster worksheet.csv) for the time Moodle recorded"
                )
        report.times[student] = f"{utc_stamp(when)} from the {sources[student]}"
        place(root, lesson, student, data, when, source, report, replace, archive)
    _keep_identities(root, lesson, roster, best, report, sources, lms_sheet)
    if lms_sheet is not None:
        dest = sheet_copy_path(root, lesson, lms_sheet.lms)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(sheet, dest)
    return report


def _keep_identities(
    root: Path,
    lesson: str,
    roster: Path | None,
    best: dict,
    report: IntakeReport,
    sources: dict[str, str],
    lms_sheet: LmsSheet | None,
) -> None:
    """Keep the roster used and the LMS identity of each student whose file is in submitted/."""
    dest = roster_copy_path(root, lesson)
    if roster is not None and roster.resolve() != dest.resolve():
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(roster, dest)
    current = {s for s, _ in report.placed + report.unchanged}
    found = {}
    for student, (_, source, _, _) in best.items():
        ident = lms_identity(source)
        if student in current and ident:
            found[student] = {**ident, "time_source": sources.get(student, "")}
            if lms_sheet and lms_sheet.lms == ident["lms"]:  # the LMS's own name and e-mail
                found[student].update(
                    {k: v for k, v in lms_sheet.rows.get(ident["lms_id"], {}).items() if v}
                )
    update_identities(root, lesson, found)


def update_identities(root: Path, lesson: str, found: dict[str, dict[str, str]]) -> None:
    """Record (replace) the identities of ``found`` students in ``identities.json``."""
    path = identities_path(root, lesson)
    known = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    known.update(found)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".part")
    tmp.write_text(json.dumps(known, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    tmp.replace(path)


#: The course directory's map of roster ids to JupyterHub (Unix) user names, written by
#: ``python -m grader hub``: on that hub the exchange names submissions by hub user.
HUB_USERS = "hub-users.csv"


def read_hub_users(root: Path) -> dict[str, str] | None:
    """``{hub user: student_id}`` from ``root/hub-users.csv``, or None without that file."""
    path = root / HUB_USERS
    if not path.is_file():
        return None
    return {r["hub_user"]: r["student_id"] for r in read_csv(path) if r.get("hub_user")}


def intake_exchange(
    root: Path,
    lesson: str,
    exchange: Path | None = None,
    replace: bool = False,
    course_id: str = "mixed-precision",
) -> IntakeReport:
    """Intake from nbgrader's exchange (``inbound/``) without nbgrader collect's overwrites.

    The exchange holds ``<course>/inbound/<student>+<lesson>+<timestamp>[+random]/``; for each
    student the latest is taken, its ``timestamp.txt`` and ``submission_secret.txt`` kept
    verbatim. ``exchange`` defaults to nbgrader's ``Exchange.root`` in the course's config.
    On ``python -m grader hub``'s JupyterHub the folder names the hub user: the course
    directory's ``hub-users.csv`` maps it back to the roster id (identities keep the hub user
    as the exchange's ``lms_id``).
    """
    from grader.courseconfig import exchange_root

    report = IntakeReport()
    archive = root / "intake" / lesson / f"{datetime.now(UTC):%Y%m%dT%H%M%S%f}"
    archive.mkdir(parents=True)
    report.archive = archive
    base = exchange or exchange_root(root)
    inbound = base / course_id / "inbound"
    if not inbound.is_dir():
        report.unmapped.append((str(inbound), "no such exchange inbound folder"))
        return report
    hub_users = read_hub_users(root)
    latest: dict[str, tuple[str, Path]] = {}
    hub_user_of: dict[str, str] = {}
    for entry in sorted(inbound.iterdir()):
        parts = entry.name.split("+")
        if len(parts) < 3 or parts[1] != lesson:
            continue
        student, stamp = parts[0], parts[2]
        if hub_users is not None:
            if student not in hub_users:
                report.unmapped.append((entry.name, f"hub user {student!r} is not in {HUB_USERS}"))
                continue
            hub_user_of[hub_users[student]] = student
            student = hub_users[student]
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
    found = {}
    for student, (stamp, entry) in sorted(latest.items()):
        shutil.copytree(entry, archive / _safe_name(entry.name))
        data = (entry / f"{lesson}.ipynb").read_bytes()
        kept = entry / "timestamp.txt"
        when: datetime | str = kept.read_text() if kept.is_file() else stamp
        extra = {}
        secret = entry / "submission_secret.txt"
        if secret.is_file():
            extra["submission_secret.txt"] = secret.read_bytes()
        else:
            report.warnings.append(
                f"{student}: no submission_secret.txt in {entry.name}: nbgrader release_feedback "
                "cannot return feedback to this student"
            )
        report.times[student] = f"{str(when).strip()} from the exchange"
        place(root, lesson, student, data, when, entry.name, report, replace, archive, extra)
        if student in {s for s, _ in report.placed + report.unchanged}:
            found[student] = {
                "lms": "exchange",
                "lms_id": hub_user_of.get(student, student),
                "name": student,
                "time_source": "exchange",
            }
    update_identities(root, lesson, found)
    return report
