"""Feedback goes back the way submissions came in: Moodle's feedback zip, Canvas's re-upload
zip, nbgrader's exchange (release_feedback); written answers not graded yet are shown so."""

from __future__ import annotations

import os
import shutil
import warnings
import zipfile
from pathlib import Path

from grader.feedback import deliver, generate
from grader.intake import intake_exchange, intake_zip
from grader.nbtools import nbgrader, tool_env

LESSON = "90-fixture"


def _graded_class(course: Path, tmp_path: Path) -> Path:
    """Three students from Canvas, Moodle (4.1 folders) and the exchange, 'autograded'."""
    from nbgrader.api import Gradebook

    exchange = tmp_path / "exchange"
    with open(course / "grader" / "nbgrader_config.py", "a") as fh:
        fh.write(f'\nc.Exchange.root = "{exchange}"\n')
    nbgrader(["generate_assignment", LESSON, "--force", "--create"], cwd=course)
    released = (course / "lessons" / LESSON / f"{LESSON}.ipynb").read_bytes()
    canvas = tmp_path / "canvas.zip"
    with zipfile.ZipFile(canvas, "w") as zf:
        zf.writestr(f"doejane_LATE_12345_67890_{LESSON}.ipynb", released)
    moodle = tmp_path / "moodle.zip"
    with zipfile.ZipFile(moodle, "w") as zf:
        zf.writestr(f"Bob Smith_202_assignsubmission_file/{LESSON}.ipynb", released)
    inbound = exchange / "mixed-precision" / "inbound"
    stamp = "2026-11-20 09:00:00.000000 UTC"
    entry = inbound / f"carol+{LESSON}+{stamp}"
    entry.mkdir(parents=True)
    (entry / f"{LESSON}.ipynb").write_bytes(released)
    (entry / "timestamp.txt").write_text(stamp)
    (entry / "submission_secret.txt").write_text("carols-secret")
    intake_zip(course, LESSON, canvas)
    intake_zip(course, LESSON, moodle)
    intake_exchange(course, LESSON)
    os.environ["PATH"] = tool_env()["PATH"]
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        warnings.simplefilter("ignore")
        for student in ("12345", "202", "carol"):
            gb.update_or_create_student(student)
            gb.add_submission(LESSON, student)
            for gid in ("double_tests", "halve_tests", "triple_tests"):
                grade = gb.find_grade(gid, LESSON, LESSON, student)
                grade.auto_score, grade.needs_manual_grade = 1, False
            if student == "carol":
                written = gb.find_grade("why_exact", LESSON, LESSON, student)
                written.manual_score, written.needs_manual_grade = 1, False
            dest = course / "autograded" / student / LESSON
            dest.mkdir(parents=True)
            shutil.copy2(course / "submitted" / student / LESSON / f"{LESSON}.ipynb", dest)
            shutil.copy2(course / "submitted" / student / LESSON / "timestamp.txt", dest)
        gb.db.commit()
    return exchange


def test_feedback_is_delivered_in_each_channel(course, tmp_path):
    from nbgrader.utils import notebook_hash

    exchange = _graded_class(course, tmp_path)
    report = generate(course, LESSON)
    assert len(report.files) == 3
    html = (course / "feedback" / "202" / LESSON / f"{LESSON}.html").read_text()
    assert "not graded yet / 1.0" in html and "this score is not final" in html
    assert "(Score: 0.0 / 1.0)" not in html, "an ungraded answer is shown as a zero"
    graded = (course / "feedback" / "carol" / LESSON / f"{LESSON}.html").read_text()
    assert "not graded yet" not in graded and "(Score: 1.0 / 1.0)" in graded
    assert sorted(w.split(":")[0] for w in report.warnings) == ["12345", "202"]
    assert "joblib" not in "\n".join(report.lines())
    assert (course / "feedback" / "carol" / LESSON / "submission_secret.txt").read_text() == (
        "carols-secret"
    )

    deliver(course, LESSON, report, ["moodle", "canvas", "exchange"])
    out = course / "lms-feedback" / LESSON
    with zipfile.ZipFile(out / "moodle-feedback.zip") as zf:
        # Moodle's importer takes the participant from the folder named as in its download
        assert zf.namelist() == [f"Bob Smith_202_assignsubmission_file/{LESSON}-feedback.html"]
    with zipfile.ZipFile(out / "canvas-feedback.zip") as zf:
        # Canvas's re-upload matches the download's prefix <name>[_LATE]_<userid>_<subid>_
        assert zf.namelist() == [f"doejane_LATE_12345_67890_{LESSON}-feedback.html"]
    released = exchange / "mixed-precision" / "feedback"
    expected = notebook_hash(secret="carols-secret", notebook_id=LESSON)
    assert [p.name for p in released.iterdir()] == [f"{expected}.html"]
    assert "moodle" in "\n".join(report.lines()) and "release_feedback" in "\n".join(report.lines())


def test_a_student_without_the_lms_file_name_is_named_not_skipped(tmp_path):
    import json

    from grader.feedback import FeedbackReport
    from grader.intake import identities_path

    root = tmp_path / "course"
    for sid in ("old", "new"):
        page = root / "feedback" / sid / LESSON / f"{LESSON}.html"
        page.parent.mkdir(parents=True)
        page.write_text("<html>feedback</html>")
    path = identities_path(root, LESSON)
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "old": {"lms": "canvas", "lms_id": "7"},  # an identities.json of an older intake
                "new": {"lms": "canvas", "lms_id": "8", "prefix": "newname_8_99_"},
            }
        )
    )
    report = FeedbackReport()
    deliver(root, LESSON, report, ["canvas"])
    with zipfile.ZipFile(root / "lms-feedback" / LESSON / "canvas-feedback.zip") as zf:
        assert zf.namelist() == [f"newname_8_99_{LESSON}-feedback.html"]
    assert any(w.startswith("old: no canvas file-name prefix") for w in report.warnings)
