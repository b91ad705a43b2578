"""Benchmark: plain serial ``nbgrader autograde`` against this grader, on one synthetic class.

``python -m grader.benchmark [--submissions 20] [--workers N] [--lesson ID] [--grader-only]``
grades the lesson's solution and its wrong variants, repeated to ``--submissions`` students, with
plain serial nbgrader and with :func:`grader.autograde.autograde`, checks both gave the same
scores, and prints seconds per submission for each, their ratio, one worker's overhead over bare
nbclient execution and where that worker's time goes (stamps from
:func:`grader.execute.record_timing`). Every kernel gets ``cores // workers`` threads unless
``--default-threads``. Not a test: nothing asserts timing; compare figures within one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import nbformat

from grader import REPO_ROOT
from grader.audit import wrong_variants
from grader.settings import TIMING_ENV


def make_class(lesson: str, count: int, dest: Path) -> dict[str, Path]:
    """``count`` submissions of ``lesson``: the solution and its wrong variants in turn."""
    source = REPO_ROOT / "solutions" / lesson / f"{lesson}.ipynb"
    kinds: list[tuple[str, str | None, str | None]] = [("right", None, None)]
    kinds += [(name, gid, src) for name, (gid, src) in wrong_variants(lesson).items()]
    out: dict[str, Path] = {}
    for i in range(count):
        name, gid, src = kinds[i % len(kinds)]
        nb = nbformat.read(source, as_version=4)
        if gid:
            for cell in nb.cells:
                if cell.metadata.get("nbgrader", {}).get("grade_id") == gid:
                    cell.source = src
        path = dest / f"s{i:03d}-{name}".replace("_", "-") / f"{lesson}.ipynb"
        path.parent.mkdir(parents=True)
        nbformat.write(nb, path)
        out[path.parent.name] = path
    return out


def bare_execution(lesson: str) -> tuple[float, dict[str, float]]:
    """Seconds to execute the solution notebook once with nbclient, and its phases."""
    from course.selfcheck import notebook_client

    nb = nbformat.read(REPO_ROOT / "solutions" / lesson / f"{lesson}.ipynb", as_version=4)
    with tempfile.TemporaryDirectory() as tmp:
        client = notebook_client(
            nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": tmp}}
        )
        start = time.perf_counter()
        with client.setup_kernel():
            ready = time.perf_counter()
            for index, cell in enumerate(nb.cells):
                client.execute_cell(cell, index)
            done = time.perf_counter()
        end = time.perf_counter()
    phases = {"kernel start": ready - start, "cells": done - ready, "shutdown": end - done}
    return end - start, phases


#: The phases of one submission in a worker, from :func:`grader.execute.record_timing`'s stamps.
PHASES = [
    ("nbgrader start (imports, config, gradebook)", "process_start", "preprocess_start"),
    (
        "execution in the sandbox (kernel start, cells, judges)",
        "preprocess_start",
        "preprocess_end",
    ),
    ("nbgrader after execution (scores, files)", "preprocess_end", "exit"),
]


def worker_phases(path: Path) -> list[tuple[str, float]]:
    """Mean seconds per submission of each phase in ``path`` (JSON lines, one process each)."""
    by_pid: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        data = json.loads(line)
        by_pid.setdefault(data["pid"], {}).update(data)
    runs = [r for r in by_pid.values() if "exit" in r and "preprocess_end" in r]
    if not runs:
        return []
    rows = []
    for name, start, end in PHASES:
        values = [(r[end] - r[start]) if start else r.get(end, 0.0) for r in runs]
        rows.append((name, sum(values) / len(values)))
    return rows


def worker_split_of(results: Path) -> dict[str, float]:
    """Mean seconds of each phase in results' ``phases`` (:func:`grader.autograde.grade_one`)."""
    totals: dict[str, list[float]] = {}
    for path in sorted(results.glob("*.json")):
        for name, seconds in (json.loads(path.read_text()).get("phases") or {}).items():
            totals.setdefault(name, []).append(float(seconds))
    return {name: sum(v) / len(v) for name, v in totals.items()}


def slow_cells(path: Path, top: int = 5) -> list[tuple[int, float, float, float]]:
    """The cells with the longest single run across submissions: ``(index, min, median, max)``.

    A cell whose max is far above its median waited on something in one run (the load of the
    machine, a lock, a child): the figure to look at before the phases' means.
    """
    runs: dict[int, list[float]] = {}
    for line in path.read_text().splitlines():
        for index, seconds in (json.loads(line).get("cell_seconds") or {}).items():
            runs.setdefault(int(index), []).append(float(seconds))
    rows = []
    for index, values in runs.items():
        values.sort()
        rows.append((index, values[0], values[len(values) // 2], values[-1]))
    return sorted(rows, key=lambda r: -r[3])[:top]


#: A cell counts as stalled when one run of it took this much longer than its median run.
STALL_MARGIN = 30.0


def stalls(results: Path, timing: Path | None) -> list[str]:
    """Every sign of a stall in one graded class, a line each: a cell that ran
    :data:`STALL_MARGIN` seconds past its median over the submissions, and a cell stopped at its
    time limit."""
    found = []
    if timing is not None and timing.is_file():
        runs: dict[int, list[float]] = {}
        for line in timing.read_text().splitlines():
            for index, seconds in (json.loads(line).get("cell_seconds") or {}).items():
                runs.setdefault(int(index), []).append(float(seconds))
        for index, values in sorted(runs.items()):
            median = sorted(values)[len(values) // 2]
            for seconds in values:
                if seconds > median + STALL_MARGIN:
                    found.append(f"cell {index}: {seconds:.1f} s (median {median:.1f} s)")
    for path in sorted(results.glob("*.json")):
        data = json.loads(path.read_text())
        for event in data.get("events") or []:
            if "still running after" in event:
                found.append(f"{path.stem}: {event}")
        for timeout in data.get("timeouts") or []:
            found.append(f"{path.stem}: ran out of time: {timeout}")
    return found


#: The events of a cell whose execute_reply was late or lost (course.selfcheck.RecoversLostReplies,
#: REPLY_GRACE).
LOST_REPLY = (
    "its execute_reply came only after",
    "its execute_reply never came",
    "its execute_reply was found by a new poll",
)


def lost_replies(results: Path) -> list[str]:
    """Every execute_reply the client had to recover (the kernel idle, its reply not come), a
    line each: a nudge brought it, or the cell was completed from iopub. Seconds each, where a
    stall would have cost the cell's whole limit."""
    return [
        f"{path.stem}: {event}"
        for path in sorted(results.glob("*.json"))
        for event in json.loads(path.read_text()).get("events") or []
        if any(sign in event for sign in LOST_REPLY)
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m grader.benchmark",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--lesson", default="01-number-formats")
    parser.add_argument("--submissions", type=int, default=20)
    parser.add_argument(
        "--grader-only",
        action="store_true",
        help="skip plain serial nbgrader (and the score comparison): the grader alone, for a "
        "long run that counts stalls",
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--keep",
        type=Path,
        metavar="DIR",
        help="grade in DIR (a new folder) and keep it: the autograded notebooks show what a slow "
        "cell was doing when its limit stopped it (its traceback)",
    )
    parser.add_argument(
        "--unsandboxed",
        action="store_true",
        help="run the grader without bubblewrap (if it is missing)",
    )
    parser.add_argument(
        "--default-threads",
        action="store_true",
        help="leave plain nbgrader and bare execution at torch's default thread count (the "
        "grader gives each sandbox cores // workers threads); by default all three get that",
    )
    args = parser.parse_args(argv)
    threads = max(1, (os.cpu_count() or 1) // args.workers)
    if not args.default_threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)

    from grader.autograde import autograde
    from grader.gradebook import autograde_notebooks
    from grader.release import copy_course_skeleton
    from grader.sandbox import require_isolation

    mode = require_isolation(args.unsandboxed)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=False)
        folder = contextlib.nullcontext(str(args.keep.resolve()))
    else:
        folder = tempfile.TemporaryDirectory(prefix="grader-bench-")
    with folder as tmp:
        tmp = Path(tmp)
        subs = make_class(args.lesson, args.submissions, tmp / "class")
        print(
            f"class: {len(subs)} submissions of {args.lesson}; {os.cpu_count()} cores; "
            f"grader workers: {args.workers}; isolation: {mode}; threads per kernel: "
            f"{'torch default (plain, bare)' if args.default_threads else threads}",
            flush=True,
        )

        # Twice, keeping the faster: the first run also pays cold file and import caches.
        bare, bare_phases = min(bare_execution(args.lesson) for _ in range(2))
        print(
            f"bare execution of the solution (faster of 2): {bare:.1f} s ("
            + ", ".join(f"{k} {v:.1f} s" for k, v in bare_phases.items())
            + ")",
            flush=True,
        )

        plain, plain_s = {}, 0.0
        if not args.grader_only:
            start = time.perf_counter()
            plain = autograde_notebooks(args.lesson, subs, tmp / "plain")
            plain_s = time.perf_counter() - start
            print(f"plain serial nbgrader autograde: {plain_s:.1f} s", flush=True)

        course = tmp / "course"
        copy_course_skeleton(REPO_ROOT, course)
        for student, path in subs.items():
            dest = course / "submitted" / student / args.lesson
            dest.mkdir(parents=True)
            shutil.copy2(path, dest / path.name)
        timing = tmp / "timing.jsonl"
        os.environ[TIMING_ENV] = str(timing)  # grader.execute appends each run's phases
        start = time.perf_counter()
        outcomes = autograde(
            args.lesson, course, workers=args.workers, mode=mode, progress=args.grader_only
        )
        grader_s = time.perf_counter() - start
        del os.environ[TIMING_ENV]
        per_worker = sum(o.seconds for o in outcomes) / max(1, len(outcomes))
        phases = worker_phases(timing) if timing.is_file() else []
        slowest = slow_cells(timing) if timing.is_file() else []
        worker_split = worker_split_of(course / ".grader" / args.lesson / "results")
        stalled = stalls(course / ".grader" / args.lesson / "results", timing)
        recovered = lost_replies(course / ".grader" / args.lesson / "results")
        print(f"this grader ({args.workers} workers): {grader_s:.1f} s", flush=True)

    n = len(subs)
    mismatches = []
    for o in outcomes if plain else ():
        theirs = {g: c.score for g, c in plain[o.student].items() if c.auto}
        mine = {g: o.scores.get(g, 0.0) for g in theirs}
        if mine != theirs:
            mismatches.append((o.student, theirs, mine))
    print()
    if phases:
        print("where one worker's time per submission goes (mean seconds):")
        for name, seconds in phases:
            print(f"  {name:<46} {seconds:6.2f}")
        print()
    if worker_split:
        print("the worker's own split of a submission (mean seconds):")
        for name, seconds in worker_split.items():
            print(f"  {name:<46} {seconds:6.2f}")
        print()
    if slowest:
        print("slowest cells in the grader (seconds over the submissions: min / median / max):")
        for index, low, mid, high in slowest:
            print(f"  cell {index:>3}: {low:6.2f} / {mid:6.2f} / {high:6.2f}")
        print()
    print(
        f"stalls in {n} submissions (a cell {STALL_MARGIN:.0f} s past its median "
        f"or out of time): {len(stalled)}"
    )
    for line in stalled:
        print(f"  {line}")
    print(
        "execute_replies late or lost, and recovered (the kernel idle, its reply not come: "
        f"found by a new poll, come after a nudge, or completed from iopub): {len(recovered)}"
    )
    for line in recovered:
        print(f"  {line}")
    if plain:
        print(f"seconds per submission, plain serial nbgrader: {plain_s / n:7.1f}")
    print(f"seconds per submission, this grader:           {grader_s / n:7.1f}")
    if plain:
        print(f"ratio (plain / grader):                        {plain_s / grader_s:7.2f}x")
    print(
        f"one worker's time per submission:              {per_worker:7.1f} s "
        f"(bare execution {bare:.1f} s: overhead {per_worker / bare - 1:+.0%}, "
        f"{per_worker - bare:+.1f} s)"
    )
    if plain:
        print(f"scores identical to plain nbgrader: {'yes' if not mismatches else 'NO'}")
    for m in mismatches:
        print(f"  {m}")
    return 0 if not mismatches else 1


if __name__ == "__main__":
    raise SystemExit(main())
