"""The grading key: hidden tests' inputs are unpredictable to students, the same on a regrade.

Each course directory keeps one secret, ``.grading-key`` (git-ignored, mode 0600), created by
:func:`ensure_key` the first time ``python -m grader autograde`` runs (or by
``python -m grader.keys``). For a submission of student ``s``, the kernel that grades it gets
``COURSE_GRADING_KEY`` = :func:`student_key` (an HMAC of ``s`` under the course key, never the
course key itself) and ``COURSE_STUDENT_ID`` = ``s``; ``course.checks.hidden_seed(exercise)``
turns them into each exercise's seed. So the same submission graded twice sees the same hidden
inputs, two students see different ones, and a kernel that reads its own environment learns
nothing about another student's seeds. Replacing the key file changes every seed; results already
graded are kept until ``autograde --force`` regrades them.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
import secrets
from pathlib import Path

#: Where the course key lives, relative to the course directory.
KEY_FILE = ".grading-key"
#: The kernel's environment variables that ``course.checks.hidden_seed`` reads (and removes).
GRADING_KEY_ENV = "COURSE_GRADING_KEY"
STUDENT_ID_ENV = "COURSE_STUDENT_ID"


def ensure_key(root: Path) -> str:
    """The course key of ``root`` (created, 256 random bits as hex, if it does not exist yet)."""
    path = Path(root) / KEY_FILE
    try:
        key = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        key = ""
    if key:
        return key
    key = secrets.token_hex(32)
    try:  # O_EXCL: two graders starting at once agree on the first key written
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_text(encoding="ascii").strip()
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(key + "\n")
    return key


def student_key(course_key: str, student: str) -> str:
    """The key one student's grading kernel gets: an HMAC of ``student`` under ``course_key``."""
    return hmac.new(course_key.encode(), student.encode(), hashlib.sha256).hexdigest()


def kernel_env(course_key: str | None, student: str) -> dict[str, str]:
    """The environment variables that key ``hidden_seed`` in one submission's kernel."""
    if course_key is None:
        return {}
    return {GRADING_KEY_ENV: student_key(course_key, student), STUDENT_ID_ENV: student}


def seed_for(key: str, student: str, exercise: str) -> int:
    """What ``course.checks.hidden_seed(exercise)`` returns in a kernel keyed with ``key``.

    Calls the real function (with its module's key set for the call), so the two never differ.
    """
    import course.checks as checks

    saved = checks._GRADING_KEY, checks._STUDENT_ID
    checks._GRADING_KEY, checks._STUDENT_ID = key, student
    try:
        return checks.hidden_seed(exercise)
    finally:
        checks._GRADING_KEY, checks._STUDENT_ID = saved


def main(argv: list[str] | None = None) -> int:
    """``python -m grader.keys [--root DIR]``: create the course key if needed, say where it is."""
    parser = argparse.ArgumentParser(prog="python -m grader.keys", description=__doc__)
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the course directory")
    args = parser.parse_args(argv)
    path = args.root / KEY_FILE
    existed = path.is_file()
    ensure_key(args.root)
    print(f"{'kept' if existed else 'created'} the grading key {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
