"""The lesson registry (grader/lessons/__init__.py): every lesson has one entry, and each entry's
notebook, helper modules, grading package and tests exist; every course module belongs to one
lesson or to all of them. Hidden tests are written once: a test cell's hidden part calls its
lesson's driver, whose inputs the judge builds with the same functions."""

from __future__ import annotations

import ast
import importlib
import inspect
import sys

import nbformat
import pytest

from grader import REPO_ROOT
from grader.judge import judges
from grader.lessons import LESSONS, SHARED
from grader.release import lesson_ids


def _hidden_parts(lesson: str) -> dict[str, str]:
    nb = nbformat.read(LESSONS[lesson].notebook, as_version=4)
    parts = {}
    for cell in nb.cells:
        if "### BEGIN HIDDEN TESTS" in cell.source:
            hidden = cell.source.split("### BEGIN HIDDEN TESTS")[1].split("### END HIDDEN TESTS")[0]
            parts[cell.metadata["nbgrader"]["grade_id"]] = hidden
    return parts


@pytest.mark.parametrize("lesson", list(LESSONS))
def test_a_hidden_test_is_one_call_to_its_lessons_driver(lesson):
    """The hidden part imports ``drive_<exercise>`` from the lesson's ``inputs`` and calls it with
    the test cell's globals; the driver observes that exercise (the judge's), and the judge builds
    its inputs from the same module."""
    entry = LESSONS[lesson]
    inputs = importlib.import_module(f"{entry.grading}.inputs")
    judged = entry.judge().JUDGES
    parts = _hidden_parts(lesson)
    assert sorted(parts) == sorted(judged), lesson
    for grade_id, hidden in parts.items():
        exercise = judged[grade_id][0]
        body = ast.parse(hidden).body
        assert len(body) == 2, (grade_id, hidden)
        imported, called = body
        assert isinstance(imported, ast.ImportFrom) and imported.module == f"{entry.grading}.inputs"
        assert [a.name for a in imported.names] == [f"drive_{exercise}"], grade_id
        call = called.value if isinstance(called, ast.Expr) else None
        assert isinstance(call, ast.Call) and ast.unparse(call.func) == f"drive_{exercise}"
        assert ast.unparse(call.args[0]) == "globals()", grade_id
        driver = inspect.getsource(getattr(inputs, f"drive_{exercise}"))
        assert f'observer("{exercise}", namespace)' in driver, grade_id
    assert f"from {entry.grading}.inputs import" in inspect.getsource(entry.judge())


def test_every_lesson_has_one_entry_and_its_pieces_exist():
    assert list(LESSONS) == lesson_ids(REPO_ROOT / "solutions")
    for entry in LESSONS.values():
        assert entry.notebook.is_file(), entry
        expected = {"__init__.py", "inputs.py", "judge.py", "variants.py"}
        assert {p.name for p in entry.folder.glob("*.py")} == expected, entry
        assert entry.judge().JUDGES and entry.variants().VARIANTS, entry
        for test in entry.tests:
            assert (REPO_ROOT / test).is_file(), (entry.id, test)
        for helper in entry.helpers:
            importlib.import_module(helper)


def test_every_course_module_belongs_to_one_lesson_or_to_all():
    modules = {
        "course" if p.stem == "__init__" else f"course.{p.stem}"
        for p in (REPO_ROOT / "course").glob("*.py")
    }
    owners = [h for entry in LESSONS.values() for h in entry.helpers] + list(SHARED)
    assert sorted(owners) == sorted(modules)  # each once, none missing, none made up


def test_judges_are_found_by_lesson():
    ids = set(judges("04-batchnorm"))
    assert ids == set(LESSONS["04-batchnorm"].judge().JUDGES)
    assert ids < set(judges()) and judges("99-none") == {}
    fixture = set(judges("90-fixture"))  # a lesson of the grader's tests, not among every lesson's
    assert fixture == {"double_tests", "halve_tests", "triple_tests"} and not fixture & set(
        judges()
    )


def test_the_registry_loads_where_nbgrader_grades(tmp_path):
    """nbgrader runs the grader's config in a course folder whose ``grader/`` holds the config:
    there ``grader`` is a namespace package (its ``__init__`` never runs), and the judges and
    the registry must still load."""
    import subprocess
    import sys

    (tmp_path / "grader").mkdir()
    (tmp_path / "grader" / "nbgrader_config.py").write_text("")
    code = (
        "import grader, grader.execute\n"
        "from grader.judge import judges\n"
        "assert not hasattr(grader, 'REPO_ROOT')  # the namespace package, as nbgrader sees it\n"
        "assert judges('01-number-formats')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-2000:]


@pytest.mark.parametrize("lesson", list(LESSONS))
def test_a_lessons_drivers_import_only_what_the_sandbox_mounts_and_hold_no_reference(lesson):
    """``inputs.py`` runs in the student's kernel: it imports only torch, the standard library,
    ``course`` and ``grader.lessons.drive`` (what the sandbox mounts), defines no reference
    (``_ref_*``), and every driver ends with ``obs.done()``."""
    path = LESSONS[lesson].folder / "inputs.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or ""]
        else:
            continue
        for name in names:
            top = name.split(".")[0]
            allowed = top in ("__future__", "torch", "course") or name == "grader.lessons.drive"
            assert allowed or top in sys.stdlib_module_names, (lesson, name)
    defined = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert not [n for n in defined if n.lstrip("_").startswith("ref")], (lesson, defined)
    drivers = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("drive_")
    ]
    assert drivers, lesson
    for driver in drivers:
        assert ast.unparse(driver.body[-1]) == "obs.done()", (lesson, driver.name)
