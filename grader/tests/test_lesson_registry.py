"""The lesson registry (grader/lessons/__init__.py): every lesson has one entry, and each entry's
notebook, helper modules, grading package and tests exist; every course module belongs to one
lesson or to all of them."""

from __future__ import annotations

import importlib

from grader import REPO_ROOT
from grader.judge import judges
from grader.lessons import LESSONS, SHARED
from grader.release import lesson_ids


def test_every_lesson_has_one_entry_and_its_pieces_exist():
    assert list(LESSONS) == lesson_ids(REPO_ROOT / "solutions")
    for entry in LESSONS.values():
        assert entry.notebook.is_file(), entry
        assert sorted(p.name for p in entry.folder.glob("*.py")) == [
            "__init__.py",
            "judge.py",
            "variants.py",
        ], entry
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
    assert ids < set(judges()) and judges("90-fixture") == {}


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
