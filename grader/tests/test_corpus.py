"""The tamper corpus: every case scores what its code earns honestly, each batch finishes, honest
students are unaffected, submitted files are untouched, and a re-run grades nothing twice. Then
export and feedback are checked on the same gradebook.

The corpus is graded in ``GROUPS`` batches, each in its own course, so that pytest-xdist workers
grade them at the same time (``-n 2``: two batches at once, each with one grading worker); without
xdist the batches run one after the other, each with two grading workers."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import socket
import threading
from pathlib import Path

import pytest

from grader import REPO_ROOT, sandbox
from grader.autograde import Outcome, autograde
from grader.cli import main
from grader.lessons import LESSONS, kernel_files
from grader.sandbox import Limits, Settings
from grader.tests.conftest import make_course, need_bwrap
from grader.tests.corpus import CASES, LESSON, REJECTED, write_case

SOURCE = REPO_ROOT / "grader" / "tests" / "fixtures" / "solutions" / LESSON / f"{LESSON}.ipynb"
TESTS = ("double_tests", "halve_tests", "triple_tests")
LIMITS = dict(cell_timeout=20, notebook_timeout=300, memory_mb=4096, nproc=128, fsize_mb=64)
#: Batches graded apart. Group 0 holds the honest students and the cases the module-wide tests
#: (export, feedback, re-run, flags) read; the others are spread over the rest.
GROUPS = 4
CORE = {
    "honest-right",
    "honest-wrong-hidden",
    "broken-json",
    "patch-torch-allclose",
    "patch-check-helpers",
    "hide-traceback",
    "torch-py-beside-notebook",
}


def group_of(name: str) -> int:
    """The batch that grades the case called ``name``."""
    if name in CORE:
        return 0
    rest = [c.name for c in CASES if c.name not in CORE]
    return 1 + rest.index(name) % (GROUPS - 1)


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _grade_batch(base: Path, group: int):
    root = make_course(base / "course")
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    threading.Thread(target=lambda: [server.accept() for _ in range(5)], daemon=True).start()
    ctx = {
        "paths": [
            str(root / "solutions"),
            str(root / "gradebook.db"),
            str(root / "submitted" / "honest-right" / LESSON / f"{LESSON}.ipynb"),
            str(REPO_ROOT / "solutions"),
            str(root / ".grader"),
        ],
        "port": server.getsockname()[1],
        "other_lesson": REPO_ROOT / "lessons" / "01-number-formats" / "01-number-formats.ipynb",
    }
    for case in CASES:
        if group_of(case.name) == group:
            write_case(case, SOURCE, root / "submitted" / case.name / LESSON, ctx)
    # A second honest student in every batch, graded beside the attacks.
    write_case(CASES[0], SOURCE, root / "submitted" / "honest-too" / LESSON, ctx)
    before = _digest(root / "submitted")
    workers = 1 if os.environ.get("PYTEST_XDIST_WORKER") else 2
    # Batches graded at once must not share sandbox uids: a fork bomb in one would use up the
    # other's process limit.
    os.environ["GRADER_UID_BASE"] = str(210000 + 100 * group)
    try:
        outcomes = autograde(LESSON, root, workers=workers, limits=Limits(**LIMITS), progress=False)
    finally:
        del os.environ["GRADER_UID_BASE"]
    server.close()
    return root, outcomes, before


def _batch(tmp_path_factory, group: int):
    """Group ``group`` graded once per test run, whichever xdist worker asks first (it grades
    under the group's file lock; the others read its result)."""
    from filelock import FileLock

    need_bwrap()
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # popen-gwN/: its parent is this run's
        base = base.parent
    shared = base / f"grader-corpus-{group}"
    shared.mkdir(exist_ok=True)
    cache = shared / "batch.json"
    with FileLock(str(shared / "lock")):
        if not cache.is_file():
            root, outcomes, before = _grade_batch(shared, group)
            cache.write_text(
                json.dumps(
                    {
                        "root": str(root),
                        "before": before,
                        "outcomes": [dataclasses.asdict(o) for o in outcomes],
                    }
                )
            )
        data = json.loads(cache.read_text())
    outcomes = {o["student"]: Outcome(**o) for o in data["outcomes"]}
    return Path(data["root"]), outcomes, data["before"]


@pytest.fixture(scope="session")
def batch(tmp_path_factory):
    """Group 0: the honest students and the cases the module-wide tests read."""
    return _batch(tmp_path_factory, 0)


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=pytest.mark.xdist_group(f"corpus-{group_of(c.name)}")) for c in CASES],
    ids=[c.name for c in CASES],
)
def test_case_earns_only_what_its_code_earns(tmp_path_factory, case):
    _, outcomes, _ = _batch(tmp_path_factory, group_of(case.name))
    o = outcomes[case.name]
    if case.expect == REJECTED:
        assert o.status == "rejected", o
        assert case.reason in o.reason, o.reason
        assert sum(o.scores.values()) == 0
        return
    assert o.status == "graded", o
    got = tuple(o.scores.get(t, 0.0) for t in TESTS)
    if case.at_most:
        assert all(g <= e for g, e in zip(got, case.expect, strict=True)), (got, o.reason)
    else:
        assert got == case.expect, (got, o.reason)
    # Nothing a student does changes the points an exercise is worth.
    assert {t: o.max_scores[t] for t in TESTS} == dict.fromkeys(TESTS, 1.0)


@pytest.mark.xdist_group("corpus-0")
def test_honest_students_are_unaffected_by_the_attacks(batch):
    _, outcomes, _ = batch
    for student in ("honest-right", "honest-too"):
        assert [outcomes[student].scores[t] for t in TESTS] == [1.0, 1.0, 1.0]
        assert outcomes[student].flags == []


@pytest.mark.xdist_group("corpus-0")
def test_submitted_files_are_never_modified(batch):
    root, _, before = batch
    assert _digest(root / "submitted") == before


@pytest.mark.xdist_group("corpus-0")
def test_planted_modules_are_not_imported(batch):
    root, _, _ = batch
    executed = root / "autograded" / "torch-py-beside-notebook" / LESSON / f"{LESSON}.ipynb"
    text = executed.read_text()
    assert "FAKE TORCH" not in text and "FAKE COURSE" not in text
    assert not (root / "autograded" / "torch-py-beside-notebook" / LESSON / "torch.py").exists()


@pytest.mark.xdist_group("corpus-0")
def test_suspicious_code_is_flagged(batch):
    _, outcomes, _ = batch
    assert "patches-torch" in outcomes["patch-torch-allclose"].flags
    assert "patches-checks" in outcomes["patch-check-helpers"].flags
    assert "kernel-internals" in outcomes["hide-traceback"].flags


def test_what_outlives_its_cell_is_flagged_for_a_person(tmp_path_factory):
    """Honest code that leaves a thread running keeps its points (the case above) and is flagged;
    so is every leftover trick."""
    for name, flag in [
        ("honest-progress-thread", "threads"),
        ("leftover-thread", "threads"),
        ("leftover-signal-handlers-and-itimers", "signals"),
        ("leftover-audit-hook", "hooks"),
        ("leftover-asyncio-callbacks-and-tasks", "event-loop"),
        ("leftover-child-processes", "processes"),
    ]:
        _, outcomes, _ = _batch(tmp_path_factory, group_of(name))
        assert flag in outcomes[name].flags, (name, outcomes[name].flags)


@pytest.mark.xdist_group("corpus-0")
def test_rerun_grades_nothing_twice_and_merges_a_lost_merge(batch):
    root, outcomes, _ = batch
    results = root / ".grader" / LESSON / "results"
    stamps = {p.name: p.stat().st_mtime_ns for p in results.glob("*.json")}
    # Simulate an interruption between writing a result and merging it.
    lost = results / "honest-too.json"
    data = json.loads(lost.read_text())
    data["merged"] = False
    lost.write_text(json.dumps(data))
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        gb.remove_submission(LESSON, "honest-too")
    again = autograde(LESSON, root, workers=2, limits=Limits(**LIMITS), progress=False)
    assert {o.student: o.scores for o in again} == {s: o.scores for s, o in outcomes.items()}
    changed = [
        p.name
        for p in results.glob("*.json")
        if p.stat().st_mtime_ns != stamps[p.name] and p.name != "honest-too.json"
    ]
    assert changed == []
    assert json.loads(lost.read_text())["merged"] is True
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        assert gb.find_submission(LESSON, "honest-too").score == 3.0


@pytest.mark.xdist_group("corpus-0")
def test_export_has_a_column_per_exercise_and_totals(batch, tmp_path):
    root, _, _ = batch
    out = tmp_path / "grades.csv"
    assert main(["export", "--root", str(root), "--out", str(out)]) == 0
    rows = {r["student_id"]: r for r in csv.DictReader(out.open())}
    header = list(next(iter(rows.values())))
    for column in (
        "90-fixture/double",
        "90-fixture/halve",
        "90-fixture/triple",
        "90-fixture/why_exact",
        "90-fixture/total",
        "total",
        "max",
    ):
        assert column in header
    assert float(rows["honest-right"]["90-fixture/total"]) == 3.0
    assert float(rows["patch-torch-allclose"]["90-fixture/double"]) == 0.0
    assert "rejected" in rows["broken-json"]["90-fixture/status"]
    assert "needs manual grading" in rows["honest-right"]["90-fixture/status"]


@pytest.mark.xdist_group("corpus-0")
def test_feedback_shows_messages_but_no_hidden_tests(batch):
    root, _, _ = batch
    assert main(["feedback", LESSON, "--root", str(root), "--student", "honest-wrong-hidden"]) == 0
    html = (root / "feedback" / "honest-wrong-hidden" / LESSON / f"{LESSON}.html").read_text()
    assert "double on random input" in html  # the CheckFailed message
    assert "BEGIN HIDDEN TESTS" not in html and "_seed" not in html


L01_POINTS = {
    "fp16_bits_tests": 2.0,
    "fp16_fate_tests": 3.0,
    "kahan_sum_tests": 3.0,
    "underflow_fraction_tests": 2.0,
    "max_safe_scale_tests": 2.0,
}


@pytest.mark.lesson
@pytest.mark.xdist_group("corpus-l01")
def test_lesson01_attacks_on_the_hidden_tests_earn_nothing(tmp_path):
    """Lesson 01 through the real sandboxed autograde: each exercise attacked by code that looks
    for the hidden test's reference at call time (the notebook's globals, the caller's frames, gc
    referrers of its inputs, every live function, a thread waiting for it), or that attacks the
    judged tests' plumbing (a patched torch.save writing a pickle that runs code, a forged second
    set of observations, the judges' module or file, the driver's observer emptied), falling back
    to code that is right on the visible inputs only. None earns a point; the honest exercise
    beside them keeps its points (after code left running, it may lose them to that code); the
    payload never ran in the grader's process."""
    from grader.release import copy_course_skeleton
    from grader.tests.corpus import L01_LESSON, L01_SPOILED, L01_STUDENTS, write_l01_attack

    need_bwrap()
    root = tmp_path / "course"
    copy_course_skeleton(REPO_ROOT, root)
    source = REPO_ROOT / "solutions" / L01_LESSON / f"{L01_LESSON}.ipynb"
    marker = tmp_path / "payload-ran"
    judges = [str(LESSONS["01-number-formats"].folder / "judge.py")]
    for student in L01_STUDENTS:
        dest = root / "submitted" / student / L01_LESSON
        write_l01_attack(student, source, dest, {"marker": marker, "judges": judges})
    limits = Limits(cell_timeout=300, notebook_timeout=900)
    outcomes = {
        o.student: o for o in autograde(L01_LESSON, root, workers=2, limits=limits, progress=False)
    }
    for student, tricks in L01_STUDENTS.items():
        o = outcomes[student]
        assert o.status == "graded", o
        for exercise, trick in tricks.items():
            gid = f"{exercise}_tests"
            assert o.max_scores[gid] == L01_POINTS[gid]
            want = L01_POINTS[gid] if trick is None else 0.0
            if trick is None and student in L01_SPOILED:
                assert o.scores[gid] <= want, (student, exercise, o.reason)
                continue
            assert o.scores[gid] == want, (student, exercise, trick, o.reason)
    assert not marker.exists(), "the payload ran in the grader's process"


#: A sandbox uid slot of its own per run (two runs may grade at once under xdist).
KIND_SLOTS = {"first": 61, "second": 62}
#: The grader's modules a kernel may hold: the drivers, their inputs and the packages above them.
DRIVER_MODULES = {
    ".".join(parts[:n])
    for _, rel in kernel_files()
    for parts in [rel.removesuffix(".py").split("/")]
    for n in range(1, len(parts) + 1)
}


def _no_reference(suspect: str) -> bool:
    """A function an attack suspected (``name@file:line``) that holds no reference: one a test
    cell defines, a driver's, or one the drivers import (torch's, the course's, Python's); never
    a judge's, a variant's or a solution's."""
    where = suspect.partition("@")[2].rpartition(":")[0]
    return not any(part in where for part in ("judge", "variants", "solutions"))


@pytest.mark.lesson
@pytest.mark.filterwarnings("ignore:Detected pickle protocol:UserWarning")  # the forged pickle
@pytest.mark.parametrize("path", list(KIND_SLOTS))
def test_lessons_02_to_09_attacks_by_kind_earn_nothing(tmp_path, path):
    """Lessons 02-09's hidden tests attacked by kind (see ``KIND_KIT`` in corpus.py) in one
    sandboxed submission per set of lessons (``KIND_PATHS``), judged here as
    ``SandboxedExecute`` judges: a stateful exercise (lesson 02's scaler), one whose function
    runs in 2 ranks (lesson 06's worker) and one of lessons 03, 04, 05, 08 and 09 each. Every
    attack ran and looked (each finder reports what it
    scanned), none found a judge, a judges file or a solution, and none earned a point: each
    visible part passed and each judge failed the answers. The control, a hidden test of the old
    kind, is beaten by every finder; the serializer's payload never ran here."""
    import secrets

    from nbgrader.utils import determine_grade

    from grader.cells import graded_test_cells
    from grader.execute import apply_answer
    from grader.judge import judge_cell
    from grader.keys import seed_for
    from grader.tests.corpus import (
        KIND_EXERCISES,
        KIND_FINDERS,
        KIND_PATHS,
        kind_attack_notebook,
        kind_reports,
    )

    need_bwrap()
    marker = tmp_path / "payload-ran"
    hidden = [REPO_ROOT / "grader" / "lessons", REPO_ROOT / "solutions"]
    nb, tests = kind_attack_notebook(path, marker, hidden, REPO_ROOT / "solutions")
    key, student = secrets.token_hex(32), "attacker"
    settings = Settings(
        limits=Limits(cell_timeout=120, notebook_timeout=420),
        slot=KIND_SLOTS[path],
        kernel_env={"COURSE_GRADING_KEY": key, "COURSE_STUDENT_ID": student},
    )
    answer = sandbox.execute(json.loads(json.dumps(nb)), graded_test_cells(nb), settings)
    statuses = apply_answer(nb, answer)
    assert sorted(tests) == graded_test_cells(nb)
    every = []  # the looks at the lessons' exercises
    for index, lesson in tests.items():
        cell = nb.cells[index]
        # The look's report, printed in the hidden part (a rank's lines replayed by the launcher).
        looks, channels = kind_reports(cell)
        verdict = judge_cell(cell, lesson, lambda exercise: seed_for(key, student, exercise))
        score, max_score = determine_grade(cell)
        errors = [f"{o['ename']}: {o['evalue'][:300]}" for o in cell.outputs if "ename" in o]
        where = f"{path}, {lesson or 'control'}: {errors}"
        assert statuses[index] == "ok", f"{where}: the visible part or the driver failed"
        assert looks, f"{where}: the attack never looked (its hidden part did not call it)"
        for look in looks:
            for finder in KIND_FINDERS:
                assert "error" not in look[finder], (where, finder, look[finder])
            assert look["globals"]["scanned"] > 0 and look["frames"]["scanned"] > 0, look
            assert look["frames"]["names"] > 0 and look["gc"]["functions"] > 0, look
            assert look["thread"]["polls"] > 0 and look["source"]["chars"] > 0, look
        if lesson is None:  # the control: every finder but the globals found its reference
            assert (score, max_score) == (1.0, 1.0), where
            (look,) = looks
            assert "_secret_reference" in look["used"], look
            assert not look["globals"]["suspects"], look  # the test's names stay the test's
            for finder in KIND_FINDERS[1:]:
                assert any("_secret_reference" in s for s in look[finder]["suspects"]), finder
            assert "grader.lessons.l99_leaky.judge" in look["gc"]["grader modules"], look["gc"]
            assert "/tmp/leak/grader/lessons/l99_leaky/judge.py" in look["judges"]["files"], look
            continue  # (not among ``every``)
        grade_id, _, _ = KIND_EXERCISES[lesson]
        assert cell.metadata["nbgrader"]["grade_id"] == f"{grade_id}_tests"
        assert max_score > 0 and score == 0, where
        assert verdict == "failed" and errors[-1].startswith(("CheckFailed", "ObservationError")), (
            where
        )
        # Two ranks looked, each in its own process; elsewhere the test's own process looked.
        assert len({look["pid"] for look in looks}) == (2 if lesson == "06-multi-gpu" else 1)
        for look in looks:
            assert look["referrers"]["scanned"] > 0, (where, look["referrers"])
            # Of the grader, the kernel holds the drivers and their inputs at most, never a judge.
            assert set(look["gc"]["grader modules"]) <= DRIVER_MODULES, (where, look["gc"])
            assert set(look["judges"]["modules"]) <= DRIVER_MODULES, look
            assert look["judges"]["file count"] == 0, look
            # What a test cell defines is found (where it defines any) but is no reference.
            for finder in KIND_FINDERS:
                assert all(map(_no_reference, look[finder]["suspects"])), (finder, look)
        channel = KIND_PATHS[path][lesson]
        if channel == "hijack":
            (look,) = looks
            hijack = look["channel"]
            assert hijack["live"] == 1 and hijack["lists emptied"] >= 1, look
            assert "end before" in errors[-1], where
        elif channel == "serializer":
            assert channels == [{"serializer": ["torch.save", "torch.serialization.save"]}]
            assert "could not be read" in errors[-1], where
        every.extend(looks)
    # The finders' candidates were used: functions a test cell defines were called with the
    # inputs, and values of the right kind found beside a call were returned.
    assert any(look["tried"] for look in every), every
    assert any((look["used"] or "").startswith("a ") for look in every), every
    assert not marker.exists(), "the serializer's payload ran in the grader's process"
