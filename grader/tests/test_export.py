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
import shutil
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


_BUILT: dict[str, Path] = {}


def _class(root: Path, lms: str) -> Path:
    """A course whose gradebook holds the term test's class, taken in through an LMS zip.

    Built once per LMS (each gradebook opening runs alembic), then copied for each test.
    """
    if lms in _BUILT and _BUILT[lms].is_dir():
        shutil.copytree(_BUILT[lms], root)
        shutil.copy2(_BUILT[lms].parent / f"roster-{lms}.csv", root.parent / f"roster-{lms}.csv")
        return root
    built = _build_class(root, lms)
    keep = root.parent.parent / f"export-class-{lms}" / "course"  # in pytest's session folder
    shutil.copytree(built, keep)
    shutil.copy2(root.parent / f"roster-{lms}.csv", keep.parent / f"roster-{lms}.csv")
    _BUILT[lms] = keep
    return built


def _build_class(root: Path, lms: str) -> Path:
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


TOP = sum(POINTS.values()) + WRITTEN[1]


def _rows(path: Path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))


def _total(student: str) -> float:
    return sum(DESERVED[student].values()) + (WRITTEN[1] if student == "alice" else 0)


def test_canvas_gradebook_import_csv(tmp_path):
    root = _class(tmp_path / "course", "canvas")
    out = tmp_path / "canvas.csv"
    result = export_canvas(
        root, out, [LESSON], assignment_ids={LESSON: "4242"}, points_possible={LESSON: TOP}
    )
    rows = _rows(out)
    assert rows[0] == [*CANVAS_HEADER, f"{LESSON} (4242)"]
    assert rows[1][0].strip() == "Points Possible" and rows[1][1:5] == ["", "", "", ""]
    assert float(rows[1][5]) == TOP
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
    export_moodle(root, out, LESSON, now=now, points_possible=TOP)
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
    base = ["export", "--root", str(root), "--lesson", LESSON, "--points-possible", "14"]
    out = tmp_path / "c.csv"
    args = [*base, "--format", "canvas", "--out", str(out), "--lms-assignment", f"{LESSON}=77"]
    assert main(args) == 0
    assert _rows(out)[0][-1] == f"{LESSON} (77)"
    assert main([*base, "--format", "canvas", "--lms-assignment", "77"]) == 2
    assert main([*base, "--format", "canvas", "--points-possible", "x"]) == 2
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


def test_an_export_never_sends_one_lms_ids_to_another(tmp_path, capsys):
    """Students who came from Canvas have no Moodle participant number: refused, and named."""
    root = _class(tmp_path / "course", "canvas")
    with pytest.raises(ValueError) as err:
        export_moodle(root, tmp_path / "m.csv", LESSON, points_possible=TOP)
    for student in DESERVED:
        assert student in str(err.value)
    assert "canvas" in str(err.value)
    assert not (tmp_path / "m.csv").exists()
    base = ["export", "--root", str(root), "--lesson", LESSON, "--points-possible", "14"]
    assert main([*base, "--format", "moodle", "--out", str(tmp_path / "m.csv")]) == 2
    assert "alice (came from canvas as id 1001)" in capsys.readouterr().err
    # A roster given to the export maps them: then they go, under the roster's ids.
    roster = tmp_path / "moodle-roster.csv"
    roster.write_text(
        "student_id,lms_id,lms,name\nalice,501,moodle,A S\nbob,502,moodle,B J\ncarol,503,,C L\n"
    )
    result = export_moodle(root, tmp_path / "m.csv", LESSON, roster=roster, points_possible=TOP)
    ids = {r[0] for r in _rows(tmp_path / "m.csv")[1:]}
    assert {"Participant 501", "Participant 502", "Participant 503"} <= ids
    assert "Participant 1001" not in ids and not result.not_exported


def test_a_class_from_two_lmses_goes_back_each_to_its_own(tmp_path):
    root = _class(tmp_path / "course", "canvas")
    archive = tmp_path / "moodle.zip"
    with zipfile.ZipFile(archive, "w") as zf:  # carol resubmits through Moodle
        zf.writestr(f"Carol Lee_77_assignsubmission_file/{LESSON}.ipynb", b'{"cells": [1]}')
    roster = tmp_path / "r.csv"
    roster.write_text("student_id,lms_id,lms\ncarol,77,moodle\n")
    intake_zip(root, LESSON, archive, roster, replace=True)
    result = export_canvas(root, tmp_path / "c.csv", [LESSON], points_possible={LESSON: TOP})
    ids = {r[1] for r in _rows(tmp_path / "c.csv")[2:]}
    assert "1003" not in ids and "77" not in ids and {"1001", "1002"} <= ids
    assert result.not_exported == {"carol": "came from moodle as Participant 77"}
    assert any("not exported to Canvas" in w and "carol" in w for w in result.warnings)
    export_moodle(root, tmp_path / "m.csv", LESSON, points_possible=TOP)
    assert [r[0] for r in _rows(tmp_path / "m.csv")[1:]] == ["Participant 77"]


def test_points_are_scaled_to_the_lms_maximum_or_refused(tmp_path):
    root = _class(tmp_path / "course", "canvas")
    out = tmp_path / "c.csv"
    with pytest.raises(ValueError, match="--points-possible"):
        export_canvas(root, out, [LESSON])
    result = export_canvas(root, out, [LESSON], points_possible={LESSON: 100})
    rows = _rows(out)
    assert float(rows[1][5]) == 100
    by_id = {r[1]: r for r in rows[2:]}
    assert float(by_id["1001"][5]) == pytest.approx(round(_total("alice") * 100 / TOP, 2))
    assert float(by_id["1003"][5]) == pytest.approx(round(_total("carol") * 100 / TOP, 2))
    assert any("scaled from 14 points" in w and "100" in w for w in result.warnings)


def test_moodle_maximum_grade_read_from_its_worksheet(tmp_path):
    """The worksheet given at intake (as --roster) holds Moodle's own maximum grade."""
    root = tmp_path / "course"
    root.mkdir()
    archive = tmp_path / "m.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"Carol Lee_1003_assignsubmission_file/{LESSON}.ipynb", b"{}")
    sheet = tmp_path / "worksheet.csv"
    with open(sheet, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(MOODLE_HEADER)
        w.writerow(
            [
                "Participant 1003",
                "Carol Lee",
                "carol@uni.example",
                "Submitted for grading",
                "",
                "50.00",
                "Yes",
                "Friday, 20 November 2026, 9:30 AM",
                "-",
                "",
            ]
        )
    intake_zip(root, LESSON, archive, sheet=sheet)
    _grades(root, {"1003": 7})
    result = export_moodle(root, tmp_path / "out.csv", LESSON)
    (row,) = _rows(tmp_path / "out.csv")[1:]
    got = dict(zip(MOODLE_HEADER, row, strict=True))
    assert got["Maximum Grade"] == "50.00" and got["Grade"] == "25.00"
    assert got["Email address"] == "carol@uni.example"
    assert "7/14 scaled to 25/50" in got["Feedback comments"]
    assert any("scaled" in w for w in result.warnings)


def _grades(root: Path, totals: dict[str, float], manual: dict[str, float] | None = None) -> None:
    """A gradebook where each student got ``totals`` on fp16_bits.. (spread) and ``manual``."""
    from nbgrader.api import Gradebook

    from grader.nbtools import tool_env

    os.environ["PATH"] = tool_env()["PATH"]
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        warnings.simplefilter("ignore")
        gb.add_assignment(LESSON)
        gb.add_notebook(LESSON, LESSON)
        gb.add_grade_cell("all_tests", LESSON, LESSON, max_score=12, cell_type="code")
        gb.add_grade_cell(WRITTEN[0], LESSON, LESSON, max_score=WRITTEN[1], cell_type="markdown")
        for student, total in totals.items():
            gb.add_student(student)
            gb.add_submission(LESSON, student, timestamp=datetime(2026, 11, 20, 9, 0))
            grade = gb.find_grade("all_tests", LESSON, LESSON, student)
            grade.auto_score, grade.needs_manual_grade = total, False
            if student in (manual or {}):
                written = gb.find_grade(WRITTEN[0], LESSON, LESSON, student)
                written.manual_score = manual[student]
                written.needs_manual_grade = True  # flagged again, as after a regrade
        gb.db.commit()


def test_ungraded_written_answers_are_blank_and_warnings_say_what_was_sent(tmp_path):
    from grader.export import export_csv

    root = _class(tmp_path / "course", "canvas")
    out = tmp_path / "grades.csv"
    said: list[str] = []
    export_csv(root, out, [LESSON], warnings=said)
    rows = {r["student_id"]: r for r in csv.DictReader(out.open())}
    assert rows["alice"][f"{LESSON}/{WRITTEN[0]}"] == "2.0"
    assert rows["bob"][f"{LESSON}/{WRITTEN[0]}"] == "", "an ungraded answer is not a zero"
    assert "needs manual grading: why_fp16_range" in rows["bob"][f"{LESSON}/status"]
    assert "needs manual grading" not in rows["alice"][f"{LESSON}/status"]
    assert sorted(w.split()[0] for w in said) == ["bob", "carol"]
    # A manual grade kept through a regrade whose cell is flagged again was sent: say so.
    other = tmp_path / "other"
    other.mkdir()
    _grades(other, {"1001": 10, "1002": 10}, manual={"1001": 2})
    result = export_canvas(other, tmp_path / "c.csv", [LESSON], points_possible={LESSON: TOP})
    by_id = {r[1]: r for r in _rows(tmp_path / "c.csv")[2:]}
    assert float(by_id["1001"][5]) == 12 and float(by_id["1002"][5]) == 10
    assert not any(w.startswith("1001") for w in result.warnings), result.warnings
    assert any(w.startswith("1002") and "autograded part only" in w for w in result.warnings)
    export_csv(other, tmp_path / "other.csv", [LESSON])
    flagged = {r["student_id"]: r for r in csv.DictReader((tmp_path / "other.csv").open())}
    assert flagged["1001"][f"{LESSON}/{WRITTEN[0]}"] == "2.0"
    assert "flagged for review: why_fp16_range" in flagged["1001"][f"{LESSON}/status"]
    assert "needs manual grading" not in flagged["1001"][f"{LESSON}/status"]


def test_late_penalties_are_subtracted_and_the_lms_policy_warned_about(tmp_path):
    from nbgrader.api import Gradebook

    from grader.late import apply_late_penalties

    root = tmp_path / "course"
    root.mkdir()
    (root / "nbgrader_config.py").write_text(
        'c = get_config()\nc.AssignLatePenalties.plugin_class = "grader.late.PenaltyPerDay"\n'
    )
    _grades(root, {"1001": 10, "1002": 10})
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        warnings.simplefilter("ignore")
        gb.update_or_create_assignment(LESSON, duedate=datetime(2026, 11, 18, 23, 59))
    late = apply_late_penalties(root, LESSON)
    assert set(late.late) == {"1001", "1002"}  # 33 hours late: two started days, 20%
    result = export_canvas(root, tmp_path / "c.csv", [LESSON], points_possible={LESSON: TOP})
    by_id = {r[1]: r for r in _rows(tmp_path / "c.csv")[2:]}
    assert float(by_id["1001"][5]) == 8
    assert any("Late Policies" in w and "deducts again" in w for w in result.warnings)


def test_lms_formats_are_nbgrader_export_plugins(tmp_path):
    from grader.nbtools import nbgrader

    root = _class(tmp_path / "course", "canvas")
    (root / "nbgrader_config.py").write_text("c = get_config()\n")
    nbgrader(
        [
            "export",
            "--exporter=grader.export.CanvasExportPlugin",
            "--to=plugin.csv",
            f"--CanvasExportPlugin.points_possible={LESSON}=100",
            f"--CanvasExportPlugin.assignment_ids={LESSON}=4242",
        ],
        cwd=root,
    )
    rows = _rows(root / "plugin.csv")
    assert rows[0][-1] == f"{LESSON} (4242)" and float(rows[1][5]) == 100
    assert {r[1] for r in rows[2:]} == {lms_id for lms_id, *_ in ROSTER.values()}


def test_canvas_points_possible_read_from_its_gradebook_export(tmp_path):
    """Canvas's own gradebook export, given at intake, holds the assignment's Points Possible."""
    root = tmp_path / "course"
    root.mkdir()
    archive = tmp_path / "c.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"leecarol_1003_5003_{LESSON}.ipynb", b"{}")
    export = tmp_path / "gradebook-export.csv"
    export.write_text(
        f"Student,ID,SIS User ID,SIS Login ID,Section,Quiz 1 (11),{LESSON} (4242)\n"
        "    Points Possible,,,,,10.00,70.00\n"
        f'"Lee, Carol",1003,S-03,clee,Lab B,8,\n'
    )
    intake_zip(root, LESSON, archive, sheet=export)
    _grades(root, {"1003": 7})
    out = tmp_path / "c.csv"
    result = export_canvas(root, out, [LESSON], assignment_ids={LESSON: "4242"})
    rows = _rows(out)
    assert float(rows[1][5]) == 70 and float(rows[2][5]) == 35
    assert rows[2][:5] == ["Lee, Carol", "1003", "S-03", "clee", "Lab B"]
    assert any("scaled from 14 points to the Canvas assignment's 70" in w for w in result.warnings)


def test_canvas_points_possible_from_the_assignments_own_column(tmp_path):
    """The Points Possible read from Canvas's export is the column of that assignment: by its id
    when given (not an earlier column whose title contains the lesson's name), else by a title
    that is exactly the lesson; an ambiguous or missing one refuses and says what to give."""
    root = tmp_path / "course"
    root.mkdir()
    archive = tmp_path / "c.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr(f"leecarol_1003_5003_{LESSON}.ipynb", b"{}")
    export = tmp_path / "gradebook-export.csv"
    export.write_text(
        f"Student,ID,SIS User ID,SIS Login ID,Section,{LESSON} quiz (11),{LESSON} (4242)\n"
        "    Points Possible,,,,,10.00,70.00\n"
        f'"Lee, Carol",1003,S-03,clee,Lab B,8,\n'
    )
    intake_zip(root, LESSON, archive, sheet=export)
    _grades(root, {"1003": 7})
    out = tmp_path / "c.csv"
    export_canvas(root, out, [LESSON], assignment_ids={LESSON: "4242"})
    assert float(_rows(out)[1][5]) == 70
    export_canvas(root, out, [LESSON])  # no id: the column titled exactly the lesson
    assert float(_rows(out)[1][5]) == 70
    with pytest.raises(ValueError, match="--lms-assignment"):
        export_canvas(root, out, [LESSON], assignment_ids={LESSON: "999"})
