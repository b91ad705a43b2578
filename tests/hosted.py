"""A Colab-like runtime on this machine, for ``tests/test_hosted.py``.

Colab's GPU runtime (its published package list, August 2026) holds torch 2.11, torchao 0.10,
ipywidgets 7.7.1, IPython 7.34 and notebook 6.5.7, and not the course. The rehearsal here:

- ``.venv-colab/``: Python 3.11 with the course's pinned torch 2.13 (CPU build) and Colab's pins
  of everything else the lessons import (:data:`COLAB_PINS`), made once and reused;
- a kernel in it (:func:`write_kernel`) whose IPython startup file makes torch behave as 2.11
  (``scripts/older_torch.py``), with ``COURSE_SITE_URL`` pointing at
- a loopback web server (``tests.conftest.serving_folder``) over a folder laid out as the course
  site's ``pkg/`` (:func:`build_site`): a wheel of ``course/`` alone and an ``index.html``
  linking it, so each lesson's setup cell installs the course from it as it would from the
  published site.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import nbformat

from grader.package import write_course_index

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-colab"
PYTHON = VENV / "bin" / "python"
KERNEL = "colab-profile"
SETUP_CELL_ID = "hosted-setup"
DIST = "mixed-precision-course"

#: Colab's GPU runtime (googlecolab/backend-info, pip-freeze.gpu.txt, August 2026) for what the
#: lessons and the check import, except torch: the course's pinned 2.13 CPU build, with what 2.11
#: lacks taken away in the kernel.
COLAB_PINS: tuple[str, ...] = (
    "torch==2.13.0",
    "torchao==0.10.0",
    "ipywidgets==7.7.1",
    # Colab has 3.6.10, whose classic-notebook bundle cannot create an Output widget (it looks
    # the OutputModel class up in @jupyter-widgets/output 4's exports and finds none: "Could not
    # create a model"); Colab's own front end does not load it. The classic Notebook that stands
    # in for Colab's front end here gets 3.6.6, whose Output widget works.
    "widgetsnbextension==3.6.6",
    "ipython==7.34.0",
    "ipykernel==6.17.1",
    "notebook==6.5.7",
    "nbformat==5.11.1",
    "nbclient==0.10.4",
    "nbconvert==7.17.1",
    "jupyter_client==7.4.9",
    "traitlets==5.7.1",
    "pyzmq==26.2.1",
    "tornado==6.5.7",
    "matplotlib==3.10.0",
    "numpy==2.1.3",
    "scikit-learn==1.6.1",
    "cloudpickle==3.1.2",
    "psutil==5.9.5",
)
#: The packages the setup cell must leave as they are.
KEPT: tuple[str, ...] = ("torch", "numpy", "ipython", "ipykernel", "ipywidgets")


def site_url() -> str:
    """The published site's URL: ``[tool.course] site_url`` of pyproject.toml."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)["tool"]["course"]["site_url"]


def setup_cell(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """A lesson's hosted-notebook setup cell."""
    return next(c for c in nb.cells if c.get("id") == SETUP_CELL_ID)


def ensure_venv(timeout: float = 1500.0) -> Path:
    """``.venv-colab/`` with :data:`COLAB_PINS` installed (made once; remade when the pins
    change); returns its Python. Safe to call from several test processes at once."""
    VENV.parent.mkdir(exist_ok=True)
    with open(ROOT / ".venv-colab.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stamp = VENV / ".colab-pins"
        if stamp.is_file() and stamp.read_text() == "\n".join(COLAB_PINS) and PYTHON.exists():
            return PYTHON
        shutil.rmtree(VENV, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True, timeout=300)
        subprocess.run(
            [str(PYTHON), "-m", "pip", "install", "--quiet", *COLAB_PINS],
            check=True,
            timeout=timeout,
        )
        stamp.write_text("\n".join(COLAB_PINS))
        return PYTHON


def uninstall_course() -> None:
    """Remove what a setup cell installed into ``.venv-colab/``, so the next lesson starts bare."""
    subprocess.run(
        [str(PYTHON), "-m", "pip", "uninstall", "--yes", "--quiet", DIST],
        capture_output=True,
        timeout=300,
    )


def build_site(dest: Path) -> Path:
    """``dest`` laid out as the site's ``pkg/`` folder, as ``run.py site`` lays it out
    (:func:`grader.package.write_course_index`: a wheel of ``course/`` alone, never ``grader/``,
    and an ``index.html`` linking it, as pip's ``--find-links`` reads it)."""
    write_course_index(dest / "pkg")
    return dest


STARTUP = """\
# Torch 2.11's view of this torch 2.13 (see scripts/older_torch.py).
import importlib.util as _util

_spec = _util.spec_from_file_location("older_torch", {path!r})
_older = _util.module_from_spec(_spec)
_spec.loader.exec_module(_older)
_older.hide_newer_apis()
del _util, _spec, _older
"""


def write_kernel(folder: Path, site: str) -> Path:
    """A kernelspec :data:`KERNEL` under ``folder`` (add ``folder`` to JUPYTER_PATH): Python of
    ``.venv-colab/``, torch 2.11's view (an IPython startup file), ``COURSE_SITE_URL=site``,
    and ``COURSE_QUICK=1`` (lesson 09 trains a few steps)."""
    ipython = folder / "ipython"
    startup = ipython / "profile_default" / "startup"
    startup.mkdir(parents=True)
    (startup / "00-torch-2.11.py").write_text(
        STARTUP.format(path=str(ROOT / "scripts" / "older_torch.py"))
    )
    spec = folder / "kernels" / KERNEL
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(
        json.dumps(
            {
                "argv": [str(PYTHON), "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                "display_name": "Colab profile (torch 2.11's view)",
                "language": "python",
                "env": {
                    "IPYTHONDIR": str(ipython),
                    "COURSE_SITE_URL": site,
                    "COURSE_QUICK": "1",
                },
            },
            indent=1,
        )
    )
    return folder


#: A cell that prints every installed distribution and its version, as JSON on one line.
INVENTORY = (
    "import importlib.metadata as _md, json as _json\n"
    "print('INVENTORY', _json.dumps(sorted({d.metadata['Name'].lower().replace('_', '-'): "
    "d.version for d in _md.distributions()}.items())))"
)


def inventory(cell: nbformat.NotebookNode) -> dict[str, str]:
    """The distributions an executed :data:`INVENTORY` cell printed."""
    text = "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream")
    line = next(ln for ln in text.splitlines() if ln.startswith("INVENTORY "))
    return dict(json.loads(line.removeprefix("INVENTORY ")))
