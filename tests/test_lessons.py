"""Every lesson: the solution earns full marks, the unfilled release zero, wrong answers lose
exactly their exercise's points. Each lesson is executed once per session (see conftest)."""

from __future__ import annotations

import pytest

from tests.conftest import LESSON_IDS, WRONG_VARIANTS, outputs_text, round_student, variant_rounds

pytestmark = pytest.mark.lesson

#: One xdist group per lesson, so a lesson's tests share one worker and one autograde run.
LESSONS = [pytest.param(lesson, marks=pytest.mark.xdist_group(lesson)) for lesson in LESSON_IDS]
VARIANTS = [
    pytest.param(lesson, name, marks=pytest.mark.xdist_group(lesson))
    for lesson, variants in WRONG_VARIANTS.items()
    for name in variants
]


def _auto(cells):
    return {gid: c for gid, c in cells.items() if c.auto or gid.endswith("_tests")}


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_earns_full_marks(graded, lesson):
    cells = graded.scores(lesson)["solution"]
    tests = {gid: c for gid, c in cells.items() if gid.endswith("_tests")}
    assert tests, f"{lesson} has no autograded test cells"
    lost = {gid: (c.score, c.max_score) for gid, c in tests.items() if c.score != c.max_score}
    assert not lost, f"{lesson}: the solution loses points on {lost}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_unfilled_release_earns_zero(graded, lesson):
    cells = graded.scores(lesson)["unfilled"]
    earned = {gid: c.score for gid, c in cells.items() if c.score != 0}
    assert not earned, f"{lesson}: the unfilled notebook earns points on {earned}"
    assert any(c.max_score > 0 for c in cells.values())


@pytest.mark.parametrize("lesson", LESSONS)
def test_lesson_has_written_question_graded_by_hand(graded, lesson):
    cells = graded.scores(lesson)["solution"]
    manual = [gid for gid, c in cells.items() if not c.auto]
    assert manual, f"{lesson} has no written answer left for manual grading"


@pytest.mark.parametrize("lesson", LESSONS)
def test_solution_runs_without_errors_or_torch_deprecations(graded, lesson):
    nb = graded.executed(lesson, "solution")
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


@pytest.mark.parametrize("lesson,variant", VARIANTS)
def test_wrong_exercise_loses_exactly_its_points(graded, lesson, variant):
    grade_id = WRONG_VARIANTS[lesson][variant][0]
    rounds = variant_rounds(lesson)
    index = next(i for i, packed in enumerate(rounds) if packed.get(grade_id) == variant)
    wrong_ids = {f"{gid}_tests" for gid in rounds[index]}
    scores = graded.scores(lesson)
    wrong = scores[round_student(index)]
    right = scores["solution"]
    cell = wrong[f"{grade_id}_tests"]
    assert cell.score == 0, f"{variant}: {grade_id}_tests still earned {cell.score}"
    for gid, other in _auto(wrong).items():
        if gid not in wrong_ids:
            assert other.score == right[gid].score, (
                f"{variant} (graded together with {sorted(rounds[index].values())}): {gid} "
                f"changed from {right[gid].score} to {other.score}"
            )
