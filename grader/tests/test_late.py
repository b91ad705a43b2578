"""Late work: the course's LateSubmissionPlugin, due dates and extensions in the gradebook."""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from datetime import datetime

import pytest

from grader import REPO_ROOT
from grader.cli import main
from grader.intake import intake_zip
from grader.late import PenaltyPerDay, _plugin, apply_late_penalties, parse_when

LESSON = "90-fixture"
NB = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'
HOUR = 3600.0


def test_penalty_per_day_with_a_cap():
    policy = PenaltyPerDay(per_day=0.1, cap=0.5)
    assert policy.late_submission_penalty("s", 10.0, 0) is None
    assert policy.late_submission_penalty("s", 10.0, 1) == 1.0  # a started day counts
    assert policy.late_submission_penalty("s", 10.0, 24 * HOUR) == 1.0
    assert policy.late_submission_penalty("s", 10.0, 24 * HOUR + 1) == 2.0
    assert policy.late_submission_penalty("s", 10.0, 30 * 24 * HOUR) == 5.0  # the cap
    grace = PenaltyPerDay(per_day=0.1, cap=0.5, grace_minutes=15)
    assert grace.late_submission_penalty("s", 10.0, 10 * 60) is None


def test_the_course_policy_is_an_nbgrader_setting():
    plugin, mark = _plugin(REPO_ROOT)
    assert type(plugin) is PenaltyPerDay and (plugin.per_day, plugin.cap) == (0.1, 0.5)
    assert mark == 1.0
    text = (REPO_ROOT / "grader" / "nbgrader_config.py").read_text()
    assert 'c.AssignLatePenalties.plugin_class = "grader.late.PenaltyPerDay"' in text


def test_dates_are_read_as_utc():
    assert parse_when("2026-11-20T23:59+01:00") == datetime.fromisoformat("2026-11-20T22:59+00:00")
    assert parse_when("2026-11-20 23:59 UTC").hour == 23
    with pytest.raises(ValueError, match="ISO 8601"):
        parse_when("next friday")


def _gradebook_from_submitted(root, scores):
    """What autograde's merge does for late work: each timestamp.txt into the gradebook."""
    from nbgrader.api import Gradebook
    from nbgrader.utils import parse_utc

    from grader.nbtools import tool_env

    os.environ["PATH"] = tool_env()["PATH"]
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        warnings.simplefilter("ignore")
        gb.add_assignment(LESSON, duedate=datetime(2026, 11, 20, 12, 0))
        gb.add_notebook(LESSON, LESSON)
        gb.add_grade_cell("t_tests", LESSON, LESSON, max_score=10, cell_type="code")
        for student, score in scores.items():
            stamp = (root / "submitted" / student / LESSON / "timestamp.txt").read_text()
            gb.add_student(student)
            gb.add_submission(LESSON, student, timestamp=parse_utc(stamp))
            grade = gb.find_grade("t_tests", LESSON, LESSON, student)
            grade.auto_score, grade.needs_manual_grade = score, False
        gb.db.commit()


def test_late_canvas_and_moodle_students_and_an_extension(tmp_path):
    """Due 2026-11-20 12:00 UTC. Canvas: on time, and _LATE with no time (one day's penalty).
    Moodle (worksheet times): 30 h late (two days: 20%), and 30 h late with a 2-day extension."""
    root = tmp_path / "course"
    (root / "grader").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text(
        'c = get_config()\nload_subconfig("grader/nbgrader_config.py")\n'
    )
    (root / "grader" / "nbgrader_config.py").write_text(
        (REPO_ROOT / "grader" / "nbgrader_config.py").read_text()
    )
    roster = tmp_path / "roster.csv"
    roster.write_text(
        "student_id,lms_id,lms,extension_days\nann,11,canvas,\nben,12,canvas,\n"
        "cat,21,moodle,\ndan,22,moodle,2\n"
    )
    canvas = tmp_path / "canvas.zip"
    with zipfile.ZipFile(canvas, "w") as zf:
        zf.writestr(f"ann_11_901_{LESSON}.ipynb", NB)
        zf.writestr(f"ben_LATE_12_902_{LESSON}.ipynb", NB)
    moodle = tmp_path / "moodle.zip"
    with zipfile.ZipFile(moodle, "w") as zf:
        zf.writestr(f"Cat Ray_21_assignsubmission_file/{LESSON}.ipynb", NB)
        zf.writestr(f"Dan Fox_22_assignsubmission_file/{LESSON}.ipynb", NB)
    sheet = tmp_path / "worksheet.csv"
    sheet.write_text(
        "Identifier,Full name,Email address,Status,Grade,Maximum Grade,Grade can be changed,"
        "Last modified (submission),Last modified (grade),Feedback comments\n"
        'Participant 21,Cat Ray,c@x,,,10.00,Yes,"Saturday, 21 November 2026, 6:00 PM",-,\n'
        'Participant 22,Dan Fox,d@x,,,10.00,Yes,"Saturday, 21 November 2026, 6:00 PM",-,\n'
    )
    intake_zip(root, LESSON, canvas, roster)
    intake_zip(root, LESSON, moodle, roster, sheet=sheet)
    _gradebook_from_submitted(root, {"ann": 10, "ben": 10, "cat": 10, "dan": 10})
    report = apply_late_penalties(root, LESSON)
    assert {s: points for s, (_, points) in report.late.items()} == {"ben": 1.0, "cat": 2.0}
    assert report.late["cat"][0] == 30 * HOUR
    assert report.marked == {"ben"}
    assert "late: ben marked late by Canvas (no time): -1 points" in report.lines()[0]

    from grader.export import export_csv

    out = tmp_path / "grades.csv"
    export_csv(root, out, [LESSON])
    import csv

    rows = {r["student_id"]: r for r in csv.DictReader(out.open())}
    assert {s: float(r[f"{LESSON}/total"]) for s, r in rows.items()} == {
        "ann": 10,
        "ben": 9,
        "cat": 8,
        "dan": 10,
    }
    assert "late penalty -2" in rows["cat"][f"{LESSON}/status"]
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:  # nbgrader's own fields
        assert gb.find_submission(LESSON, "dan").extension.days == 2
        assert gb.find_submission(LESSON, "dan").total_seconds_late == 0
        assert gb.find_submission_notebook(LESSON, LESSON, "cat").late_submission_penalty == 2


def test_intake_due_sets_the_gradebooks_duedate(course, tmp_path, capsys):
    z = tmp_path / "c.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr(f"ann_11_901_{LESSON}.ipynb", NB)
    args = ["intake", LESSON, "--lms-zip", str(z), "--root", str(course)]
    assert main([*args, "--due", "2026-11-20T23:59+01:00"]) == 0
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        assignment = gb.find_assignment(LESSON)
        assert assignment.duedate == datetime(2026, 11, 20, 22, 59)
        assert assignment.notebooks, "the lesson's notebooks and cells are in the gradebook"
    assert main([*args, "--due", "friday"]) == 2
    assert "ISO 8601" in capsys.readouterr().err
    seen = json.loads((course / "intake" / LESSON / "identities.json").read_text())
    assert seen["11"]["late"] == "no"


def test_extensions_are_read_from_the_roster_or_refused_clearly():
    from datetime import timedelta

    from grader.late import extensions

    rows = [
        {"student_id": "a", "extension_days": "2"},
        {"student_id": "b", "extension_hours": "36"},
        {"student_id": "c", "extension_days": ""},
    ]
    assert extensions(rows) == {"a": timedelta(days=2), "b": timedelta(hours=36)}
    with pytest.raises(ValueError, match="must be numbers"):
        extensions([{"student_id": "d", "extension_days": "2d"}])
    with pytest.raises(ValueError, match="negative"):
        extensions([{"student_id": "e", "extension_days": "-1"}])
