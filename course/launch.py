"""Real processes with ``torch.distributed``, started from a notebook or a script.

The launcher every multi-process lesson uses (06-multi-gpu, 07-sharded, 08-float8); introduced
in lesson 06. Lesson content lives with its lesson (:mod:`course.multigpu` for 06).

:func:`launch` runs ``fn(rank, world_size, *args)`` in ``world_size`` processes joined in one
process group and returns what each rank returned, in rank order. It is built for teaching
and grading, where the code under test may be wrong:

- **Start method.** On a machine without a GPU, ranks are started with ``fork``: the
  children inherit the kernel's memory (functions defined in notebook cells, imported
  modules), which starts them in a fraction of a second. Where torch sees a GPU, the kernel
  itself must not be forked, gloo ranks included: a process that has initialised CUDA cannot
  be forked safely, and once a process has run a backward pass there, autograd has started its
  per-device threads and a forked child refuses to run backward at all ("Unable to handle
  autograd's threading in combination with fork-based multiprocessing"). There ranks are
  forked from a ``forkserver`` instead, a clean process that has imported torch and nothing
  else (started once, on the first launch), or, on Windows and macOS, ``spawn``-ed as fresh
  interpreters (seconds each: every one imports torch). Either way they receive ``fn`` and
  ``args`` *by value*, serialised with ``cloudpickle``, so functions defined in notebook cells
  work there too. Real multi-GPU and multi-node jobs use
  ``torchrun`` instead (see :mod:`course.ddp_train`).
- **Rendezvous without ports.** Every launch gets a fresh temporary folder and the ranks meet
  through a ``FileStore`` in it (``init_method="file://..."``), so launches running in
  parallel (tests, several notebooks) never collide on a TCP port.
- **Results and errors.** Each rank writes its result (tensors moved to the CPU) or its
  exception with the full traceback to its own file; the caller gets the results, or a
  :class:`RankFailed` naming the rank and carrying its traceback. Each rank's printed output
  is captured in a file and replayed, prefixed with ``[rank r]``.
- **No process outlives a launch.** Each rank leads its own process group and asks the kernel
  to kill it if its parent dies (``PR_SET_PDEATHSIG``): the launching process, or the
  forkserver, which exits when the launching process does. The launcher stops early when
  a rank fails; then, whatever happened (success, exception, timeout, ``KeyboardInterrupt``),
  it sends SIGKILL to every rank's whole process group (which also ends anything a rank
  started) and reaps every child before returning.
- **A timeout that a busy machine cannot trip.** ``timeout`` counts the seconds the ranks
  *could run*, not wall-clock seconds: while more processes are runnable than there are CPUs
  (a grading machine running one notebook per core, each with its ranks), each wall-clock
  second counts only as the CPUs' share of it (:func:`cpu_share`, from ``/proc/loadavg``).
  So a correct run that is merely slowed down is never stopped, while a rank that waits for a
  peer that never comes (which uses no CPU, so the machine is not busier for it) is stopped
  after about ``timeout`` seconds on a quiet machine and at most :data:`MAX_STRETCH` times that
  on a busy one. Notebook graders also stop a cell after a wall-clock limit; an interrupted
  launch (``KeyboardInterrupt``) kills its ranks like any other. The collectives get a timeout
  longer than the launch's longest wait, so the launcher, not a rank, reports a hang.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import importlib
import multiprocessing as mp
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import wait as _wait_for
from pathlib import Path
from typing import Any

import cloudpickle
import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from course.device import DeviceProfile, dist_backend, start_method

#: Seconds of CPU-available time a launch may take before every rank is killed (lesson 06).
DEFAULT_TIMEOUT = 120.0
#: On a busy machine the timeout stretches, up to this many times its value in wall-clock time.
MAX_STRETCH = 10.0
#: Seconds the launcher waits for the other ranks after one failed, to report the first cause.
FAILURE_GRACE = 0.5

_PR_SET_PDEATHSIG = 1


class LaunchError(RuntimeError):
    """A distributed launch did not produce a result from every rank (lesson 06)."""

    def __init__(self, message: str, outputs: dict[int, str] | None = None) -> None:
        super().__init__(message)
        #: What each rank printed, by rank.
        self.outputs = outputs or {}


class RankFailed(LaunchError):
    """A rank raised (or died); ``rank``, ``exc_type`` and ``remote_traceback`` say where/why."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        exc_type: str,
        message: str,
        remote_traceback: str,
        original: BaseException | None = None,
        outputs: dict[int, str] | None = None,
    ) -> None:
        self.rank = rank
        self.world_size = world_size
        self.exc_type = exc_type
        self.remote_traceback = remote_traceback
        #: The exception object raised in the rank, when it could be sent back.
        self.original = original
        text = f"rank {rank} of {world_size} raised {exc_type}: {message}"
        if remote_traceback:
            text += f"\n\nTraceback from rank {rank}:\n{remote_traceback.rstrip()}"
        text += "\n\nEvery rank of this launch has been stopped."
        super().__init__(text, outputs)


class LaunchTimeout(LaunchError, TimeoutError):
    """The ranks did not all finish within the launch's timeout; all were killed (lesson 06)."""


@dataclass(frozen=True)
class Backend:
    """Where ranks run: the ``torch.distributed`` backend and the device type of each rank."""

    name: str
    device_type: str

    def device(self, rank: int) -> torch.device:
        """The device rank ``rank`` computes on (``cuda:<rank>`` for nccl, else the CPU)."""
        if self.device_type == "cuda":
            return torch.device("cuda", rank % max(1, torch.cuda.device_count()))
        return torch.device("cpu")


def pick_backend(
    world_size: int, prefer: str | None = None, profile: DeviceProfile | None = None
) -> Backend:
    """``nccl`` with one GPU per rank when there are enough GPUs, else ``gloo`` on the CPU.

    ``prefer`` ("gloo" or "nccl") forces a choice. Decided by
    :func:`course.device.dist_backend` from ``profile`` (default: this machine's GPUs; a Mac's
    ranks are CPU processes, as gloo cannot carry MPS tensors). Introduced in lesson 06.
    """
    if prefer == "gloo":
        return Backend("gloo", "cpu")
    if profile is None:
        profile = _gpu_profile()
    enough = dist_backend(profile, world_size) == "nccl"
    if prefer == "nccl" and not enough:
        raise RuntimeError(
            f"nccl needs one GPU per rank: {world_size} ranks asked for, "
            f"{profile.gpu_count if profile.kind in ('cuda', 'rocm') else 0} GPUs visible"
            + ("" if profile.nccl else ", and this torch build has no NCCL")
        )
    return Backend("nccl", "cuda") if enough else Backend("gloo", "cpu")


def _gpu_profile() -> DeviceProfile:
    """This machine's CUDA (or ROCm) GPUs as a profile, read cheaply: only what the choice of
    backend needs (the count, and whether this build has NCCL)."""
    if not torch.cuda.is_available():
        return DeviceProfile(kind="cpu", name="CPU", fork=fork_is_safe())
    return DeviceProfile(
        kind="rocm" if torch.version.hip is not None else "cuda",
        name="GPU",
        gpu_count=torch.cuda.device_count(),
        nccl=dist.is_available() and dist.is_nccl_available(),
    )


def describe_backend(backend: Backend, world_size: int) -> str:
    """One line saying how many ranks run where, printed beside distributed results (lesson 06)."""
    if backend.name == "nccl":
        names = sorted({torch.cuda.get_device_name(i) for i in range(world_size)})
        return f"{world_size} ranks on {world_size} GPUs ({', '.join(names)}), backend nccl"
    return f"{world_size} CPU processes on this machine, backend gloo, torch {torch.__version__}"


def rank_device() -> torch.device:
    """Inside a rank: the device this rank should use (its GPU for nccl, else the CPU)."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------
# The child side


def _die_with_parent(parent_pid: int) -> None:
    """Ask Linux to SIGKILL this process when its parent dies (no orphans if the kernel dies).

    ``parent_pid`` is the launching process: the parent of a forked or spawned rank; a
    forkserver's rank has the server as its parent, which exits when the launcher does."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == parent_pid:
        return
    try:  # the launcher died before prctl took effect (or is gone while a server forks)
        os.kill(parent_pid, 0)
    except ProcessLookupError:
        os._exit(1)
    except PermissionError:
        pass


def _to_cpu(value: Any) -> Any:
    """``value`` with every tensor detached, copied to the CPU and made compact."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True).contiguous()
    if isinstance(value, dict):
        items = [(k, _to_cpu(v)) for k, v in value.items()]
        try:
            return type(value)(items)
        except TypeError:
            return dict(items)
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_to_cpu(v) for v in value)
    return value


def _write(path: Path, payload: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(payload, tmp)
    os.replace(tmp, path)


def _child(
    fn: Callable[..., Any] | bytes,
    rank: int,
    world_size: int,
    args: tuple,
    backend: str,
    workdir: str,
    timeout: float,
    parent_pid: int,
    threads: int | None,
) -> None:
    """Body of every rank: isolate, join the group, run ``fn``, report, exit."""
    with contextlib.suppress(OSError):
        os.setpgid(0, 0)
    _die_with_parent(parent_pid)
    folder = Path(workdir)
    log = os.open(folder / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = sys.stdout
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    code = 0
    try:
        if isinstance(fn, bytes):  # spawned: fn and args travel by value (see launch)
            fn, args = cloudpickle.loads(fn)
        if threads:
            torch.set_num_threads(threads)
        if backend == "nccl":
            torch.cuda.set_device(rank % torch.cuda.device_count())
        dist.init_process_group(
            backend,
            init_method=(folder / "store").as_uri(),
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=collective_timeout(timeout)),
        )
        payload = {"ok": True, "result": _to_cpu(fn(rank, world_size, *args))}
        try:
            _write(folder / f"rank{rank}.pt", payload)
        except Exception as exc:  # noqa: BLE001 - reported to the caller below
            raise RuntimeError(
                f"rank {rank}'s result could not be sent back (return tensors, numbers, "
                f"lists and dicts): {type(exc).__name__}: {exc}"
            ) from exc
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, then we exit
        code = 1
        try:
            original = pickle.dumps(exc)
            pickle.loads(original)
        except Exception:  # noqa: BLE001 - not every exception survives pickling
            original = None
        payload = {
            "ok": False,
            "type": type(exc).__name__,
            "message": str(exc),
            "traceback": traceback.format_exc(),
            "exception": original,
        }
        with contextlib.suppress(Exception):
            _write(folder / f"rank{rank}.pt", payload)
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    if code == 0:
        # Leave together, so that no rank tears down a connection a peer is still reading.
        with contextlib.suppress(Exception):
            dist.barrier()
            dist.destroy_process_group()
    os._exit(code)


# --------------------------------------------------------------------------------------------
# The parent side


def _this_machine() -> DeviceProfile:
    """What the choice of start method needs to know of this machine: its accelerator's kind
    and whether the OS forks."""
    kind = "cpu"
    if torch.accelerator.is_available():
        found = torch.accelerator.current_accelerator()
        kind = found.type if found is not None and found.type in ("mps", "xpu") else "cuda"
    return DeviceProfile(kind=kind, name="this machine", fork="fork" in mp.get_all_start_methods())


def default_start_method(backend: str = "gloo") -> str:
    """How :func:`launch` starts ranks on this machine when not told:
    :func:`course.device.start_method` of it (fork, forkserver or spawn)."""
    return start_method(_this_machine(), backend)


def fork_is_safe() -> bool:
    """Whether ranks may be forked from this process: only where the OS forks and torch sees
    no accelerator (:func:`course.device.start_method`).

    With a GPU present, the first backward pass starts autograd's per-device threads, after
    which a forked child cannot run backward; CUDA itself cannot be used across fork either.
    """
    return default_start_method("gloo") == "fork"


def _by_value(fn: Callable[..., Any], args: tuple) -> bytes:
    """``(fn, args)`` serialised with cloudpickle, for a spawned rank (which cannot see the
    notebook's ``__main__``)."""
    try:
        return cloudpickle.dumps((fn, tuple(args)))
    except Exception as exc:  # noqa: BLE001 - re-raised with what to do about it
        raise ValueError(
            f"{getattr(fn, '__qualname__', fn)!r} or its arguments cannot be sent to a new "
            f"process ({type(exc).__name__}: {exc}). Pass plain values (numbers, tensors, "
            "dataclasses) and build models, optimizers and locks inside the rank."
        ) from exc


def _read_outcome(folder: Path, rank: int) -> dict | None:
    path = folder / f"rank{rank}.pt"
    if not path.exists():
        return None
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 - a half-written file counts as no result
        return None


def _kill_all(procs: Sequence[Any]) -> None:
    """SIGKILL every rank's process group (the rank and anything it started), then reap."""
    for proc in procs:
        if proc.pid is None:
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.kill()
    for proc in procs:
        with contextlib.suppress(Exception):
            proc.join(timeout=30)


def _outputs(folder: Path, world_size: int) -> dict[int, str]:
    texts = {}
    for rank in range(world_size):
        path = folder / f"rank{rank}.log"
        with contextlib.suppress(OSError):
            texts[rank] = path.read_text(encoding="utf-8", errors="replace")
    return texts


def _replay(outputs: dict[int, str]) -> None:
    for rank, text in sorted(outputs.items()):
        for line in text.splitlines():
            print(f"[rank {rank}] {line}")


def _is_comm_error(outcome: dict) -> bool:
    """Errors a rank gets because a *peer* failed (a closed connection, a collective timeout)."""
    text = f"{outcome.get('type', '')} {outcome.get('message', '')}"
    return outcome.get("type", "").startswith("Dist") or any(
        word in text for word in ("Connection closed", "Connection reset", "Timed out", "timed out")
    )


#: Modules DDP and the optimizers import on first use (torch._dynamo pulls in sympy: seconds).
#: Imported once in the parent, forked ranks inherit them instead of each importing them again.
PRELOAD = ("torch._dynamo", "torch.nn.parallel", "torch.distributed.algorithms.ddp_comm_hooks")


def _preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)


def launch(
    fn: Callable[..., Any],
    world_size: int = 2,
    args: tuple = (),
    *,
    backend: str = "gloo",
    timeout: float = DEFAULT_TIMEOUT,
    start_method: str | None = None,
    threads: int | None = None,
    show_output: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` processes; return each rank's result.

    The ranks are already in one default process group (``backend``, joined through a
    ``FileStore`` in a fresh temporary folder) when ``fn`` starts. Results come back in rank
    order with tensors on the CPU. If a rank raises or dies, the others are stopped and
    :class:`RankFailed` is raised with that rank's traceback; if the ranks have not all finished
    after ``timeout`` seconds (of CPU time available to them: a busy machine stretches it, see
    :func:`cpu_share`), every one is killed and :class:`LaunchTimeout` is raised. In every
    case no process of the launch is left running when this function returns or raises.

    ``start_method`` defaults to ``fork`` where that is safe (no GPU, see
    :func:`fork_is_safe`), else ``forkserver`` (``spawn`` on Windows and macOS:
    :func:`default_start_method`); ranks that are not forked from the caller get ``fn`` and
    ``args`` by value through cloudpickle, so notebook functions work either way. Forked ranks
    compute on one thread each (GNU OpenMP cannot be used across fork); ``threads`` sets the
    torch thread count of the others (default: the CPUs shared among the ranks). Printed output
    of the ranks is replayed with a ``[rank r]`` prefix when ``show_output``. Introduced in
    lesson 06.
    """
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if timeout <= 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    method = start_method or default_start_method(backend)
    if method not in ("fork", "spawn", "forkserver"):
        raise ValueError(f"start_method must be fork, spawn or forkserver, got {method!r}")
    if method == "fork" and backend == "nccl":
        raise ValueError("nccl ranks use CUDA, which cannot be used across fork: use spawn")
    if backend == "nccl":
        pick_backend(world_size, prefer="nccl")  # raises when there are too few GPUs
    target: Any = fn
    if method == "fork":
        # GNU OpenMP's thread pool does not survive fork(): a forked rank that runs torch ops
        # on more than one thread can hang forever once the parent has used its pool.
        if threads not in (None, 1):
            raise ValueError(f"forked ranks run on one thread each; threads={threads!r}")
        threads = 1
        _preload()
    else:
        target, args = _by_value(fn, args), ()
        if threads is None:
            threads = max(1, (os.cpu_count() or 1) // world_size)
    ctx = mp.get_context(method)
    if method == "forkserver":
        # Takes effect when the server starts (the first forkserver launch of this process):
        # the server imports what every rank needs once, and each rank is forked from it.
        ctx.set_forkserver_preload(["course.launch", *PRELOAD])
    folder = Path(tempfile.mkdtemp(prefix="course-dist-"))
    procs: list[Any] = []
    outputs: dict[int, str] = {}
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns on fork() in a process with threads (Jupyter's kernel has a
            # few). The ranks only run torch code in the forking thread's copy, then _exit.
            warnings.filterwarnings("ignore", message=r".*fork\(\)", category=DeprecationWarning)
            for rank in range(world_size):
                proc = ctx.Process(
                    target=_child,
                    args=(
                        target,
                        rank,
                        world_size,
                        tuple(args),
                        backend,
                        str(folder),
                        timeout,
                        os.getpid(),
                        threads,
                    ),
                    name=f"course-rank-{rank}",
                    daemon=False,
                )
                proc.start()
                procs.append(proc)
                with contextlib.suppress(OSError):
                    os.setpgid(proc.pid, proc.pid)  # also set by the child: no race either way
        outcomes = _supervise(procs, folder, world_size, timeout)
    except LaunchError as exc:
        _kill_all(procs)
        outputs = _outputs(folder, world_size)
        exc.outputs = outputs
        if show_output:
            _replay(outputs)
        raise
    finally:
        _kill_all(procs)
        if not outputs:
            outputs = _outputs(folder, world_size)
        shutil.rmtree(folder, ignore_errors=True)
    if show_output:
        _replay(outputs)
    return [outcomes[rank]["result"] for rank in range(world_size)]


def collective_timeout(timeout: float) -> float:
    """The process group's collective timeout for a launch of ``timeout`` (lesson 06).

    Longer than the longest the launcher waits (``timeout`` stretched :data:`MAX_STRETCH`
    times), so a rank waiting for a slow peer never gives up before the launcher decides.
    """
    return timeout * MAX_STRETCH + 60.0


def usable_cpus() -> float:
    """CPUs this process may use: its affinity mask, lowered by a cgroup v2 CPU quota (lesson 06).

    A container limited by ``cpu.max`` (say 2 CPUs' worth on a 64-core host) runs slower than
    its affinity mask suggests; the quota is what its processes share.
    """
    try:
        cpus = float(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cpus = float(os.cpu_count() or 1)
    with contextlib.suppress(OSError, ValueError, IndexError):
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            cpus = min(cpus, max(float(quota) / float(period), 0.01))
    return cpus


def cpu_share(cpus: float | None = None, loadavg: str | None = None) -> float:
    """The share of a CPU each runnable process gets right now, at most 1 (lesson 06).

    ``/proc/loadavg``'s fourth field is "runnable/total" scheduling entities at this instant;
    with more runnable than ``cpus`` (default: :func:`usable_cpus`), each gets
    ``cpus / runnable``. 1.0 where that cannot be read. The launcher's timeout counts time
    at this rate.
    """
    if cpus is None:
        cpus = usable_cpus()
    try:
        text = loadavg if loadavg is not None else Path("/proc/loadavg").read_text()
        runnable = int(text.split()[3].split("/")[0])
    except (OSError, IndexError, ValueError):
        return 1.0
    return min(1.0, cpus / max(1, runnable))


def _supervise(procs: list[Any], folder: Path, world_size: int, timeout: float) -> dict:
    """Wait for the ranks; stop at the first failure or when the timeout is used up.

    The timeout is spent at the rate :func:`cpu_share` gives (a busy machine spends it more
    slowly), and never lasts longer than :data:`MAX_STRETCH` times its value.
    """
    start = last = time.monotonic()
    hard_deadline = start + timeout * MAX_STRETCH
    used = 0.0
    pending = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    outcomes: dict[int, dict] = {}
    failed_at: float | None = None
    while pending:
        now = time.monotonic()
        used += (now - last) * cpu_share()
        last = now
        if failed_at is not None and (now - failed_at > FAILURE_GRACE or not pending):
            break
        if used >= timeout or now >= hard_deadline:
            if failed_at is not None:
                break
            running = sorted(pending.values())
            raise LaunchTimeout(
                f"rank(s) {running} of {world_size} had not finished after {now - start:.1f} s "
                f"(a timeout of {timeout:g} s of CPU time available to them), so every rank "
                "was killed. A rank that waits in a collective (all_reduce, barrier, DDP's "
                "backward) for a peer that never joins it waits until the process group's "
                f"timeout (gloo's default: {default_pg_timeout}): check that every rank makes "
                "the same collective calls in the same order."
            )
        wait_for = min(max(timeout - used, 0.0), 0.25)
        if failed_at is not None:
            wait_for = min(wait_for, FAILURE_GRACE)
        for sentinel in _wait_for(list(pending), timeout=max(wait_for, 0.0)):
            rank = pending.pop(sentinel)
            outcome = _read_outcome(folder, rank)
            if outcome is None:
                procs[rank].join(timeout=1)
                outcome = {
                    "ok": False,
                    "type": "ProcessDied",
                    "message": f"the process exited (code {procs[rank].exitcode}) without "
                    "reporting a result: killed by a signal, out of memory, or os._exit()",
                    "traceback": "",
                    "exception": None,
                }
            outcomes[rank] = outcome
            if not outcome["ok"] and failed_at is None:
                failed_at = time.monotonic()
    failures = {r: o for r, o in outcomes.items() if not o["ok"]}
    if failures:
        # Report the root cause: a rank whose error is not just "my peer went away".
        causes = [r for r, o in sorted(failures.items()) if not _is_comm_error(o)]
        rank = causes[0] if causes else min(failures)
        o = failures[rank]
        original = None
        if o.get("exception") is not None:
            with contextlib.suppress(Exception):
                original = pickle.loads(o["exception"])
        raise RankFailed(
            rank, world_size, o["type"], o["message"], o.get("traceback", ""), original
        )
    return outcomes


#: Command-line marks of multiprocessing's own helper processes: ``spawn`` starts a resource
#: tracker once per process (it stays, and exits with its parent), ``forkserver`` a server.
_MP_HELPERS = (b"multiprocessing.resource_tracker", b"multiprocessing.forkserver")


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def child_pids(include_helpers: bool = False) -> list[int]:
    """PIDs of this process's living descendants (psutil when installed, else /proc).

    multiprocessing's own helpers (the resource tracker ``spawn`` starts once and the
    ``forkserver``, both kept until this process exits) are left out unless
    ``include_helpers``: they are not ranks. The ranks a forkserver forks carry its command
    line too, so a helper is recognised by its mark *and* a parent without it. Used to check
    that a launch leaves no process behind. Introduced in lesson 06.
    """
    try:
        import psutil
    except ImportError:
        psutil = None
    found: dict[int, int] = {}  # pid -> parent pid
    if psutil is not None:
        for child in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess):
                if child.status() != psutil.STATUS_ZOMBIE:
                    found[child.pid] = child.ppid()
    else:
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    stat = (entry / "stat").read_text()
                    fields = stat[stat.rindex(")") + 2 :].split()
                    if fields[0] != "Z":
                        parents[int(entry.name)] = int(fields[1])
        frontier = {os.getpid()}
        while frontier:
            frontier = {pid for pid, ppid in parents.items() if ppid in frontier}
            found.update({pid: parents[pid] for pid in sorted(frontier)})
    if include_helpers:
        return list(found)

    def helper(pid: int) -> bool:
        marks = [mark for mark in _MP_HELPERS if mark in _cmdline(pid)]
        return bool(marks) and not any(mark in _cmdline(found[pid]) for mark in marks)

    return [pid for pid in found if not helper(pid)]


# --------------------------------------------------------------------------------------------
# Instruments the graders use inside a rank


class AllReduceCount:
    """What :func:`count_ddp_allreduces` saw: DDP models built, all-reduce calls made, and
    the first tensor argument of every DDP forward call (detached copies, in call order)."""

    def __init__(self) -> None:
        self.models = 0
        self.calls = 0
        self.inputs: list[torch.Tensor] = []


@contextlib.contextmanager
def count_ddp_allreduces():
    """Inside a rank: count the gradient all-reduces of every DDP model built in the block.

    Every ``DistributedDataParallel`` constructed inside the ``with`` block gets a comm hook
    that all-reduces exactly as DDP does by default and counts one call per gradient bucket.
    (So the code under test must not register a comm hook of its own.) Every forward call of a
    DDP model inside the block also records a copy of its first tensor argument in ``inputs``,
    so a grader can see which rows each rank trained on. Introduced in lesson 06.
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel

    count = AllReduceCount()
    original = DistributedDataParallel.__init__
    original_forward = DistributedDataParallel.forward

    def recording_forward(self, *args, **kwargs):
        first = next((a for a in _tensors_in(list(args) + list(kwargs.values()))), None)
        if first is not None:
            count.inputs.append(first.detach().to("cpu", copy=True))
        return original_forward(self, *args, **kwargs)

    def counting_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        count.models += 1

        def hook(state, bucket):  # no annotations: DDP rejects string annotations on hooks
            count.calls += 1
            return default_hooks.allreduce_hook(None, bucket)

        self.register_comm_hook(None, hook)

    DistributedDataParallel.__init__ = counting_init
    DistributedDataParallel.forward = recording_forward
    try:
        yield count
    finally:
        DistributedDataParallel.__init__ = original
        DistributedDataParallel.forward = original_forward


#: The ``torch.distributed`` collectives :func:`record_collectives` watches.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "broadcast",
    "reduce",
    "all_to_all_single",
)


def _tensors_in(values) -> list[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_tensors_in(value))
    return found


@contextlib.contextmanager
def spy_on_collectives(names: Sequence[str], record: Callable[[str, tuple, dict], None]):
    """Inside a rank: call ``record(name, args, kwargs)`` before each ``torch.distributed.<name>``.

    The functions are replaced as attributes of ``torch.distributed`` for the block (code that
    calls ``dist.all_reduce(...)`` is seen; a name imported before the block is not) and put
    back afterwards. A spied function that calls another spied one (a deprecated name calling
    its successor) is recorded once, by the name it was called with. Introduced in lesson 06;
    lesson 07 watches FSDP2's collectives with it.
    """
    originals = {name: getattr(dist, name) for name in names if hasattr(dist, name)}
    inside = threading.local()  # a spied function that calls another is recorded once

    def spy(name, function):
        def wrapper(*args, **kwargs):
            if getattr(inside, "depth", 0):
                return function(*args, **kwargs)
            record(name, args, kwargs)
            inside.depth = 1
            try:
                return function(*args, **kwargs)
            finally:
                inside.depth = 0

        return wrapper

    for name, function in originals.items():
        setattr(dist, name, spy(name, function))
    try:
        yield
    finally:
        for name, function in originals.items():
            setattr(dist, name, function)


@contextlib.contextmanager
def record_collectives():
    """Inside a rank: record ``(collective, dtype)`` for every tensor sent in the block.

    Watches the functions in :data:`COLLECTIVES` (see :func:`spy_on_collectives`). Yields the
    list the records are appended to. Introduced in lesson 06.
    """
    records: list[tuple[str, torch.dtype]] = []

    def record(name: str, args: tuple, kwargs: dict) -> None:
        for tensor in _tensors_in(list(args) + list(kwargs.values())):
            records.append((name, tensor.dtype))

    with spy_on_collectives(COLLECTIVES, record):
        yield records


# --------------------------------------------------------------------------------------------
# Scripts run by torchrun (course.ddp_train, course.gpt_train)


def under_torchrun() -> bool:
    """Whether this process is a rank started by ``torchrun`` (its environment names one)."""
    return all(name in os.environ for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def init_torchrun(backend: str = "auto") -> torch.device:
    """Inside a torchrun rank: join the process group and return the device to compute on.

    ``nccl`` on this rank's GPU (``LOCAL_RANK``) when the machine has a GPU for each of its local
    ranks (``LOCAL_WORLD_SIZE``), with ``device_id`` so the communicator forms now; else ``gloo``
    on the CPU (on a one-GPU machine with two ranks, rank 1 has no GPU of its own). ``backend``
    "gloo" or "nccl" forces a choice; "nccl" without a GPU per rank stops with the reason.
    Introduced in lesson 06 (course.ddp_train), also used by lesson 09's course.gpt_train.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    try:  # the same choice as the course's launcher makes, over this machine's ranks
        chosen = pick_backend(local_ranks, None if backend == "auto" else backend)
    except RuntimeError as exc:
        raise SystemExit(f"--backend nccl needs a GPU per rank: {exc}") from None
    if chosen.name == "nccl":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
        return device
    dist.init_process_group("gloo")
    return torch.device("cpu")


def exit_script(code: int) -> None:
    """End a ``python -m course.<script>`` process with ``code`` (lesson 06).

    Under torchrun, Gloo's worker threads can abort the interpreter's teardown ("terminate called
    without an active exception", SIGABRT) even after ``destroy_process_group()``; the group is
    gone and the output flushed, so the rank leaves without finalising, as launched ranks do.
    """
    if under_torchrun():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
