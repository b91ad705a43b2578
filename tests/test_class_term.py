"""One term of lesson 01, through the instructor's CLI as an instructor types it.

Release (with a hidden test that is wrong: it demands int32 fields of ``fp16_bits``, where the
task asks for integer tensors) → the student kit (``package``); the students' notebooks are the
kit's copy of the lesson. Five students submit: two through Canvas (one marked late by Canvas),
two through Moodle (one in Moodle >= 4.1's per-student folders, one in the older file layout;
Moodle's grading worksheet gives their submission times, both 30 hours late, one with a two-day
extension in the roster) and one through nbgrader's exchange (JupyterHub). Intake (with the due
date) → calibrate → sandboxed autograde → the written answers graded by hand through formgrader's
own HTTP API on the instructor's JupyterLab (one left ungraded) → feedback, delivered in each
channel (Moodle's feedback zip, Canvas's re-upload zip, nbgrader release_feedback) → export (the
per-exercise CSV, Canvas's import scaled to its 50 points, Moodle's worksheet scaled to the 100
its worksheet says; no student under another LMS's identity) → the hidden test is fixed and the
student whose valid answer it failed is regraded (``autograde --force --student``): the score
rises, the manual grade stays, and the feedback generated again goes back in Canvas's zip. Every
student's final score, status and what each receives are checked. The course's late policy: 10%
of the score per started day late, at most 50% (grader/nbgrader_config.py).
"""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader import REPO_ROOT
from grader.lessons.l01_number_formats.variants import VALID
from tests.test_browser import _start_lab

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
#: A valid answer in other words: the fields as int64 tensors (the task asks for integer tensors).
INT64_BITS = VALID["bits_by_integer_division"][1]
#: The hidden test's mistake, as the term began: it demanded int32 fields. Fixed after feedback.
WRONG_HIDDEN = (
    "check(all(_p.dtype == torch.int32 for _p in fp16_bits(torch.ones(2, dtype=torch.float16))),\n"
    '      "fp16_bits should return int32 tensors")\n'
)
WRONG_MESSAGE = "fp16_bits should return int32 tensors"
ANSWER = "bfloat16 keeps float32's 8 exponent bits, so its range is float32's."
DUE = "2026-11-20T12:00+00:00"
#: Moodle's worksheet times (English interface, UTC): 30 hours after the due date.
MOODLE_LATE = "Saturday, 21 November 2026, 6:00 PM"
EXCHANGE_STAMP = "2026-11-20 09:15:00.000000 UTC"

#: student: (exercises answered: None for the solution's code, else the source; manual points)
CLASS = {
    "alice": ({gid: None for gid in POINTS}, 2),  # Canvas, on time
    "bob": ({"fp16_bits": INT64_BITS, "kahan_sum": None}, 1),  # Canvas, marked _LATE; int64
    "carol": ({"fp16_bits": None, "fp16_fate": WRONG_FATE}, 2),  # Moodle 4.1, extension
    "dave": ({"fp16_bits": None, "fp16_fate": None, "underflow_fraction": None}, 0),  # Moodle
    "erin": ({gid: None for gid in POINTS}, None),  # exchange; written answer not graded
}
#: What the wrong hidden test failed (bob's int64 fields), until it was fixed.
WRONGLY_FAILED = {("bob", "fp16_bits")}
REGRADED = "bob"


def deserved(student: str, exercise: str, fixed: bool) -> float:
    """The points ``student``'s answer to ``exercise`` is worth, before or after the fix."""
    answers = CLASS[student][0]
    if exercise not in answers or answers[exercise] == WRONG_FATE:
        return 0
    return 0 if not fixed and (student, exercise) in WRONGLY_FAILED else POINTS[exercise]


def auto(student: str, fixed: bool) -> float:
    return sum(deserved(student, e, fixed) for e in POINTS)


PENALTY = {"alice": 0.0, "bob": 0.1, "carol": 0.0, "dave": 0.2, "erin": 0.0}  # of the score


def final(student: str, fixed: bool = True) -> float:
    """The score after late penalties (without an ungraded written answer)."""
    return round((auto(student, fixed) + (CLASS[student][1] or 0)) * (1 - PENALTY[student]), 4)


# After the fix: alice 14, bob 5.4, carol 4, dave 5.6, erin 12 (+ the written answer to grade);
# before it bob had 3.6 (his fp16_bits failed).
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


def _kit(root: Path, work: Path) -> Path:
    """The student kit of the term's release (``package``), unpacked; returns its notebook."""
    for name in ("course", "jupyter", "pyproject.toml"):  # what the kit ships besides lessons/
        (root / name).symlink_to(REPO_ROOT / name)
    kit_zip = work / "kit.zip"
    proc = cli(root, "package", "--lesson", LESSON, "--out", str(kit_zip))
    assert proc.returncode == 0, proc.stderr
    with zipfile.ZipFile(kit_zip) as zf:
        names = zf.namelist()
        zf.extractall(work / "kit")
    lessons = {n.split("/")[2] for n in names if n.startswith("mixed-precision-course/lessons/")}
    assert lessons == {LESSON}, lessons
    notebook = work / "kit" / "mixed-precision-course" / "lessons" / LESSON / f"{LESSON}.ipynb"
    released = root / "lessons" / LESSON / f"{LESSON}.ipynb"
    assert notebook.read_bytes() == released.read_bytes(), "the kit is not the term's release"
    return notebook


def filled(kit_notebook: Path, answers: dict[str, str | None], dest: Path) -> Path:
    """The kit's notebook with some exercises answered: the solution's code, or ``source``."""
    solution = nbformat.read(REPO_ROOT / "solutions" / LESSON / f"{LESSON}.ipynb", 4)
    by_id = {
        c.metadata["nbgrader"]["grade_id"]: c.source
        for c in solution.cells
        if c.metadata.get("nbgrader", {}).get("solution")
    }
    nb = nbformat.read(kit_notebook, 4)
    for cell in nb.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if gid in answers:
            source = answers[gid] or by_id[gid]
            cell.source = "\n".join(line for line in source.splitlines() if "### " not in line)
        elif gid == WRITTEN:  # (an unchanged stub is nbgrader's 0, not a grade to give)
            cell.source = ANSWER
    nbformat.write(nb, dest)
    return dest


def _hidden_test(path: Path, grade_id: str, edit) -> None:
    """Change the source of test cell ``grade_id`` of the notebook at ``path`` by ``edit``."""
    nb = nbformat.read(path, 4)
    (cell,) = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    new = edit(cell.source)
    assert new != cell.source
    cell.source = new
    nbformat.write(nb, path)


def _api(url: str, token: str, path: str, body: dict | None = None) -> object:
    """A call to formgrader's API (``body``: a PUT of it, as formgrader's page saves a grade)."""
    request = urllib.request.Request(
        f"{url}/formgrader/api/{path}",
        data=None if body is None else json.dumps(body).encode(),
        method="GET" if body is None else "PUT",
        headers={"Authorization": f"token {token}", "Content-Type": "application/json"},
    )
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback, no proxy
    with opener.open(request, timeout=60) as reply:
        return json.loads(reply.read())


def _grade_in_formgrader(
    root: Path, scores: dict[str, float]
) -> tuple[dict[str, tuple[dict, dict]], set[str]]:
    """Each student's written answer graded as formgrader's Manual Grading page does: the
    lesson's submitted notebooks, a submission's grades, then a PUT of the grade with its manual
    score; on the instructor's JupyterLab (``run.py lab --instructor``) over the course folder.
    Returns ``{student: (the grade before, the grade formgrader answered with)}`` and the
    students formgrader still lists as needing manual grading."""
    start = time.monotonic()
    lab = _start_lab(root, instructor=True)
    url, token = next(lab)
    try:
        submissions = {
            s["student"]: s for s in _api(url, token, f"submitted_notebooks/{LESSON}/{LESSON}")
        }
        assert set(submissions) == set(CLASS), submissions
        graded = {}
        for student, score in scores.items():
            assert submissions[student]["needs_manual_grade"], student
            grades = _api(url, token, f"grades?submission_id={submissions[student]['id']}")
            (grade,) = [g for g in grades if g["name"] == WRITTEN]
            saved = _api(url, token, f"grade/{grade['id']}", {**grade, "manual_score": score})
            graded[student] = (grade, saved)
        left = {
            s["student"]
            for s in _api(url, token, f"submitted_notebooks/{LESSON}/{LESSON}")
            if s["needs_manual_grade"]
        }
    finally:
        lab.close()
    DURATIONS["formgrader"] = time.monotonic() - start
    return graded, left


def _csv(path: Path) -> dict[str, dict[str, str]]:
    return {r["student_id"]: r for r in csv.DictReader(path.open())}


def _zip_texts(path: Path) -> dict[str, str]:
    with zipfile.ZipFile(path) as zf:
        return {name: zf.read(name).decode() for name in zf.namelist()}


def _pages(root: Path) -> dict[str, str]:
    """Each student's feedback page as ``feedback`` wrote it."""
    return {s: (root / "feedback" / s / LESSON / f"{LESSON}.html").read_text() for s in CLASS}


SCORE = re.compile(r"<h4>" + re.escape(LESSON) + r" \(Score: ([0-9.]+) / ([0-9.]+)")
WRITTEN_SCORE = re.compile(r"Written response</a> \(Score: ([^)]*)\)")


def _page_score(html: str) -> tuple[float, float]:
    """The score and maximum a feedback page states at its top."""
    (found,) = SCORE.findall(html)
    return float(found[0]), float(found[1])


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
    source = root / "solutions" / LESSON / f"{LESSON}.ipynb"
    begin = "### BEGIN HIDDEN TESTS\n"
    _hidden_test(source, "fp16_bits_tests", lambda s: s.replace(begin, begin + WRONG_HIDDEN))
    assert cli(root, "release").returncode == 0
    kit_notebook = _kit(root, work)

    subs = {s: filled(kit_notebook, a, work / f"{s}.ipynb") for s, (a, _) in CLASS.items()}
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
    manual = {s: m for s, (_, m) in CLASS.items() if m is not None}
    formgrader, still_to_grade = _grade_in_formgrader(root, manual)

    feedback = cli(root, "feedback", LESSON)
    assert feedback.returncode == 0, feedback.stderr
    lms_feedback = root / "lms-feedback" / LESSON
    delivered = {
        "pages": _pages(root),
        "canvas": _zip_texts(lms_feedback / "canvas-feedback.zip"),
        "moodle": _zip_texts(lms_feedback / "moodle-feedback.zip"),
    }
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

    # The hidden test is fixed (it demanded int32 fields), and bob, whose valid int64 fields it
    # failed, is regraded with it; his feedback is generated again and goes back to Canvas.
    _hidden_test(source, "fp16_bits_tests", lambda s: s.replace(WRONG_HIDDEN, ""))
    assert nbformat.read(source, 4) == nbformat.read(
        REPO_ROOT / "solutions" / LESSON / source.name, 4
    )
    regrade = cli(root, *args, "--force", "--student", REGRADED)
    assert regrade.returncode == 0, regrade.stderr
    refeedback = cli(root, "feedback", LESSON, "--student", REGRADED, "--deliver", "canvas")
    assert refeedback.returncode == 0, refeedback.stderr
    delivered["canvas-after"] = _zip_texts(lms_feedback / "canvas-feedback.zip")
    delivered["pages-after"] = _pages(root)
    after = root / "after.csv"
    exported["after"] = cli(root, "export", "--lesson", LESSON, "--out", str(after))
    exported["canvas-after"] = cli(
        root, *lms_args, "--format", "canvas", "--out", str(root / "canvas-after.csv"),
        "--points-possible", f"{LESSON}=50",
    )  # fmt: skip
    for fmt in ("after", "canvas-after"):
        assert exported[fmt].returncode == 0, (fmt, exported[fmt].stderr)
    DURATIONS["whole term"] = time.monotonic() - started
    print("durations:", json.dumps({k: round(v, 1) for k, v in DURATIONS.items()}, indent=1))
    return {
        "root": root,
        "out": out,
        "after": after,
        "feedback": feedback,
        "refeedback": refeedback,
        "delivered": delivered,
        "formgrader": formgrader,
        "still_to_grade": still_to_grade,
        "exported": exported,
        "regrade": regrade,
        "exchange": exchange,
        "subs": subs,
    }


def test_every_student_gets_the_points_deserved_after_late_penalties(term):
    """The first export (before the fix): bob's valid fp16_bits was failed by the wrong test."""
    rows = _csv(term["out"])
    print(term["out"].read_text())
    assert set(rows) == set(CLASS)
    for student, (_, manual) in CLASS.items():
        row = rows[student]
        for exercise in POINTS:
            want = deserved(student, exercise, fixed=False)
            got = float(row[f"{LESSON}/{exercise}"])
            assert got == want, f"{student} {exercise}: exported {got}, expected {want}"
        if manual is None:
            assert row[f"{LESSON}/{WRITTEN}"] == "", "an ungraded answer is not a zero"
            assert "needs manual grading: why_bf16" in row[f"{LESSON}/status"]
        else:
            assert float(row[f"{LESSON}/{WRITTEN}"]) == manual
            assert "needs manual grading" not in row[f"{LESSON}/status"]
        assert float(row[f"{LESSON}/total"]) == pytest.approx(final(student, False)), student
        penalty = row[f"{LESSON}/late_penalty"]
        assert (float(penalty) if penalty else 0.0) == pytest.approx(
            (auto(student, False) + (manual or 0)) * PENALTY[student]
        ), student
        assert row[f"{LESSON}/status"].startswith("graded")
    err = term["exported"]["exercises"].stderr
    assert "late: bob marked late by Canvas (no time): -0.4" in err
    assert "late: dave 30.0 h late: -1.4" in err and "late: carol" not in err
    assert "erin 01-number-formats: written answers not graded yet" in err


def test_written_answers_are_graded_through_formgrader(term):
    """formgrader's grade API took each manual score; export and feedback report what it
    answered."""
    graded = term["formgrader"]
    assert set(graded) == {s for s, (_, m) in CLASS.items() if m is not None}
    for student, (before, saved) in graded.items():
        manual = CLASS[student][1]
        assert before["manual_score"] is None and before["auto_score"] is None, before
        assert before["needs_manual_grade"] and before["max_score"] == 2, before
        assert saved["id"] == before["id"] and saved["manual_score"] == manual, saved
        assert before["student"] == saved["student"] == student, saved
        assert not saved["needs_manual_grade"], saved
    assert term["still_to_grade"] == {"erin"}, "formgrader still lists them for grading"
    rows = _csv(term["out"])
    pages = term["delivered"]["pages"]
    for student, (_, saved) in graded.items():
        assert float(rows[student][f"{LESSON}/{WRITTEN}"]) == saved["manual_score"]
        (shown,) = WRITTEN_SCORE.findall(pages[student])
        assert shown == f"{float(saved['manual_score'])} / 2.0", (student, shown)
    assert WRITTEN_SCORE.findall(pages["erin"]) == ["not graded yet / 2.0"]


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
        want = round(final(student, False) * 50 / TOP, 2)
        assert float(by_id[lms_id][5]) == pytest.approx(want)
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
        assert float(row["Grade"]) == pytest.approx(round(final(student) * 100 / TOP, 2))
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

    report = term["feedback"].stdout + term["feedback"].stderr
    assert "joblib" not in report and "Permission denied" not in report
    pages = term["delivered"]["pages"]
    for student, html in pages.items():
        assert "BEGIN HIDDEN TESTS" not in html and "_ref_" not in html, student
        assert "hidden tests ran here; their code is not shown" in html, student
        assert _page_score(html) == (pytest.approx(final(student, False)), TOP), student
    assert "Late submission penalty (Score: -0.4)" in pages["bob"]
    assert "Late submission penalty" not in pages["carol"]
    assert "Late submission penalty (Score: -1.4)" in pages["dave"]
    assert "fp16_fate(x) (0 fine, 1 subnormal" in pages["carol"], "carol's failure is not shown"
    assert WRONG_MESSAGE in pages["bob"] and WRONG_MESSAGE not in pages["alice"]
    assert "not graded yet / 2.0" in pages["erin"] and "not final" in pages["erin"]
    assert "not graded yet" not in pages["alice"]

    moodle = term["delivered"]["moodle"]
    assert sorted(moodle) == [
        f"Carol Lee_202_assignsubmission_file/{LESSON}-feedback.html",
        f"Dave Diaz_203_assignsubmission_file/{LESSON}-feedback.html",
    ]
    assert moodle[sorted(moodle)[0]] == pages["carol"]
    assert moodle[sorted(moodle)[1]] == pages["dave"]

    # Canvas's re-upload zip: each file is its student's own page (Canvas attaches it to the
    # submission whose user id the name holds), with that student's score and nothing hidden.
    canvas = term["delivered"]["canvas"]
    files = {
        "alice": f"smithalice_1001_5001_{LESSON}-feedback.html",
        "bob": f"jonesbob_LATE_1002_5002_{LESSON}-feedback.html",
    }
    assert sorted(canvas) == sorted(files.values())
    for student, name in files.items():
        assert canvas[name] == pages[student], f"{name} is not {student}'s feedback"
    assert _page_score(canvas[files["alice"]]) == (14, TOP)
    assert _page_score(canvas[files["bob"]]) == (pytest.approx(3.6), TOP)
    assert "Late submission penalty (Score: -0.4)" in canvas[files["bob"]]
    assert "Late submission penalty" not in canvas[files["alice"]]
    assert WRITTEN_SCORE.findall(canvas[files["bob"]]) == ["1.0 / 2.0"]

    released = term["exchange"] / "mixed-precision" / "feedback"
    secret_hash = notebook_hash(secret="erins-secret", notebook_id=LESSON)
    assert [p.name for p in released.iterdir()] == [f"{secret_hash}.html"]
    erin = (released / f"{secret_hash}.html").read_text()
    assert erin == pages["erin"] and "not graded yet / 2.0" in erin


def test_a_regrade_after_a_test_fix_raises_the_score_and_keeps_the_manual_grade(term):
    root = term["root"]
    before, after = _csv(term["out"]), _csv(term["after"])
    print(term["after"].read_text())
    for student in set(CLASS) - {REGRADED}:
        assert after[student] == before[student], f"the regrade changed {student}'s grades"
    bob = after[REGRADED]
    for exercise in POINTS:
        assert float(bob[f"{LESSON}/{exercise}"]) == deserved(REGRADED, exercise, fixed=True)
    assert (
        float(bob[f"{LESSON}/fp16_bits"]) == 2 and float(before["bob"][f"{LESSON}/fp16_bits"]) == 0
    )
    assert float(bob[f"{LESSON}/total"]) == pytest.approx(final(REGRADED)) == 5.4
    assert float(bob[f"{LESSON}/late_penalty"]) == pytest.approx(0.6)
    assert float(bob[f"{LESSON}/{WRITTEN}"]) == 1, "the manual grade was lost"
    assert "needs manual grading" not in bob[f"{LESSON}/status"]
    assert bob[f"{LESSON}/status"].startswith("graded")
    assert "late: bob marked late by Canvas (no time): -0.6" in term["exported"]["after"].stderr

    log = (root / ".grader" / LESSON / "regrades.jsonl").read_text().splitlines()
    (entry,) = [json.loads(line) for line in log]
    assert entry["student"] == REGRADED and entry["status"] == "graded"
    assert (entry["score_before"], entry["score_after"], entry["max_score"]) == (4, 6, TOP)
    assert not entry["needs_manual_grade"]
    (kept,) = entry["manual_grades"]
    assert kept["grade_id"] == WRITTEN and kept["manual_score"] == 1
    assert kept["action"] == "kept" and kept["why"] == "the written answer is unchanged"

    # The feedback generated again shows the new score, in the zip that goes back to Canvas.
    report = term["refeedback"].stdout
    assert "canvas: wrote" in report and "(2 file(s))" in report
    canvas = term["delivered"]["canvas-after"]
    bob_file = f"jonesbob_LATE_1002_5002_{LESSON}-feedback.html"
    alice_file = f"smithalice_1001_5001_{LESSON}-feedback.html"
    assert sorted(canvas) == [bob_file, alice_file]
    assert canvas[alice_file] == term["delivered"]["canvas"][alice_file], "alice's changed"
    page = canvas[bob_file]
    assert page == term["delivered"]["pages-after"]["bob"]
    assert _page_score(page) == (pytest.approx(5.4), TOP)
    assert WRONG_MESSAGE not in page and "BEGIN HIDDEN TESTS" not in page
    assert "Late submission penalty (Score: -0.6)" in page
    assert WRITTEN_SCORE.findall(page) == ["1.0 / 2.0"]

    err = term["exported"]["canvas-after"].stderr
    assert "bob" not in "".join(line for line in err.splitlines() if "not graded" in line)
    with open(root / "canvas-after.csv", newline="") as fh:
        canvas_rows = {r[1]: r for r in list(csv.reader(fh))[2:]}
    for student, lms_id in CANVAS_IDS.items():
        want = round(final(student) * 50 / TOP, 2)
        assert float(canvas_rows[lms_id][5]) == pytest.approx(want), student


def test_originals_were_kept(term):
    root = term["root"]
    kept = list((root / "intake").rglob("*.zip")) + list((root / "intake").rglob("*.ipynb"))
    assert len([p for p in kept if p.suffix == ".zip"]) >= 2
    idents = json.loads((root / "intake" / LESSON / "identities.json").read_text())
    assert {s: i["lms"] for s, i in idents.items()} == LMS
