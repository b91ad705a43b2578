"""One kernel per lesson: execute the notebook once, then re-grade single exercises in it.

Grading a wrong variant, a valid alternative or another hidden-test seed does not need the whole
lesson executed again: the exercise's test cell depends only on what the cells before it defined.
:class:`LessonKernel` executes a source notebook (``solutions/``, hidden tests included) top to
bottom in one kernel, then :meth:`LessonKernel.run_exercise` runs another version of one
exercise's solution cell followed by that exercise's test cell and scores the test cell exactly
as the grader does: :func:`course.selfcheck.warnings_are_not_failures` (a warning or a log line on
stderr is output, not a failure), then :func:`nbgrader.utils.determine_grade` (an error scores
zero). Afterwards the notebook's own solution cell is run again, so the next
exercise sees the reference definitions. The test suite and ``python -m grader.audit`` use it.

Graded test cells run as in the sandbox: with globals of their own, a copy of the notebook's
namespace (:mod:`grader.harness`), so names a test binds never replace the notebook's. A
converted hidden test's observations are judged here, in the suite's process
(:mod:`grader.judge`), before the cell is scored.
"""

from __future__ import annotations

import ast
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbgrader.utils import determine_grade

from course.selfcheck import notebook_client, warnings_are_not_failures
from grader import harness
from grader.judge import judge_cell
from grader.keys import seed_for


class SeamError(RuntimeError):
    """The seam itself could not do what was asked (no such exercise, kernel died, ...)."""


@dataclass(frozen=True)
class ExerciseRun:
    """What one run of an exercise's test cell scored."""

    grade_id: str
    score: float
    max_score: float
    error: str
    seconds: float
    #: what the test cell wrote to stderr (warnings, log lines): shown, never scored
    stderr: str = ""
    #: everything the test cell printed, stdout and stderr (ranks' lines are replayed on stdout)
    printed: str = ""

    @property
    def passed(self) -> bool:
        """Full marks on the test cell."""
        return self.score == self.max_score


def _nbgrader(cell: NotebookNode) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _error_text(cell: NotebookNode) -> str:
    parts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error":
            parts.append(f"{out.get('ename', '')}: {out.get('evalue', '')}")
        elif out.get("output_type") == "stream" and out.get("name") == "stderr":
            parts.append("stderr: " + "".join(out.get("text", "")).strip())
    return "\n".join(parts)


def defined_names(source: str) -> list[str]:
    """The names a cell binds at its top level (functions, classes, assignments, imports).

    A replacement cell that fails half-way must not leave the reference's definitions in place,
    so these are removed from the kernel before another version of the cell runs.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names.extend(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.extend((a.asname or a.name).split(".")[0] for a in node.names)
    return sorted(set(names) - {"*"})


def bound_names(source: str) -> list[str]:
    """Every name a cell binds in its own namespace: definitions, assignments, loop and ``with``
    targets, imports, ``except ... as`` (not names inside functions, classes or comprehensions)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names: set[str] = set()
    nested = (
        ast.FunctionDef,
        ast.AsyncFunctionDef,
        ast.ClassDef,
        ast.Lambda,
        ast.ListComp,
        ast.SetComp,
        ast.DictComp,
        ast.GeneratorExp,
    )

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.NamedExpr):
            names.add(node.target.id)
        if isinstance(node, nested):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                for d in node.decorator_list:
                    visit(d)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    for stmt in tree.body:
        visit(stmt)
    return sorted(names - {"*"})


def is_test_cell(cell: NotebookNode) -> bool:
    """An autograded test cell (nbgrader ``grade`` without ``solution``)."""
    meta = _nbgrader(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


class LessonKernel:
    """A source notebook executed once in a kernel kept alive for re-grading exercises.

    Use as a context manager: entering starts the kernel and executes every cell (errors are
    kept in the outputs, as nbgrader does); leaving shuts the kernel down. ``executed`` is the
    notebook as it ran, with outputs. ``cwd`` defaults to the notebook's folder; ``env``, the
    kernel's environment (default: this process's).
    """

    def __init__(
        self,
        notebook: Path,
        *,
        cwd: Path | None = None,
        timeout: int = 600,
        kernel_name: str = "python3",
        env: dict[str, str] | None = None,
    ) -> None:
        self.path = Path(notebook)
        self.cwd = Path(cwd) if cwd else self.path.parent
        self.executed: NotebookNode = nbformat.read(self.path, as_version=4)
        self._original = nbformat.read(self.path, as_version=4)
        self._client = notebook_client(
            self.executed,
            timeout=timeout,
            kernel_name=kernel_name,
            allow_errors=True,
            resources={"metadata": {"path": str(self.cwd)}},
        )
        self._env = env
        self._stack = contextlib.ExitStack()
        self._extra = 0
        self.seconds = 0.0

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> LessonKernel:
        start = time.perf_counter()
        extra = {} if self._env is None else {"env": self._env}
        self._stack.enter_context(self._client.setup_kernel(**extra))
        try:
            self.run_code("import grader.harness")
            for index, cell in enumerate(self.executed.cells):
                if not is_test_cell(cell):
                    self._client.execute_cell(cell, index)
                    continue
                source = cell.source
                cell.source = harness.call(source, f"<test cell {index}>")
                try:
                    self._client.execute_cell(cell, index)
                finally:
                    cell.source = source
                judge_cell(cell, self.lesson)
            # The widgets' state as the cells left it, in ``executed.metadata.widgets`` (nbclient
            # stores it only from its own ``execute``): what a page shows a widget from.
            self._client.set_widgets_metadata()
        except BaseException:
            self._stack.close()
            raise
        self.seconds = time.perf_counter() - start
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stack.close()

    # -- running code ------------------------------------------------------------------------

    def _run(self, source: str) -> NotebookNode:
        """Execute ``source`` as a new cell (not part of ``executed``) and return the cell."""
        cell = nbformat.v4.new_code_cell(source)
        self._extra += 1
        # nbclient addresses the cell by index in its notebook: append it for the run only.
        self.executed.cells.append(cell)
        try:
            self._client.execute_cell(cell, len(self.executed.cells) - 1)
        except Exception as exc:  # a dead kernel or a timeout, not an error in the code
            raise SeamError(f"the kernel could not run the cell: {exc}") from exc
        finally:
            self.executed.cells.pop()
        return cell

    def run_code(self, source: str) -> str:
        """Run ``source`` in the kernel; returns what it printed, raises SeamError on an error."""
        cell = self._run(source)
        error = _error_text(cell)
        if any(o.get("output_type") == "error" for o in cell.outputs):
            raise SeamError(f"code raised in the kernel:\n{error}")
        return "".join(
            "".join(o.get("text", "")) for o in cell.outputs if o.get("output_type") == "stream"
        )

    @property
    def lesson(self) -> str:
        """The lesson's id: the notebook's name (its grading: :mod:`grader.lessons`)."""
        return self.path.stem

    @staticmethod
    def _seed_of(key: str | None, student: str) -> Callable[[str], int] | None:
        """The seeds a converted hidden test must have used (None without a key: the driver's)."""
        if key is None:
            return None
        return lambda exercise: seed_for(key, student, exercise)

    @property
    def source(self) -> NotebookNode:
        """The source notebook as read (no outputs)."""
        return self._original

    def cell_of(self, grade_id: str) -> NotebookNode:
        """The source notebook's cell whose nbgrader ``grade_id`` is ``grade_id``."""
        found = [c for c in self._original.cells if _nbgrader(c).get("grade_id") == grade_id]
        if len(found) != 1:
            raise SeamError(f"{self.path.name} has no single cell with grade_id {grade_id!r}")
        return found[0]

    def exercises(self) -> list[str]:
        """The grade ids of the solution cells that have a ``<grade_id>_tests`` cell."""
        ids = [_nbgrader(c).get("grade_id") for c in self._original.cells]
        return [
            gid
            for c, gid in zip(self._original.cells, ids, strict=True)
            if _nbgrader(c).get("solution") and c.cell_type == "code" and f"{gid}_tests" in ids
        ]

    @staticmethod
    def _bound(source: str) -> list[str]:
        """What a solution cell defines, less what it imports (modules stay available)."""
        tree = ast.parse(source)
        imported = {
            (a.asname or a.name).split(".")[0]
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
            for a in node.names
        }
        return [name for name in defined_names(source) if name not in imported]

    def _between(self, grade_id: str) -> list[str]:
        """Sources of the plain code cells between an exercise's solution and its test cell."""
        cells = self._original.cells
        ids = [_nbgrader(c).get("grade_id") for c in cells]
        first, last = ids.index(grade_id), ids.index(f"{grade_id}_tests")
        return [
            c.source
            for c in cells[first + 1 : last]
            if c.cell_type == "code" and not _nbgrader(c).get("grade")
        ]

    def scores(self) -> dict[str, tuple[float, float, bool]]:
        """``{grade_id: (score, max_score, auto)}`` of the full run, scored as nbgrader does.

        Autograded test cells are scored from their outputs; manually graded cells (written
        answers) count 0 with ``auto`` False, as nbgrader leaves them for the instructor.
        """
        found: dict[str, tuple[float, float, bool]] = {}
        for cell in self.executed.cells:
            meta = _nbgrader(cell)
            if not meta.get("grade"):
                continue
            if cell.cell_type == "code" and not meta.get("solution"):
                score, max_score = determine_grade(warnings_are_not_failures(cell))
                found[meta["grade_id"]] = (float(score or 0.0), float(max_score), True)
            else:
                found[meta["grade_id"]] = (0.0, float(meta.get("points", 0)), False)
        return found

    def set_grading_key(self, key: str | None, student: str = "") -> None:
        """Make ``course.checks.hidden_seed`` derive seeds from ``key`` (None: fresh each call)."""
        self.run_code(
            "import course.checks as _seam_checks\n"
            f"_seam_checks._GRADING_KEY = {key!r}\n"
            f"_seam_checks._STUDENT_ID = {student!r}\n"
            "del _seam_checks\n"
        )

    def run_exercise(
        self,
        grade_id: str,
        source: str | None = None,
        key: str | None = None,
        student: str = "",
    ) -> ExerciseRun:
        """Run ``source`` (default: the notebook's solution cell), then score ``<grade_id>_tests``.

        With ``key``, the hidden tests' seed comes from ``(key, student, grade_id)``; the key is
        reset afterwards. The notebook's own solution cell is run again at the end, so every call
        starts from the reference definitions.
        """
        solution = self.cell_of(grade_id).source
        test = self.cell_of(f"{grade_id}_tests")
        between = self._between(grade_id)
        start = time.perf_counter()
        try:
            if key is not None:
                self.set_grading_key(key, student)
            if source is not None:
                # Not imports: a variant may rely on the modules the setup cell imported.
                self.run_code(
                    f"for _seam_name in {self._bound(solution)!r}:\n"
                    "    globals().pop(_seam_name, None)\n"
                )
            answer = self._run(solution if source is None else source)
            for code in between:
                self._run(code)
            cell = self._run(harness.call(test.source, f"<test cell {grade_id}_tests>"))
            cell.metadata = test.metadata
            judge_cell(cell, self.lesson, self._seed_of(key, student))
            streams = [o for o in cell.outputs if o.get("output_type") == "stream"]
            text = ["".join(o.get("text", "")) for o in streams]
            stderr = "".join(t for o, t in zip(streams, text, strict=True) if o["name"] == "stderr")
            printed = "".join(text)
            score, max_score = determine_grade(warnings_are_not_failures(cell))
            error = _error_text(cell)
            if any(o.get("output_type") == "error" for o in answer.outputs):
                error = f"(the solution cell itself raised: {_error_text(answer)})\n{error}"
        finally:
            if key is not None:
                self.set_grading_key(None)
            if source is not None:
                self._run(solution)
        return ExerciseRun(
            grade_id,
            float(score or 0.0),
            float(max_score),
            error,
            time.perf_counter() - start,
            stderr,
            printed,
        )
