"""Every notebook: no outputs committed, the same opening, goals, widget, written answer."""

from __future__ import annotations

import json

import pytest

from grader import REPO_ROOT
from tests.conftest import LESSON_IDS

NOTEBOOKS = sorted(
    p.relative_to(REPO_ROOT)
    for folder in ("solutions", "lessons")
    for p in (REPO_ROOT / folder).rglob("*.ipynb")
    if ".ipynb_checkpoints" not in p.parts
)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=str)
def test_committed_without_outputs(path):
    nb = json.loads((REPO_ROOT / path).read_text(encoding="utf-8"))
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [], f"{path} cell {i} has outputs"
            assert cell.get("execution_count") is None, f"{path} cell {i} has an execution count"


@pytest.mark.parametrize("lesson", LESSON_IDS)
def test_lesson_opens_with_goals_and_setup(lesson):
    nb = json.loads((REPO_ROOT / "solutions" / lesson / f"{lesson}.ipynb").read_text())
    first_md = "".join(nb["cells"][0]["source"])
    assert first_md.startswith(f"# {lesson[:2]} "), f"{lesson} should open with its title"
    assert "Learning goals" in first_md, f"{lesson} should state learning goals first"
    # The first code cell is the hosted-notebook setup (tests/test_hosted.py); the first one that
    # imports the course calls course.setup.
    first_code = next(
        src
        for c in nb["cells"]
        if c["cell_type"] == "code" and "import course" in (src := "".join(c["source"]))
    )
    assert "course.setup(" in first_code, f"{lesson}'s first course cell should call course.setup"


@pytest.mark.parametrize("lesson", LESSON_IDS)
def test_lesson_has_widget_exercises_and_written_question(lesson):
    nb = json.loads((REPO_ROOT / "solutions" / lesson / f"{lesson}.ipynb").read_text())
    meta = [c["metadata"].get("nbgrader", {}) for c in nb["cells"]]
    solutions = [m["grade_id"] for m in meta if m.get("solution") and not m.get("grade")]
    tests = {m["grade_id"] for m in meta if m.get("grade") and not m.get("solution")}
    written = [m for m in meta if m.get("grade") and m.get("solution")]
    assert solutions, f"{lesson} has no exercises"
    for gid in solutions:
        assert f"{gid}_tests" in tests, f"{lesson}: exercise {gid} has no {gid}_tests cell"
    assert written, f"{lesson} has no written question graded by hand"
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert "course." in code and ("Explorer" in code or "widget" in code.lower()), (
        f"{lesson} shows no widget"
    )


def test_lessons_use_current_amp_api_only():
    for path in NOTEBOOKS:
        nb = json.loads((REPO_ROOT / path).read_text())
        for cell in nb["cells"]:
            if cell["cell_type"] != "code":
                continue
            src = "".join(cell["source"])
            for old in ("torch.cuda.amp.", "torch.cpu.amp."):
                assert old not in src, f"{path} uses the deprecated {old}* API in code"
