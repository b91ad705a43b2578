"""nbgrader's Execute step, replaced by execution in the sandbox.

``SandboxedExecute`` takes the place of nbgrader's ``Execute`` in ``Autograde``'s pipeline (see
:func:`grader.autograde.scratch_config`): nbgrader still restores the locked and hidden test cells,
checks checksums and saves grades; only the kernel runs elsewhere. Settings come from the
``GRADER_SANDBOX`` environment variable (a :class:`grader.sandbox.Settings` as JSON); what happened
(per-cell status, limits hit) is written to the file named by ``GRADER_EVENTS``.

A graded test cell counts as passed only if the kernel's reply for it was ``ok``: any other status
(error, timeout, dead kernel, restore failed, not run) gets an error output, which is what
nbgrader's ``determine_grade`` scores as zero.
"""

from __future__ import annotations

import json
import os

from nbformat import NotebookNode
from nbgrader.preprocessors import Execute

from grader.sandbox import Settings, execute


def graded_test_cells(nb: NotebookNode) -> list[int]:
    """Indices of the autograded code cells (nbgrader ``grade`` without ``solution``)."""
    found = []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution"):
            found.append(index)
    return found


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


class SandboxedExecute(Execute):
    """Execute the notebook in the sandbox; see the module docstring."""

    def preprocess(self, nb: NotebookNode, resources: dict):  # type: ignore[override]
        settings = Settings.from_env(os.environ["GRADER_SANDBOX"])
        plain = json.loads(json.dumps(nb))
        # Calibrated per-cell limits (grader/calibrate.py), when autograde passes them.
        from grader.calibrate import cell_limits, timeouts_from_answer

        calibration = json.loads(os.environ.get("GRADER_CELL_LIMITS") or "null")
        per_cell = cell_limits(nb, calibration) if calibration else None
        answer = execute(plain, graded_test_cells(nb), settings, cell_timeouts=per_cell)
        statuses = apply_answer(nb, answer)
        events_file = os.environ.get("GRADER_EVENTS")
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
        return nb, resources
