"""The LMS round trip: grades go back to Canvas or Moodle as each documents its import file.

The class is the end-to-end term test's (alice, bob, carol, with the points each deserves), put
straight into a gradebook so no kernel runs; submissions come in through intake from a Canvas or
a Moodle zip with a roster, and the export must map each student back to the LMS identity they
came with. The expected columns are spelled out here from the LMS documentation (Canvas:
"How do I import grades in the Gradebook?"; Moodle: mod/assign/feedback/offline), not taken from
the module under test.
"""

from __future__ import annotations

import csv
import json
import os
import warnings
import zipfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from grader.cli import main
from grader.export import export_canvas, export_moodle
from grader.intake import identities_path, intake_zip, roster_copy_path

LESSON = "01-number-formats"
POINTS = {
    "fp16_bits": 2,
    "fp16_fate": 3,
    "kahan_sum": 3,
    "underflow_fraction": 2,
    "max_safe_scale": 2,
}
WRITTEN = ("why_fp16_range", 2)
DESERVED = {
    "alice": dict(POINTS),
    "bob": {**dict.fromkeys(POINTS, 0), "fp16_bits": 2, "kahan_sum": 3},
    "carol": {**dict.fromkeys(POINTS, 0), "fp16_bits": 2},
}
SUBMITTED = {s: datetime(2026, 11, 20, 9 + i, 30, tzinfo=UTC) for i, s in enumerate(DESERVED)}
ROSTER = {  # student_id: (lms_id, name, email, sis_user_id, sis_login_id, section)
    "alice": ("1001", "Smith, Alice", "alice@uni.example", "S-01", "asmith", "Lab A"),
    "bob": ("1002", "Jones, Bob", "bob@uni.example", "S-02", "bjones", "Lab A"),
    "carol": ("1003", "Lee, Carol", "carol@uni.example", "S-03", "clee", "Lab B"),
    "dave": ("1004", "Diaz, Dave", "dave@uni.example", "S-04", "ddiaz", "Lab B"),  # no submission
}
TIMEOUT = "fp16_fate: timed out after 20 s (solution: 0.41 s)"
CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MOODLE_HEADER = [
    "Identifier",
    "Full name",
    "Email address",
    "Status",
    "Grade",
    "Maximum Grade",
    "Grade can be changed",
    "Last modified (submission)",
    "Last modified (grade)",
    "Feedback comments",
]


def _roster(path: Path) -> Path:
    lines = ["student_id,lms_id,name,email,sis_user_id,sis_login_id,section"]
    lines += [",".join([sid, *(f'"{v}"' for v in row)]) for sid, row in ROSTER.items()]
    path.write_text("\n".join(lines) + "\n")
    return path


def _class(root: Path, lms: str) -> Path:
    """A course whose gradebook holds the term test's class, taken in through an LMS zip."""
    from nbgrader.api import Gradebook

    from grader.nbtools import tool_env

    os.environ["PATH"] = tool_env()["PATH"]  # nbgrader runs alembic from PATH
    root.mkdir(parents=True)
    archive = root.parent / f"{lms}.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for student in DESERVED:
            lms_id, name = ROSTER[student][:2]
            if lms == "canvas":
                entry = (
                    f"{name.replace(', ', '').lower()}_{lms_id}_{int(lms_id) + 4000}_{LESSON}.ipynb"
                )
            else:
                first_last = " ".join(reversed(name.split(", ")))
                entry = f"{first_last}_{lms_id}_assignsubmission_file_{LESSON}.ipynb"
            zf.writestr(entry, b'{"cells": []}')
    roster = _roster(root.parent / f"roster-{lms}.csv")
    report = intake_zip(root, LESSON, archive, roster)
    assert sorted(s for s, _ in report.placed) == sorted(DESERVED), report.lines()
    assert roster_copy_path(root, LESSON).read_text() == roster.read_text()
    seen = json.loads(identities_path(root, LESSON).read_text())
    assert {s: (i["lms"], i["lms_id"]) for s, i in seen.items()} == {
        s: (lms, ROSTER[s][0]) for s in DESERVED
    }

    with warnings.catch_warnings(), Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        warnings.simplefilter("ignore")  # nbgrader's own SQLAlchemy autoflush warnings
        gb.add_assignment(LESSON)
        gb.add_notebook(LESSON, LESSON)
        for exercise, points in POINTS.items():
            gb.add_grade_cell(
                f"{exercise}_tests", LESSON, LESSON, max_score=points, cell_type="code"
            )
        gb.add_grade_cell(WRITTEN[0], LESSON, LESSON, max_score=WRITTEN[1], cell_type="markdown")
        for student, scores in DESERVED.items():
            gb.add_student(student)
            gb.add_submission(LESSON, student, timestamp=SUBMITTED[student].replace(tzinfo=None))
            for exercise, points in scores.items():
                grade = gb.find_grade(f"{exercise}_tests", LESSON, LESSON, student)
                grade.auto_score = points
                grade.needs_manual_grade = False
        written = gb.find_grade(WRITTEN[0], LESSON, LESSON, "alice")
        written.manual_score = 2
        written.needs_manual_grade = False
        gb.add_student("dave")
        gb.db.commit()
    results = root / ".grader" / LESSON / "results"
    results.mkdir(parents=True)
    (results / "bob.json").write_text(json.dumps({"status": "graded", "reason": TIMEOUT}))
    return root


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


def _total(student: str) -> float:
    return sum(DESERVED[student].values()) + (WRITTEN[1] if student == "alice" else 0)


def test_canvas_gradebook_import_csv(tmp_path):
    root = _class(tmp_path / "course", "canvas")
    out = tmp_path / "canvas.csv"
    result = export_canvas(root, out, [LESSON], assignment_ids={LESSON: "4242"})
    rows = _rows(out)
    assert rows[0] == [*CANVAS_HEADER, f"{LESSON} (4242)"]
    assert rows[1][0].strip() == "Points Possible" and rows[1][1:5] == ["", "", "", ""]
    assert float(rows[1][5]) == sum(POINTS.values()) + WRITTEN[1]
    by_id = {r[1]: r for r in rows[2:]}
    assert set(by_id) == {lms_id for lms_id, *_ in ROSTER.values()}, "a roster student is missing"
    for student, (lms_id, name, _, sis_user, sis_login, section) in ROSTER.items():
        row = by_id[lms_id]
        assert row[:5] == [name, lms_id, sis_user, sis_login, section]
        if student == "dave":
            assert row[5] == "", "no submission must leave Canvas's grade alone"
        else:
            assert float(row[5]) == _total(student), student
    # bob's and carol's written answers are not graded yet: the export says so
    assert sorted(w.split()[0] for w in result.warnings) == ["bob", "carol"]


def test_moodle_offline_grading_worksheet(tmp_path):
    root = _class(tmp_path / "course", "moodle")
    out = tmp_path / "moodle.csv"
    now = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
    export_moodle(root, out, LESSON, now=now)
    rows = _rows(out)
    assert rows[0] == MOODLE_HEADER
    got = {r[0]: dict(zip(MOODLE_HEADER, r, strict=True)) for r in rows[1:]}
    assert set(got) == {f"Participant {lms_id}" for lms_id, *_ in ROSTER.values()}
    top = sum(POINTS.values()) + WRITTEN[1]
    for student, (lms_id, name, email, *_) in ROSTER.items():
        row = got[f"Participant {lms_id}"]
        assert (row["Full name"], row["Email address"]) == (name, email)
        assert float(row["Maximum Grade"]) == top
        assert row["Grade can be changed"] == "Yes"
        if student == "dave":
            assert row["Grade"] == "" and row["Status"] == "No submission"
            continue
        assert float(row["Grade"]) == _total(student)
        # What Moodle's importer reads back with PHP's strtotime: an unambiguous UTC date.
        assert datetime.strptime(
            row["Last modified (grade)"], "%Y-%m-%d %H:%M:%S %Z"
        ) == now.replace(tzinfo=None)
        when = datetime.strptime(row["Last modified (submission)"], "%Y-%m-%d %H:%M:%S %Z")
        assert when == SUBMITTED[student].replace(tzinfo=None)
        for exercise, points in DESERVED[student].items():
            assert f"{exercise} {points:g}/{POINTS[exercise]:g}" in row["Feedback comments"]
    assert TIMEOUT in got["Participant 1002"]["Feedback comments"]


def test_export_command_writes_each_format_and_checks_its_arguments(tmp_path, capsys):
    root = _class(tmp_path / "course", "canvas")
    base = ["export", "--root", str(root), "--lesson", LESSON]
    out = tmp_path / "c.csv"
    args = [*base, "--format", "canvas", "--out", str(out), "--lms-assignment", f"{LESSON}=77"]
    assert main(args) == 0
    assert _rows(out)[0][-1] == f"{LESSON} (77)"
    assert main([*base, "--format", "moodle", "--out", str(tmp_path / "m.csv")]) == 0
    assert _rows(tmp_path / "m.csv")[1][0] == "Participant 1001"
    assert main([*base, "--format", "canvas", "--lms-assignment", "77"]) == 2
    assert main(["export", "--root", str(root), "--format", "moodle"]) == 2
    assert "one --lesson" in capsys.readouterr().err


@pytest.mark.parametrize("lms", ["canvas", "moodle"])
def test_without_a_roster_the_lms_id_is_the_student_id(tmp_path, lms):
    root = tmp_path / "course"
    root.mkdir()
    archive = tmp_path / "a.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        name = "leecarol_1003_5003_" if lms == "canvas" else "Carol Lee_1003_assignsubmission_file_"
        zf.writestr(name + f"{LESSON}.ipynb", b"{}")
    intake_zip(root, LESSON, archive)
    from grader.export import identities

    assert identities(root, LESSON)["1003"]["lms_id"] == "1003"
    assert not roster_copy_path(root, LESSON).exists()
