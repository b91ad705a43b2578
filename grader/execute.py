"""nbgrader's Execute step, replaced by execution in the sandbox.

:class:`SandboxedExecute` takes the place of nbgrader's ``Execute`` in ``Autograde``'s pipeline:
nbgrader still restores locked and hidden test cells and scores; the kernel runs in the sandbox
(settings from ``SANDBOX_ENV``, :mod:`grader.settings`). A graded test cell whose status is not
``ok``, or whose judge fails (:mod:`grader.judge`), gets an error output (nbgrader scores it 0);
then ``course.selfcheck.warnings_are_not_failures`` keeps stderr visible without costing points.
"""

from __future__ import annotations

import json
import os
import secrets
import time

from nbformat import NotebookNode
from nbgrader.preprocessors import Execute

from course.selfcheck import warnings_are_not_failures
from grader.cells import cell_limits, graded_test_cells, stall_after, timeouts_from_answer
from grader.keys import GRADING_KEY_ENV, STUDENT_ID_ENV
from grader.sandbox import Settings, execute
from grader.settings import CELL_LIMITS_ENV, EVENTS_ENV, SANDBOX_ENV, TIMING_ENV

__all__ = ["SandboxedExecute", "apply_answer", "graded_test_cells", "record_timing"]


def apply_answer(nb: NotebookNode, answer: dict) -> dict[int, str]:
    """Copy outputs from the runner's answer into ``nb``; returns ``{cell index: status}``.

    Only outputs and execution counts are taken: sources and metadata stay nbgrader's. Code cells
    with no answer (the sandbox failed) and graded cells whose status is not ``ok`` get an error.
    """
    statuses: dict[int, str] = {}
    by_index = {c["index"]: c for c in answer.get("cells", []) if isinstance(c, dict)}
    graded = set(graded_test_cells(nb))
    events = "; ".join(answer.get("events", [])) or "no answer from the sandbox"
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        got = by_index.get(index)
        if got is None:
            status = "missing"
            outputs = [
                {
                    "output_type": "error",
                    "ename": "GraderError",
                    "evalue": f"this cell was not executed: {events}",
                    "traceback": [f"GraderError: this cell was not executed: {events}"],
                }
            ]
            count = None
        else:
            status = str(got.get("status"))
            outputs = got.get("outputs") or []
            count = got.get("execution_count")
        cell.outputs = [NotebookNode(o) for o in outputs if isinstance(o, dict)]
        cell.execution_count = count if isinstance(count, int) else None
        if index in graded and status != "ok":
            if not any(o.get("output_type") == "error" for o in cell.outputs):
                cell.outputs.append(
                    NotebookNode(
                        output_type="error",
                        ename="GraderFailed",
                        evalue=f"the kernel reported {status!r} for this test cell",
                        traceback=[
                            f"GraderFailed: the kernel reported {status!r} for this test cell"
                        ],
                    )
                )
        statuses[index] = status
    return statuses


def judge(nb: NotebookNode, resources: dict, settings: Settings) -> dict[int, str]:
    """Judge the converted hidden tests of the executed ``nb`` here, in nbgrader's process (no
    student code runs in it): see :mod:`grader.judge`. Returns ``{index: "error"}`` for each
    graded cell the judge failed (an error output was added: nbgrader scores it 0)."""
    from grader.judge import apply_judges, exposed, judges
    from grader.keys import seed_for

    lesson = (resources.get("nbgrader") or {}).get("assignment")
    problem = exposed() if lesson and judges(lesson) else None
    if problem:
        raise RuntimeError(problem)
    key = settings.kernel_env[GRADING_KEY_ENV]
    student = settings.kernel_env.get(STUDENT_ID_ENV, "")
    verdicts = apply_judges(nb, lesson, lambda exercise: seed_for(key, student, exercise))
    return {index: "error" for index, verdict in verdicts.items() if verdict == "failed"}


class SandboxedExecute(Execute):
    """Execute the notebook in the sandbox; see the module docstring."""

    def preprocess(self, nb: NotebookNode, resources: dict):  # type: ignore[override]
        begun = time.time()
        settings = Settings.from_env(os.environ[SANDBOX_ENV])
        if GRADING_KEY_ENV not in settings.kernel_env:
            # Converted hidden tests are judged here with the seed the kernel used: a key the
            # kernel gets and this process keeps (without one each seed would be the kernel's).
            settings.kernel_env = {
                **settings.kernel_env,
                GRADING_KEY_ENV: secrets.token_hex(32),
                STUDENT_ID_ENV: settings.kernel_env.get(STUDENT_ID_ENV, ""),
            }
        plain = json.loads(json.dumps(nb))
        # Calibrated per-cell limits (grader/calibrate.py), when autograde passes them.
        calibration = json.loads(os.environ.get(CELL_LIMITS_ENV) or "null")
        per_cell = cell_limits(nb, calibration) if calibration else None
        slow = stall_after(nb, calibration) if calibration else None
        answer = execute(
            plain, graded_test_cells(nb), settings, cell_timeouts=per_cell, stall_after=slow
        )
        statuses = apply_answer(nb, answer)
        statuses.update(judge(nb, resources, settings))
        for index in graded_test_cells(nb):
            warnings_are_not_failures(nb.cells[index])
        events_file = os.environ.get(EVENTS_ENV)
        if events_file:
            cells = {}
            for index, status in statuses.items():
                gid = nb.cells[index].get("metadata", {}).get("nbgrader", {}).get("grade_id")
                if gid:
                    cells[gid] = status
            with open(events_file, "w", encoding="utf-8") as fh:
                timeouts = timeouts_from_answer(nb, answer, calibration)
                json.dump(
                    {"events": answer.get("events", []), "cells": cells, "timeouts": timeouts}, fh
                )
        if os.environ.get(TIMING_ENV):
            cells = {
                str(c["index"]): c["seconds"]
                for c in answer.get("cells", [])
                if isinstance(c, dict) and isinstance(c.get("seconds"), (int, float))
            }
            timing = dict(answer.get("timing") or {}, cell_seconds=cells)
            record_timing(os.environ[TIMING_ENV], begun, timing)
        return nb, resources


def process_started() -> float:
    """When this process started (seconds since the epoch), from ``/proc`` (0.0 elsewhere)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", encoding="ascii") as fh:
            boot = next(int(ln.split()[1]) for ln in fh if ln.startswith("btime"))
    except (OSError, ValueError, StopIteration, IndexError):
        return 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def record_timing(path: str, begun: float, timing: dict) -> None:
    """Append this nbgrader process's phases to ``path`` (JSON lines; ``grader.benchmark`` reads
    them): when it started, when the Execute step began and ended, the sandbox's and the runner's
    stamps, and (at exit) when it ended."""
    import atexit

    pid = os.getpid()
    line = {"pid": pid, "process_start": process_started(), "preprocess_start": begun}
    line.update(timing, preprocess_end=time.time())

    def append(data: dict) -> None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(data) + "\n")

    append(line)
    atexit.register(lambda: append({"pid": pid, "exit": time.time()}))
