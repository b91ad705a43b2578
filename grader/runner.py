"""Executes one notebook inside the sandbox (a standalone script: it imports nothing from grader).

Run as ``python -I runner.py``: one JSON request on stdin (``nb``, ``graded`` cell indices, the
guard's ``prelude``/``test_call``/``verdict``, ``cell_timeout``, ``notebook_timeout``,
``max_output``, optional per-cell ``cell_timeouts`` and ``stall_after``, ``lesson_files``,
``kernel_env``), one JSON answer on the stdout it was started with: ``{"cells": [{index, outputs,
execution_count, status, seconds, limit}], "events": [str], "timing": {...}}``. ``status`` is the
execute_reply's (``ok``/``error``/``aborted``) or ``timeout``, ``dead``, ``not-run``,
``guard-failed``, ``refused`` or ``no-verdict``. The shell channel is polled in slices of
:data:`POLL_SLICE`; a reply lost after ``idle`` is recovered (a nudge, then the cell completed
from iopub), leaving an event. The runner is non-dumpable and its stdio is /dev/null before the
kernel starts, so the kernel cannot forge the answer. Background: ``docs/grader-design.md``.
"""

import asyncio
import ctypes
import functools
import json
import os
import secrets
import shutil
import signal
import sys
import time

DEVNULL = os.open(os.devnull, os.O_RDWR)

#: The display output that carries a converted hidden test's observations (``grader.observe.MIME``)
#: and the most it may hold (``grader/lessons/observer.py`` stops a driver before this).
OBSERVATIONS = "application/x-grader-observations"
OBSERVATIONS_LIMIT = 24 * 1024 * 1024

#: Seconds after which a cell with no calibrated ``stall_after`` is described (see above).
STALL_DEFAULT = 60.0

#: Seconds after a cell's ``status: idle`` without its ``execute_reply`` before the runner nudges
#: the kernel's shell channel, and again before it completes the cell without the reply.
REPLY_GRACE = 5.0
#: Longest wait of one poll of the shell channel: a zmq socket wakes its asyncio reader through
#: an edge-triggered file descriptor, and a missed edge leaves a reply in the client's socket
#: until the poll times out; a new poll reads the socket's events at once (the course's
#: ``course.selfcheck.poll_in_slices``, which this isolated process cannot import).
POLL_SLICE = 1.0
#: A reply that comes this long after its cell's ``status: idle`` was found by a later poll.
LATE_REPLY = 0.5


def _sliced(get):
    """``get`` (an async channel's ``get_msg``) waiting in polls of at most :data:`POLL_SLICE`."""
    from queue import Empty

    async def get_msg(timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            try:
                return await get(
                    timeout=POLL_SLICE if left is None else max(0.0, min(POLL_SLICE, left))
                )
            except Empty:
                if left is not None and left <= POLL_SLICE:
                    raise

    return get_msg


#: x86-64 and aarch64 numbers of the system calls a waiting thread is usually in.
SYSCALLS = {
    "x86_64": {
        0: "read",
        7: "poll",
        23: "select",
        35: "nanosleep",
        61: "wait4",
        202: "futex",
        230: "clock_nanosleep",
        232: "epoll_wait",
        270: "pselect6",
        271: "ppoll",
        281: "epoll_pwait",
    },
    "aarch64": {
        63: "read",
        73: "ppoll",
        72: "pselect6",
        98: "futex",
        101: "nanosleep",
        115: "clock_nanosleep",
        260: "wait4",
        22: "epoll_pwait",
    },
}


def _harden() -> int:
    """Keep the answer channel private; returns the fd to write the answer to."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans of the kernel come here
    except (OSError, AttributeError):
        pass
    answer = os.dup(1)  # non-inheritable (PEP 446)
    os.dup2(DEVNULL, 1)
    os.dup2(DEVNULL, 2)
    os.dup2(DEVNULL, 0)
    return answer


def _error(ename: str, evalue: str) -> dict:
    return {
        "output_type": "error",
        "ename": ename,
        "evalue": evalue,
        "traceback": [f"{ename}: {evalue}"],
    }


def _processes() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, state)}`` of every process this one can see in ``/proc``."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        found[int(name)] = (int(fields[1]), fields[0].decode())
    return found


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode(errors="replace").strip()
    except OSError:
        return ""


def _threads(pid: int) -> list[str]:
    """``tid name state wchan syscall`` for every thread of ``pid`` (what /proc lets us read)."""
    calls = SYSCALLS.get(os.uname().machine, {})
    found = []
    try:
        tids = sorted(os.listdir(f"/proc/{pid}/task"), key=int)
    except OSError:
        return [f"{pid}: gone"]
    for tid in tids:
        base = f"/proc/{pid}/task/{tid}"
        stat = _read(f"{base}/stat").rsplit(")", 1)[-1].split()
        state = stat[0] if stat else "?"
        wchan = _read(f"{base}/wchan") or "-"
        number = _read(f"{base}/syscall").split(" ")[0]
        call = calls.get(int(number), f"syscall {number}") if number.isdigit() else number or "-"
        name = _read(f"{base}/comm") or "?"
        main = " (main)" if tid == str(pid) else ""
        found.append(f"{tid}{main} {name} {state} {wchan} {call}")
    return found


def describe_stall(kernel: int | None, log: list, reply: bool) -> str:
    """Where a long-running cell waits: its messages so far and the kernel tree's threads."""
    seen = ", ".join(f"{kind}@{at:.1f}s" for at, kind in log[-12:]) or "none"
    parts = [
        f"messages for the cell: {seen}",
        f"execute_reply {'received' if reply else 'not received'}",
    ]
    if kernel is not None:
        procs = _processes()
        tree = [kernel] + sorted(p for p, (parent, _) in procs.items() if parent == kernel)
        for pid in tree:
            parts.append(f"process {pid}: " + "; ".join(_threads(pid)))
    return " | ".join(parts)


def _kill_leftovers(kernel: int | None) -> int:
    """Kill every process below this runner except the kernel; returns how many there were.

    The runner is the subreaper of the kernel's tree, so a child that detached itself (double
    fork, ``setsid``) is still found here. Repeated until none is left (a fork bomb refills).
    """
    me = os.getpid()
    killed: set[int] = set()
    if kernel is None:  # without the kernel's pid nothing can be told apart: kill nothing
        return 0
    for _ in range(50):
        procs = _processes()
        below = set()
        for pid in procs:
            seen, cur = set(), pid
            while cur in procs and cur not in seen and cur not in (me, 0, 1):
                seen.add(cur)
                cur = procs[cur][0]
            if cur == me and pid not in (me, kernel):
                below.add(pid)
        alive = {p for p in below if procs[p][1] != "Z"}
        for pid in below:
            if procs[pid][0] == me and procs[pid][1] == "Z":
                try:
                    os.waitpid(pid, os.WNOHANG)
                except ChildProcessError:
                    pass
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        killed |= alive
        time.sleep(0.01)
    return len(killed)


def _test_status(status: str, expressions: dict, outputs: list) -> str:
    """A graded test cell's status: ``ok`` only if the grader's own verdict for it is a pass."""
    if status != "ok":
        names = {o.get("ename") for o in outputs if o.get("output_type") == "error"}
        if "GraderRefused" in names:
            return "refused"
        if "GraderRestoreFailed" in names:
            return "guard-failed"
        return status
    got = expressions.get("verdict") or {}
    verdict = str((got.get("data") or {}).get("text/plain", "")).strip("'\"")
    if got.get("status") == "ok" and verdict == "pass":
        return "ok"
    outputs.append(
        _error("GraderNoVerdict", f"the grader's test did not report a pass ({verdict or got})")
    )
    return "no-verdict"


#: Seconds an interrupted kernel has to run ``pass`` before the rest of the notebook is not run.
ANSWER_AFTER_TIMEOUT = 10.0


async def _run(request: dict, events: list, timing: dict) -> list:
    # jsonschema (imported by nbformat) loads its optional IRI format checker, rfc3987_syntax,
    # which compiles a Lark grammar at import: seconds per submission on a loaded 2-core machine,
    # for a format no notebook schema uses. Without the module jsonschema skips that checker.
    sys.modules.setdefault("rfc3987_syntax", None)
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    nb = nbformat.from_dict(request["nb"])
    graded = set(request["graded"])
    max_output = int(request["max_output"])
    deadline = time.monotonic() + float(request["notebook_timeout"])
    statuses: dict = {}

    class Client(NotebookClient):
        def output(self, outs, msg, display_id, cell_index):  # cap what a cell may print
            data = (msg.get("content") or {}).get("data") or {}
            first = next((o for o in outs if OBSERVATIONS in (o.get("data") or {})), None)
            if (
                cell_index in graded
                and first is None
                and OBSERVATIONS in data
                and len(str(data[OBSERVATIONS])) <= OBSERVATIONS_LIMIT
            ):
                # A test's observations (grader/observe.py), once per test cell, under a limit of
                # their own: what the cell printed never crowds them out of the answer.
                return super().output(outs, msg, display_id, cell_index)
            size = sum(len(json.dumps(o)) for o in outs if o is not first)
            if size > max_output:
                if not getattr(self, "_capped", None) == cell_index:
                    self._capped = cell_index
                    events.append(f"cell {cell_index}: output cut at {max_output} bytes")
                    outs.append(
                        nbformat.v4.new_output(
                            "stream", name="stdout", text="\n[grader: output cut here]\n"
                        )
                    )
                return None
            return super().output(outs, msg, display_id, cell_index)

    expressions: dict = {}

    def on_executed(cell, cell_index, execute_reply):
        statuses[cell_index] = execute_reply["content"].get("status", "error")
        expressions[cell_index] = execute_reply["content"].get("user_expressions") or {}

    client = Client(
        nb,
        timeout=float(request["cell_timeout"]),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={
            "ename": "CellTimeoutError",
            "evalue": "",
            "traceback": ["CellTimeoutError: the cell ran past its time limit"],
        },
        kernel_name="python3",
        extra_arguments=["--HistoryManager.hist_file=:memory:"],
        resources={"metadata": {"path": os.getcwd()}},
        record_timing=False,
        shutdown_kernel="immediate",
        on_cell_executed=on_executed,
    )

    async def hidden(code: str, timeout: float) -> str:
        reply = await client.kc.execute_interactive(
            code,
            silent=True,
            store_history=False,
            timeout=timeout,
            output_hook=lambda msg: None,
            allow_stdin=False,
        )
        content = reply["content"]
        status = content.get("status", "error")
        if status == "error":  # name the exception, e.g. "error: ModuleNotFoundError: ..."
            status += f": {content.get('ename', '?')}: {str(content.get('evalue', ''))[:300]}"
        return status

    async def ask(verdict: str) -> dict:
        """A graded test's verdict, asked again where its reply (which carried it) was lost."""
        reply = await client.kc.execute_interactive(
            "pass",
            silent=True,
            store_history=False,
            user_expressions={"verdict": verdict},
            timeout=ANSWER_AFTER_TIMEOUT,
            output_hook=lambda msg: None,
            allow_stdin=False,
        )
        return reply["content"].get("user_expressions") or {}

    results = []
    dead = False
    stuck = ""  # why the kernel no longer answers, once a cell that ran out of time left it so
    tick = time.monotonic()
    timing["setup"] = tick - timing.pop("clock")  # stdin, lesson files, imports
    async with client.async_setup_kernel():
        timing["kernel_start"] = time.monotonic() - tick
        tick = time.monotonic()
        try:
            status = await hidden(request["prelude"], 120)
        except Exception as exc:  # noqa: BLE001
            status = f"error: {type(exc).__name__}: {str(exc)[:300]}"
        if status != "ok":
            events.append(f"grader prelude failed: {status}")
        timing["prelude"] = time.monotonic() - tick
        # What the current cell's messages were, for describe_stall (a cell that runs long).
        log: list = []
        loop = asyncio.get_running_loop()
        current: dict = {"msg_id": None, "start": 0.0, "reply": False}

        def fresh_cell(started: float) -> None:
            current.update(
                msg_id=None,
                start=started,
                reply=False,
                idle=None,  # when iopub said status: idle for the cell
                error=False,  # whether iopub delivered an error output for it
                nudged=None,  # when the shell channel was nudged for a missing reply
                rescue=loop.create_future(),  # set to a reply made from iopub (see above)
                rescued=False,
                index=None,
            )

        fresh_cell(0.0)

        def logged(channel, name):
            get = _sliced(channel.get_msg) if name == "shell" else channel.get_msg

            async def next_msg(*args, **kwargs):
                if name != "shell":
                    return await get(*args, **kwargs)
                getter = asyncio.ensure_future(get(*args, **kwargs))
                rescue = current["rescue"]
                await asyncio.wait({getter, rescue}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    return getter.result()
                getter.cancel()
                await asyncio.gather(getter, return_exceptions=True)
                current["rescue"] = loop.create_future()  # used once
                return rescue.result()

            async def get_msg(*args, **kwargs):
                msg = await next_msg(*args, **kwargs)
                if current["msg_id"] and msg["parent_header"].get("msg_id") == current["msg_id"]:
                    kind = msg["msg_type"]
                    if kind == "status":
                        kind += ":" + str(msg["content"].get("execution_state"))
                        if kind == "status:idle":
                            current["idle"] = time.monotonic()
                    current["error"] = current["error"] or kind == "error"
                    late = current["idle"] and time.monotonic() - current["idle"]
                    if kind == "execute_reply" and current["nudged"] and not current["reply"]:
                        events.append(
                            f"cell {current['index']}: its execute_reply came only after the "
                            f"shell channel was nudged, {late:.1f} s after the kernel went idle"
                        )
                    elif kind == "execute_reply" and late and late > LATE_REPLY:
                        events.append(
                            f"cell {current['index']}: its execute_reply was found by a new poll "
                            f"of the shell channel {late:.1f} s after the kernel went idle (a "
                            "wake-up the client's socket missed)"
                        )
                    current["reply"] = current["reply"] or kind == "execute_reply"
                    log.append((time.monotonic() - current["start"], f"{name} {kind}"))
                return msg

            channel.get_msg = get_msg

        async def rescue_reply(index: int) -> None:
            """Nudge, then complete, a cell whose kernel went idle without its reply (above)."""
            while not current["reply"]:
                await asyncio.sleep(0.25)
                idle, now = current["idle"], time.monotonic()
                if idle is None or current["reply"] or now - idle < REPLY_GRACE:
                    continue
                if current["nudged"] is None:
                    current["nudged"] = now
                    client.kc.kernel_info()  # in case a request wakes the shell socket
                elif now - current["nudged"] >= REPLY_GRACE:
                    events.append(
                        f"cell {index}: the kernel went idle {now - idle:.1f} s ago but its "
                        "execute_reply never came (not even after a kernel_info_request on the "
                        "shell channel): completed from its iopub messages"
                    )
                    status = "error" if current["error"] else "ok"
                    current.update(rescued=True, nudged=None)
                    current["rescue"].set_result(
                        {
                            "header": {"msg_type": "execute_reply", "msg_id": "grader-rescue"},
                            "msg_type": "execute_reply",
                            "parent_header": {"msg_id": current["msg_id"]},
                            "metadata": {},
                            "content": {"status": status, "user_expressions": {}},
                            "buffers": [],
                        }
                    )
                    return

        logged(client.kc.shell_channel, "shell")
        logged(client.kc.iopub_channel, "iopub")
        raw_execute = client.kc.execute

        def tracked_execute(*args, **kwargs):
            current["msg_id"] = raw_execute(*args, **kwargs)
            return current["msg_id"]

        client.kc.execute = tracked_execute
        plain_execute = client.kc.execute
        tick = time.monotonic()
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            remaining = deadline - time.monotonic()
            if dead or stuck or remaining <= 1:
                why = (
                    "the kernel died earlier"
                    if dead
                    else stuck or "the notebook ran past its time limit"
                )
                cell.outputs = [_error("NotRun", f"this cell was not run: {why}")]
                results.append(
                    {
                        "index": index,
                        "outputs": cell.outputs,
                        "execution_count": None,
                        "status": "not-run",
                    }
                )
                continue
            test = index in graded
            if test:
                # Processes the notebook left behind do not outlive its cells into a test.
                swept = time.monotonic()
                killed = _kill_leftovers(getattr(client.km.provisioner, "pid", None))
                timing["leftovers"] += time.monotonic() - swept
                if killed:
                    events.append(f"cell {index}: stopped {killed} process(es) left running")
                nonce = secrets.token_hex(8)
                source = cell.source
                cell.source = (
                    request["test_call"]
                    .replace("__SOURCE__", repr(source))
                    .replace("__INDEX__", str(index))
                    .replace("__NONCE__", repr(nonce))
                )
                asked = {"verdict": request["verdict"].replace("__NONCE__", repr(nonce))}
                client.kc.execute = functools.partial(plain_execute, user_expressions=asked)
                remaining = deadline - time.monotonic()
            # A calibrated per-cell limit (grader/calibrate.py) where one is given.
            limits = request.get("cell_timeouts") or {}
            limit = float(limits.get(str(index), request["cell_timeout"]))
            client.timeout = max(1.0, min(limit, remaining))
            statuses.pop(index, None)
            started = time.monotonic()
            log.clear()
            fresh_cell(started)
            current["index"] = index
            rescuer = asyncio.ensure_future(rescue_reply(index))
            stall = float((request.get("stall_after") or {}).get(str(index), STALL_DEFAULT))
            watchdog = None
            if stall < client.timeout:

                async def watch(after: float = stall, index: int = index) -> None:
                    await asyncio.sleep(after)
                    kernel = getattr(client.km.provisioner, "pid", None)
                    events.append(
                        f"cell {index}: still running after {after:.0f} s: "
                        + describe_stall(kernel, log, current["reply"])
                    )

                watchdog = asyncio.ensure_future(watch())
            try:
                await client.async_execute_cell(cell, index)
                status = statuses.get(index, "error")
                if test and current["rescued"] and status == "ok":
                    expressions[index] = await ask(asked["verdict"])
                if test:
                    status = _test_status(status, expressions.pop(index, {}), cell.outputs)
            except CellTimeoutError:
                status = "timeout"
                cell.outputs.append(_error("CellTimeoutError", "the cell ran past its time limit"))
            except DeadKernelError:
                status = "dead"
                dead = True
                cell.outputs.append(_error("DeadKernelError", "the kernel died in this cell"))
            except Exception as exc:  # noqa: BLE001 - anything else fails this cell only
                status = "error"
                cell.outputs.append(_error(type(exc).__name__, str(exc)[:500]))
                dead = not await client.km.is_alive()
            finally:
                rescuer.cancel()
                if watchdog is not None:
                    watchdog.cancel()
                if test:
                    cell.source = source
                    client.kc.execute = plain_execute
                    timing["tests"] += time.monotonic() - started
            ran_out = status == "timeout" or time.monotonic() - started >= client.timeout
            if ran_out and not dead:
                # Interrupted at its limit: a kernel that no longer answers (its loop swallows
                # the interrupt, or the cell broke ipykernel itself) would make every later cell
                # wait out its own limit too.
                try:
                    answered = await hidden("pass", ANSWER_AFTER_TIMEOUT)
                except Exception as exc:  # noqa: BLE001 - a timeout or a dead channel
                    answered = f"{type(exc).__name__}"
                if answered != "ok":
                    stuck = (
                        f"the kernel stopped answering after cell {index} ran past its time "
                        f"limit (asked to run `pass`, it gave {answered} within "
                        f"{ANSWER_AFTER_TIMEOUT:.0f} s)"
                    )
                    events.append(f"cell {index}: {stuck}")
            if statuses.get(index) == "error" and not any(
                o.get("output_type") == "error" for o in cell.outputs
            ):
                cell.outputs.append(
                    _error(
                        "HiddenError", "the cell raised an error whose traceback was not displayed"
                    )
                )
            results.append(
                {
                    "index": index,
                    "outputs": cell.outputs,
                    "execution_count": cell.get("execution_count"),
                    "status": status,
                    "seconds": round(time.monotonic() - started, 3),
                    "limit": client.timeout,
                }
            )
        timing["cells"] = time.monotonic() - tick
        tick = time.monotonic()
    timing["shutdown"] = time.monotonic() - tick
    return results


def run() -> None:
    started, clock = time.time(), time.monotonic()
    raw = sys.stdin.buffer.read()
    answer = _harden()
    request = json.loads(raw)
    del raw
    # The hidden tests' key for this submission (see grader/keys.py): the kernel inherits it.
    os.environ.update({str(k): str(v) for k, v in (request.get("kernel_env") or {}).items()})
    if request.get("lesson_files"):
        src = request["lesson_files"]
        for name in os.listdir(src):
            path = os.path.join(src, name)
            if os.path.isdir(path):
                shutil.copytree(path, name)
            elif not name.endswith(".ipynb"):
                shutil.copy(path, name)
    events: list = []
    timing: dict = {"started": started, "clock": clock, "leftovers": 0.0, "tests": 0.0}
    try:
        cells = asyncio.run(_run(request, events, timing))
    except Exception as exc:  # noqa: BLE001 - reported to the grader, which fails the notebook
        events.append(f"runner failed: {type(exc).__name__}: {exc}")
        cells = []
    timing["ended"] = time.time()
    data = json.dumps({"cells": cells, "events": events, "timing": timing}).encode()
    with os.fdopen(answer, "wb") as out:
        out.write(data)


if __name__ == "__main__":
    run()
