"""The instructor's command line: ``python -m grader COMMAND`` (``--help`` on each)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from grader import REPO_ROOT


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
    except ReleaseError as exc:
        print(exc, file=sys.stderr)
        print("lessons/ was left as it was.", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(exc, file=sys.stderr)
        print("lessons/ was left as it was.", file=sys.stderr)
        return 2
    print(f"released {len(ids)} lessons into {root / 'lessons'}: {', '.join(ids)}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m grader",
        description="Release, collect, grade and report the mixed precision course.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

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
    p.add_argument("--root", default=str(REPO_ROOT), help="course directory (default: this repo)")
    p.set_defaults(func=_cmd_release)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m grader``."""
    args = build_parser().parse_args(argv)
    return int(args.func(args))
