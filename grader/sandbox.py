"""Execute one notebook in its own sandboxed process tree (bubblewrap + rlimits).

Inside the sandbox only ``/usr``, ``/etc``, the Python installation, the virtual environment, the
``course`` package (at ``/opt/course/course``) and the grader's files a kernel reads
(:func:`grader.lessons.kernel_files`: the harness and the drivers, never a judge) exist, read-only;
``/home/student`` (the kernel's cwd, holding only the lesson's extra files), ``/tmp`` and
``/dev/shm`` are private tmpfs, and the kernel's connection folder is bound in; network, PID, IPC
and UTS namespaces are new; it dies with its parent. The kernel runs as an unprivileged uid per
worker slot (as root) under ``prlimit`` (:class:`Limits`); :mod:`grader.kernel` starts it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader.lessons import kernel_files
from grader.settings import UID_BASE_ENV, GraderSettings, default

HOME = "/home/student"


class SandboxUnavailable(RuntimeError):
    """No working isolation tool on this machine (and running unsandboxed was not allowed)."""


@dataclass
class Limits:
    """Resource limits for one submission (defaults: :class:`grader.settings.GraderSettings`)."""

    cell_timeout: float = default("cell_timeout")  # type: ignore[assignment]
    notebook_timeout: float = default("notebook_timeout")  # type: ignore[assignment]
    memory_mb: int = default("memory_mb")  # type: ignore[assignment]
    nproc: int = default("nproc")  # type: ignore[assignment]
    fsize_mb: int = default("fsize_mb")  # type: ignore[assignment]
    tmpfs_mb: int = default("tmpfs_mb")  # type: ignore[assignment]
    max_output: int = default("max_output")  # type: ignore[assignment]
    threads: int = 1

    @classmethod
    def of(cls, settings: GraderSettings, **given: object) -> Limits:
        """The limits ``settings`` set, with ``given`` ones in place of theirs."""
        names = ("cell_timeout", "notebook_timeout", "memory_mb", "nproc", "fsize_mb")
        names += ("tmpfs_mb", "max_output")
        return cls(**{n: getattr(settings, n) for n in names} | given)  # type: ignore[arg-type]

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Limits:
        return cls(**json.loads(text))


@dataclass
class Settings:
    """How to execute: limits, isolation mode and worker slot (for the per-slot uid)."""

    limits: Limits
    mode: str = "bwrap"  # or "unsandboxed"
    slot: int = 0
    lesson_files: str | None = None
    #: ``COURSE_GRADING_KEY``/``COURSE_STUDENT_ID`` for the kernel (:func:`grader.keys.kernel_env`).
    kernel_env: dict[str, str] = field(default_factory=dict)
    #: the ``course`` package the kernel imports (:func:`course_dir`; ``None``: the installed one)
    course_dir: str | None = None
    #: the first sandbox uid (slot 0's; ``GRADER_UID_BASE`` in the environment moves it)
    uid_base: int = default("uid_base")  # type: ignore[assignment]

    def to_env(self) -> str:
        data = asdict(self)
        return json.dumps(data)

    @classmethod
    def from_env(cls, text: str) -> Settings:
        data = json.loads(text)
        data["limits"] = Limits(**data["limits"])
        return cls(**data)


def _course_dir() -> Path:
    """The installed ``course`` package's folder, found without importing it (which would import
    torch into every nbgrader process: seconds per submission)."""
    import importlib.util

    spec = importlib.util.find_spec("course")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the course package is not importable")
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def installed_course_dir() -> Path:
    """The folder of the ``course`` package this environment imports (an editable install may
    point at another checkout)."""
    return _course_dir()


def course_dir(root: Path) -> Path:
    """The ``course`` package to grade ``root``'s lessons with: ``root/course`` when the course
    folder has one (whatever checkout the environment's ``course`` is installed from), else the
    installed package (a course folder that holds only lessons and solutions)."""
    own = root / "course"
    if (own / "__init__.py").is_file():
        return own.resolve()
    return _course_dir()


#: Where the sandbox shows the ``course`` package (its parent is the kernel's ``PYTHONPATH``).
SANDBOX_COURSE = "/opt/course/course"


def real_interpreter() -> str:
    """This interpreter's path with its folders' symbolic links resolved but the executable's
    own name kept (``.venv/bin/python`` of a ``.venv`` linked elsewhere becomes the linked
    folder's ``bin/python``, which still starts the virtual environment): the sandbox binds
    only real locations, so the path it starts must be one."""
    exe = Path(sys.executable)
    return str(Path(os.path.realpath(exe.parent)) / exe.name)


@functools.cache
def bwrap_problem() -> str | None:
    """Why bubblewrap cannot be used here (``None`` when it works)."""
    exe = shutil.which("bwrap")
    if not exe:
        return (
            "bubblewrap (bwrap) is not installed: install it (Debian/Ubuntu: apt-get install "
            "bubblewrap) so each submission runs without network or access to other files"
        )
    probe = subprocess.run(
        [
            exe,
            "--unshare-net",
            "--unshare-pid",
            "--die-with-parent",
            "--ro-bind",
            "/",
            "/",
            "--proc",
            "/proc",
            "true",
        ],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return (
            f"bubblewrap is installed but cannot create namespaces here ({probe.stderr.strip()}); "
            "enable user namespaces or run the grader as root"
        )
    return None


def require_isolation(unsandboxed: bool) -> str:
    """The mode to use; raises :class:`SandboxUnavailable` if isolation is missing."""
    problem = bwrap_problem()
    if problem is None:
        return "bwrap"
    if unsandboxed:
        return "unsandboxed"
    raise SandboxUnavailable(
        f"refusing to grade: {problem}. Without it student code would run with your files, your "
        "network and no process isolation. Pass --unsandboxed to grade anyway (only for "
        "submissions you trust)."
    )


def _env(limits: Limits, home: str, course_path: str) -> dict[str, str]:
    threads = str(max(1, limits.threads))
    return {
        "HOME": home,
        "PATH": f"{Path(real_interpreter()).parent}:/usr/local/bin:/usr/bin:/bin",
        "PYTHONPATH": course_path,
        "LANG": "C.UTF-8",
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "MPLBACKEND": "Agg",
        "MPLCONFIGDIR": "/tmp/mpl",
        "IPYTHONDIR": "/tmp/ipython",
        "JUPYTER_RUNTIME_DIR": "/tmp/jupyter-runtime",
        "JUPYTER_PLATFORM_DIRS": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "NBGRADER_EXECUTION": "autograde",
    }


def _prlimit(limits: Limits) -> list[str]:
    mb = 1024 * 1024
    return [
        "prlimit",
        f"--as={limits.memory_mb * mb}",
        f"--nproc={limits.nproc}",
        f"--fsize={limits.fsize_mb * mb}",
        f"--cpu={int(limits.notebook_timeout * 2 + 60)}",
        "--core=0",
        "--",
    ]


def sandbox_uid(settings: Settings) -> int | None:
    """The unprivileged uid the sandbox runs as: one per worker slot when the grader is root
    (rlimits on processes count per uid), else ``None``."""
    if settings.mode != "bwrap" or os.geteuid() != 0:
        return None
    return int(os.environ.get(UID_BASE_ENV) or settings.uid_base) + settings.slot


def kernel_command(settings: Settings, kernel: list[str], runtime: Path) -> list[str]:
    """The command that starts ``kernel`` (a kernel's argv) in the sandbox of ``settings``,
    with ``runtime`` (its connection file and IPC sockets) bound in at the same path."""
    if settings.mode == "unsandboxed":
        return _prlimit(settings.limits) + kernel
    if settings.mode != "bwrap":
        raise ValueError(f"unknown sandbox mode {settings.mode!r}")
    return bwrap_command(settings, kernel, runtime)


def kernel_env(settings: Settings, runtime: Path) -> tuple[dict[str, str], str]:
    """The kernel's environment and working folder (inside the sandbox, or in ``runtime``)."""
    course = Path(settings.course_dir) if settings.course_dir else _course_dir()
    if settings.mode == "bwrap":
        env = _env(settings.limits, HOME, str(Path(SANDBOX_COURSE).parent))
        return env | settings.kernel_env, HOME
    home, path = runtime / "home", runtime / "path"
    home.mkdir(exist_ok=True)
    path.mkdir(exist_ok=True)
    links = [("course", course.resolve()), *((rel, src) for src, rel in kernel_files())]
    for rel, src in links:  # the course and the drivers, where the sandbox mounts them
        link = path / rel
        if not link.is_symlink():  # made by this kernel's first start already
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(src)
    env = {**os.environ, **_env(settings.limits, str(home), str(path))}
    env.update(MPLCONFIGDIR=str(home / ".mpl"), IPYTHONDIR=str(home / ".ipython"))
    env["JUPYTER_RUNTIME_DIR"] = str(home / ".runtime")
    return env | settings.kernel_env, str(home)


def bwrap_command(
    settings: Settings, inner: list[str] | None = None, runtime: Path | None = None
) -> list[str]:
    """The command line that runs ``inner`` (a kernel) inside bubblewrap."""
    python = real_interpreter()
    inner = inner or [python, "-m", "ipykernel_launcher"]
    limits = settings.limits
    home = HOME
    binds: list[tuple[str, str]] = []
    for src in {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}:
        binds.append((str(src), str(src)))
    if not any(Path(inner[0]).is_relative_to(Path(b[0])) for b in binds) and inner[0] == python:
        raise SandboxUnavailable(
            f"the interpreter {python} is outside the Python installation "
            f"({sys.base_prefix}) and the virtual environment ({sys.prefix}) that the sandbox "
            "shows: run the grader with the course's own .venv/bin/python"
        )
    course = Path(settings.course_dir) if settings.course_dir else _course_dir()
    binds.append((str(course.resolve()), SANDBOX_COURSE))
    root = Path(SANDBOX_COURSE).parent
    binds += [(str(src), str(root / rel)) for src, rel in kernel_files()]
    # Parent folders must be created traversable (bwrap makes them 0700 otherwise).
    parents: set[str] = set()
    for _, dest in binds:
        for parent in Path(dest).parents:
            if str(parent) not in ("/", "/usr", "/etc", "/tmp"):
                parents.add(str(parent))
    cmd = [
        "bwrap",
        "--unshare-net",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--die-with-parent",
        "--new-session",
        # The kernel's parent is outside its PID namespace: with JPY_PARENT_PID it would think
        # itself orphaned and exit. The rest of the environment is what the manager passes.
        "--unsetenv",
        "JPY_PARENT_PID",
        # The private /tmp comes first, so that binds below it (a course or venv that lives
        # under /tmp, as in a CI checkout) are mounted on top of it rather than hidden by it.
        "--perms",
        "1777",
        "--size",
        str(limits.tmpfs_mb * 1024 * 1024),
        "--tmpfs",
        "/tmp",
    ]
    for parent in sorted(parents, key=lambda p: p.count("/")):
        cmd += ["--perms", "0755", "--dir", parent]
    cmd += ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in ("lib", "lib64", "bin", "sbin", "lib32"):
        target = Path("/") / name
        if target.is_symlink():
            cmd += ["--symlink", os.readlink(target), str(target)]
        elif target.is_dir():
            cmd += ["--ro-bind", str(target), str(target)]
    for src, dest in binds:
        cmd += ["--ro-bind", src, dest]
    if runtime is not None:
        cmd += ["--bind", str(runtime), str(runtime)]
    if settings.lesson_files:
        cmd += ["--ro-bind", settings.lesson_files, "/opt/lesson"]
    cmd += [
        "--dev",
        "/dev",
        # bwrap's /dev/shm is root's: POSIX semaphores (multiprocessing, joblib's probe at
        # import) would fail there with a warning naming the grader's paths.
        "--perms",
        "1777",
        "--size",
        str(limits.tmpfs_mb * 1024 * 1024),
        "--tmpfs",
        "/dev/shm",
        "--proc",
        "/proc",
        "--perms",
        "0777",
        "--size",
        str(limits.tmpfs_mb * 1024 * 1024),
        "--tmpfs",
        home,
        "--chdir",
        home,
    ]
    if os.geteuid() == 0:
        # One uid per slot (rlimits on processes count per uid); UID_BASE_ENV moves the range
        # for a second grading run on the same machine, so the two never share a uid.
        uid = str(sandbox_uid(settings))
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    else:
        cmd[1:1] = ["--unshare-user"]
    return cmd + _prlimit(limits) + inner


def execute(
    nb: dict,
    graded: list[int],
    settings: Settings,
    cell_timeouts: dict[int, float] | None = None,
) -> dict:
    """Execute ``nb`` (a notebook as a dict) in the sandbox with nbclient; what happened.

    ``cell_timeouts`` (cell index -> seconds, from :mod:`grader.calibrate`) overrides
    ``limits.cell_timeout`` for those cells. The answer is ``{"cells": [{index, outputs,
    execution_count, status, seconds, limit}], "events": [...]}``; when the sandbox itself
    fails, ``cells`` is empty and ``events`` says why.
    """
    import nbformat
    from nbclient import NotebookClient

    from grader.kernel import SandboxedClient, SandboxedKernelManager

    class Client(SandboxedClient, NotebookClient):
        pass

    node = nbformat.from_dict(nb)
    client = Client(
        node,
        km=SandboxedKernelManager(settings),
        allow_errors=True,
        interrupt_on_timeout=True,
        error_on_timeout={
            "ename": "CellTimeoutError",
            "evalue": "",
            "traceback": ["CellTimeoutError: the cell ran past its time limit"],
        },
        record_timing=False,
    )
    client.setup_grading(set(graded), cell_timeouts or {}, settings)
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 - the sandbox failed: say why, run nothing more
        return {"cells": [], "events": [*client.events, f"the sandbox failed: {exc}"]}
    finally:
        client.release()
    return {"cells": client.answer_cells(node), "events": client.events}
