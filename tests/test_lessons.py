"""Every lesson: the solution earns full marks on fresh seeds, the unfilled release zero, wrong
answers lose their exercise's points and valid alternatives keep them.

Each lesson's solution is executed once per session in one kernel; variants and extra seeds re-run
only their own exercise there (see conftest and :mod:`grader.seam`).
"""

from __future__ import annotations

import ast
import re
import secrets

import pytest

from grader.seam import bound_names, is_test_cell
from tests.conftest import (
    BROKEN,
    LESSON_IDS,
    NOISY_EXERCISES,
    SEED_SAMPLE,
    VALID_VARIANTS,
    WRONG_VARIANTS,
    outputs_text,
)

pytestmark = pytest.mark.lesson


def _grouped(lesson: str, *values: str):
    """One xdist group per lesson, so a lesson's tests share one worker and one kernel."""
    return pytest.param(lesson, *values, marks=pytest.mark.xdist_group(lesson))


LESSONS = [_grouped(lesson) for lesson in LESSON_IDS]
WRONG = [_grouped(lesson, name) for lesson, table in WRONG_VARIANTS.items() for name in table]
VALID = [_grouped(lesson, name) for lesson, table in VALID_VARIANTS.items() for name in table]


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_earns_full_marks(graded, lesson):
    cells = graded.solution_scores(lesson)
    tests = {gid: c for gid, c in cells.items() if gid.endswith("_tests")}
    assert tests, f"{lesson} has no autograded test cells"
    lost = {gid: (c.score, c.max_score) for gid, c in tests.items() if c.score != c.max_score}
    assert not lost, f"{lesson}: the solution loses points on {lost}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_passes_fresh_hidden_seeds(graded, lesson):
    kernel = graded.kernel(lesson)
    failures = []
    for grade_id in kernel.exercises():
        for _ in range(SEED_SAMPLE):
            key = secrets.token_hex(8)
            run = kernel.run_exercise(grade_id, key=key, student="seed-sample")
            if not run.passed:
                failures.append(f"{grade_id} with grading key {key!r}: {run.error}")
    assert not failures, f"{lesson}: the solution lost points on\n" + "\n".join(failures)


@pytest.mark.parametrize("lesson", LESSONS)
def test_unfilled_release_earns_zero(graded, lesson):
    cells = graded.unfilled_scores(lesson)
    earned = {gid: c.score for gid, c in cells.items() if c.score != 0}
    assert not earned, f"{lesson}: the unfilled notebook earns points on {earned}"
    assert any(c.max_score > 0 for c in cells.values())


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_has_written_question_graded_by_hand(graded, lesson):
    cells = graded.solution_scores(lesson)
    manual = [gid for gid, c in cells.items() if not c.auto]
    assert manual, f"{lesson} has no written answer left for manual grading"


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_runs_without_errors_or_torch_deprecations(graded, lesson):
    nb = graded.executed(lesson)
    errors = [
        (i, out.get("ename"), out.get("evalue"))
        for i, cell in enumerate(nb["cells"])
        for out in cell.get("outputs", [])
        if out.get("output_type") == "error"
    ]
    assert not errors, f"{lesson}: cells raised {errors}"
    text = outputs_text(nb)
    for word in ("FutureWarning", "DeprecationWarning"):
        assert word not in text, f"{lesson} printed a {word}:\n{text}"


@pytest.mark.parametrize("lesson,variant", WRONG)
def test_wrong_exercise_loses_its_points(graded, lesson, variant):
    grade_id = WRONG_VARIANTS[lesson][variant][0]
    run = graded.variant(lesson, variant)
    assert run.score == 0, f"{variant}: {grade_id}_tests still earned {run.score}/{run.max_score}"
    assert run.error, f"{variant}: scored zero without an error message"
    broken = [name for name in BROKEN if run.error.startswith(name) or f"\n{name}" in run.error]
    assert not broken and "the solution cell itself raised" not in run.error, (
        f"{variant} is broken rather than wrong (its failure teaches nothing):\n{run.error}"
    )


@pytest.mark.parametrize("lesson,variant", VALID)
def test_valid_alternative_keeps_full_marks(graded, lesson, variant):
    grade_id = VALID_VARIANTS[lesson][variant][0]
    run = graded.variant(lesson, variant)
    assert run.passed, (
        f"{variant} (a correct {grade_id}) lost points: {run.score}/{run.max_score}\n{run.error}"
    )


NOISY = [_grouped(lesson, *NOISY_EXERCISES[lesson]) for lesson in LESSON_IDS]


@pytest.mark.parametrize("lesson,exercise,noise", NOISY)
def test_a_correct_answer_that_warns_or_logs_keeps_its_points(graded, lesson, exercise, noise):
    """The solution made to warn (or log) every time it is called (grader.audit.make_noisy):
    what it writes is shown in the test cell (on stderr; a rank's lines are replayed on stdout),
    and costs nothing (nbgrader alone would score stderr 0:
    course.selfcheck.warnings_are_not_failures)."""
    run = graded.variant(lesson, f"{exercise}__{noise}")
    said = {"warns": "a correct answer that warns", "logs": "a correct answer that logs"}[noise]
    assert said in run.printed, f"{exercise}: the {noise} variant printed nothing: {run}"
    assert run.passed, f"{exercise} ({noise}) lost points: {run.score}/{run.max_score}\n{run.error}"


#: Names IPython itself rebinds at every execution (output and input history), not a student's.
IPYTHON_NAMES = re.compile(r"_+|_i+|_i?\d+|_[ido]h|In|Out|exit|quit|get_ipython")


@pytest.mark.parametrize("lesson", LESSONS)
def test_student_globals_named_like_the_tests_names_are_kept(graded, lesson):
    """A student global named like any name a test cell binds (its helpers, references, inputs,
    loop variables) keeps its value and is what the student's code reads after the test; the
    solution beside them keeps full marks."""
    kernel = graded.kernel(lesson)
    cells = [c for c in kernel.source.cells if c.cell_type == "code"]
    lesson_names = set().union(*(bound_names(c.source) for c in cells if not is_test_cell(c)))
    checked = 0
    for grade_id in kernel.exercises():
        solution = kernel.cell_of(grade_id).source
        in_solution = {n.id for n in ast.walk(ast.parse(solution)) if isinstance(n, ast.Name)}
        in_solution |= set(bound_names(solution))
        names = [
            n
            for n in bound_names(kernel.cell_of(f"{grade_id}_tests").source)
            if n not in lesson_names
            and n not in in_solution
            and not n.startswith("__")
            and not IPYTHON_NAMES.fullmatch(n)
        ]
        if not names:
            continue
        mine = "".join(f"{n} = ('student', {n!r})\n" for n in names)
        reader = f"def _student_reads(): return [{', '.join(names)}]\n"
        run = kernel.run_exercise(grade_id, solution + "\n\n" + mine + reader)
        assert run.passed, f"{grade_id} lost points beside globals named {names}:\n{run.error}"
        kept = kernel.run_code(
            f"print(_student_reads() == [('student', n) for n in {names!r}] and all("
            f"globals()[n] == ('student', n) for n in {names!r}))\n"
            f"for _n in {names + ['_student_reads']!r}: globals().pop(_n)\n"
        )
        assert kept.strip() == "True", f"{grade_id}'s test took a student's name among {names}"
        checked += len(names)
    assert checked, f"{lesson}: no test cell binds a name of its own"


@pytest.mark.xdist_group("09-capstone")
def test_capstone_parity_is_judged_against_the_seed_spread(graded):
    """Lesson 09's parity cell runs each 16-bit format on three seeds, prints each AMP-minus-fp32
    difference, and the spread it sets them beside is the fp32 losses' own (largest minus
    smallest, over the seeds it printed)."""
    text = outputs_text(graded.executed("09-capstone"))
    row = re.compile(
        r"seed (\d): validation loss fp32 ([\d.]+), (bf16|fp16) AMP ([\d.]+), difference (\S+)"
    )
    spread_line = re.compile(r"seed-to-seed spread of the fp32 validation loss (\S+);")
    rows = row.findall(text)
    spreads = [float(s) for s in spread_line.findall(text)]
    assert len(spreads) == 2, text
    for label, spread in zip(("bf16", "fp16"), spreads, strict=True):
        mine = [r for r in rows if r[2] == label]
        assert [int(r[0]) for r in mine] == [0, 1, 2], f"{label}: seeds {mine}"
        fp32 = [float(r[1]) for r in mine]
        assert spread == pytest.approx(max(fp32) - min(fp32), rel=0.01, abs=1e-5), (label, fp32)
        assert spread > 0, f"{label}: three seeds gave one fp32 loss"
        for _seed, f, _label, amp, diff in mine:
            assert float(diff) == pytest.approx(float(amp) - float(f), rel=0.01, abs=1.5e-5)
    assert re.search(r"\d[\d,]* of [\d,]+ would round to zero in float16", text), text
