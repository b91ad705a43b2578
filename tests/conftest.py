"""Shared fixtures: each lesson is executed once per test run and the result reused."""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import os
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from grader import REPO_ROOT
from grader.audit import declared_variants, noisy_variants
from grader.gradebook import CellScore
from grader.lessons import LESSONS as GRADING
from grader.release import lesson_ids
from grader.seam import ExerciseRun, LessonKernel

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

SOLUTIONS = REPO_ROOT / "solutions"
LESSONS = REPO_ROOT / "lessons"
LESSON_IDS = lesson_ids(SOLUTIONS)


def _load_variants() -> tuple[dict[str, dict[str, tuple[str, str]]], dict[str, dict]]:
    """Wrong (``VARIANTS``) and valid (``VALID``) versions of each lesson's exercises, from its
    grading package (:mod:`grader.lessons`): ``{lesson: {name: (grade_id, source of the solution
    cell)}}``. Every wrong variant must score zero on its exercise's test cell
    (``<grade_id>_tests``); every valid one must keep full marks.
    """
    wrong = {lesson: declared_variants(lesson, "VARIANTS") for lesson in GRADING}
    valid = {lesson: declared_variants(lesson, "VALID") for lesson in GRADING}
    return wrong, valid


WRONG_VARIANTS, VALID_VARIANTS = _load_variants()

#: One exercise per lesson whose solution the suite also grades made to warn or to log (every
#: exercise, both ways, is in ``python -m grader.audit LESSON --variants``): it must keep its
#: points, with the warning or the log line shown in the test cell.
NOISY_EXERCISES = {
    "01-number-formats": ("underflow_fraction", "warns"),
    "02-loss-scaling": ("dynamic_loss_scaler", "logs"),
    "03-autocast": ("custom_fwd_function", "warns"),
    "04-batchnorm": ("keep_norm_fp32", "logs"),
    "05-accumulation": ("accumulated_step", "warns"),
    "06-multi-gpu": ("ddp_amp_worker", "logs"),
    "07-sharded": ("stochastic_round_bf16", "warns"),
    "08-float8": ("current_scaling", "logs"),
    "09-capstone": ("transformer_flops", "warns"),
}

#: Extra hidden-test seeds per exercise each run (keys drawn afresh): the solution must pass
#: them all. A small sample in every run; ``python -m grader.audit`` runs hundreds.
SEED_SAMPLE = int(os.environ.get("COURSE_SEED_SAMPLE", "2"))

#: Exceptions that mean a variant is broken, not wrong: its failure would teach nothing.
BROKEN = ("NameError", "SyntaxError", "IndentationError", "ImportError", "ModuleNotFoundError")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def serving_folder(folder: Path) -> Iterator[str]:
    """Serve ``folder``'s files on a loopback port for the duration; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextlib.contextmanager
def serving(
    cmd: list[str], port: int, log: Path, what: str, timeout: float, **popen
) -> Iterator[subprocess.Popen]:
    """Run ``cmd`` (output to ``log``) until it listens on ``port``; stop it afterwards.

    Fails the test with the log's end if the server exits or does not listen within
    ``timeout`` seconds.
    """
    with open(log, "w") as out:
        server = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, **popen)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if server.poll() is not None:
                    pytest.fail(f"{what} exited:\n{log.read_text()[-3000:]}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        pytest.fail(f"{what} did not start within {timeout:.0f} s")
                    time.sleep(0.5)
            yield server
        finally:
            server.terminate()
            try:
                server.wait(20)
            except subprocess.TimeoutExpired:
                server.kill()


def lesson_notebook(folder: Path, lesson: str) -> Path:
    return folder / lesson / f"{lesson}.ipynb"


@pytest.fixture(scope="session")
def artifacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where executed notebooks are kept for inspection ($COURSE_TEST_ARTIFACTS or a temp dir)."""
    override = os.environ.get("COURSE_TEST_ARTIFACTS")
    path = Path(override) if override else tmp_path_factory.mktemp("artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


class GradedLessons:
    """Each lesson executed once per session, in one kernel kept alive for its variants.

    The solution notebook (hidden tests included) runs top to bottom once in a
    :class:`grader.seam.LessonKernel`; its test cells are scored as nbgrader scores them. Wrong
    and valid variants, the released (unfilled) cells and extra seeds then re-run only their own
    exercise in that kernel.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self._stack = contextlib.ExitStack()
        self._kernels: dict[str, LessonKernel] = {}
        self._unfilled: dict[str, dict[str, CellScore]] = {}
        self._runs: dict[tuple[str, str], ExerciseRun] = {}
        self._broken: dict[str, str] = {}

    def close(self) -> None:
        self._stack.close()

    def kernel(self, lesson: str) -> LessonKernel:
        """The lesson's kernel, after one full run of its solution notebook.

        A lesson that cannot be executed (a cell past its time limit, a dead kernel) fails the
        first test that needs it with the cause; every later test that needs it is skipped,
        naming the lesson and the cause, instead of failing again for another reason.
        """
        if lesson in self._broken:
            pytest.skip(f"{lesson} could not be executed (reported once): {self._broken[lesson]}")
        if lesson not in self._kernels:
            work = self.root / lesson / "work"
            shutil.rmtree(work, ignore_errors=True)
            shutil.copytree(SOLUTIONS / lesson, work)
            # One compute thread, as the grader's sandbox gives a kernel: the suite's workers
            # share the machine's cores, and lessons full of small ops slow down many times
            # over when their threads outnumber the cores.
            env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            kernel = LessonKernel(work / f"{lesson}.ipynb", timeout=900, env=env)
            try:
                self._kernels[lesson] = self._stack.enter_context(kernel)
            except Exception as exc:
                self._broken[lesson] = f"{type(exc).__name__}: {str(exc)[:2000]}"
                raise
            print(f"{lesson}: solution executed in {kernel.seconds:.1f} s")
            keep = os.environ.get("COURSE_TEST_ARTIFACTS")
            if keep:
                dest = Path(keep) / lesson / f"{lesson}.executed.ipynb"
                dest.parent.mkdir(parents=True, exist_ok=True)
                nbformat.write(kernel.executed, dest)
        return self._kernels[lesson]

    def solution_scores(self, lesson: str) -> dict[str, CellScore]:
        """``{grade_id: CellScore}`` of the solution's full run."""
        return {
            gid: CellScore(gid, score, max_score, auto)
            for gid, (score, max_score, auto) in self.kernel(lesson).scores().items()
        }

    def unfilled_scores(self, lesson: str) -> dict[str, CellScore]:
        """``{test grade_id: CellScore}`` of each exercise left as the release leaves it.

        Each exercise's solution cell is replaced by the released (unfilled) cell of
        ``lessons/`` and its test cell, hidden tests included as nbgrader restores them, is
        scored in the lesson's kernel. (That ``lessons/`` is exactly nbgrader's release is
        checked by tests/test_release.py; real ``nbgrader autograde`` of a submission is
        exercised end to end by tests/test_class_term.py.)
        """
        if lesson not in self._unfilled:
            released = nbformat.read(lesson_notebook(LESSONS, lesson), as_version=4)
            by_id = {
                c.metadata.get("nbgrader", {}).get("grade_id"): c.source for c in released.cells
            }
            kernel = self.kernel(lesson)
            found = {}
            for grade_id in kernel.exercises():
                run = kernel.run_exercise(grade_id, by_id[grade_id])
                found[f"{grade_id}_tests"] = CellScore(
                    f"{grade_id}_tests", run.score, run.max_score, True
                )
            self._unfilled[lesson] = found
        return self._unfilled[lesson]

    def executed(self, lesson: str) -> dict:
        """The solution notebook as it ran (JSON)."""
        return json.loads(nbformat.writes(self.kernel(lesson).executed))

    def variant(self, lesson: str, name: str) -> ExerciseRun:
        """The score of one wrong or valid variant's exercise, run in the lesson's kernel."""
        key = (lesson, name)
        if key not in self._runs:
            table = {**WRONG_VARIANTS.get(lesson, {}), **VALID_VARIANTS.get(lesson, {})}
            if name not in table:
                table = noisy_variants(lesson_notebook(SOLUTIONS, lesson))
            grade_id, source = table[name]
            self._runs[key] = self.kernel(lesson).run_exercise(grade_id, source)
        return self._runs[key]


@pytest.fixture(scope="session")
def graded(tmp_path_factory: pytest.TempPathFactory):
    """The session's :class:`GradedLessons` (kernels shut down at the end)."""
    lessons = GradedLessons(tmp_path_factory.mktemp("graded"))
    yield lessons
    lessons.close()


def outputs_text(nb: dict) -> str:
    """All stream and error text a notebook's cells printed."""
    parts = []
    for cell in nb.get("cells", []):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append("".join(out.get("text", "")))
            elif out.get("output_type") == "error":
                parts.append(out.get("ename", "") + ": " + out.get("evalue", ""))
    return "\n".join(parts)


# Headless Chromium, one per test process: the lesson browser tests and the student kit's test
# share it (a second sync Playwright in the same process finds the first one's loop running).


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required under CI)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        _missing("Debian's chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def shots() -> Path:
    base = Path(os.environ.get("COURSE_TEST_ARTIFACTS") or REPO_ROOT / "test-artifacts")
    folder = base / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {folder}")
    return folder
