"""What grading knows about a lesson's cells, shared by autograde, calibrate and execute.

Which cells are graded tests, each cell's key and calibrated time limit, how a timed-out cell is
described, and the lesson's key (results and calibrations are valid while it holds). This module
imports nothing of the grader, so :mod:`grader.autograde`, :mod:`grader.calibrate` and
:mod:`grader.execute` all import it at module top.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

#: Bump when the grading procedure changes: results keyed with an older version are redone.
PROCEDURE = "grader-1"


def lesson_key(root: Path, lesson: str) -> str:
    """A hash of the grading procedure and the lesson's source: results are valid while it holds."""
    source = (root / "solutions" / lesson / f"{lesson}.ipynb").read_bytes()
    return hashlib.sha256(PROCEDURE.encode() + source).hexdigest()[:16]


def graded_test_cells(nb: dict) -> list[int]:
    """Indices of the autograded code cells (nbgrader ``grade`` without ``solution``)."""
    found = []
    for index, cell in enumerate(nb.get("cells", [])):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution"):
            found.append(index)
    return found


def cell_key(cell: dict) -> str:
    """A cell's key in the calibration: its nbgrader ``grade_id``, else a hash of its source."""
    meta = cell.get("metadata", {}).get("nbgrader")
    if isinstance(meta, dict) and meta.get("grade_id"):
        return str(meta["grade_id"])
    source = cell.get("source", "")
    if isinstance(source, list):
        source = "".join(source)
    return "src:" + hashlib.sha256(source.strip().encode()).hexdigest()[:16]


def cell_label(cell: dict, index: int) -> str:
    """How reports name a cell: its grade id, else ``cell N``."""
    key = cell_key(cell)
    return f"cell {index}" if key.startswith("src:") else key


def fmt_seconds(seconds: float) -> str:
    """Seconds with as many digits as they deserve (``20``, ``0.4``, ``0.014``)."""
    if seconds >= 10:
        return f"{seconds:.0f}"
    if seconds >= 0.1:
        return f"{seconds:.1f}"
    return f"{seconds:.3f}"


def cell_limits(nb: dict, calibration: dict) -> dict[int, float]:
    """``{cell index: seconds}`` for every code cell of ``nb`` (see :mod:`grader.calibrate`)."""
    cells = calibration["cells"]
    other = float(calibration["other_limit_s"])
    out: dict[int, float] = {}
    for index, cell in enumerate(nb.get("cells", [])):
        if cell.get("cell_type") != "code":
            continue
        entry = cells.get(cell_key(cell))
        out[index] = float(entry["limit_s"]) if entry else other
    return out


def timeouts_from_answer(nb: dict, answer: dict, calibration: dict | None) -> list[dict]:
    """The cells of an execution's ``answer`` that ran out of time: label, limit, solution time."""
    cells = (calibration or {}).get("cells", {})
    found = []
    for got in answer.get("cells", []):
        if not isinstance(got, dict) or got.get("status") in ("ok", "not-run"):
            continue
        # nbclient reports a cell it interrupted at its limit as an error: the time tells.
        limit = float(got.get("limit") or 0.0)
        if got.get("status") != "timeout" and not float(got.get("seconds") or 0.0) >= limit > 0:
            continue
        index = int(got["index"])
        cell = nb["cells"][index] if index < len(nb.get("cells", [])) else {}
        entry = cells.get(cell_key(cell))
        found.append(
            {
                "cell": cell_label(cell, index),
                "limit": limit,
                "solution": float(entry["solution_s"]) if entry else None,
            }
        )
    return found


def describe_timeout(t: dict) -> str:
    """``fp16_fate: timed out after 20 s (solution: 0.41 s)``, as the report and CSV say it."""
    sol = t.get("solution")
    solution = (
        "not a cell of the solution" if sol is None else f"solution: {fmt_seconds(float(sol))} s"
    )
    return f"{t['cell']}: timed out after {fmt_seconds(float(t['limit']))} s ({solution})"
