"""nbgrader's own Execute step, with the kernel in the sandbox.

:class:`SandboxedExecute` is nbgrader's ``Execute`` (nbclient) with the kernel started in
bubblewrap by :class:`grader.kernel.SandboxedKernelManager` and the grader's additions of
:class:`grader.kernel.SandboxedClient`; nbgrader still restores locked and hidden test cells and
scores. Settings come from ``SANDBOX_ENV`` (:mod:`grader.settings`). A graded test cell whose
status is not ``ok``, or whose judge fails (:mod:`grader.judge`), gets an error output (nbgrader
scores it 0); then ``course.selfcheck.warnings_are_not_failures`` keeps stderr visible without
costing points.
"""

from __future__ import annotations

import json
import os
import secrets
import time

from nbformat import NotebookNode
from nbgrader.preprocessors import Execute

from course.selfcheck import warnings_are_not_failures
from grader.cells import cell_limits, graded_test_cells, timeouts_from_answer
from grader.kernel import SandboxedClient, SandboxedKernelManager
from grader.keys import GRADING_KEY_ENV, STUDENT_ID_ENV
from grader.sandbox import Settings
from grader.settings import CELL_LIMITS_ENV, EVENTS_ENV, SANDBOX_ENV, TIMING_ENV

__all__ = [
    "SandboxedExecute",
    "apply_answer",
    "fail_unfinished",
    "graded_test_cells",
    "record_timing",
]


def fail_unfinished(nb: NotebookNode, statuses: dict[int, str], why: str) -> dict[int, str]:
    """Give every graded test cell whose status is not ``ok`` an error output (nbgrader scores
    it 0) and every code cell without a status ``missing``; returns the statuses."""
    graded = set(graded_test_cells(nb))
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        status = statuses.setdefault(index, "missing" if cell.source.strip() else "ok")
        if index in graded and status != "ok":
            if not any(o.get("output_type") == "error" for o in cell.outputs):
                text = f"the kernel reported {status!r} for this test cell" + (
                    f": {why}" if why else ""
                )
                cell.outputs.append(
                    NotebookNode(
                        output_type="error",
                        ename="GraderFailed",
                        evalue=text,
                        traceback=[f"GraderFailed: {text}"],
                    )
                )
    return statuses


def apply_answer(nb: NotebookNode, answer: dict) -> dict[int, str]:
    """Copy the outputs of :func:`grader.sandbox.execute`'s ``answer`` into ``nb``, then
    :func:`fail_unfinished`; returns ``{cell index: status}``."""
    statuses = {}
    for got in answer.get("cells", []):
        cell = nb.cells[got["index"]]
        cell.outputs = [NotebookNode(o) for o in got.get("outputs") or []]
        cell.execution_count = got.get("execution_count")
        statuses[got["index"]] = str(got.get("status"))
    return fail_unfinished(nb, statuses, "; ".join(answer.get("events", [])))


def judge(nb: NotebookNode, resources: dict, settings: Settings) -> dict[int, str]:
    """Judge the hidden tests of the executed ``nb`` here, in nbgrader's process (no student code
    runs in it): see :mod:`grader.judge`. Returns ``{index: "error"}`` for each graded cell the
    judge failed (an error output was added: nbgrader scores it 0)."""
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


def keyed(settings: Settings) -> Settings:
    """``settings`` with a grading key for the kernel: hidden tests are judged here with the seed
    the kernel used (without a key each seed would be the kernel's own)."""
    if GRADING_KEY_ENV not in settings.kernel_env:
        settings.kernel_env = {
            **settings.kernel_env,
            GRADING_KEY_ENV: secrets.token_hex(32),
            STUDENT_ID_ENV: settings.kernel_env.get(STUDENT_ID_ENV, ""),
        }
    return settings


class SandboxedExecute(SandboxedClient, Execute):
    """nbgrader's Execute with the kernel in the sandbox; see the module docstring."""

    def preprocess(self, nb: NotebookNode, resources: dict, km=None):  # type: ignore[override]  # noqa: ANN001
        begun = time.time()
        settings = keyed(Settings.from_env(os.environ[SANDBOX_ENV]))
        calibration = json.loads(os.environ.get(CELL_LIMITS_ENV) or "null")
        limits = cell_limits(nb, calibration) if calibration else {}
        self.setup_grading(graded_test_cells(nb), limits, settings)
        why = ""
        try:
            nb, resources = super().preprocess(nb, resources, km=SandboxedKernelManager(settings))
        except Exception as exc:  # noqa: BLE001 - the kernel could not run: every test fails
            why = f"{type(exc).__name__}: {exc}"
            self.events.append(f"the sandbox failed: {why}")
        finally:
            self.release()
        statuses = fail_unfinished(nb, dict(self.statuses), why)
        statuses.update(judge(nb, resources, settings))
        for index in graded_test_cells(nb):
            warnings_are_not_failures(nb.cells[index])
        answer = {"events": self.events, "cells": self.answer_cells(nb)}
        events_file = os.environ.get(EVENTS_ENV)
        if events_file:
            cells = {}
            for index, status in statuses.items():
                gid = nb.cells[index].get("metadata", {}).get("nbgrader", {}).get("grade_id")
                if gid:
                    cells[gid] = status
            with open(events_file, "w", encoding="utf-8") as fh:
                timeouts = timeouts_from_answer(nb, answer, calibration)
                json.dump({"events": self.events, "cells": cells, "timeouts": timeouts}, fh)
        if os.environ.get(TIMING_ENV):
            seconds = {str(i): s for i, s in self.seconds.items()}
            record_timing(os.environ[TIMING_ENV], begun, {"cell_seconds": seconds})
        return nb, resources


def process_started() -> float:
    """When this process started (seconds since the epoch), from ``/proc`` (0.0 elsewhere)."""
    try:
        with open("/proc/self/stat", "rb") as fh:
            ticks = int(fh.read().rsplit(b")", 1)[1].split()[19])
        with open("/proc/stat", "rb") as fh:
            boot = next(int(line.split()[1]) for line in fh if line.startswith(b"btime"))
    except (OSError, ValueError, StopIteration, IndexError):
        return 0.0
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def record_timing(path: str, begun: float, timing: dict) -> None:
    """Append this nbgrader process's phases to ``path`` (JSON lines; ``grader.benchmark`` reads
    them): when it started, when the Execute step began and ended, and (at exit) when it ended."""
    import atexit

    pid = os.getpid()
    line = {"pid": pid, "process_start": process_started(), "preprocess_start": begun}
    line.update(timing, preprocess_end=time.time())

    def append(data: dict) -> None:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(data) + "\n")

    append(line)
    atexit.register(lambda: append({"pid": pid, "exit": time.time()}))
