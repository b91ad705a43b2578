#!/usr/bin/env python3
"""Set up the course and run it: the two commands of the README's quick start.

    python3 run.py lab     install what is needed into .venv/ and open the lessons in JupyterLab
                           (the student's view: nbgrader's Validate and assignment list only)
    python3 run.py lab --instructor   the same with nbgrader's instructor panels (Create
                           Assignment, Formgrader, course list)
    python3 run.py test    install what is needed (test tools too) and run the whole test suite
    python3 run.py hub --roster roster.csv   as root: a JupyterHub for the class on this machine
                           (accounts, passwords, nbgrader's exchange; see README.md)
    python3 run.py gpu-check   on an NVIDIA GPU machine: grade every lesson on CUDA, confirm the
                           CUDA autocast lists, print the speed/memory benchmark
    python3 run.py site [--executed DIR] [--results DIR] [--out DIR]   build the course's static
                           site into _site/ (lesson pages with the outputs of the solutions' runs,
                           answers left out; see README.md, "The course's site")

Extra arguments go to JupyterLab or pytest. Only the Python standard library is used here, so this
runs on a fresh machine with nothing but Python 3.11+.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / ("python.exe" if os.name == "nt" else "python")
STAMP = VENV / ".course-installed"
#: Debian packages the full test suite uses, each with the file that shows it is installed (a
#: glob): a headless browser, the grader's sandbox, and a PostgreSQL server for the shared
#: gradebook test (Debian puts it in /usr/lib/postgresql/<major version>/bin).
SYSTEM_PACKAGES = {
    "chromium": "/usr/bin/chromium",
    "bubblewrap": "/usr/bin/bwrap",
    "postgresql": "/usr/lib/postgresql/*/bin/pg_ctl",
}


def say(message: str) -> None:
    print(f"[run.py] {message}", flush=True)


def fail(message: str) -> None:
    print(f"[run.py] error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def run(cmd: list[str], **kwargs) -> None:
    say("$ " + " ".join(str(c) for c in cmd))
    result = subprocess.run(cmd, **kwargs)
    if result.returncode != 0:
        fail(f"command failed with exit code {result.returncode}: {' '.join(map(str, cmd))}")


def ensure_venv() -> None:
    """Create .venv/ with pip in it, or explain what the machine lacks."""
    if PY.exists():
        return
    say(f"creating a virtual environment in {VENV}")
    result = subprocess.run(
        [sys.executable, "-m", "venv", str(VENV)], capture_output=True, text=True
    )
    if result.returncode == 0:
        return
    shutil.rmtree(VENV, ignore_errors=True)
    # Debian and Ubuntu ship venv's pip bootstrap separately (python3-venv).
    has_pip = (
        subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True).returncode
        == 0
    )
    if has_pip:
        run([sys.executable, "-m", "venv", "--without-pip", str(VENV)])
        run([sys.executable, "-m", "pip", "--python", str(PY), "install", "--quiet", "pip"])
        return
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    fail(
        "this Python cannot create virtual environments (its ensurepip module is missing).\n"
        f"On Debian or Ubuntu install it with:  sudo apt-get install python{version}-venv\n"
        f"venv said: {result.stderr.strip()}"
    )


def ensure_installed(extras: str) -> None:
    """pip-install the course (editable) with ``extras``, unless already done for this config."""
    spec = f".[{extras}]" if extras else "."
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes() + spec.encode()).hexdigest()
    done = STAMP.read_text().split() if STAMP.exists() else []
    if digest in done:
        return
    say(f"installing the course and its dependencies ({spec}); the first time takes a few minutes")
    run([str(PY), "-m", "pip", "install", "--upgrade", "--quiet", "pip"])
    run([str(PY), "-m", "pip", "install", "--quiet", "-e", spec], cwd=ROOT)
    STAMP.write_text("\n".join([*done, digest]) + "\n")


def ensure_system_packages() -> list[str]:
    """Install the Debian packages the browser, sandbox and PostgreSQL tests need, where we may.

    Returns the packages still missing (their tests skip, or fail under CI=true).
    """
    missing = [pkg for pkg, path in SYSTEM_PACKAGES.items() if not glob.glob(path)]
    if not missing:
        return []
    can_apt = shutil.which("apt-get") and hasattr(os, "geteuid") and os.geteuid() == 0
    if can_apt:
        say(f"installing Debian packages: {' '.join(missing)}")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        run(["apt-get", "update", "-qq"], env=env)
        run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", *missing], env=env)
        missing = [pkg for pkg, path in SYSTEM_PACKAGES.items() if not glob.glob(path)]
    if missing:
        say(
            f"not installed: {' '.join(missing)} (needs root: sudo apt-get install "
            f"{' '.join(missing)}). The tests that need them will be skipped."
        )
    return missing


def child_env() -> dict[str, str]:
    """Environment for the venv's tools without activating it (nbgrader needs its bin on PATH)."""
    env = dict(os.environ)
    env["PATH"] = str(BIN) + os.pathsep + env.get("PATH", "")
    env["VIRTUAL_ENV"] = str(VENV)
    env.pop("PYTHONHOME", None)
    return env


def lab_env(instructor: bool, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: :func:`child_env`) with this launch's JupyterLab view configured.

    The views are Jupyter config folders under ``jupyter/``, put first on JUPYTER_CONFIG_PATH for
    this launch only, so neither view changes the other or anything in ~/.jupyter:
    ``jupyter/common`` (both: no news prompt, lessons open unmodified) and, for students,
    ``jupyter/student`` (nbgrader's Create Assignment, Formgrader and course list disabled).
    """
    env = dict(child_env() if env is None else env)
    views = [] if instructor else [ROOT / "jupyter" / "student"]
    paths = [str(p) for p in [*views, ROOT / "jupyter" / "common"]]
    if env.get("JUPYTER_CONFIG_PATH"):
        paths.append(env["JUPYTER_CONFIG_PATH"])
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(paths)
    return env


def cmd_lab(args: list[str]) -> int:
    instructor = "--instructor" in args
    args = [a for a in args if a != "--instructor"]
    ensure_venv()
    ensure_installed("")
    view = "instructor" if instructor else "student"
    say(f"opening JupyterLab at lessons/, {view} view (stop it with Ctrl-C)")
    cmd = [str(BIN / "jupyter"), "lab", "lessons/", *args]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in args:
        cmd.append("--allow-root")
    return subprocess.call(cmd, cwd=ROOT, env=lab_env(instructor))


def cmd_test(args: list[str]) -> int:
    """The suite, then (a full run that passed) the site's test on the notebooks it executed.

    The suite executes every solution notebook once and keeps each one it executed under
    ``$COURSE_TEST_ARTIFACTS`` (default ``test-artifacts/``) as ``NN-x/NN-x.executed.ipynb``.
    ``tests/test_site.py`` builds the site from those (``COURSE_SITE_EXECUTED``) instead of
    executing any lesson again. It runs only after a full run (no extra arguments) that passed:
    only then has every lesson been executed, and cleanly.
    """
    ensure_venv()
    ensure_installed("test")
    ensure_system_packages()
    env = child_env()
    artifacts = Path(env.get("COURSE_TEST_ARTIFACTS") or ROOT / "test-artifacts").resolve()
    env["COURSE_TEST_ARTIFACTS"] = str(artifacts)
    env.pop("COURSE_SITE_EXECUTED", None)
    if not args:  # a notebook left from an earlier run must not stand in for this run's
        for old in artifacts.glob("[0-9][0-9]-*/*.executed.ipynb"):
            old.unlink()
    workers = os.environ.get("COURSE_TEST_WORKERS") or str(max(2, min(os.cpu_count() or 2, 4)))
    cmd = [str(PY), "-m", "pytest", "-n", workers, "--dist", "loadgroup", "--durations=30", *args]
    say("$ " + " ".join(cmd))
    code = subprocess.call(cmd, cwd=ROOT, env=env)
    if args or code != 0:
        return code
    env["COURSE_SITE_EXECUTED"] = str(artifacts)
    cmd = [str(PY), "-m", "pytest", "--durations=10", "tests/test_site.py"]
    say(f"the site, from the notebooks the suite executed ({artifacts})")
    say(f"$ COURSE_SITE_EXECUTED={artifacts} " + " ".join(cmd))
    return subprocess.call(cmd, cwd=ROOT, env=env)


def cmd_hub(args: list[str]) -> int:
    """``python -m grader hub ARGS``: the class's JupyterHub (it installs what it needs)."""
    ensure_venv()
    ensure_installed("")
    cmd = [str(PY), "-m", "grader", "hub", *args]
    say("$ " + " ".join(cmd))
    return subprocess.call(cmd, cwd=ROOT, env=child_env())


def cmd_gpu_check(args: list[str]) -> int:
    ensure_venv()
    ensure_installed("")
    cmd = [str(PY), str(ROOT / "scripts" / "gpu_check.py"), *args]
    say("$ " + " ".join(cmd))
    return subprocess.call(cmd, cwd=ROOT, env=child_env())


def cmd_site(args: list[str]) -> int:
    """``python -m website ARGS``: build the static site (``--help`` lists the options)."""
    ensure_venv()
    ensure_installed("site")
    cmd = [str(PY), "-m", "website", *args]
    say("$ " + " ".join(cmd))
    return subprocess.call(cmd, cwd=ROOT, env=child_env())


def main(argv: list[str]) -> int:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script may be started by an older Python
        fail(f"Python 3.11 or newer is needed; this is {sys.version.split()[0]}")
    commands = {
        "lab": cmd_lab,
        "test": cmd_test,
        "hub": cmd_hub,
        "gpu-check": cmd_gpu_check,
        "site": cmd_site,
    }
    if not argv or argv[0] not in commands:
        print(__doc__.strip())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
