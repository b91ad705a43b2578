"""Running nbgrader's own command line from the course's virtual environment.

nbgrader starts the ``alembic`` executable from PATH when it opens a gradebook, so a venv that
is not activated fails there. Every nbgrader call goes through :func:`nbgrader` here, which puts
this interpreter's ``bin`` folder first on PATH.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def tool_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a child tool: this interpreter's scripts first on PATH."""
    env = dict(os.environ)
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    if extra:
        env.update(extra)
    return env


def nbgrader(
    args: list[str],
    cwd: Path,
    check: bool = True,
    capture: bool = True,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m nbgrader ARGS`` in ``cwd`` (a course directory) and return the result.

    With ``check``, a non-zero exit raises :class:`RuntimeError` carrying nbgrader's log.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "nbgrader", *args],
        cwd=cwd,
        env=tool_env(),
        text=True,
        capture_output=capture,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        log = (proc.stdout or "") + (proc.stderr or "")
        raise RuntimeError(f"nbgrader {' '.join(args)} failed (exit {proc.returncode}):\n{log}")
    return proc
