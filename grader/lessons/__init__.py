"""Every lesson's pieces, found from its id: its notebook, the course modules it teaches with, its
grading and its tests.

A lesson's grading is one package, ``grader/lessons/lNN_<name>/``: ``inputs.py`` (the hidden
tests' inputs, built from a seed, and their drivers: the hidden part of a test cell calls one; the
sandbox mounts it, see :mod:`grader.lessons.drive`), ``judge.py`` (the judges, which build the same
inputs with the same functions, run in the grader's process and are never mounted in the sandbox:
see :mod:`grader.judge`) and ``variants.py`` (``VARIANTS``, wrong answers that must score zero, and
``VALID``, correct answers written differently that must keep full marks: ``{name: (grade_id,
source of the solution cell)}``; :mod:`grader.audit` and the suite grade them).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: The repository root. Not ``grader.REPO_ROOT``: nbgrader runs the grader's config from a course
#: folder whose ``grader/`` (the config's folder) makes ``grader`` a namespace package there, and
#: ``grader/__init__.py`` never runs.
REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Lesson:
    """One lesson: its id (``04-batchnorm``), its grading package, the ``course`` modules it
    introduces, and its topic tests (paths from the repository root)."""

    id: str
    grading: str
    helpers: tuple[str, ...]
    tests: tuple[str, ...]

    @property
    def notebook(self) -> Path:
        """The instructor's notebook (solutions and hidden tests)."""
        return REPO_ROOT / "solutions" / self.id / f"{self.id}.ipynb"

    @property
    def folder(self) -> Path:
        """The grading package's folder."""
        return REPO_ROOT / Path(*self.grading.split("."))

    def judge(self) -> ModuleType:
        """The judges' module (``JUDGES = {grade_id: (exercise, judge)}``)."""
        return importlib.import_module(f"{self.grading}.judge")

    def variants(self) -> ModuleType:
        """The variants' module (``VARIANTS`` and ``VALID``)."""
        return importlib.import_module(f"{self.grading}.variants")


#: The drivers' observer, which the harness (``grader/harness.py``) hands them in the kernel.
OBSERVER_FILE = Path(__file__).resolve().parent / "observer.py"


def kernel_files() -> list[tuple[Path, str]]:
    """The grading files a kernel reads (the harness, the observer, the drivers and their inputs,
    never a judge), with their paths relative to an import root: what the sandbox mounts beside
    ``course``."""
    here = OBSERVER_FILE.parent
    files = [here.parent / "harness.py", here / "drive.py", OBSERVER_FILE]
    files += sorted(here.glob("l[0-9][0-9]_*/inputs.py"))
    files += [entry.folder / "inputs.py" for entry in TEST_LESSONS.values()]
    return [(f, f.relative_to(REPO_ROOT).as_posix()) for f in files]


def lesson(lesson_id: str) -> Lesson | None:
    """The lesson ``lesson_id``, one of the course's or of the grader's tests (None: neither)."""
    return LESSONS.get(lesson_id) or TEST_LESSONS.get(lesson_id)


#: The course's lessons, in order.
LESSONS: dict[str, Lesson] = {
    lesson.id: lesson
    for lesson in (
        Lesson(
            "01-number-formats",
            "grader.lessons.l01_number_formats",
            ("course.formats", "course.data", "course.plotting", "course.widgets"),
            ("tests/test_formats.py", "tests/test_course_basics.py"),
        ),
        Lesson(
            "02-loss-scaling",
            "grader.lessons.l02_loss_scaling",
            ("course.loss_scaling",),
            ("tests/test_loss_scaling.py",),
        ),
        Lesson(
            "03-autocast",
            "grader.lessons.l03_autocast",
            ("course.autocast",),
            ("tests/test_autocast.py",),
        ),
        Lesson(
            "04-batchnorm",
            "grader.lessons.l04_batchnorm",
            ("course.normalization",),
            ("tests/test_normalization.py",),
        ),
        Lesson(
            "05-accumulation",
            "grader.lessons.l05_accumulation",
            ("course.accumulation",),
            ("tests/test_accumulation.py",),
        ),
        Lesson(
            "06-multi-gpu",
            "grader.lessons.l06_multi_gpu",
            ("course.multigpu", "course.ddp_train", "course.launch"),
            ("tests/test_distributed.py",),
        ),
        Lesson(
            "07-sharded",
            "grader.lessons.l07_sharded",
            ("course.sharded",),
            ("tests/test_sharded.py",),
        ),
        Lesson(
            "08-float8",
            "grader.lessons.l08_float8",
            ("course.float8",),
            ("tests/test_float8.py",),
        ),
        Lesson(
            "09-capstone",
            "grader.lessons.l09_capstone",
            ("course.gpt", "course.gpt_train", "course.capstone", "course.benchmark"),
            ("tests/test_gpt.py", "tests/test_benchmark.py"),
        ),
    )
}
#: The ``course`` modules every lesson uses (no lesson introduces them).
SHARED = ("course", "course.device", "course.checks", "course.selfcheck")

#: The lessons the grader's own tests grade (``grader/tests/fixtures``): found by :func:`lesson`
#: like the course's, graded the same way, never listed with them.
TEST_LESSONS: dict[str, Lesson] = {
    "90-fixture": Lesson("90-fixture", "grader.tests.fixtures.l90_fixture", (), ()),
}
