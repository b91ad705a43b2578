"""Executes one notebook inside the sandbox (a standalone script: it imports nothing from grader).

Run as ``python -I runner.py``. It reads one JSON request on stdin::

    {"nb": <notebook>, "graded": [cell indices], "prelude": str, "restore": str,
     "cell_timeout": s, "notebook_timeout": s, "max_output": bytes, "lesson_files": dir | null}

and writes one JSON answer on the stdout it was started with::

    {"cells": [{"index", "outputs", "execution_count", "status"}], "events": [str]}

``status`` is the kernel's execute_reply status (``ok``/``error``/``aborted``) or ``timeout``,
``dead`` (the kernel died), ``not-run`` (after the notebook's time ran out or the kernel died) or
``guard-failed`` (the restore before a graded test cell did not succeed: the cell is not run).
An optional ``"cell_timeouts": {index: s}`` in the request overrides ``cell_timeout`` per cell;
each executed cell's answer also has ``seconds`` (its run time) and ``limit`` (the one applied).

Before starting the kernel it makes itself non-dumpable (so a kernel running as the same user
cannot read its memory or file descriptors through /proc or ptrace) and points fds 1 and 2 at
/dev/null, so the kernel inherits nothing it could forge an answer on.
"""

import asyncio
import ctypes
import json
import os
import shutil
import sys
import time

DEVNULL = os.open(os.devnull, os.O_RDWR)


def _harden() -> int:
    """Keep the answer channel private; returns the fd to write the answer to."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
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


async def _run(request: dict, events: list) -> list:
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
            size = sum(len(json.dumps(o)) for o in outs)
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

    def on_executed(cell, cell_index, execute_reply):
        statuses[cell_index] = execute_reply["content"].get("status", "error")

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
        return reply["content"].get("status", "error")

    results = []
    dead = False
    async with client.async_setup_kernel():
        try:
            status = await hidden(request["prelude"], 120)
        except Exception as exc:  # noqa: BLE001
            status = f"error ({type(exc).__name__})"
        if status != "ok":
            events.append(f"grader prelude failed: {status}")
        for index, cell in enumerate(nb.cells):
            if cell.cell_type != "code":
                continue
            remaining = deadline - time.monotonic()
            if dead or remaining <= 1:
                why = "the kernel died earlier" if dead else "the notebook ran past its time limit"
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
            if index in graded:
                try:
                    guard = await hidden(request["restore"], min(30, remaining))
                except Exception as exc:  # noqa: BLE001
                    guard = f"error ({type(exc).__name__})"
                    dead = not await client.km.is_alive()
                if guard != "ok":
                    events.append(f"cell {index}: grader restore failed ({guard}); not run")
                    cell.outputs = [
                        _error(
                            "GraderRestoreFailed",
                            "the grader could not restore the test environment before this test "
                            "(was torch, course.checks or the import system changed?); not run",
                        )
                    ]
                    results.append(
                        {
                            "index": index,
                            "outputs": cell.outputs,
                            "execution_count": None,
                            "status": "guard-failed",
                        }
                    )
                    continue
                remaining = deadline - time.monotonic()
            # A calibrated per-cell limit (grader/calibrate.py) where one is given.
            limits = request.get("cell_timeouts") or {}
            limit = float(limits.get(str(index), request["cell_timeout"]))
            client.timeout = max(1.0, min(limit, remaining))
            statuses.pop(index, None)
            started = time.monotonic()
            try:
                await client.async_execute_cell(cell, index)
                status = statuses.get(index, "error")
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
    return results


def run() -> None:
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
    try:
        cells = asyncio.run(_run(request, events))
    except Exception as exc:  # noqa: BLE001 - reported to the grader, which fails the notebook
        events.append(f"runner failed: {type(exc).__name__}: {exc}")
        cells = []
    data = json.dumps({"cells": cells, "events": events}).encode()
    with os.fdopen(answer, "wb") as out:
        out.write(data)


if __name__ == "__main__":
    run()
