"""The unfair-grade audit, on small lessons: it reports exactly the correct runs that lose points
and the wrong runs that score."""

from __future__ import annotations

import json
import shutil

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader.audit import (
    audit_kernel,
    audit_lesson,
    main,
    report,
    summary_line,
    valid_variants,
    wrong_variants,
)
from grader.keys import seed_for
from grader.lessons import LESSONS
from grader.seam import ExerciseRun
from grader.tests.conftest import FIXTURES

FIXTURE = FIXTURES / "solutions" / "90-fixture" / "90-fixture.ipynb"


def _meta(grade_id: str, **flags: object) -> dict:
    return {"nbgrader": {"grade_id": grade_id, "schema_version": 3, "task": False, **flags}}


def _flaky_lesson() -> nbformat.NotebookNode:
    """An exercise whose hidden test fails on every odd seed: a stand-in for a flaky check."""
    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [
        new_code_cell("import course.checks\nfrom course.checks import check"),
        new_code_cell(
            "def one():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION",
            metadata=_meta("one", grade=False, solution=True, locked=False),
        ),
        new_code_cell(
            "check(one() == 1, 'one() should be 1')\n"
            "### BEGIN HIDDEN TESTS\n"
            "_seed = course.checks.hidden_seed('one')\n"
            "check(_seed % 2 == 0, f'odd seed {_seed}')\n"
            "### END HIDDEN TESTS",
            metadata=_meta("one_tests", grade=True, solution=False, locked=True, points=2),
        ),
    ]
    return nb


def _keys_with_parities(parities: list[int], exercise: str = "one") -> list[str]:
    """Grading keys whose seeds for (audit-<i>, exercise) have the given parities, in order."""
    keys, n = [], 0
    for i, parity in enumerate(parities):
        while seed_for(f"k{n}", f"audit-{i}", exercise) % 2 != parity:
            n += 1
        keys.append(f"k{n}")
        n += 1
    return keys


@pytest.fixture(scope="module")
def flaky(tmp_path_factory):
    path = tmp_path_factory.mktemp("flaky") / "flaky.ipynb"
    nbformat.write(_flaky_lesson(), path)
    return path


def test_audit_reports_every_seed_that_loses_points_and_only_those(flaky):
    keys = _keys_with_parities([0, 1, 0, 1, 1])
    valid = {"one_by_sum": ("one", "def one():\n    return sum([1])")}
    audits, _ = audit_lesson(flaky, seeds=5, valid=valid, keys=iter(keys + keys))
    (audit,) = audits
    assert audit.runs == {"solution": 5, "one_by_sum": 5}
    lost = [(f.variant, f.student, f.key) for f in audit.failures]
    odd = [(f"audit-{i}", keys[i]) for i in (1, 3, 4)]
    assert lost == [("solution", *s) for s in odd] + [("one_by_sum", *s) for s in odd]
    for f in audit.failures:
        assert f.seed == seed_for(f.key, f.student, "one") and f.seed % 2 == 1
        assert f"odd seed {f.seed}" in f.message and (f.score, f.max_score) == (0, 2)
    text = report(audits, 1.0)
    assert "one " in text and f"seed {audit.failures[0].seed}" in text


def test_a_wrong_valid_variant_is_caught_on_the_fixture_lesson():
    wrong = {"not_double": ("double", "def double(x):\n    return x * 3")}
    right = {"double_by_add": ("double", "def double(x):\n    return x + x")}
    audits, seconds = audit_lesson(FIXTURE, seeds=3, exercises=["double"], valid={**wrong, **right})
    (audit,) = audits
    assert seconds > 0 and audit.runs == {"solution": 3, "double_by_add": 3, "not_double": 3}
    assert {f.variant for f in audit.failures} == {"not_double"}
    assert len(audit.failures) == 3


def test_command_line_exit_status(tmp_path, capsys):
    course = tmp_path / "course"
    (course / "solutions" / "90-fixture").mkdir(parents=True)
    (course / "solutions" / "90-fixture" / "90-fixture.ipynb").write_bytes(FIXTURE.read_bytes())
    assert main(["90-fixture", "--seeds", "2", "--root", str(course)]) == 0
    out = capsys.readouterr().out
    assert "double" in out and "triple" in out and "no run lost a point" in out


class _FakeKernel:
    """Stands in for a lesson kernel: each run takes ``seconds`` on the audit's (fake) clock and
    scores what ``score`` says."""

    path = FIXTURE

    def __init__(self, seconds: float, score) -> None:
        self.seconds, self.score, self.now = seconds, score, 0.0

    def perf_counter(self) -> float:
        return self.now

    def exercises(self) -> list[str]:
        return ["ex"]

    def run_exercise(self, grade_id, source=None, key=None, student=""):
        self.now += self.seconds
        return ExerciseRun(grade_id, self.score(source, key), 2.0, "", self.seconds)


def test_time_cap_stops_an_exercise_and_says_how_many_seeds_it_ran(monkeypatch):
    kernel = _FakeKernel(1.0, lambda source, key: 2.0)
    monkeypatch.setattr("grader.audit.time", kernel)  # the audit's clock: 1 s a run
    (audit,) = audit_kernel(kernel, 100, time_cap=10)
    assert audit.capped and audit.seeds_done == audit.runs["solution"] == 10
    assert audit.seconds == 10
    assert "seeds 10/100 (time cap 10 s)" in summary_line(audit)
    (audit,) = audit_kernel(kernel, 5, time_cap=10)
    assert not audit.capped and audit.seeds_done == 5 and "seeds 5/5 " in summary_line(audit)


def test_a_wrong_run_with_any_point_counts_as_scored():
    wrong = {"half_right": ("ex", "x = 1"), "all_wrong": ("ex", "x = 0")}
    scores = {None: 2.0, "x = 1": 1.0, "x = 0": 0.0}
    kernel = _FakeKernel(0.0, lambda source, key: scores[source])
    (audit,) = audit_kernel(kernel, 4, wrong=wrong)
    assert [(f.variant, f.score) for f in audit.failures] == [("half_right", 1.0)] * 4
    assert "wrong 4/8 scored (half_right on seeds" in summary_line(audit)


def test_a_wrong_variant_scoring_on_some_seeds_is_reported_with_those_seeds(tmp_path, capsys):
    """The fixture's ``double_right_on_even_seeds`` earns the point on even seeds only: the audit
    names exactly those seeds (with the key and student that replay each), the always-wrong
    variant none, and exits 1; the replay of one of them says it is unfair."""
    wrong, valid = wrong_variants("90-fixture"), valid_variants("90-fixture", FIXTURES)
    assert set(wrong) == {"double_right_on_even_seeds", "double_times_three"}
    noisy = {f"{e}__{n}" for e in ("double", "halve", "triple") for n in ("warns", "logs")}
    assert set(valid) == {"double_by_add", *noisy}  # each solution made to warn and to log
    course = tmp_path / "course"
    shutil.copytree(FIXTURES / "solutions" / "90-fixture", course / "solutions" / "90-fixture")
    key = next(  # one key for every seed: the students audit-0..5 have seeds of both parities
        f"k{n}"
        for n in range(100)
        if len({seed_for(f"k{n}", f"audit-{i}", "double") % 2 for i in range(6)}) == 2
    )
    seeds = [seed_for(key, f"audit-{i}", "double") for i in range(6)]
    even = [i for i, seed in enumerate(seeds) if seed % 2 == 0]
    found = tmp_path / "audit.json"
    args = ["90-fixture", "--root", str(course), "--exercise", "double", "--key", key]
    assert main([*args, "--variants", "--seeds", "6", "--json", str(found)]) == 1
    out = capsys.readouterr().out
    listed = ", ".join(str(seeds[i]) for i in even)
    assert "seeds 6/6" in out and "solution 0/6 lost" in out and "valid 0/18 lost" in out
    assert f"wrong {len(even)}/12 scored (double_right_on_even_seeds on seeds {listed})" in out
    assert "any point (score > 0)" in out and "lost points: none" in out
    for i in even:
        replay = f"--variant double_right_on_even_seeds --key {key} --student audit-{i}"
        assert f"seed {seeds[i]}: 1/1\n    replay: python -m grader.audit 90-fixture" in out
        assert replay in out
    record = json.loads(found.read_text())
    assert record["lesson"] == "90-fixture" and record["seeds"] == 6
    assert record["commit"] is None and record["uncommitted"] == []  # not a git checkout
    (audit,) = record["audits"]
    assert audit["runs"] == {
        "solution": 6,
        "double_by_add": 6,
        "double__warns": 6,
        "double__logs": 6,
        "double_right_on_even_seeds": 6,
        "double_times_three": 6,
    }
    assert audit["kinds"]["double_times_three"] == "wrong"
    assert [
        (f["variant"], f["kind"], f["key"], f["student"], f["seed"]) for f in audit["failures"]
    ] == [("double_right_on_even_seeds", "wrong", key, f"audit-{i}", seeds[i]) for i in even]
    replay = [*args, "--variant", "double_right_on_even_seeds", "--student", f"audit-{even[0]}"]
    assert main(replay) == 1
    assert f"[wrong double_right_on_even_seeds] seed {seeds[even[0]]}: 1/1 UNFAIR" in (
        capsys.readouterr().out
    )


def test_valid_variants_are_found_for_the_course_lessons():
    found = valid_variants("02-loss-scaling")
    assert found and all(len(v) == 2 for v in found.values())


@pytest.mark.parametrize("lesson", ["01-number-formats", "02-loss-scaling", "03-autocast"])
def test_every_exercise_has_three_wrong_and_two_valid_variants(lesson):
    entry = LESSONS[lesson]
    nb = nbformat.read(entry.notebook, as_version=4)
    ids = [c.metadata.get("nbgrader", {}).get("grade_id") for c in nb.cells]
    exercises = [gid for gid in ids if gid and f"{gid}_tests" in ids]
    module = entry.variants()
    for exercise in exercises:
        wrong = [n for n, (gid, _) in module.VARIANTS.items() if gid == exercise]
        valid = [n for n, (gid, _) in module.VALID.items() if gid == exercise]
        assert len(wrong) >= 3, f"{exercise}: only {wrong} wrong variants"
        assert len(valid) >= 2, f"{exercise}: only {valid} valid variants"
