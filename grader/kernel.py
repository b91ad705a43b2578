"""The student's kernel, started by jupyter_client inside bubblewrap and driven by nbclient.

:class:`SandboxedKernelManager` wraps the kernel's command in the sandbox of
:func:`grader.sandbox.kernel_command` and talks to it over IPC sockets in a folder bound into the
sandbox (it has no network). The kernel gets no ``JPY_PARENT_PID`` (its parent is outside its PID
namespace: it would think it orphaned and exit) and is interrupted by message (a SIGINT to
bubblewrap would take it down). :class:`SandboxedClient` is what nbclient adds: per-cell limits
(``timeout_func``), a notebook deadline, output capped in bytes as the cell runs, the channels
polled in slices and a reply lost after ``idle`` recovered (as in the seam and the check:
:class:`course.selfcheck.RecoversLostReplies`), graded test cells run through the harness
(:mod:`grader.harness`), the kernel's processes killed at a timeout, and a kernel that died or
stopped answering restarted with the cells before run again.
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from queue import Empty
from typing import Any

import nbformat
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from nbclient.exceptions import DeadKernelError

from course.selfcheck import RecoversLostReplies
from grader import harness
from grader.harness import MIME
from grader.sandbox import Settings, kernel_command, kernel_env, real_interpreter, sandbox_uid

#: The most a test's observations (``grader.harness.MIME``) may hold apart from the notebook's
#: output cap.
OBSERVATIONS_LIMIT = 32 * 1024 * 1024
#: How long a kernel has to answer after a timeout's interrupt before it is killed.
INTERRUPT_GRACE = 10.0
#: How long the outputs of a cell that replied may take to arrive.
IOPUB_GRACE = 30
#: How many times a notebook's kernel is restarted after it stopped (``SandboxedClient._revive``).
MAX_RESTARTS = 3

#: Sent before the notebook, and again after a restart (silent): lesson files into the working
#: folder, an oversized write raises instead of killing the kernel, the harness imported.
PRELUDE = """
def _grader_prelude(lesson):
    import os, shutil, signal, sys
    for name in os.listdir(lesson) if os.path.isdir(lesson) else []:
        path = os.path.join(lesson, name)
        if os.path.isdir(path):
            shutil.copytree(path, name, dirs_exist_ok=True)
        elif not name.endswith('.ipynb'):
            shutil.copy(path, name)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    sys.path[:] = [p for p in sys.path if p not in ('', os.getcwd())]
    __import__('course.checks')  # takes the grading key out of the environment
    __import__('grader.harness')
_grader_prelude(%(lesson)r)
del _grader_prelude
"""


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``, read from ``/proc`` (children before their own children),
    with its start time: a PID the system gave to another process since has another."""
    children: dict[int, list[tuple[int, str]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            fields = _stat(int(entry))
            if fields:
                children.setdefault(int(fields[1]), []).append((int(entry), fields[19]))
    found, todo = {}, list(children.get(pid, []))
    while todo:
        child, started = todo.pop(0)
        found[child] = started
        todo += children.get(child, [])
    return found


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command's name (state first), or none."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


class SandboxedKernelManager(AsyncKernelManager):
    """An ipykernel in the sandbox of ``settings``, over IPC sockets in a folder of its own."""

    def __init__(self, settings: Settings, **kwargs: Any) -> None:
        runtime = Path(tempfile.mkdtemp(prefix="grader-kernel-"))
        super().__init__(
            transport="ipc",
            ip=str(runtime / "ipc"),
            connection_file=str(runtime / "kernel.json"),
            **kwargs,
        )
        self.settings = settings
        self.runtime = runtime
        self.uid = sandbox_uid(settings)
        if self.uid is not None:
            os.chown(runtime, self.uid, self.uid)
        runtime.chmod(0o700)

    @property
    def kernel_spec(self) -> KernelSpec:
        return KernelSpec(
            argv=[real_interpreter(), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            display_name="Python 3 (grader sandbox)",
            language="python",
            interrupt_mode="message",
        )

    def write_connection_file(self, **kwargs: Any) -> None:
        # The folder is the sandbox's to write (its sockets): on a restart the file may be a link
        # a student planted, so it is written anew and never followed.
        Path(self.connection_file).unlink(missing_ok=True)
        self._connection_file_written = False
        super().write_connection_file(**kwargs)
        if self.uid is not None:
            os.chown(self.connection_file, self.uid, self.uid, follow_symlinks=False)

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        return kernel_command(
            self.settings, super().format_kernel_cmd(extra_arguments), self.runtime
        )

    async def _async_launch_kernel(self, kernel_cmd: list[str], **kw: Any) -> None:
        env, cwd = kernel_env(self.settings, self.runtime)
        kw.update(env=env, cwd=cwd if self.settings.mode != "bwrap" else str(self.runtime))
        kw.update(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # nothing to write on
        await super()._async_launch_kernel(kernel_cmd, **kw)

    @property
    def pid(self) -> int | None:
        """The sandbox's first process (bubblewrap's, or the kernel's when unsandboxed)."""
        process = getattr(self.provisioner, "process", None)
        return process.pid if process is not None else None

    def kill_children(self) -> int:
        """Kill every process the kernel started (the kernel itself lives on); how many."""
        pid = self.pid
        if pid is None:
            return 0
        tree = descendants(pid)
        kernel = next((p for p in tree if _is_kernel(p)), None)
        victims = descendants(kernel) if kernel else {}
        _kill(victims)
        return len(victims)

    async def _async_kill_kernel(self, restart: bool = False) -> None:
        pid = self.pid
        tree = descendants(pid) if pid else {}
        await super()._async_kill_kernel(restart=restart)
        _kill(tree)  # anything that outlived the sandbox's own end (unsandboxed)

    async def _async_cleanup_resources(self, restart: bool = False) -> None:
        try:
            await super()._async_cleanup_resources(restart=restart)
        finally:
            if not restart:
                shutil.rmtree(self.runtime, ignore_errors=True)

    cleanup_resources = _async_cleanup_resources


def _kill(processes: dict[int, str]) -> None:
    """SIGKILL each process of ``descendants`` that is still the one listed: a pidfd holds the
    process while its start time is compared, so a PID reused meanwhile is never hit."""
    for pid, started in processes.items():
        try:
            handle = os.pidfd_open(pid)
        except OSError:  # gone already
            continue
        try:
            fields = _stat(pid)
            if fields and fields[19] == started:
                signal.pidfd_send_signal(handle, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os.close(handle)


def _is_kernel(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return argv[1:3] == [b"-m", b"ipykernel_launcher"]  # not bubblewrap's, which names it too


class SandboxedClient(RecoversLostReplies):
    """What the grader adds to an nbclient ``NotebookClient`` (mixed in before it).

    :meth:`setup_grading` before executing, :meth:`release` after. Then :attr:`statuses`
    (index -> ``ok``, ``error``, ``timeout``, ``dead`` or ``not-run``) and :attr:`events` say what
    happened.
    """

    graded: set[int]
    cell_limits: dict[int, float]
    max_output: int
    deadline: float

    def setup_grading(
        self, graded: set[int], cell_limits: dict[int, float], settings: Settings
    ) -> None:
        """Grade under ``settings``' limits; ``cell_limits`` (cell index -> seconds, from
        :mod:`grader.calibrate`) override its cell timeout for those cells."""
        limits = settings.limits
        self.graded = set(graded)
        self.cell_limits = dict(cell_limits)
        self.default_limit = limits.cell_timeout
        self.max_output = limits.max_output
        self.deadline = time.monotonic() + limits.notebook_timeout
        self.extra_arguments = ["--HistoryManager.hist_file=:memory:"]
        self.shutdown_kernel = "immediate"  # the outputs are in: nothing of the kernel is kept
        self.statuses: dict[int, str] = {}
        self.seconds: dict[int, float] = {}
        self.events: list[str] = []
        self.dead: str = ""  # why the kernel no longer runs cells
        self.killers: set[int] = set()  # cells the kernel died in (never run again)
        self._poll: dict[str, Any] = {}
        self._capped: int | None = None
        self.timeout_func = self._cell_timeout
        # After a cell's reply, its last outputs and idle may lag on a busy machine: a cell that
        # ran is never failed for that (nbgrader's config waits 4 s, then raises).
        self.iopub_timeout = max(self.iopub_timeout, IOPUB_GRACE)

    # nbclient's synchronous entry point (what nbconvert's Execute calls) is bound to its own
    # coroutine: route it through this class's.
    def execute_cell(self, *args: Any, **kwargs: Any) -> Any:
        return run_sync(self.async_execute_cell)(*args, **kwargs)

    def release(self) -> None:
        """Shut the kernel down and remove its folder: nbclient leaves a kernel it was given."""
        try:
            if self.km is not None:
                self._cleanup_kernel()
        except Exception as exc:  # noqa: BLE001 - the notebook is done: say so, lose nothing
            self.events.append(f"the kernel's shutdown failed: {type(exc).__name__}: {exc}")

    def _limit(self, index: int) -> float:
        return self.cell_limits.get(index, self.default_limit)

    def _cell_timeout(self, cell: Any) -> float:
        limit = self._limit(self._index(cell))
        return max(1.0, min(limit, self.deadline - time.monotonic()))

    def answer_cells(self, nb: Any) -> list[dict]:
        """Each executed code cell: index, outputs, execution count, status, seconds, limit."""
        return [
            {
                "index": index,
                "outputs": [dict(o) for o in cell.outputs],
                "execution_count": cell.get("execution_count"),
                "status": self.statuses[index],
                "seconds": round(self.seconds.get(index, 0.0), 3),
                "limit": self._limit(index),
            }
            for index, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and index in self.statuses
        ]

    async def async_start_new_kernel_client(self) -> Any:
        kc = await super().async_start_new_kernel_client()
        await self._prelude(kc)
        return kc

    async def _prelude(self, kc: Any) -> None:
        settings = self.km.settings
        lesson = "/opt/lesson" if settings.mode == "bwrap" else settings.lesson_files
        code = PRELUDE % {"lesson": lesson or "/nonexistent"}
        why = await self._quietly(kc, code, min(120, max(1.0, self.deadline - time.monotonic())))
        if why:
            self.events.append(f"grader prelude failed: {why}")

    async def _quietly(self, kc: Any, code: str, timeout: float) -> str:
        """Run ``code`` without outputs; why it failed ("" when it did not)."""
        try:
            reply = await kc.execute_interactive(
                code, silent=True, store_history=False, timeout=timeout, output_hook=lambda m: None
            )
        except TimeoutError:
            return f"no reply within {timeout:g} s"
        content = reply["content"]
        if content.get("status") == "ok":
            return ""
        return f"{content.get('status')}: {content.get('ename')}: {content.get('evalue')}"

    async def _revive(self, died_in: int) -> str:
        """After the kernel died or stopped answering in cell ``died_in``: restart it and run
        again, without their outputs, the cells before that were not graded tests and ended (not
        at a time limit), so that an exercise that ends its kernel (a crash, ``os._exit``, the
        memory limit) costs only its own points. Returns why it could not ("" when it did)."""
        if len(self.killers) > MAX_RESTARTS:
            return f"the kernel stopped {len(self.killers)} times"
        await self.km.restart_kernel(now=True)
        for channel in (self.kc.shell_channel, self.kc.iopub_channel):
            while True:  # the old kernel's last messages would pass for the new one's
                try:
                    await channel.get_msg(timeout=0)
                except Empty:
                    break
        left = max(1.0, self.deadline - time.monotonic())
        await self.kc.wait_for_ready(timeout=min(self.startup_timeout, left))  # iopub too
        await self._prelude(self.kc)
        for index, cell in enumerate(self.nb.cells[:died_in]):
            if index in self.graded or self.statuses.get(index) not in ("ok", "error"):
                continue  # a test, or a cell that did not end (it ran past its limit, stopped it)
            left = self.deadline - time.monotonic()
            why = await self._quietly(self.kc, cell.source, min(self._limit(index), left))
            if why.startswith("no reply"):
                return f"cell {index} {why} when run again"
        self.events.append(
            f"cell {died_in}: the kernel stopped; restarted, the cells before it were run again"
        )
        return ""

    def recovered(self, text: str) -> None:
        self.events.append(text)

    def made_up_error(self, index: int, cell: Any) -> bool:
        return self._capped == index or super().made_up_error(index, cell)

    async def _async_handle_timeout(self, timeout: int, cell: Any = None) -> Any:
        index = self._index(cell)
        self._poll = {}
        self.statuses[index] = "timeout"
        killed = self.km.kill_children()
        self.events.append(
            f"cell {index}: timed out after {timeout:g} s"
            + (f"; {killed} process(es) it started killed" if killed else "")
        )
        reply = await super()._async_handle_timeout(timeout, cell)  # type: ignore[misc]
        if not await self._answers(INTERRUPT_GRACE):
            self.events.append(f"cell {index}: the kernel stopped answering after its time limit")
            self.killers.add(index)  # restarted when the cell ends (async_execute_cell)
            # Its outputs will not end either: nbclient cancels their task on this error, where
            # a reply would have it wait IOPUB_GRACE for them.
            raise RuntimeError("the kernel stopped answering after its time limit")
        return reply

    async def _answers(self, within: float) -> bool:
        """Whether the kernel answers a ``kernel_info_request`` within ``within`` seconds."""
        msg_id = self.kc.kernel_info()
        end = time.monotonic() + within
        while time.monotonic() < end:
            try:
                msg = await self.kc.shell_channel.get_msg(timeout=max(0.1, end - time.monotonic()))
            except Empty:
                return False
            if msg["parent_header"].get("msg_id") == msg_id:
                return True
        return False

    async def async_execute_cell(
        self,
        cell: Any,
        cell_index: int,
        execution_count: int | None = None,
        store_history: bool = True,
    ) -> Any:  # type: ignore[override]
        if cell.cell_type != "code" or not cell.source.strip():
            return await super().async_execute_cell(
                cell, cell_index, execution_count, store_history
            )  # type: ignore[misc]
        if self.dead or time.monotonic() >= self.deadline:
            why = self.dead or "the notebook ran out of time"
            self.statuses[cell_index] = "not-run"
            cell.outputs = [_error("GraderNotRun", f"this cell was not run: {why}")]
            return cell
        source = cell.source
        if cell_index in self.graded:
            cell.source = harness.call(source, f"<test cell {cell_index}>")
        started = time.monotonic()
        self.statuses.pop(cell_index, None)
        self._reply_status = "error"
        try:
            await super().async_execute_cell(cell, cell_index, execution_count, store_history)  # type: ignore[misc]
        except Exception as exc:  # the kernel died, or stopped answering after a timeout
            what = f"{type(exc).__name__}: {exc}"
            if self.statuses.get(cell_index) == "timeout":
                why = f"the cell ran past its limit of {self._limit(cell_index):g} s"
                cell.outputs.append(_error("CellTimeoutError", why))
                self.killers.add(cell_index)
            elif isinstance(exc, DeadKernelError) or not await self.km.is_alive():
                self.statuses[cell_index] = "dead"
                cell.outputs.append(_error("GraderKernelDied", what))
                self.killers.add(cell_index)
            else:  # the client gave up waiting (IOPub), the kernel lives on: no restart
                self.statuses[cell_index] = "error"
                cell.outputs.append(_error("GraderFailed", what))
        finally:
            cell.source = source
            self.seconds[cell_index] = time.monotonic() - started
            self.statuses.setdefault(cell_index, self._reply_status)
        if cell_index in self.killers:
            try:
                why = await self._revive(cell_index)
            except Exception as exc:  # noqa: BLE001 - it cannot be restarted: stop here
                why = f"{type(exc).__name__}: {exc}"
            if why:
                self.dead = f"the kernel stopped in cell {cell_index} ({why})"
        return cell

    def on_cell_executed(self, **kwargs: Any) -> None:
        """Record the reply's status (then nbgrader's own step, where there is one)."""
        self._reply_status = kwargs["execute_reply"].get("content", {}).get("status", "error")
        mro = type(self).__mro__
        for klass in mro[mro.index(SandboxedClient) + 1 :]:
            step = klass.__dict__.get("on_cell_executed")
            if step is not None:  # nbgrader's method, or nbclient's hook trait
                if inspect.isfunction(step):
                    step(self, **kwargs)
                break

    def output(self, outs: list, msg: dict, display_id: str, cell_index: int) -> Any:
        data = (msg.get("content") or {}).get("data") or {}
        first = next((o for o in outs if MIME in (o.get("data") or {})), None)
        if (
            cell_index in self.graded
            and first is None
            and MIME in data
            and len(str(data[MIME])) <= OBSERVATIONS_LIMIT
        ):
            return super().output(outs, msg, display_id, cell_index)  # type: ignore[misc]
        room = self.max_output - sum(len(json.dumps(o)) for o in outs if o is not first)
        content = msg.get("content") or {}
        if len(json.dumps(content)) > room:
            if msg.get("msg_type") == "stream" and self._capped != cell_index and room > 0:
                cut = {**msg, "content": {**content, "text": str(content["text"])[: room // 2]}}
                super().output(outs, cut, display_id, cell_index)  # type: ignore[misc]
            if self._capped != cell_index:
                self._capped = cell_index
                self.events.append(f"cell {cell_index}: output cut at {self.max_output} bytes")
                outs.append(
                    nbformat.v4.new_output(
                        "stream", name="stdout", text="\n[grader: output cut here]\n"
                    )
                )
            return None
        return super().output(outs, msg, display_id, cell_index)  # type: ignore[misc]


def _error(ename: str, evalue: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_output(
        "error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"]
    )
