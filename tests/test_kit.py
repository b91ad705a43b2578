"""The student kit as a student gets it: built for one lesson, installed on its own (no grader),
opened with its own launcher in JupyterLab's student view, checked in headless Chromium.

The install is cheap: a fresh virtual environment that sees this environment's packages (a
``.pth`` file naming its site-packages, in place of downloading the dependencies) and
``pip install --no-deps`` of the unpacked kit, so ``course`` is imported from the kit's install
and ``grader`` (which the kit does not hold) cannot be imported at all. JupyterLab's application
and extension files and the packages' Jupyter config are where this environment's packages put
them, so the launch points ``JUPYTERLAB_DIR``, ``JUPYTER_PATH`` and ``JUPYTER_CONFIG_PATH`` there
(what ``pip install`` of the dependencies would have put into the kit's own environment).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

import pytest

from grader import REPO_ROOT
from grader.hub import free_port
from grader.package import build_kit
from tests.conftest import serving
from tests.test_browser import (
    NEWS_PROMPT,
    STUDENT_PLUGINS,
    VIEWS,
    _modified,
    _open,
    _page,
    _view,
)

pytestmark = [pytest.mark.browser]
LESSON = "01-number-formats"


def _install(kit: Path) -> Path:
    """A virtual environment with the kit installed (``--no-deps``); returns its python."""
    venv = kit / ".venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(site, "_course_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps"]
    pip += ["--no-build-isolation", "--no-index", "--quiet", str(kit)]
    proc = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def _lab(kit: Path, python: Path):
    """The kit's own launcher (``python lab.py``) on a free loopback port."""
    port = free_port()
    token = secrets.token_hex(16)
    here = Path(sys.prefix)
    env = dict(os.environ)
    env.pop("JUPYTER_CONFIG_PATH", None)
    env |= {
        "JUPYTERLAB_DIR": str(here / "share" / "jupyter" / "lab"),
        "JUPYTER_PATH": str(here / "share" / "jupyter"),
        "JUPYTER_CONFIG_PATH": str(here / "etc" / "jupyter"),
        "PATH": f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
    }
    cmd = [str(python), "lab.py", "--no-browser", "--ip=127.0.0.1", f"--port={port}"]
    cmd += [f"--IdentityProvider.token={token}", "--ServerApp.port_retries=0"]
    cmd += ["--LabApp.expose_app_in_browser=True"]
    cmd += [f"--LabApp.user_settings_dir={kit / '.settings'}"]
    cmd += [f"--LabApp.workspaces_dir={kit / '.workspaces'}"]
    with serving(cmd, port, kit / "jupyter.log", "the kit's JupyterLab", 90, cwd=kit, env=env):
        yield f"http://127.0.0.1:{port}", token


@VIEWS
def test_kit_installs_alone_and_opens_in_the_student_view(tmp_path, browser, shots):
    kit_zip = tmp_path / "kit.zip"
    names = build_kit(REPO_ROOT, kit_zip, [LESSON])
    assert {n.split("/")[1] for n in names if n.startswith("lessons/")} == {LESSON}
    assert "lab.py" in names and "jupyter/student/labconfig/page_config.json" in names
    assert not any(n.startswith(("grader/", "solutions/", "tests/")) for n in names)
    with zipfile.ZipFile(kit_zip) as zf:
        zf.extractall(tmp_path)
    kit = tmp_path / "mixed-precision-course"
    project = tomllib.loads((kit / "pyproject.toml").read_text())
    assert "scripts" not in project["project"], "the kit declares a command it cannot run"
    assert project["tool"]["setuptools"]["packages"]["find"]["include"] == ["course*"]

    python = _install(kit)
    probe = (
        "import importlib.util, course\n"
        "print(course.__file__)\n"
        "print(importlib.util.find_spec('grader'))\n"
    )
    out = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd="/")
    where, grader = out.stdout.split()
    assert Path(where).is_relative_to(kit / ".venv"), where
    assert grader == "None", "the kit's environment imports the grader"
    assert not (kit / ".venv" / "bin" / "mp-grader").exists()

    lab = _lab(kit, python)
    url, token = next(lab)
    page, errors = _page(browser)
    try:
        # lab.py opens JupyterLab on lessons/: the notebook's path is relative to it.
        _open(page, url, token, f"{LESSON}/{LESSON}.ipynb", "kit")
        assert not _modified(page), f"{LESSON} is marked modified on opening"
        view = _view(page)
        page.screenshot(path=str(shots / "view-kit.png"))
        assert set(view["plugins"]) == STUDENT_PLUGINS, view["plugins"]
        assert view["menu"] == ["Assignment List"], view["menu"]
        assert not any("Create Assignment" in t for t in view["sidebars"]), view["sidebars"]
        assert NEWS_PROMPT not in view["text"], "the Jupyter news prompt showed"
        status = page.request.get(f"{url}/formgrader?token={token}").status
        assert status == 404, f"/formgrader answered {status} in the kit's view"
        assert not errors, errors
    finally:
        page.close()
        lab.close()
