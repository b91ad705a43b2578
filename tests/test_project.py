"""Project plumbing: dependencies agree, the README's commands are the ones CI runs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from grader import REPO_ROOT


def _pyproject() -> dict:
    return tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())


def _environment_pip() -> list[str]:
    lines = (REPO_ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    return [
        line.strip()[2:].strip() for line in lines[start + 1 :] if line.strip().startswith("- ")
    ]


def test_environment_yml_agrees_with_pyproject():
    deps = sorted(_pyproject()["project"]["dependencies"])
    assert sorted(_environment_pip()) == deps
    names = {re.split(r"[<>=!~ \[]", d)[0].lower() for d in deps}
    assert {"torch", "jupyterlab", "nbgrader", "matplotlib", "ipywidgets"} <= names


def test_readme_quick_start_is_what_ci_runs():
    readme = (REPO_ROOT / "README.md").read_text()
    ci = (REPO_ROOT / ".ci" / "run").read_text()
    assert "python3 run.py lab" in readme
    assert "python3 run.py test" in readme
    assert "python3 run.py site" in readme
    assert re.search(r"^python3 run\.py test$", ci, re.M), ".ci/run must call the README command"


def test_ignored_runtime_state():
    ignored = (REPO_ROOT / ".gitignore").read_text().split()
    for name in ("submitted/", "autograded/", "feedback/", "gradebook.db", ".venv/"):
        assert name in ignored


def test_code_is_linted_and_formatted():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    paths = ["course", "grader", "tests", "scripts", "website", "run.py"]
    lint = subprocess.run([ruff, "check", *paths], cwd=REPO_ROOT, capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    fmt = subprocess.run(
        [ruff, "format", "--check", *paths], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert fmt.returncode == 0, fmt.stdout + fmt.stderr


def test_readme_lists_every_lesson_with_its_exercises():
    """The README's lesson table names each lesson in solutions/ and exactly its exercises."""
    import json

    from grader.release import lesson_ids

    readme = (REPO_ROOT / "README.md").read_text()
    rows = {
        m.group(1): set(re.findall(r"`([a-z0-9_]+)`", m.group(2)))
        for m in re.finditer(r"^\| `(\d\d-[a-z0-9-]+)` \|[^|]*\| (.*) \|$", readme, re.M)
    }
    solutions = REPO_ROOT / "solutions"
    assert sorted(rows) == lesson_ids(solutions)
    for lesson, listed in rows.items():
        nb = json.loads((solutions / lesson / f"{lesson}.ipynb").read_text())
        exercises = {
            c["metadata"]["nbgrader"]["grade_id"]
            for c in nb["cells"]
            if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("solution")
        }
        assert listed == exercises, (
            f"README row of {lesson}: {sorted(listed)} != {sorted(exercises)}"
        )
