"""The instructor's command line: ``python -m grader COMMAND`` (``--help`` on each)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from grader import REPO_ROOT

if TYPE_CHECKING:
    from grader.sandbox import Limits


def _cmd_release(args: argparse.Namespace) -> int:
    from grader.release import ReleaseError, differences, release

    root = Path(args.root).resolve()
    try:
        if args.check:
            diffs = differences(root)
            if diffs:
                print("lessons/ is out of sync with solutions/:", file=sys.stderr)
                for line in diffs:
                    print(f"  {line}", file=sys.stderr)
                print("Run `python -m grader release` to regenerate it.", file=sys.stderr)
                return 1
            print("lessons/ is in sync with solutions/.")
            return 0
        ids = release(root, args.lesson or None)
    except (ReleaseError, RuntimeError) as exc:  # RuntimeError: nbgrader itself failed
        print(exc, file=sys.stderr)
        print("lessons/ was left as it was.", file=sys.stderr)
        return 2
    print(f"released {len(ids)} lessons into {root / 'lessons'}: {', '.join(ids)}")
    return 0


def _cmd_package(args: argparse.Namespace) -> int:
    from grader.package import PackageError, build_kit

    root = Path(args.root).resolve()
    out = Path(args.out).resolve()
    try:
        names = build_kit(root, out, args.lesson or None)
    except PackageError as exc:
        print(exc, file=sys.stderr)
        return 2
    lessons = sorted({n.split("/")[1] for n in names if n.startswith("lessons/")})
    print(
        f"wrote {out}: {len(names)} files (lessons {', '.join(lessons)}; course/, "
        "pyproject.toml, requirements.txt, the student's JupyterLab view in jupyter/ with "
        "lab.py to open it, README.md); no solutions, no hidden tests"
    )
    return 0


def _cmd_intake(args: argparse.Namespace) -> int:
    from grader.intake import intake_exchange, intake_zip, sheet_kind

    root = Path(args.root).resolve()
    try:
        roster = sheet = None
        for given in args.roster or []:
            kind = "roster" if sheet_kind(Path(given)) == "roster" else "LMS download"
            if (roster if kind == "roster" else sheet) is not None:
                raise ValueError(f"--roster {given}: a second {kind}; give one of each at most")
            if kind == "roster":
                roster = Path(given)
            else:
                sheet = Path(given)
        if args.due:
            from grader.late import parse_when, set_duedate

            due = parse_when(args.due)
            set_duedate(root, args.lesson, due, args.db_url)
            print(f"{args.lesson} is due {due:%Y-%m-%d %H:%M} UTC (the gradebook's duedate)")
        if args.lms_zip:
            report = intake_zip(
                root,
                args.lesson,
                Path(args.lms_zip),
                roster,
                replace=args.replace,
                sheet=sheet,
                timezone=args.lms_timezone,
            )
        else:
            report = intake_exchange(
                root,
                args.lesson,
                Path(args.exchange) if args.exchange else None,
                replace=args.replace,
            )
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        print(f"intake failed: {exc}", file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    return 1 if report.unmapped or report.kept_existing else 0


def _parse_shard(text: str) -> tuple[int, int]:
    try:
        i, n = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError("--shard is I/N, e.g. 2/3") from None
    if not 1 <= i <= n:
        raise argparse.ArgumentTypeError("--shard I/N needs 1 <= I <= N")
    return i, n


def _course_note(root: Path) -> None:
    """Say which ``course`` package grades ``root`` when it is not the installed one."""
    from grader.sandbox import course_dir, installed_course_dir

    try:
        used, installed = course_dir(root), installed_course_dir()
    except RuntimeError as exc:
        print(f"WARNING: {exc}", file=sys.stderr)
        return
    if used != installed:
        print(
            f"grading with the course package in {used} (this environment's installed course "
            f"package is {installed})",
            file=sys.stderr,
        )


def autograde_limits(args: argparse.Namespace, root: Path, calibration: dict | None) -> Limits:
    """The limits ``autograde`` grades with: the options given, else the calibrated notebook
    limit, else the course's ``GraderSettings``."""
    from grader.sandbox import Limits
    from grader.settings import configured

    given = {n: getattr(args, n) for n in ("cell_timeout", "memory_mb", "nproc", "fsize_mb")}
    given["notebook_timeout"] = args.notebook_timeout
    if args.notebook_timeout is None and calibration:
        given["notebook_timeout"] = calibration["notebook_limit_s"]
    return Limits.of(configured(root), **{k: v for k, v in given.items() if v is not None})


def _cmd_autograde(args: argparse.Namespace) -> int:
    from grader.autograde import autograde
    from grader.sandbox import SandboxUnavailable, require_isolation

    root = Path(args.root).resolve()
    try:
        mode = require_isolation(args.unsandboxed)
    except SandboxUnavailable as exc:
        print(exc, file=sys.stderr)
        return 3
    _course_note(root)
    if mode == "unsandboxed":
        print(
            "WARNING: grading UNSANDBOXED: student code runs with this machine's files and "
            "network (rlimits only).",
            file=sys.stderr,
        )
    calibration = None
    if args.cell_timeout is None and not args.no_calibration:
        from grader.calibrate import calibration_path, load

        calibration, warning = load(root, args.lesson)
        if warning:
            print(f"WARNING: {warning}", file=sys.stderr)
        if calibration:
            per_cell = [float(c["limit_s"]) for c in calibration["cells"].values()]
            print(
                f"calibrated limits from {calibration_path(root, args.lesson)}: "
                f"{min(per_cell):g}-{max(per_cell):g} s per cell, other cells "
                f"{calibration['other_limit_s']:g} s, "
                f"notebook {calibration['notebook_limit_s']:g} s",
                file=sys.stderr,
            )
    limits = autograde_limits(args, root, calibration)
    try:
        outcomes = autograde(
            args.lesson,
            root,
            db_url=args.db_url,
            workers=args.workers,
            limits=limits,
            mode=mode,
            shard=args.shard,
            students=args.student or None,
            force=args.force,
            progress=not args.no_progress,
            calibration=calibration,
        )
    except KeyboardInterrupt:
        print(
            "\ninterrupted: finished submissions are saved; run the same command to resume.",
            file=sys.stderr,
        )
        return 130
    width = max([len(o.student) for o in outcomes] + [7])
    for o in outcomes:
        line = f"{o.student:<{width}}  {o.status:<8}"
        if o.total is not None:  # the gradebook's total: manual grades included
            line += f" {o.total:g}/{o.max_total:g}"
        elif o.max_scores:
            line += f" {sum(o.scores.values()):g}/{sum(o.max_scores.values()):g}"
        if o.skipped:
            line += "  (skipped: graded before; the gradebook's total)"
        if o.ungraded:
            line += f"  ({o.ungraded:g} point(s) of written answers not graded yet)"
        if o.reason:
            line += f"  {o.reason}"
        if o.flags:
            line += f"  [flags: {', '.join(o.flags)}]"
        print(line)
    counts = {s: sum(o.status == s for o in outcomes) for s in ("graded", "rejected", "failed")}
    summary = ", ".join(f"{v} {k}" for k, v in counts.items())
    skipped = sum(o.skipped for o in outcomes)
    if skipped:
        summary += f"; {skipped} skipped (already graded, unchanged: --force grades again)" + (
            " - nothing was graded in this run" if skipped == len(outcomes) else ""
        )
    print(summary)
    return 1 if counts["failed"] else 0


def _cmd_calibrate(args: argparse.Namespace) -> int:
    from grader.calibrate import calibrate, calibration_path, report
    from grader.sandbox import SandboxUnavailable, require_isolation
    from grader.settings import configured

    root = Path(args.root).resolve()
    try:
        mode = require_isolation(args.unsandboxed)
    except SandboxUnavailable as exc:
        print(exc, file=sys.stderr)
        return 3
    _course_note(root)
    settings = configured(root)
    try:
        data = calibrate(
            root,
            args.lesson,
            factor=args.calibration_factor or settings.calibration_factor,
            floor=settings.calibration_floor
            if args.calibration_floor is None
            else args.calibration_floor,
            runs=args.runs,
            workers=args.workers,
            mode=mode,
        )
    except (OSError, RuntimeError) as exc:
        print(f"calibration failed: {exc}", file=sys.stderr)
        return 2
    for line in report(data):
        print(line)
    print(f"wrote {calibration_path(root, args.lesson)}")
    return 0


def _cmd_feedback(args: argparse.Namespace) -> int:
    from grader.feedback import channels_of, deliver, generate

    root = Path(args.root).resolve()
    try:
        report = generate(root, args.lesson, args.db_url, args.student)
        channels = args.deliver or channels_of(root, args.lesson)
        if "none" not in channels:
            deliver(root, args.lesson, report, channels)
    except (RuntimeError, OSError, ValueError) as exc:
        print(exc, file=sys.stderr)
        return 2
    for line in report.lines():
        print(line)
    return 0


def _points_value(text: str) -> tuple[str, float]:
    lesson, sep, value = text.rpartition("=")
    try:
        points = float(value)
    except ValueError:
        raise ValueError(
            f"--points-possible {text!r}: expected N or LESSON=N, e.g. 01-number-formats=100"
        ) from None
    return (lesson if sep else ""), points


def _cmd_export(args: argparse.Namespace) -> int:
    from grader.export import collect, export_canvas, export_csv, export_moodle
    from grader.late import apply_late_penalties

    root = Path(args.root).resolve()
    lessons = args.lesson or None
    roster = Path(args.roster) if args.roster else None
    out = Path(args.out or {"exercises": "grades.csv"}.get(args.format, f"{args.format}.csv"))
    late: list[str] = []
    try:
        ids = dict(_lesson_value(text) for text in args.lms_assignment or [])
        points = dict(_points_value(text) for text in args.points_possible or [])
        for lesson in lessons or [g.lesson for g in collect(root, None, args.db_url)[1]]:
            late += apply_late_penalties(root, lesson, args.db_url).lines()
        if args.format == "exercises":
            warnings: list[str] = []
            n = export_csv(root, out, lessons, db_url=args.db_url, warnings=warnings)
            for line in late + [f"WARNING: {w}" for w in warnings]:
                print(line, file=sys.stderr)
            print(f"wrote {out}: {n} students")
            return 0
        if args.format == "canvas":
            result = export_canvas(root, out, lessons, args.db_url, ids, roster, points)
        else:
            if not lessons or len(lessons) != 1:
                raise ValueError("a Moodle grading worksheet is per assignment: give one --lesson")
            top = points.get(lessons[0], points.get(""))
            result = export_moodle(root, out, lessons[0], args.db_url, roster, points_possible=top)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    for line in late + [f"WARNING: {w}" for w in result.warnings]:
        print(line, file=sys.stderr)
    print(f"wrote {out} ({args.format} import format): {result.rows} students")
    return 0


def _lesson_value(text: str) -> tuple[str, str]:
    lesson, sep, value = text.partition("=")
    if not sep or not lesson or not value:
        raise ValueError(
            f"--lms-assignment {text!r}: expected LESSON=ID, e.g. 01-number-formats=42"
        )
    return lesson, value


def _cmd_check(args: argparse.Namespace) -> int:
    from course.selfcheck import main as selfcheck

    return selfcheck([args.notebook, "--timeout", str(args.timeout)])


def _cmd_hub(args: argparse.Namespace) -> int:
    from grader.hub import DEFAULT_EXCHANGE, DEFAULT_PREFIX, STATE, HubOptions, main

    return main(
        HubOptions(
            roster=Path(args.roster),
            instructor=args.instructor,
            prefix=Path(args.prefix or DEFAULT_PREFIX),
            exchange=Path(args.exchange or DEFAULT_EXCHANGE),
            state=Path(args.state or STATE),
            user_prefix=args.user_prefix,
            port=args.port,
            public=args.public,
            ssl_cert=args.ssl_cert,
            ssl_key=args.ssl_key,
            lessons=args.lesson or [],
            mem_limit=args.mem_limit,
            cull_timeout=args.cull_timeout,
            reset_passwords=args.reset_passwords,
            setup_only=args.setup_only,
        )
    )


def _setting(
    p: argparse.ArgumentParser,
    name: str,
    what: str | None = None,
    flag: str | None = None,
    calibrated: bool = False,
) -> None:
    """An option for the setting ``name`` of :class:`grader.settings.GraderSettings`: unset, the
    course's ``c.GraderSettings.NAME`` (its ``nbgrader_config.py``) or the built-in default."""
    from grader.settings import GraderSettings, default

    trait = GraderSettings.class_traits()[name]
    kind = type(default(name))
    help_ = what or str(trait.help)
    flag = flag or "--" + name.replace("_", "-")
    p.add_argument(
        flag,
        dest=name,
        metavar=flag.strip("-").replace("-", "_").upper(),
        type=kind,
        default=None,
        help=f"{help_} (default: {'the calibrated limit, else ' if calibrated else ''}"
        f"c.GraderSettings.{name} in nbgrader_config.py, {default(name)})",
    )


def _common(p: argparse.ArgumentParser, db: bool = False) -> None:
    """Arguments every command that works on a course directory takes."""
    p.add_argument("--root", default=str(REPO_ROOT), help="course directory (default: this repo)")
    if db:
        p.add_argument(
            "--db-url",
            default=None,
            help="nbgrader gradebook URL (default: sqlite:///ROOT/gradebook.db; "
            "postgresql+psycopg2://USER@HOST/DB to share one gradebook between machines: "
            "the driver must be named, a bare postgresql:// needs psycopg 3)",
        )


def _add_release(sub: argparse._SubParsersAction) -> None:
    """The ``release`` command's arguments."""
    p = sub.add_parser(
        "release",
        help="regenerate lessons/ from solutions/ through nbgrader",
        description="Regenerate lessons/ from solutions/ with nbgrader generate_assignment. "
        "Nothing in lessons/ changes unless every lesson releases cleanly.",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="only report whether lessons/ matches a fresh release (exit 1 if not)",
    )
    p.add_argument(
        "--lesson",
        action="append",
        metavar="ID",
        help="release only this lesson (repeatable); the others stay as they are",
    )
    _common(p)
    p.set_defaults(func=_cmd_release)


def _add_package(sub: argparse._SubParsersAction) -> None:
    """The ``package`` command's arguments."""
    p = sub.add_parser(
        "package",
        help="zip what students get: lessons/, course/, requirements, README",
        description="Write the student kit (lessons/, the course package, a pyproject.toml "
        "that installs it, requirements.txt, the student's JupyterLab view with lab.py to open "
        "it, a README). Refuses if any file holds solution or hidden-test markers.",
    )
    p.add_argument("--out", default="dist/mixed-precision-student-kit.zip", help="zip to write")
    p.add_argument(
        "--lesson",
        action="append",
        metavar="ID",
        help="only this released lesson (repeatable; default: every lesson in lessons/)",
    )
    _common(p)
    p.set_defaults(func=_cmd_package)


def _add_intake(sub: argparse._SubParsersAction) -> None:
    """The ``intake`` command's arguments."""
    p = sub.add_parser(
        "intake",
        help="collect submissions from an LMS zip or nbgrader's exchange into submitted/",
        description="Place submissions into submitted/<student>/<lesson>/ without overwriting "
        "any. Everything received is archived in intake/<lesson>/. LMS file names: Canvas "
        "'name[_LATE]_<userid>_<subid>_<file>.ipynb' or Moodle "
        "'<Full Name>_<id>_assignsubmission_file_<file>.ipynb', or Moodle 4.1's folders "
        "'<Full Name>_<id>_assignsubmission_file/<file>.ipynb'. Exit 1 if some files could "
        "not be mapped (they are listed).",
    )
    p.add_argument("lesson", help="lesson id, e.g. 02-loss-scaling")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--lms-zip", metavar="ZIP", help="an LMS 'download all submissions' zip")
    src.add_argument(
        "--exchange",
        metavar="DIR",
        nargs="?",
        const="",
        help="nbgrader's exchange root (default: nbgrader's Exchange.root in the course's "
        "config, /usr/local/share/nbgrader/exchange unless set)",
    )
    p.add_argument(
        "--roster",
        metavar="CSV",
        action="append",
        help="CSV with columns student_id,lms_id (optional: lms, name, email, sis_user_id, "
        "sis_login_id, section, submitted_at, extension_days, extension_hours); or the LMS's "
        "own download: Moodle's offline grading worksheet (submission times, maximum grade; "
        "download it with Moodle in English) or Canvas's gradebook export (points possible). "
        "Repeatable: a roster and a download",
    )
    p.add_argument(
        "--due",
        metavar="WHEN",
        help="the lesson's due date, ISO 8601 (2026-11-20T23:59+01:00; no zone: UTC), stored "
        "as the gradebook assignment's duedate",
    )
    p.add_argument(
        "--lms-timezone",
        default="UTC",
        metavar="TZ",
        help="the zone the LMS wrote local times in (zip entries, Moodle's worksheet dates), "
        "e.g. Europe/Berlin (default UTC)",
    )
    p.add_argument(
        "--replace",
        action="store_true",
        help="replace an existing different submission (the old one is archived)",
    )
    _common(p, db=True)
    p.set_defaults(func=_cmd_intake)


def _add_autograde(sub: argparse._SubParsersAction) -> None:
    """The ``autograde`` command's arguments."""
    p = sub.add_parser(
        "autograde",
        help="grade submitted/ in parallel, each submission sandboxed (resumable)",
        description="Autograde every submission of a lesson with nbgrader, each in its own "
        "sandbox (bubblewrap: no network, only its own files; time, memory, process and file "
        "size limits), in parallel. Interrupt and re-run at will: nothing is graded twice.",
    )
    p.add_argument("lesson", help="lesson id")
    p.add_argument("--workers", type=int, default=None, help="parallel workers (default: cores)")
    p.add_argument(
        "--shard",
        type=_parse_shard,
        default=(1, 1),
        metavar="I/N",
        help="grade only share I of N of the students (several machines, one PostgreSQL gradebook)",
    )
    p.add_argument("--student", action="append", help="only this student (repeatable)")
    p.add_argument("--force", action="store_true", help="grade again even if already graded")
    _setting(p, "cell_timeout", "seconds for every cell, in place of the calibrated limits")
    _setting(p, "notebook_timeout", calibrated=True)
    p.add_argument(
        "--no-calibration",
        action="store_true",
        help="ignore .grader/ID/calibration.json (uniform --cell-timeout limits)",
    )
    for name in ("memory_mb", "nproc", "fsize_mb"):
        _setting(p, name)
    p.add_argument(
        "--unsandboxed",
        action="store_true",
        help="grade without bubblewrap when it is missing (trusted code only)",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    _common(p, db=True)
    p.set_defaults(func=_cmd_autograde)


def _add_calibrate(sub: argparse._SubParsersAction) -> None:
    """The ``calibrate`` command's arguments."""
    p = sub.add_parser(
        "calibrate",
        help="time the solution on this machine: per-cell limits for autograde",
        description="Execute the lesson's solution as autograde executes a submission (same "
        "sandbox, limits, threads and harness) and store per-cell time limits, FACTOR x the "
        "measured time and at least FLOOR seconds, in .grader/ID/calibration.json. autograde "
        "uses them unless --cell-timeout or --no-calibration is given. Run it on the grading "
        "machine.",
    )
    p.add_argument("lesson", help="lesson id")
    _setting(p, "calibration_factor", flag="--factor")
    _setting(p, "calibration_floor", flag="--floor")
    p.add_argument("--runs", type=int, default=1, help="runs to take the slowest time of")
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="the --workers autograde will use (sets the threads per kernel; default: cores)",
    )
    p.add_argument(
        "--unsandboxed", action="store_true", help="time without bubblewrap when it is missing"
    )
    _common(p)
    p.set_defaults(func=_cmd_calibrate)


def _add_feedback(sub: argparse._SubParsersAction) -> None:
    """The ``feedback`` command's arguments."""
    p = sub.add_parser(
        "feedback",
        help="feedback HTML per student (nbgrader generate_feedback, hidden tests removed)",
        description="Write feedback/<student>/<lesson>/<lesson>.html from the autograded "
        "notebooks and the gradebook. Hidden test code is not shown.",
    )
    p.add_argument("lesson", help="lesson id")
    p.add_argument("--student", help="only this student")
    p.add_argument(
        "--deliver",
        action="append",
        choices=["moodle", "canvas", "exchange", "none"],
        help="return the feedback this way (repeatable; default: every way the lesson's "
        "submissions came in): moodle / canvas write lms-feedback/LESSON/<lms>-feedback.zip "
        "to upload (Moodle: 'Upload multiple feedback files in a zip'; Canvas: 'Re-upload "
        "Submissions'), exchange runs nbgrader release_feedback",
    )
    _common(p, db=True)
    p.set_defaults(func=_cmd_feedback)


def _add_export(sub: argparse._SubParsersAction) -> None:
    """The ``export`` command's arguments."""
    p = sub.add_parser(
        "export",
        help="grades to CSV: a column per exercise, or the Canvas / Moodle import format",
        description="exercises (default): one row per student; per lesson a column per "
        "exercise, its total, max and status (rejected/failed reasons, flags, needs manual "
        "grading); overall totals. canvas: Canvas's gradebook import CSV (a column per lesson). "
        "moodle: the assignment's offline grading worksheet (one lesson). The LMS formats map "
        "students back through the roster used at intake.",
    )
    p.add_argument("--lesson", action="append", help="only this lesson (repeatable)")
    p.add_argument("--format", choices=["exercises", "canvas", "moodle"], default="exercises")
    p.add_argument(
        "--out",
        default=None,
        help="CSV file to write (default: grades.csv, canvas.csv, moodle.csv)",
    )
    p.add_argument(
        "--roster",
        metavar="CSV",
        help="roster for the LMS formats (default: the one used at intake of each lesson)",
    )
    p.add_argument(
        "--lms-assignment",
        action="append",
        metavar="LESSON=ID",
        help="the LMS's assignment id of a lesson (Canvas's column 'LESSON (ID)'); repeatable",
    )
    p.add_argument(
        "--points-possible",
        action="append",
        metavar="[LESSON=]N",
        help="the LMS assignment's maximum (canvas, moodle): totals are scaled to it; without "
        "it, the maximum in the LMS's own download given at intake, else the export is refused",
    )
    _common(p, db=True)
    p.set_defaults(func=_cmd_export)


def _add_check(sub: argparse._SubParsersAction) -> None:
    """The ``check`` command's arguments."""
    p = sub.add_parser(
        "check",
        help="self-check a notebook: per exercise, passed or failed and why",
        description="Run a (saved) lesson notebook in a fresh kernel and report each exercise's "
        "visible tests: passed, FAILED with the check's message, or not attempted. Hidden tests "
        "are never run or shown. In a notebook: from course.selfcheck import check_my_work; "
        "check_my_work()",
    )
    p.add_argument("notebook", help="e.g. lessons/02-loss-scaling/02-loss-scaling.ipynb")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    p.set_defaults(func=_cmd_check)


def _add_hub(sub: argparse._SubParsersAction) -> None:
    """The ``hub`` command's arguments."""
    p = sub.add_parser(
        "hub",
        help="a JupyterHub for the class on this machine (as root): accounts, exchange, views",
        description="Install (pinned) and start a JupyterHub for the class: a Unix account and "
        "password per roster student and for the instructor (PAM), the students' servers from a "
        "world-readable class environment, nbgrader's exchange with the lessons released, the "
        "student view for students and formgrader for the instructor. Roster changes take "
        "effect when the command is run again: it adds students, locks and blocks those removed "
        "(their work is kept) and restarts the hub (a hub running from the same --state is "
        "stopped first). Passwords: .hub/passwords.csv.",
    )
    p.add_argument("--roster", required=True, help="CSV with a student_id column (optional "
                   "hub_user: the Unix name to use)")  # fmt: skip
    p.add_argument("--instructor", default="instructor", help="the instructor's Unix user")
    p.add_argument("--port", type=int, default=8000, help="the hub's port (default 8000)")
    p.add_argument(
        "--public",
        action="store_true",
        help="listen on all interfaces over HTTPS (needs --ssl-cert and --ssl-key)",
    )
    p.add_argument("--ssl-cert", help="TLS certificate (PEM, full chain) for --public")
    p.add_argument("--ssl-key", help="the certificate's private key (PEM)")
    p.add_argument("--lesson", action="append", help="release only this lesson (repeatable)")
    p.add_argument("--prefix", help="the class environment (default /opt/mixed-precision-course)")
    p.add_argument("--exchange", help="nbgrader's exchange root (default nbgrader's own)")
    p.add_argument("--state", help="the hub's own files: proxy, database, passwords (.hub/)")
    p.add_argument("--user-prefix", default="", help="put in front of every student's Unix name")
    p.add_argument(
        "--mem-limit",
        default="4G",
        help="per-user memory limit: shown to users, NOT enforced by this machine's "
        "LocalProcessSpawner (Kubernetes enforces it)",
    )
    p.add_argument("--cull-timeout", type=int, default=3600, help="stop servers idle this long (s)")
    p.add_argument("--reset-passwords", action="store_true", help="new passwords for everyone")
    p.add_argument("--setup-only", action="store_true", help="set everything up, do not start")
    p.set_defaults(func=_cmd_hub)


def build_parser() -> argparse.ArgumentParser:
    """``python -m grader``'s parser: one sub-command per ``_add_NAME``."""
    parser = argparse.ArgumentParser(
        prog="python -m grader",
        description="Release, collect, grade and report the mixed precision course.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        _add_release,
        _add_package,
        _add_intake,
        _add_autograde,
        _add_calibrate,
        _add_feedback,
        _add_export,
        _add_check,
        _add_hub,
    ):
        add(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m grader``."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))
