"""Check your own work: run a lesson notebook and say, exercise by exercise, what passes (grader).

From a terminal::

    python -m grader check lessons/02-loss-scaling/02-loss-scaling.ipynb
    python -m course.selfcheck lessons/02-loss-scaling/02-loss-scaling.ipynb

or as the last cell of a notebook (save it first: the check runs the saved file in a fresh
kernel)::

    from course.selfcheck import check_my_work
    check_my_work()

Each exercise is reported as ``passed``, ``FAILED`` with the message of the check that failed
(what was expected, what your code gave), or ``not attempted``. Only the tests in your notebook
run (the visible ones); hidden-test regions, if a notebook has any, are removed before running,
so their code is never run or shown here. The instructor's grading also runs hidden tests on
fresh random inputs.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import nbformat
from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

_BEGIN, _END = "### BEGIN " + "HIDDEN TESTS", "### END " + "HIDDEN TESTS"  # not literal: the
# student kit is checked to contain no nbgrader markers.
HIDDEN = re.compile(rf"^[ \t]*{_BEGIN}.*?^[ \t]*{_END}[^\n]*\n?", re.S | re.M)
ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RUNNING = "COURSE_SELFCHECK_RUNNING"


@dataclass
class ExerciseResult:
    """The outcome of one exercise's visible tests."""

    exercise: str
    points: float
    status: str  # "passed" | "failed" | "not attempted"
    message: str = ""


def warnings_are_not_failures(cell: Any) -> Any:
    """Apply the course's one scoring rule to an executed cell; returns the cell.

    In a graded test cell, what the code wrote to stderr (a warning, a log line) stays in the
    outputs, as stdout, so the student still reads it, but it is no longer a failure: nbgrader's
    ``determine_grade`` and its Validate button score a test cell with any stderr output 0, and a
    correct answer that makes torch or NumPy warn would lose its points. Only an error output
    fails a test. The sandboxed grader, plain ``nbgrader autograde`` and Validate
    (:class:`WarningsAreNotFailures`), the test suite's seam and :func:`check_my_work` all apply
    it between execution and scoring.
    """
    meta = _nbgrader(cell)
    if cell.get("cell_type") == "code" and meta.get("grade") and not meta.get("solution"):
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                out["name"] = "stdout"
    return cell


class WarningsAreNotFailures(Preprocessor):
    """:func:`warnings_are_not_failures` on every cell, as an nbconvert step after nbgrader's
    ``Execute``: in ``Autograde.autograde_preprocessors`` (``grader/nbgrader_config.py``) and in
    the Validate button's steps (``jupyter/common/nbgrader_config.py``)."""

    enabled = Bool(True)  # nbconvert's preprocessors are off unless enabled

    def preprocess(self, nb: Any, resources: dict) -> tuple[Any, dict]:
        for cell in nb.cells:
            warnings_are_not_failures(cell)
        return nb, resources


def failure_message(cell: Any) -> str | None:
    """The message of an executed test cell's first error, or None when it passed (see
    :func:`warnings_are_not_failures`: warnings and log lines are not failures)."""
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    if not errors:
        return None
    return ANSI.sub("", f"{errors[0].get('ename', 'Error')}: {errors[0].get('evalue', '')}")


def _nbgrader(cell) -> dict:
    meta = cell.get("metadata", {}).get("nbgrader", {})
    return meta if isinstance(meta, dict) else {}


def _local_kernel_manager() -> type:
    """jupyter_client's kernel manager on IPC sockets (files in Jupyter's private runtime
    folder, an absolute path since the kernel runs in the notebook's folder) instead of loopback
    TCP: the check's kernel is this user's only, and ipykernel has no reason to print "Kernel is
    running over TCP without encryption" at the student."""
    import secrets

    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.paths import jupyter_runtime_dir

    class LocalKernelManager(AsyncKernelManager):
        def __init__(self, **kwargs: object) -> None:
            runtime = jupyter_runtime_dir()
            os.makedirs(runtime, mode=0o700, exist_ok=True)
            kwargs.setdefault("transport", "ipc")
            kwargs.setdefault("ip", os.path.join(runtime, f"check-{secrets.token_hex(8)}-ipc"))
            super().__init__(**kwargs)

    return LocalKernelManager


def poll_in_slices(
    channel: Any, every: float = 1.0, idle: Callable[[], dict | None] | None = None
) -> None:
    """Make an async jupyter_client channel's ``get_msg`` wait in polls of at most ``every``
    seconds, so a message that has arrived is never left waiting. ``idle()``, called after each
    empty poll, may return a message to give instead (the grader's recovery of a lost reply).

    A zmq socket wakes its reader through an edge-triggered file descriptor, and pyzmq's asyncio
    poll can miss the edge: the message then sits in the client's socket until the poll times
    out, when pyzmq reads the socket's events again (seen: a lesson's last cell, a widget, got
    its ``execute_reply`` only at its 900 s limit, and a request sent meanwhile did not help).
    Each new poll reads the events at once, so a missed wake-up costs at most ``every``.
    """
    get = channel.get_msg

    async def get_msg(timeout: float | None = None) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                return await get(timeout=every if left is None else max(0.0, min(every, left)))
            except Empty:
                instead = idle() if idle is not None else None
                if instead is not None:
                    return instead
                if left is not None and left <= every:
                    raise

    get_msg.polls_every = every
    channel.get_msg = get_msg


#: After a cell's kernel went idle, how long its missing ``execute_reply`` is waited for before
#: the shell channel is nudged, and again before the cell is completed from its IOPub messages.
REPLY_GRACE = 5.0


class RecoversLostReplies:
    """Mixed in before nbclient's ``NotebookClient`` (here, in the suite's seam and in the
    grader's client): both channels poll in slices (:func:`poll_in_slices`), and a cell whose
    kernel went idle but whose ``execute_reply`` never came is completed instead of waiting out
    its time limit. ``REPLY_GRACE`` s after idle a ``kernel_info_request`` nudges the shell
    channel (a reply stuck behind a missed wake-up then comes); ``REPLY_GRACE`` s later the
    reply is made up from what IOPub delivered (``error`` where it showed one). Seen once in 200
    graded submissions (ipykernel 7.4): a widget cell idle at 0.1 s whose reply never came."""

    def recovered(self, text: str) -> None:
        """Say what was recovered (the grader keeps it in its events)."""
        self.log.warning(text)  # type: ignore[attr-defined]

    def made_up_error(self, index: int, cell: Any) -> bool:
        """Whether the reply made up for cell ``index`` says ``error``."""
        return any(o.get("output_type") == "error" for o in cell.outputs)

    # nbclient's synchronous name wraps the base class's coroutine when the class is made, so
    # ``setup_kernel`` (the suite's seam) and nbgrader's Execute would bypass the override below.
    def start_new_kernel_client(self) -> Any:
        from nbclient.util import run_sync

        return run_sync(self.async_start_new_kernel_client)()

    async def async_start_new_kernel_client(self) -> Any:
        kc = await super().async_start_new_kernel_client()  # type: ignore[misc]
        poll_in_slices(kc.shell_channel, idle=self._lost_reply)
        poll_in_slices(kc.iopub_channel)
        return kc

    def _index(self, cell: Any) -> int:
        return next((i for i, c in enumerate(self.nb.cells) if c is cell), -1)  # type: ignore[attr-defined]

    def _lost_reply(self) -> dict | None:
        poll = getattr(self, "_poll", None)
        output = poll.get("output") if poll else None
        if output is None or not output.done() or output.cancelled() or output.exception():
            return None
        now = time.monotonic()
        poll.setdefault("idle", now)
        if "nudged" not in poll and now - poll["idle"] > REPLY_GRACE:
            poll["nudged"] = now
            self.kc.kernel_info()  # type: ignore[attr-defined]
            return None
        if "nudged" not in poll or now - poll["nudged"] <= REPLY_GRACE:
            return None
        cell, index = poll["cell"], poll["index"]
        self.recovered(
            f"cell {index}: the kernel went idle but its execute_reply never came: "
            "completed from its iopub messages"
        )
        self._poll = {}
        content: dict[str, Any] = {"status": "ok", "execution_count": cell.get("execution_count")}
        if self.made_up_error(index, cell):
            content.update(status="error", ename="Error", evalue="", traceback=[])
        return {
            "msg_type": "execute_reply",
            "parent_header": {"msg_id": poll["msg_id"]},
            "header": {"msg_type": "execute_reply"},
            "metadata": {},
            "content": content,
        }

    async def _async_poll_for_reply(
        self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive
    ):  # type: ignore[no-untyped-def]
        self._poll = {
            "msg_id": msg_id,
            "cell": cell,
            "output": task_poll_output_msg,
            "index": self._index(cell),
        }
        try:
            reply = await super()._async_poll_for_reply(  # type: ignore[misc]
                msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive
            )
            poll = self._poll  # emptied where the reply was made up (_lost_reply)
            if poll.get("nudged"):
                self.recovered(
                    f"cell {poll['index']}: its execute_reply came only after the shell "
                    f"channel was nudged, {time.monotonic() - poll['idle']:.1f} s after the "
                    "kernel went idle"
                )
            return reply
        finally:
            self._poll = {}


def notebook_client(nb: nbformat.NotebookNode, **kwargs: Any) -> Any:
    """An nbclient ``NotebookClient`` for ``nb`` that recovers lost replies
    (:class:`RecoversLostReplies`): the check here, and the course's tests and benchmark."""
    from nbclient import NotebookClient

    class Client(RecoversLostReplies, NotebookClient):
        pass

    return Client(nb, **kwargs)


def check_notebook(path: str | Path, timeout: float = 600.0) -> list[ExerciseResult]:
    """Run the notebook at ``path`` in a fresh kernel; one result per autograded exercise."""
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    unattempted = set()
    for cell in nb.cells:
        meta = _nbgrader(cell)
        if cell.cell_type == "code" and meta.get("solution"):
            if "raise NotImplementedError" in cell.source:
                unattempted.add(meta.get("grade_id"))
    tests = []
    keep = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            if "check_my_work(" in cell.source:
                continue  # do not check from inside the check
            cell.source = HIDDEN.sub("", cell.source)
            cell.outputs = []
            meta = _nbgrader(cell)
            if meta.get("grade") and not meta.get("solution"):
                tests.append(cell)
        keep.append(cell)
    nb.cells = keep
    client = notebook_client(
        nb,
        # Whole seconds: nbclient's timeout is an Integer trait, and the traitlets of Colab's
        # runtime (5.7) refuse a float there.
        timeout=math.ceil(timeout),
        allow_errors=True,
        kernel_name="python3",
        kernel_manager_class=_local_kernel_manager(),
        resources={"metadata": {"path": str(path.parent)}},
    )
    # The check's kernel inherits these: _RUNNING stops a check_my_work() cell from checking
    # again; the other keeps debugpy's "frozen modules" warning (Python 3.12+) out of the report.
    marks = {_RUNNING: "1", "PYDEVD_DISABLE_FILE_VALIDATION": "1"}
    previous = {key: os.environ.get(key) for key in marks}
    os.environ.update(marks)
    try:
        client.execute()
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    results = []
    for cell in tests:
        meta = _nbgrader(cell)
        gid = str(meta.get("grade_id", "?"))
        exercise = gid.removesuffix("_tests")
        points = float(meta.get("points", 0) or 0)
        failure = failure_message(warnings_are_not_failures(cell))
        if exercise in unattempted:
            results.append(
                ExerciseResult(
                    exercise,
                    points,
                    "not attempted",
                    "the solution cell still raises NotImplementedError",
                )
            )
        elif failure is not None:
            results.append(ExerciseResult(exercise, points, "failed", failure))
        else:
            results.append(ExerciseResult(exercise, points, "passed"))
    return results


def report(results: list[ExerciseResult], out=None) -> str:
    """The per-exercise report as text (also printed to ``out`` if given)."""
    lines = []
    for r in results:
        mark = {"passed": "passed", "failed": "FAILED", "not attempted": "not attempted"}
        lines.append(f"{mark[r.status]:>13}  {r.exercise} ({r.points:g} points)")
        if r.message:
            lines.append(f"               {r.message}")
    got = sum(r.points for r in results if r.status == "passed")
    total = sum(r.points for r in results)
    passed = sum(r.status == "passed" for r in results)
    lines.append(
        f"{passed} of {len(results)} exercises pass their visible tests "
        f"({got:g} of {total:g} points). Grading also runs hidden tests on fresh "
        "random inputs."
    )
    text = "\n".join(lines)
    if out is not None:
        print(text, file=out)
    return text


#: The prefix of the temporary folder holding a copy of a Colab notebook (:func:`_colab_notebook`).
_COLAB_COPY = "check-my-work-colab-"
#: What :func:`check_my_work` says on Kaggle, whose notebooks live outside the runtime's disk.
KAGGLE_HELP = (
    "On Kaggle this notebook is not a file the runtime can read, so check a saved copy: "
    "File > Download Notebook, then either run `python -m course.selfcheck NN-topic.ipynb` on "
    "a machine with the course installed, or upload the file to this notebook's inputs (the "
    "Input panel's Upload) and call check_my_work('/kaggle/input/<your upload>/NN-topic.ipynb')."
)


def _colab_notebook(timeout: float = 60.0) -> Path | None:
    """On Colab, the open notebook as it is now, written to a temporary folder; else None.

    Colab keeps notebooks in Drive, not on the runtime's disk, so no file path is known. Its
    front end hands the notebook's JSON to the kernel on request: ``google.colab._message``'s
    ``blocking_request("get_ipynb")`` answers ``{"ipynb": {...}}``, or None when it does not
    answer within ``timeout`` seconds.
    """
    try:
        from google.colab import _message  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        reply = _message.blocking_request("get_ipynb", timeout_sec=timeout)
    except Exception:  # noqa: BLE001 - the front end refused: fall back to the other ways
        return None
    content = reply.get("ipynb") if isinstance(reply, dict) else None
    if not isinstance(content, dict):
        return None
    # Colab's cell sources are lists of lines, as on disk: nbformat joins them when it reads.
    nb = nbformat.reads(json.dumps(content), as_version=4)
    name = str(nb.metadata.get("colab", {}).get("name", ""))
    if not re.fullmatch(r"[\w.-]+\.ipynb", name):
        name = "notebook.ipynb"
    path = Path(tempfile.mkdtemp(prefix=_COLAB_COPY)) / name
    nbformat.write(nb, path)
    return path


def _find_notebook() -> Path | None:
    colab = _colab_notebook()
    if colab is not None:
        return colab
    session = os.environ.get("JPY_SESSION_NAME")
    if session and session.endswith(".ipynb") and Path(session).is_file():
        return Path(session)
    try:
        from IPython import get_ipython

        shell = get_ipython()
        vsc = shell.user_ns.get("__vsc_ipynb_file__") if shell else None
        if vsc and Path(vsc).is_file():
            return Path(vsc)
    except ImportError:
        pass
    found = sorted(Path.cwd().glob("*.ipynb"))
    return found[0] if len(found) == 1 else None


def check_my_work(path: str | Path | None = None) -> list[ExerciseResult]:
    """Check the (saved) notebook you are working in and print what passes; see the module.

    On Colab the notebook is read from Colab's front end as it is now (saved or not); on Kaggle,
    where neither is possible, it says how to check a downloaded copy (:data:`KAGGLE_HELP`).
    """
    if os.environ.get(_RUNNING):
        return []
    nb_path = Path(path) if path else _find_notebook()
    if nb_path is None:
        if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
            print(KAGGLE_HELP)
        else:
            print("Could not tell which notebook this is: call check_my_work('NN-topic.ipynb').")
        return []
    colab = nb_path.parent.name.startswith(_COLAB_COPY)
    if colab:
        print(f"Checking {nb_path.name} as Colab has it now, in a fresh kernel...")
    else:
        print(f"Checking the saved {nb_path.name} in a fresh kernel (save first: Ctrl-S)...")
    try:
        results = check_notebook(nb_path)
    finally:
        if colab:
            shutil.rmtree(nb_path.parent, ignore_errors=True)
    report(results, out=sys.stdout)
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m course.selfcheck NOTEBOOK``: exit 0 if every exercise passes."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m course.selfcheck",
        description="Run a lesson notebook's visible tests and report each exercise.",
    )
    parser.add_argument("notebook", help="path of the lesson notebook (saved)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per cell")
    args = parser.parse_args(argv)
    if not Path(args.notebook).is_file():
        print(f"no such notebook: {args.notebook}", file=sys.stderr)
        return 2
    print(f"Checking {args.notebook} (visible tests only)...")
    results = check_notebook(args.notebook, timeout=args.timeout)
    report(results, out=sys.stdout)
    return 0 if results and all(r.status == "passed" for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
