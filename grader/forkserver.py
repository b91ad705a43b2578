"""A warm ``nbgrader``: one long-lived process per grading worker that forks a fresh child per run.

:class:`NbgraderServer` imports nbgrader, nbconvert and SQLAlchemy once; for each request it
forks a child that runs nbgrader's command line exactly as ``python -m nbgrader`` in the request's
folder would (its own traitlets singletons, killed with its server and when past its time). The
protocol is JSON lines: the request ``{"argv", "cwd", "env", "log"}``, the replies ``{"pid"}``
and ``{"returncode"}``; the child's output goes to ``log``.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

#: What the server imports before it forks (what ``nbgrader autograde`` spends its start on).
WARM_MODULES = (
    "nbgrader.apps.nbgraderapp",
    "nbgrader.api",
    "nbgrader.preprocessors",
    "nbgrader.converters",
    "nbconvert.preprocessors",
    "nbclient",
    "nbformat",
    "sqlalchemy",
)


#: Seconds a server may take to import :data:`WARM_MODULES` and answer its first request.
STARTUP_TIMEOUT = 300.0


def _serve() -> None:  # pragma: no cover - runs in the server process (tested through the class)
    """The server's loop (``python -c``: ``sys.path[0]`` is ``''``, the current folder)."""
    import ctypes
    import importlib
    import runpy
    import traceback

    sys.modules.setdefault("rfc3987_syntax", None)  # see grader/runner.py: seconds, unused
    for name in WARM_MODULES:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    requests = os.fdopen(os.dup(0), "r", encoding="utf-8")
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    server = os.getpid()

    def reply(data: dict) -> None:
        replies.write(json.dumps(data) + "\n")
        replies.flush()

    for line in requests:
        request = json.loads(line)
        if threading.active_count() != 1:  # a fork would lose a thread's state: refuse
            reply({"pid": None, "returncode": None, "error": "server has threads"})
            continue
        pid = os.fork()
        if pid:
            reply({"pid": pid})
            _, status = os.waitpid(pid, 0)
            reply({"returncode": os.waitstatus_to_exitcode(status)})
            continue
        # The child: the life of one ``python -m nbgrader`` process.
        code = 1
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != server:
                os._exit(1)
            requests.close()
            replies.close()
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.close(log)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = ["nbgrader", *request["argv"]]
            sys.path[0] = os.getcwd()  # as ``python -m`` in that folder
            try:
                runpy.run_module("nbgrader", run_name="__main__", alter_sys=True)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            except BaseException:  # noqa: BLE001 - reported in the log, like an uncaught error
                traceback.print_exc()
                code = 1
            import atexit

            atexit._run_exitfuncs()  # as at a normal exit (nbgrader's and the timing stamps)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            # Tearing down the ~1300 modules the server imported would take a second per run
            # for nothing: every file is written and closed by now.
            os._exit(code)


class NbgraderServer:
    """A warm nbgrader for one worker; :meth:`run` is ``subprocess.run`` of ``python -m nbgrader``.

    Thread-safe for one caller at a time (each grading worker owns one server). The server is
    started on first use, restarted if it died, and stopped by :meth:`close`.
    """

    def __init__(self, python: str = sys.executable) -> None:
        self.python = python
        self.proc: subprocess.Popen[str] | None = None
        self.lock = threading.Lock()

    def start(self) -> None:
        """Start the server now (its imports then overlap with the caller's own work)."""
        with self.lock:
            self._start()

    def _start(self) -> subprocess.Popen[str]:
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        code = (
            "import sys; sys.argv = ['grader-forkserver']; "
            f"exec(compile(open({__file__!r}).read(), {__file__!r}, 'exec'))"
        )
        # setpriv --pdeathsig: the server (and with it each child) dies if the grader dies.
        prefix = ["setpriv", "--pdeathsig", "KILL", "--"] if shutil.which("setpriv") else []
        from grader.nbtools import tool_env

        self.proc = subprocess.Popen(
            [*prefix, self.python, "-c", code],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=None if os.environ.get("GRADER_FORKSERVER_DEBUG") else subprocess.DEVNULL,
            text=True,
            cwd="/",
            env=tool_env(),
        )
        return self.proc

    def _read(self, proc: subprocess.Popen[str], deadline: float | None) -> dict | None:
        """The server's next reply, or None at the deadline (or if the server is gone)."""
        assert proc.stdout is not None
        while True:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([proc.stdout], [], [], wait)
            if not ready:
                return None
            line = proc.stdout.readline()
            return json.loads(line) if line else None

    def run(
        self, argv: list[str], cwd: Path, env: dict[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """Run ``nbgrader ARGV`` in ``cwd`` with ``env``; output in the result's ``stdout``.

        Past ``timeout`` seconds the child is killed and :class:`subprocess.TimeoutExpired` raised,
        as ``subprocess.run`` does.
        """
        with self.lock:
            proc = self._start()
            log = Path(cwd).parent / f"{Path(cwd).name}.nbgrader.log"
            request = {"argv": argv, "cwd": str(cwd), "env": env, "log": str(log)}
            assert proc.stdin is not None
            try:
                proc.stdin.write(json.dumps(request) + "\n")
                proc.stdin.flush()
            except BrokenPipeError:
                self.proc = None
                raise RuntimeError("the nbgrader server died") from None
            # A new server imports first (seconds): the run's own time starts at its fork.
            started = self._read(proc, time.monotonic() + STARTUP_TIMEOUT)
            deadline = time.monotonic() + timeout
            if not started or not started.get("pid"):
                self.close()
                why = (started or {}).get("error", "it did not answer")
                raise RuntimeError(f"the nbgrader server could not start a run: {why}")
            finished = self._read(proc, deadline)
            if finished is None and proc.poll() is None:
                try:
                    os.kill(started["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                finished = self._read(proc, None)
                output = log.read_text(errors="replace") if log.is_file() else ""
                log.unlink(missing_ok=True)
                raise subprocess.TimeoutExpired(argv, timeout, output=output)
            if finished is None:
                self.proc = None
                raise RuntimeError("the nbgrader server died during a run")
            output = log.read_text(errors="replace") if log.is_file() else ""
            log.unlink(missing_ok=True)
            return subprocess.CompletedProcess(argv, int(finished["returncode"]), output, "")

    def close(self) -> None:
        """Stop the server (a run in progress dies with it)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()


if __name__ == "__main__" and sys.argv[:1] == ["grader-forkserver"]:
    _serve()
