"""Execute one notebook in its own sandboxed process tree (bubblewrap + rlimits).

Inside the sandbox only ``/usr``, ``/etc``, the Python installation, the virtual environment, the
``course`` package (at ``/opt/course/course``) and the runner exist, read-only; ``/home/student``
(the kernel's cwd, holding only the lesson's extra files), ``/tmp`` and ``/dev/shm`` are private
tmpfs; network, PID, IPC and UTS namespaces are new; it dies with its parent. The runner drops to
an unprivileged uid per worker slot (as root) under ``prlimit`` (:class:`Limits`). The notebook
travels on stdin and the answer comes back on a pipe only the runner holds.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from grader import guard
from grader.lessons import OBSERVER_FILE, kernel_files
from grader.settings import UID_BASE_ENV, GraderSettings, default

RUNNER = Path(__file__).with_name("runner.py")


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
    #: run graded test cells in a fork of the kernel (False: in the kernel, as with CUDA)
    fork: bool = True
    #: ``COURSE_GRADING_KEY``/``COURSE_STUDENT_ID`` for the kernel (:func:`grader.keys.kernel_env`).
    kernel_env: dict[str, str] = field(default_factory=dict)
    #: the ``course`` package the kernel imports (:func:`course_dir`; ``None``: the installed one)
    course_dir: str | None = None

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
#: Where the sandbox shows the grader's guard for the kernel (``grader/kernel_guard.py``).
SANDBOX_GUARD = "/opt/grader/kernel_guard.py"


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


def bwrap_command(settings: Settings, python: str | None = None) -> list[str]:
    """The command line that runs the runner inside bubblewrap."""
    python = python or real_interpreter()
    limits = settings.limits
    home = "/home/student"
    binds: list[tuple[str, str]] = []
    for src in {Path(sys.base_prefix).resolve(), Path(sys.prefix).resolve()}:
        binds.append((str(src), str(src)))
    if not any(Path(python).is_relative_to(Path(b[0])) for b in binds):
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
        "--clearenv",
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
    cmd += [
        "--perms",
        "0755",
        "--dir",
        "/opt",
        "--perms",
        "0755",
        "--dir",
        "/opt/grader",
        "--ro-bind",
        str(RUNNER),
        "/opt/grader/runner.py",
        "--ro-bind",
        str(guard.KERNEL_GUARD),
        SANDBOX_GUARD,
    ]
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
    for key, value in _env(limits, home, str(Path(SANDBOX_COURSE).parent)).items():
        cmd += ["--setenv", key, value]
    if os.geteuid() == 0:
        # One uid per slot (rlimits on processes count per uid); UID_BASE_ENV moves the range
        # for a second grading run on the same machine, so the two never share a uid.
        uid = str(int(os.environ.get(UID_BASE_ENV) or default("uid_base")) + settings.slot)
        cmd += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    else:
        cmd[1:1] = ["--unshare-user"]
    cmd += _prlimit(limits) + [python, "-I", "/opt/grader/runner.py"]
    return cmd


def execute(
    nb: dict,
    graded: list[int],
    settings: Settings,
    cell_timeouts: dict[int, float] | None = None,
    stall_after: dict[int, float] | None = None,
) -> dict:
    """Execute ``nb`` (a notebook as a dict); returns the runner's answer.

    ``cell_timeouts`` (cell index -> seconds, from :mod:`grader.calibrate`) overrides
    ``limits.cell_timeout`` for those cells; a cell still running at its ``stall_after`` leaves
    an event saying where the kernel waits (``grader/runner.py``).

    The answer is ``{"cells": [{index, outputs, execution_count, status}], "events": [...]}``;
    when the sandbox itself fails (killed at the notebook's limit, crashed), ``cells`` is empty
    and ``events`` says why.
    """
    limits = settings.limits
    token = secrets.token_hex(8)
    course = Path(settings.course_dir) if settings.course_dir else _course_dir()
    checks = SANDBOX_COURSE if settings.mode == "bwrap" else str(course.resolve())
    observer, kernel_guard = str(OBSERVER_FILE), str(guard.KERNEL_GUARD)
    if settings.mode == "bwrap":  # where bwrap_command mounts them
        observer = str(Path(SANDBOX_COURSE).parent / dict(kernel_files())[OBSERVER_FILE])
        kernel_guard = SANDBOX_GUARD
    prelude = guard.prelude(token, f"{checks}/checks.py", observer, kernel_guard, settings.fork)
    request = {
        "nb": nb,
        "graded": graded,
        "prelude": prelude,
        "test_call": guard.test_call(token),
        "verdict": guard.verdict_expression(token),
        "cell_timeout": limits.cell_timeout,
        "notebook_timeout": limits.notebook_timeout,
        "max_output": limits.max_output,
        "lesson_files": None,
        "kernel_env": dict(settings.kernel_env),
        "cell_timeouts": {str(k): float(v) for k, v in (cell_timeouts or {}).items()},
        "stall_after": {str(k): float(v) for k, v in (stall_after or {}).items()},
    }
    cwd = None
    tmp = None
    if settings.mode == "bwrap":
        cmd = bwrap_command(settings)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
        if settings.lesson_files:
            request["lesson_files"] = "/opt/lesson"
    elif settings.mode == "unsandboxed":
        import tempfile

        tmp = tempfile.mkdtemp(prefix="grader-unsandboxed-")
        cwd = tmp
        # The kernel imports the course's package through a folder holding only a link to it.
        path = os.path.join(tmp, ".course-path")
        os.mkdir(path)
        os.symlink(course.resolve(), os.path.join(path, "course"))
        for src, rel in kernel_files():
            os.makedirs(os.path.dirname(os.path.join(path, rel)), exist_ok=True)
            os.symlink(src, os.path.join(path, rel))
        env = {**os.environ, **_env(limits, tmp, path)}
        env["MPLCONFIGDIR"] = os.path.join(tmp, ".mpl")
        env["IPYTHONDIR"] = os.path.join(tmp, ".ipython")
        env["JUPYTER_RUNTIME_DIR"] = os.path.join(tmp, ".runtime")
        request["lesson_files"] = settings.lesson_files
        cmd = _prlimit(limits) + [real_interpreter(), "-I", str(RUNNER)]
    else:
        raise ValueError(f"unknown sandbox mode {settings.mode!r}")
    begun = time.time()
    try:
        proc = subprocess.run(
            cmd,
            input=json.dumps(request).encode(),
            capture_output=True,
            timeout=limits.notebook_timeout + 120,
            cwd=cwd,
            env=env,
            start_new_session=True,
        )
    except subprocess.TimeoutExpired:
        return {"cells": [], "events": ["the sandbox was killed at the notebook's time limit"]}
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        answer = json.loads(proc.stdout)
    except (json.JSONDecodeError, UnicodeDecodeError):
        err = proc.stderr.decode(errors="replace").strip()[-500:]
        return {
            "cells": [],
            "events": [f"the sandbox gave no answer (exit {proc.returncode}) {err}"],
        }
    if isinstance(answer.get("timing"), dict):
        answer["timing"].update(sandbox_start=begun, sandbox_end=time.time())
    return answer
