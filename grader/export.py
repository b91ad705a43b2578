"""Grades to CSV: one row per student, a column per exercise, totals, and what went wrong.

Columns: ``student_id``; for each lesson (in id order) one column per graded cell named
``<lesson>/<exercise>`` (an autograded test cell ``fp16_bits_tests`` is the exercise
``fp16_bits``; a written answer keeps its id), then ``<lesson>/total``, ``<lesson>/max`` and
``<lesson>/status`` (graded, rejected or failed with the reason, ``needs manual grading``, the
scan's flags); then ``total`` and ``max`` over the lessons exported. A student without a
submission gets empty cells and ``missing``.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path


def _exercise(grade_id: str) -> str:
    return grade_id.removesuffix("_tests")


def export_csv(
    root: Path, out: Path, lessons: list[str] | None = None, db_url: str | None = None
) -> int:
    """Write the CSV to ``out``; returns the number of student rows."""
    import os

    from nbgrader.api import Gradebook, MissingEntry

    from grader.nbtools import tool_env

    os.environ["PATH"] = tool_env()["PATH"]
    db_url = db_url or f"sqlite:///{root / 'gradebook.db'}"
    header = ["student_id"]
    rows: dict[str, dict[str, object]] = {}
    with Gradebook(db_url) as gb:
        wanted = lessons or sorted(a.name for a in gb.assignments)
        students = sorted(s.id for s in gb.students)
        for sid in students:
            rows[sid] = {"student_id": sid, "total": 0.0, "max": 0.0}
        for lesson in wanted:
            try:
                assignment = gb.find_assignment(lesson)
            except MissingEntry:
                raise ValueError(f"no lesson {lesson!r} in the gradebook") from None
            cells = []
            for nb in assignment.notebooks:
                cells += [(nb.name, c.name, c.max_score) for c in nb.grade_cells]
            columns = [f"{lesson}/{_exercise(name)}" for _, name, _ in cells]
            header += columns + [f"{lesson}/total", f"{lesson}/max", f"{lesson}/status"]
            lesson_max = sum(m for _, _, m in cells)
            results = root / ".grader" / lesson / "results"
            for sid in students:
                row = rows[sid]
                row[f"{lesson}/max"] = lesson_max
                row["max"] = float(row["max"]) + lesson_max
                try:
                    sub = gb.find_submission(lesson, sid)
                except MissingEntry:
                    row[f"{lesson}/status"] = "missing"
                    continue
                total = 0.0
                manual = False
                for nb_name, name, _ in cells:
                    grade = gb.find_grade(name, nb_name, lesson, sid)
                    score = grade.score if grade.score is not None else 0.0
                    manual = manual or bool(grade.needs_manual_grade)
                    row[f"{lesson}/{_exercise(name)}"] = score
                    total += score
                row[f"{lesson}/total"] = total
                row["total"] = float(row["total"]) + total
                status = ["graded"]
                info = results / f"{sid}.json"
                if info.is_file():
                    data = json.loads(info.read_text())
                    status = [data.get("status", "graded")]
                    if data.get("reason"):
                        status.append(data["reason"])
                    if data.get("flags"):
                        status.append("flags: " + ",".join(data["flags"]))
                if manual:
                    status.append("needs manual grading")
                row[f"{lesson}/status"] = "; ".join(status)
                del sub
    header += ["total", "max"]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=header, restval="")
        writer.writeheader()
        for sid in sorted(rows):
            writer.writerow(rows[sid])
    return len(rows)
