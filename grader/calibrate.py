"""Per-cell time limits calibrated from the solution, measured on the grading machine.

``python -m grader calibrate ID`` executes ``solutions/ID/ID.ipynb`` in the kernel ``autograde``
uses (:func:`grader.sandbox.execute`: the sandbox, the course's limits, the harness; no nbgrader,
no judges) and times every code cell. A cell's limit is ``factor`` x its slowest measured time,
at least ``floor`` s, written to ``.grader/ID/calibration.json``. A submission's cell gets the
limit of the solution's cell with the same grade id, else with the same source, else
``other_limit_s``; the notebook's limit is the sum of the solution's cells' limits.
"""

from __future__ import annotations

import json
import math
import os
import platform
from datetime import UTC, datetime
from pathlib import Path

import nbformat

from grader.cells import (
    cell_key,
    cell_label,
    cell_limits,
    describe_timeout,
    fmt_seconds,
    graded_test_cells,
    lesson_key,
    timeouts_from_answer,
)
from grader.sandbox import Limits, Settings, course_dir, execute
from grader.settings import configured, default

__all__ = [
    "calibrate",
    "calibration_path",
    "cell_key",
    "cell_limits",
    "describe_timeout",
    "fmt_seconds",
    "limits_from",
    "load",
    "measure",
    "report",
    "timeouts_from_answer",
]

#: Format of the calibration file; a file of another version is ignored (with a warning).
VERSION = 1


def calibration_path(root: Path, lesson: str) -> Path:
    """Where the calibration of ``lesson`` lives (``.grader/<lesson>/calibration.json``)."""
    return root / ".grader" / lesson / "calibration.json"


def limits_from(
    measured: list[dict],
    factor: float = default("calibration_factor"),  # type: ignore[assignment]
    floor: float = default("calibration_floor"),  # type: ignore[assignment]
) -> dict[str, object]:
    """The calibration's limits from measured cells (``{"key", "label", "seconds"}`` each)."""
    cells: dict[str, dict[str, object]] = {}
    for m in measured:
        limit = float(math.ceil(max(floor, factor * float(m["seconds"]))))
        old = cells.get(str(m["key"]))
        if old is None or float(old["solution_s"]) < float(m["seconds"]):
            cells[str(m["key"])] = {
                "label": m["label"],
                "solution_s": round(float(m["seconds"]), 3),
                "limit_s": limit,
            }
    others = [float(c["limit_s"]) for k, c in cells.items() if k.startswith("src:")]
    return {
        "cells": cells,
        "other_limit_s": max(others, default=float(math.ceil(floor))),
        "notebook_limit_s": float(sum(float(c["limit_s"]) for c in cells.values())),
        "factor": factor,
        "floor": floor,
    }


def measure(
    root: Path,
    lesson: str,
    workers: int | None = None,
    mode: str = "bwrap",
    runs: int = 1,
) -> tuple[list[dict], int]:
    """Run the solution ``runs`` times under the course's limits (``GraderSettings``), as
    autograde runs a submission; per-cell times.

    Returns the measured cells (the slowest run of each) and the BLAS/OpenMP thread count used.
    Raises ``RuntimeError`` if a cell of the solution does not run cleanly (its time would mean
    nothing).
    """
    path = root / "solutions" / lesson / f"{lesson}.ipynb"
    nb = nbformat.read(path, as_version=4)
    workers = max(1, workers or os.cpu_count() or 1)
    threads = max(1, (os.cpu_count() or 1) // workers)
    course = configured(root)
    limits = Limits.of(course, threads=threads)
    extra = [p for p in path.parent.iterdir() if p.suffix != ".ipynb" and p.name[0] != "."]
    settings = Settings(
        limits=limits,
        mode=mode,
        lesson_files=str(path.parent) if extra else None,
        course_dir=str(course_dir(root)),
        uid_base=course.uid_base,
    )
    slowest: dict[int, float] = {}
    for _ in range(max(1, runs)):
        answer = execute(json.loads(json.dumps(nb)), graded_test_cells(nb), settings)
        got = {c["index"]: c for c in answer.get("cells", [])}
        bad = []
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            c = got.get(index)
            if c is None or c.get("status") != "ok":
                status = c.get("status") if c else "not executed"
                bad.append(f"{cell_label(cell, index)}: {status}")
                continue
            slowest[index] = max(slowest.get(index, 0.0), float(c["seconds"]))
        if bad:
            events = "; ".join(answer.get("events", []))
            raise RuntimeError(
                f"the solution of {lesson} did not run cleanly, so it cannot be timed: "
                + ", ".join(bad[:5])
                + (f" ({events})" if events else "")
            )
    measured = [
        {"key": cell_key(nb.cells[i]), "label": cell_label(nb.cells[i], i), "seconds": s}
        for i, s in sorted(slowest.items())
    ]
    return measured, threads


def calibrate(
    root: Path,
    lesson: str,
    factor: float = default("calibration_factor"),  # type: ignore[assignment]
    floor: float = default("calibration_floor"),  # type: ignore[assignment]
    runs: int = 1,
    workers: int | None = None,
    mode: str = "bwrap",
) -> dict:
    """Measure the solution of ``lesson`` and write its calibration file; returns its content."""
    start = datetime.now(UTC)
    measured, threads = measure(root, lesson, workers=workers, mode=mode, runs=runs)
    data = {
        "version": VERSION,
        "lesson": lesson,
        "lesson_key": lesson_key(root, lesson),
        "measured_at": start.isoformat(timespec="seconds"),
        "machine": {
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "threads": threads,
            "mode": mode,
        },
        "runs": runs,
        **limits_from(measured, factor, floor),
    }
    path = calibration_path(root, lesson)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    tmp.replace(path)
    return data


def load(root: Path, lesson: str) -> tuple[dict | None, str | None]:
    """The usable calibration of ``lesson`` (or ``None``) and a warning when one was not usable."""
    path = calibration_path(root, lesson)
    if not path.is_file():
        return None, None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return None, f"ignoring {path}: unreadable ({exc}); using the default limits"
    if data.get("version") != VERSION:
        return None, f"ignoring {path}: another format version; run calibrate again"
    if data.get("lesson_key") != lesson_key(root, lesson):
        return None, (
            f"ignoring {path}: the solution of {lesson} changed since it was measured; run "
            f"`python -m grader calibrate {lesson}` again (using the default limits meanwhile)"
        )
    return data, None


def report(data: dict) -> list[str]:
    """Lines for the terminal: each cell's measured time and limit, the notebook's limit."""
    lines = [f"{'cell':<28} {'solution s':>10} {'limit s':>8}"]
    for c in data["cells"].values():
        lines.append(f"{c['label']:<28} {c['solution_s']:>10.3f} {c['limit_s']:>8.0f}")
    total = sum(float(c["solution_s"]) for c in data["cells"].values())
    lines.append(
        f"solution total {total:.1f} s; limits: other cells {data['other_limit_s']:.0f} s, "
        f"notebook {data['notebook_limit_s']:.0f} s ({data['factor']:g}x, at least "
        f"{data['floor']:g} s; {data['machine']['threads']} thread(s), {data['machine']['mode']})"
    )
    return lines
