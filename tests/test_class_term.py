"""One term of lesson 01, through the instructor's CLI as an instructor types it.

Release; five students submit: two through Canvas (one marked late by Canvas), two through
Moodle (one in Moodle >= 4.1's per-student folders, one in the older file layout; Moodle's grading
worksheet gives their submission times, both 30 hours late, one with a two-day extension in the
roster) and one through nbgrader's exchange (JupyterHub). Intake (with the due date) →
calibrate → sandboxed autograde → the written answers graded by hand through nbgrader's
gradebook API, as formgrader does (one left ungraded) → feedback, delivered in each channel
(Moodle's feedback zip, Canvas's re-upload zip, nbgrader release_feedback) → export (the
per-exercise CSV, Canvas's import scaled to its 50 points, Moodle's worksheet scaled to the 100
its worksheet says; no student under another LMS's identity) → a hidden test is fixed and one
student regraded (``autograde --force --student``), keeping the manual grade. Every student's
final score, status and what each receives are checked. The course's late policy: 10% of the
score per started day late, at most 50% (grader/nbgrader_config.py).
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import time
import warnings
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
WRITTEN = "why_bf16"  # 2 points, graded by hand
TOP = sum(POINTS.values()) + 2
WRONG_FATE = """
def fp16_fate(x):
    return torch.zeros(x.shape, dtype=torch.long)  # everything "fine": wrong
"""
ANSWER = "bfloat16 keeps float32's 8 exponent bits, so its range is float32's."
DUE = "2026-11-20T12:00+00:00"
#: Moodle's worksheet times (English interface, UTC): 30 hours after the due date.
MOODLE_LATE = "Saturday, 21 November 2026, 6:00 PM"
EXCHANGE_STAMP = "2026-11-20 09:15:00.000000 UTC"

#: student: (exercises answered with the solution or a given source, manual points)
CLASS = {
    "alice": ({gid: None for gid in POINTS}, 2),  # Canvas, on time
    "bob": ({"fp16_bits": None, "kahan_sum": None}, 1),  # Canvas, marked _LATE
    "carol": ({"fp16_bits": None, "fp16_fate": WRONG_FATE}, 2),  # Moodle 4.1, extension
    "dave": ({"fp16_bits": None, "fp16_fate": None, "underflow_fraction": None}, 0),  # Moodle
    "erin": ({gid: None for gid in POINTS}, None),  # exchange; written answer not graded
}
AUTO = {
    s: sum(POINTS[e] for e, src in answers.items() if src is None)
    for s, (answers, _) in CLASS.items()
}
PENALTY = {"alice": 0.0, "bob": 0.1, "carol": 0.0, "dave": 0.2, "erin": 0.0}  # of the score
FINAL = {
    s: round((AUTO[s] + (CLASS[s][1] or 0)) * (1 - PENALTY[s]), 4) for s in CLASS
}  # alice 14, bob 5.4, carol 4, dave 5.6, erin 12 (+ the written answer still to grade)
LMS = {"alice": "canvas", "bob": "canvas", "carol": "moodle", "dave": "moodle", "erin": "exchange"}
CANVAS_IDS = {"alice": "1001", "bob": "1002"}
MOODLE_IDS = {"carol": "202", "dave": "203"}
DURATIONS: dict[str, float] = {}

pytestmark = pytest.mark.xdist_group("class-term")


def cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "grader", *args, "--root", str(root)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env=env,
        timeout=1200,
    )
    took = time.monotonic() - start
    DURATIONS[" ".join(args[:2])] = DURATIONS.get(" ".join(args[:2]), 0.0) + took
    print(f"$ python -m grader {' '.join(args)}  ({took:.1f} s)\n{proc.stdout}{proc.stderr}")
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
        elif gid == WRITTEN:  # (an unchanged stub is nbgrader's 0, not a grade to give)
            cell.source = ANSWER
    nbformat.write(nb, dest)
    return dest


def _grade_by_hand(root: Path, scores: dict[str, float]) -> None:
    """What formgrader's grade API does (nbgrader's apihandlers.GradeHandler.put)."""
    from nbgrader.api import Gradebook

    from grader.nbtools import tool_env

    os.environ["PATH"] = tool_env()["PATH"]
    with warnings.catch_warnings(), Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        warnings.simplefilter("ignore")
        for student, score in scores.items():
            grade = gb.find_grade(WRITTEN, LESSON, LESSON, student)
            grade.manual_score = score
            grade.needs_manual_grade = grade.manual_score is None and grade.auto_score is None
        gb.db.commit()


def _csv(path: Path) -> dict[str, dict[str, str]]:
    return {r["student_id"]: r for r in csv.DictReader(path.open())}


@pytest.fixture(scope="module")
def term(tmp_path_factory: pytest.TempPathFactory):
    if not shutil.which("bwrap") and os.environ.get("CI"):
        pytest.fail("bubblewrap is required under CI for the sandboxed autograde")
    started = time.monotonic()
    root = tmp_path_factory.mktemp("term")
    work = tmp_path_factory.mktemp("students")
    exchange = work / "exchange"
    (root / "grader").mkdir()
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", root)
    config = (REPO_ROOT / "grader" / "nbgrader_config.py").read_text()
    (root / "grader" / "nbgrader_config.py").write_text(
        config + f'\nc.Exchange.root = "{exchange}"  # this JupyterHub\'s exchange\n'
    )
    shutil.copytree(REPO_ROOT / "solutions" / LESSON, root / "solutions" / LESSON)
    assert cli(root, "release").returncode == 0

    subs = {s: filled(a, work / f"{s}.ipynb") for s, (a, _) in CLASS.items()}
    with zipfile.ZipFile(work / "canvas.zip", "w") as zf:
        zf.write(subs["alice"], f"smithalice_1001_5001_{LESSON}.ipynb")
        zf.write(subs["bob"], f"jonesbob_LATE_1002_5002_{LESSON}.ipynb")
    with zipfile.ZipFile(work / "moodle.zip", "w") as zf:
        zf.write(subs["carol"], f"Carol Lee_202_assignsubmission_file/{LESSON}.ipynb")
        zf.write(subs["dave"], f"Dave Diaz_203_assignsubmission_file_{LESSON}.ipynb")
    worksheet = work / "worksheet.csv"
    with open(worksheet, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["Identifier", "Full name", "Email address", "Status", "Grade", "Maximum Grade",
             "Grade can be changed", "Last modified (submission)", "Last modified (grade)",
             "Feedback comments"]
        )  # fmt: skip
        for name, pid in (("Carol Lee", 202), ("Dave Diaz", 203)):
            first = name.split()[0].lower()
            w.writerow(
                [f"Participant {pid}", name, f"{first}@uni.example", "Submitted for grading",
                 "", "100.00", "Yes", MOODLE_LATE, "-", ""]
            )  # fmt: skip
    roster = work / "roster.csv"
    roster.write_text(
        "student_id,lms_id,lms,name,email,sis_user_id,sis_login_id,section,extension_days\n"
        '"alice",1001,canvas,"Smith, Alice",alice@uni.example,SIS-1001,alice.login,Lab A,\n'
        '"bob",1002,canvas,"Jones, Bob",bob@uni.example,SIS-1002,bob.login,Lab B,\n'
        "carol,202,moodle,Carol Lee,carol@uni.example,,,,2\n"
        "dave,203,moodle,Dave Diaz,dave@uni.example,,,,\n"
    )
    inbound = exchange / "mixed-precision" / "inbound" / f"erin+{LESSON}+{EXCHANGE_STAMP}"
    inbound.mkdir(parents=True)
    shutil.copy2(subs["erin"], inbound / f"{LESSON}.ipynb")
    (inbound / "timestamp.txt").write_text(EXCHANGE_STAMP)
    (inbound / "submission_secret.txt").write_text("erins-secret")

    canvas = ["intake", LESSON, "--lms-zip", str(work / "canvas.zip"), "--roster", str(roster)]
    proc = cli(root, *canvas, "--due", DUE)
    assert proc.returncode == 0, proc.stderr
    moodle = ["--lms-zip", str(work / "moodle.zip"), "--roster", str(roster), "--roster"]
    proc = cli(root, "intake", LESSON, *moodle, str(worksheet))
    assert proc.returncode == 0, proc.stderr
    assert "Moodle worksheet" in proc.stdout
    proc = cli(root, "intake", LESSON, "--exchange")
    assert proc.returncode == 0, proc.stderr

    sandbox = [] if shutil.which("bwrap") else ["--unsandboxed"]
    assert cli(root, "calibrate", LESSON, "--workers", "2", *sandbox).returncode == 0
    args = ["autograde", LESSON, "--no-progress", "--workers", "2", *sandbox]
    assert cli(root, *args).returncode == 0
    _grade_by_hand(root, {s: m for s, (_, m) in CLASS.items() if m is not None})

    feedback = cli(root, "feedback", LESSON)
    assert feedback.returncode == 0, feedback.stderr
    out = root / "grades.csv"
    exported = {}
    exported["exercises"] = cli(root, "export", "--lesson", LESSON, "--out", str(out))
    lms_args = ["export", "--lesson", LESSON, "--lms-assignment", f"{LESSON}=5150"]
    exported["canvas"] = cli(
        root, *lms_args, "--format", "canvas", "--out", str(root / "canvas.csv"),
        "--points-possible", f"{LESSON}=50",
    )  # fmt: skip
    exported["moodle"] = cli(
        root, *lms_args, "--format", "moodle", "--out", str(root / "moodle.csv")
    )
    for fmt, proc in exported.items():
        assert proc.returncode == 0, (fmt, proc.stderr)
    before = out.read_text()

    # A hidden test is fixed (here: a clearer comment), and bob is regraded with it.
    path = root / "solutions" / LESSON / f"{LESSON}.ipynb"
    nb = nbformat.read(path, 4)
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == ("kahan_sum_tests")
    )
    cell.source += "\n# (fixed: the reference now names its inputs)"
    nbformat.write(nb, path)
    regrade = cli(root, *args, "--force", "--student", "bob")
    assert regrade.returncode == 0, regrade.stderr
    after = root / "after.csv"
    exported["after"] = cli(root, "export", "--lesson", LESSON, "--out", str(after))
    exported["canvas-after"] = cli(
        root, *lms_args, "--format", "canvas", "--out", str(root / "canvas-after.csv"),
        "--points-possible", f"{LESSON}=50",
    )  # fmt: skip
    DURATIONS["whole term"] = time.monotonic() - started
    print("durations:", json.dumps({k: round(v, 1) for k, v in DURATIONS.items()}, indent=1))
    return {
        "root": root,
        "out": out,
        "before": before,
        "after": after,
        "feedback": feedback,
        "exported": exported,
        "regrade": regrade,
        "exchange": exchange,
        "subs": subs,
    }


def test_every_student_gets_the_points_deserved_after_late_penalties(term):
    rows = _csv(term["out"])
    print(term["out"].read_text())
    assert set(rows) == set(CLASS)
    for student, (answers, manual) in CLASS.items():
        row = rows[student]
        for exercise, points in POINTS.items():
            deserved = points if answers.get(exercise, "x") is None else 0
            got = float(row[f"{LESSON}/{exercise}"])
            assert got == deserved, f"{student} {exercise}: exported {got}, deserves {deserved}"
        if manual is None:
            assert row[f"{LESSON}/{WRITTEN}"] == "", "an ungraded answer is not a zero"
            assert "needs manual grading: why_bf16" in row[f"{LESSON}/status"]
        else:
            assert float(row[f"{LESSON}/{WRITTEN}"]) == manual
            assert "needs manual grading" not in row[f"{LESSON}/status"]
        assert float(row[f"{LESSON}/total"]) == pytest.approx(FINAL[student]), student
        penalty = row[f"{LESSON}/late_penalty"]
        assert (float(penalty) if penalty else 0.0) == pytest.approx(
            (AUTO[student] + (manual or 0)) * PENALTY[student]
        ), student
        assert row[f"{LESSON}/status"].startswith("graded")
    err = term["exported"]["exercises"].stderr
    assert "late: bob marked late by Canvas (no time): -0.6" in err
    assert "late: dave 30.0 h late: -1.4" in err and "late: carol" not in err
    assert "erin 01-number-formats: written answers not graded yet" in err


def test_grades_go_back_scaled_to_each_lms_and_never_under_another_lms_identity(term):
    root = term["root"]
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
    assert canvas[1][0] == "Points Possible" and float(canvas[1][5]) == 50
    by_id = {r[1]: r for r in canvas[2:]}
    assert set(by_id) == set(CANVAS_IDS.values()), "only Canvas's students go to Canvas"
    for student, lms_id in CANVAS_IDS.items():
        assert by_id[lms_id][2] == f"SIS-{lms_id}"
        assert float(by_id[lms_id][5]) == pytest.approx(round(FINAL[student] * 50 / TOP, 2))
    err = term["exported"]["canvas"].stderr
    assert "scaled from 14 points to the Canvas assignment's 50" in err
    assert "not exported to Canvas" in err
    for student in ("carol", "dave", "erin"):
        assert student in err.split("not exported to Canvas")[1].splitlines()[0]
    assert "Late Policies" in err and "deducts again" in err

    with open(root / "moodle.csv", newline="") as fh:
        moodle = {r["Identifier"]: r for r in csv.DictReader(fh)}
    print(*(",".join(r.values()) for r in moodle.values()), sep="\n")
    assert set(moodle) == {f"Participant {i}" for i in MOODLE_IDS.values()}
    for student, pid in MOODLE_IDS.items():
        row = moodle[f"Participant {pid}"]
        assert row["Maximum Grade"] == "100.00", "the worksheet's maximum"
        assert float(row["Grade"]) == pytest.approx(round(FINAL[student] * 100 / TOP, 2))
        assert row["Email address"] == f"{student}@uni.example"
        assert row["Last modified (submission)"] == "2026-11-21 18:00:00 UTC"
        for exercise in POINTS:
            assert f"{exercise} " in row["Feedback comments"]
    carol = moodle["Participant 202"]["Feedback comments"]
    assert "fp16_fate 0/3 (CheckFailed" in carol, "the failing test's message goes to Moodle"
    assert "late" not in carol, "carol's extension covers her submission"
    assert "late (1.2 days): -1.4" in moodle["Participant 203"]["Feedback comments"]
    assert (
        "scaled from 14 points to the Moodle assignment's 100" in term["exported"]["moodle"].stderr
    )


def test_feedback_reaches_each_student_through_the_channel_they_used(term):
    from nbgrader.utils import notebook_hash

    root = term["root"]
    report = term["feedback"].stdout + term["feedback"].stderr
    assert "joblib" not in report and "Permission denied" not in report
    pages = {}
    for student in CLASS:
        html = (root / "feedback" / student / LESSON / f"{LESSON}.html").read_text()
        assert "BEGIN HIDDEN TESTS" not in html and "_ref_" not in html
        pages[student] = html
    assert "Late submission penalty (Score: -0.6)" in pages["bob"]
    assert "Late submission penalty" not in pages["carol"]
    assert "Late submission penalty (Score: -1.4)" in pages["dave"]
    assert "fp16_fate(x) (0 fine, 1 subnormal" in pages["carol"], "carol's failure is not shown"
    assert "not graded yet / 2.0" in pages["erin"] and "not final" in pages["erin"]
    assert "not graded yet" not in pages["alice"]
    out = root / "lms-feedback" / LESSON
    with zipfile.ZipFile(out / "moodle-feedback.zip") as zf:
        assert sorted(zf.namelist()) == [
            f"Carol Lee_202_assignsubmission_file/{LESSON}-feedback.html",
            f"Dave Diaz_203_assignsubmission_file/{LESSON}-feedback.html",
        ]
        assert "fp16_fate(x) (0 fine" in zf.read(zf.namelist()[0]).decode()
    with zipfile.ZipFile(out / "canvas-feedback.zip") as zf:
        assert sorted(zf.namelist()) == [
            f"jonesbob_LATE_1002_5002_{LESSON}-feedback.html",
            f"smithalice_1001_5001_{LESSON}-feedback.html",
        ]
    released = term["exchange"] / "mixed-precision" / "feedback"
    secret_hash = notebook_hash(secret="erins-secret", notebook_id=LESSON)
    assert [p.name for p in released.iterdir()] == [f"{secret_hash}.html"]
    assert "not graded yet / 2.0" in (released / f"{secret_hash}.html").read_text()


def test_a_regrade_after_a_test_fix_keeps_the_manual_grade(term):
    root = term["root"]
    assert term["after"].read_text() == term["before"], "the regrade changed somebody's grades"
    rows = _csv(term["after"])
    assert float(rows["bob"][f"{LESSON}/{WRITTEN}"]) == 1
    assert "needs manual grading" not in rows["bob"][f"{LESSON}/status"]
    log = (root / ".grader" / LESSON / "regrades.jsonl").read_text().splitlines()
    (entry,) = [json.loads(line) for line in log]
    assert entry["student"] == "bob" and not entry["needs_manual_grade"]
    assert [m["action"] for m in entry["manual_grades"]] == ["kept"]
    err = term["exported"]["canvas-after"].stderr
    assert "bob" not in "".join(line for line in err.splitlines() if "not graded" in line)
    with open(root / "canvas-after.csv", newline="") as fh:
        after = {r[1]: r for r in list(csv.reader(fh))[2:]}
    assert float(after["1002"][5]) == pytest.approx(round(FINAL["bob"] * 50 / TOP, 2))


def test_originals_were_kept(term):
    root = term["root"]
    kept = list((root / "intake").rglob("*.zip")) + list((root / "intake").rglob("*.ipynb"))
    assert len([p for p in kept if p.suffix == ".zip"]) >= 2
    idents = json.loads((root / "intake" / LESSON / "identities.json").read_text())
    assert {s: i["lms"] for s, i in idents.items()} == LMS
