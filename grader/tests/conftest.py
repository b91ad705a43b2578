"""Fixtures for the grader's tests: a scratch course holding the small fixture lesson."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from grader import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"


def make_course(dest: Path) -> Path:
    """A course directory with the repo's nbgrader config and the fixture lesson's solutions."""
    (dest / "grader").mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", dest / "nbgrader_config.py")
    shutil.copy2(
        REPO_ROOT / "grader" / "nbgrader_config.py", dest / "grader" / "nbgrader_config.py"
    )
    shutil.copytree(FIXTURES / "solutions", dest / "solutions", dirs_exist_ok=True)
    return dest


@pytest.fixture
def course(tmp_path: Path) -> Path:
    return make_course(tmp_path / "course")


def need_bwrap() -> None:
    """Skip (or fail under CI=true) when bubblewrap cannot sandbox here."""
    from grader.sandbox import bwrap_problem

    problem = bwrap_problem()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the grader's sandbox is required in CI: {problem}")
        pytest.skip(problem)
