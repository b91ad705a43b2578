"""A whole term in miniature, through the instructor's CLI as an instructor types it.

Release lesson 01, three students submit through an LMS zip (Canvas naming plus a roster),
autograde (sandboxed, in parallel), feedback, export. The CSV must give each exercise exactly the
points each submission deserves, each student's feedback must show every failure, and the grades
must go back in Canvas's gradebook import CSV and Moodle's offline grading worksheet, each student
under the LMS identity the roster gave them at intake (columns as the LMSes document them: see
grader/export.py).
"""

from __future__ import annotations

import csv
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader import REPO_ROOT

LESSON = "01-number-formats"
POINTS = {
    "fp16_bits": 2,
    "fp16_fate": 3,
    "kahan_sum": 3,
    "underflow_fraction": 2,
    "max_safe_scale": 2,
}
WRONG_FATE = """
def fp16_fate(x):
    return torch.zeros(x.shape, dtype=torch.long)  # everything "fine": wrong
"""

pytestmark = pytest.mark.xdist_group("class-term")


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    proc = subprocess.run(
        [sys.executable, "-m", "grader", *args, "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=1200,
    )
    print(f"$ python -m grader {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    return proc


def filled(answers: dict[str, str | None], dest: Path) -> Path:
    """The released notebook with some exercises answered: the solution's code, or ``source``."""
    solution = nbformat.read(REPO_ROOT / "solutions" / LESSON / f"{LESSON}.ipynb", 4)
    by_id = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in solution.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    nb = nbformat.read(REPO_ROOT / "lessons" / LESSON / f"{LESSON}.ipynb", 4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            source = answers[gid] or by_id[gid]
            cell.source = "\n".join(line for line in source.splitlines() if "### " not in line)
    nbformat.write(nb, dest)
    return dest


@pytest.fixture(scope="module")
def term(tmp_path_factory: pytest.TempPathFactory):
    if not shutil.which("bwrap") and os.environ.get("CI"):
        pytest.fail("bubblewrap is required under CI for the sandboxed autograde")
    root = tmp_path_factory.mktemp("term")
    (root / "grader").mkdir()
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", root)
    shutil.copy2(REPO_ROOT / "grader" / "nbgrader_config.py", root / "grader")
    shutil.copytree(REPO_ROOT / "solutions" / LESSON, root / "solutions" / LESSON)

    assert cli(root, "release").returncode == 0
    assert (root / "lessons" / LESSON / f"{LESSON}.ipynb").is_file()

    work = tmp_path_factory.mktemp("students")
    subs = {
        "alice": filled({gid: None for gid in POINTS}, work / "alice.ipynb"),
        "bob": filled({"fp16_bits": None, "kahan_sum": None}, work / "bob.ipynb"),
        "carol": filled({"fp16_bits": None, "fp16_fate": WRONG_FATE}, work / "carol.ipynb"),
    }
    lms = {"alice": ("smithalice", 1001), "bob": ("jonesbob", 1002), "carol": ("leecarol", 1003)}
    archive = work / "submissions.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        for student, path in subs.items():
            name, lms_id = lms[student]
            zf.write(path, f"{name}_{lms_id}_{lms_id + 4000}_{LESSON}.ipynb")
    roster = work / "roster.csv"
    roster.write_text(
        "student_id,lms_id,name,email,sis_user_id,sis_login_id,section\n"
        + "".join(
            f'{student},{lms_id},"{name}, {student}",{student}@uni.example,SIS-{lms_id},'
            f"{student}.login,Section {lms_id % 2}\n"
            for student, (name, lms_id) in lms.items()
        )
    )
    proc = cli(root, "intake", LESSON, "--lms-zip", str(archive), "--roster", str(roster))
    assert proc.returncode == 0, proc.stderr

    args = ["autograde", LESSON, "--no-progress", "--workers", "2"]
    if not shutil.which("bwrap"):
        args.append("--unsandboxed")
    assert cli(root, *args).returncode == 0
    assert cli(root, "feedback", LESSON).returncode == 0
    out = root / "grades.csv"
    assert cli(root, "export", "--lesson", LESSON, "--out", str(out)).returncode == 0
    lms_args = ["export", "--lesson", LESSON, "--lms-assignment", f"{LESSON}=5150"]
    for fmt in ("canvas", "moodle"):
        proc = cli(root, *lms_args, "--format", fmt, "--out", str(root / f"{fmt}.csv"))
        assert proc.returncode == 0, proc.stderr
    return root, out, subs


def test_export_gives_each_exercise_what_each_submission_deserves(term):
    root, out, _ = term
    rows = {row["student_id"]: row for row in csv.DictReader(out.open())}
    print(out.read_text())
    assert set(rows) == {"alice", "bob", "carol"}
    deserved = {
        "alice": dict(POINTS),
        "bob": {**dict.fromkeys(POINTS, 0), "fp16_bits": 2, "kahan_sum": 3},
        "carol": {**dict.fromkeys(POINTS, 0), "fp16_bits": 2},
    }
    for student, expected in deserved.items():
        for exercise, points in expected.items():
            got = float(rows[student][f"{LESSON}/{exercise}"])
            assert got == points, f"{student} {exercise}: exported {got}, deserves {points}"
        assert float(rows[student][f"{LESSON}/total"]) == sum(expected.values())


LMS_IDS = {"alice": "1001", "bob": "1002", "carol": "1003"}


def test_grades_go_back_in_the_lms_import_formats(term):
    root, out, _ = term
    rows = {row["student_id"]: row for row in csv.DictReader(out.open())}
    with open(root / "canvas.csv", newline="") as fh:
        canvas = list(csv.reader(fh))
    print(*map(",".join, canvas), sep="\n")
    assert canvas[0] == [
        "Student",
        "ID",
        "SIS User ID",
        "SIS Login ID",
        "Section",
        f"{LESSON} (5150)",
    ]
    assert canvas[1][0].strip() == "Points Possible"
    assert float(canvas[1][5]) == float(rows["alice"][f"{LESSON}/max"])
    by_id = {r[1]: r for r in canvas[2:]}
    assert set(by_id) == set(LMS_IDS.values())
    for student, lms_id in LMS_IDS.items():
        row = by_id[lms_id]
        assert row[2:5] == [f"SIS-{lms_id}", f"{student}.login", f"Section {int(lms_id) % 2}"]
        assert row[0].endswith(f", {student}")
        assert float(row[5]) == float(rows[student][f"{LESSON}/total"])

    with open(root / "moodle.csv", newline="") as fh:
        moodle = list(csv.DictReader(fh))
    print(*(",".join(r.values()) for r in moodle), sep="\n")
    assert list(moodle[0]) == [
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
    by_participant = {r["Identifier"]: r for r in moodle}
    assert set(by_participant) == {f"Participant {i}" for i in LMS_IDS.values()}
    for student, lms_id in LMS_IDS.items():
        row = by_participant[f"Participant {lms_id}"]
        assert row["Email address"] == f"{student}@uni.example"
        assert float(row["Grade"]) == float(rows[student][f"{LESSON}/total"])
        assert float(row["Maximum Grade"]) == float(rows[student][f"{LESSON}/max"])
        assert row["Last modified (grade)"] and row["Last modified (submission)"]
        for exercise in POINTS:
            got = float(rows[student][f"{LESSON}/{exercise}"])
            assert f"{exercise} {got:g}/{POINTS[exercise]:g}" in row["Feedback comments"]


def test_feedback_exists_for_each_student_and_hides_no_failure(term):
    root, _, _ = term
    for student, failing in {
        "alice": [],
        "bob": ["fp16_fate", "underflow_fraction", "max_safe_scale"],
        "carol": ["fp16_fate", "kahan_sum"],
    }.items():
        html_path = root / "feedback" / student / LESSON / f"{LESSON}.html"
        assert html_path.is_file(), f"no feedback for {student}"
        html = html_path.read_text()
        assert "BEGIN HIDDEN TESTS" not in html and "_ref_" not in html
        for exercise in failing:
            assert exercise in html
        if "carol" == student:
            assert "fp16_fate(x) (0 fine, 1 subnormal" in html, "carol's failure is not shown"
        if failing:
            assert "NotImplementedError" in html or "CheckFailed" in html


def test_originals_were_kept(term):
    root, _, subs = term
    kept = list((root / "intake").rglob("*.zip")) + list((root / "intake").rglob("*.ipynb"))
    assert kept, "intake kept no copy of what was received"
