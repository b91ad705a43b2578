"""The student kit: a zip of what students get, and nothing they must not see.

Contents: ``lessons/`` (the released notebooks and their files; all of them, or the lessons
asked for), the ``course/`` package, a ``pyproject.toml`` of its own (the course's name, version
and dependencies, packaging ``course`` only: no ``grader`` and no instructor command), so
``pip install -e .`` installs the course and its dependencies, ``requirements.txt`` (the same
dependencies, for a plain ``pip install -r``), the student's JupyterLab view (``jupyter/student``
and ``jupyter/common``: nbgrader's instructor panels off) with ``lab.py`` that opens the lessons
in it, and a ``README.md`` for students. Never ``solutions/``, ``grader/``, ``tests/``, gradebooks
or submissions. Before the zip is written every file is checked for nbgrader's solution and
hidden-test markers.
"""

from __future__ import annotations

import json
import tomllib
import zipfile
from pathlib import Path

SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints", ".DS_Store"}
FORBIDDEN = ("### BEGIN HIDDEN TESTS", "### BEGIN SOLUTION", "### END SOLUTION")

README = """# Mixed precision training with PyTorch: student kit

1. Install (Python 3.11 or newer):

       python3 -m venv .venv
       .venv/bin/pip install -e .

2. Open the lessons (JupyterLab in the student's view; extra arguments go to JupyterLab):

       .venv/bin/python lab.py

3. Work the exercises (cells that say `# YOUR CODE HERE`), then check yourself: as the last cell
   of a notebook (after saving it)

       from course.selfcheck import check_my_work
       check_my_work()

   or from a terminal: `.venv/bin/python -m course.selfcheck lessons/NN-topic/NN-topic.ipynb`.
   It prints, per exercise, passed or failed with what was expected. Grading also runs hidden
   tests on fresh random inputs, so make your code right in general, not only for the examples.

4. Submit the notebook as your instructor says (nbgrader's Assignments tab or your LMS).
"""


class PackageError(Exception):
    """The kit would contain something students must not see."""


#: The kit's JupyterLab launcher (standard library only): the student view's config folders first
#: on JUPYTER_CONFIG_PATH, as the course's ``run.py lab`` does, then JupyterLab on ``lessons/``.
LAB_PY = """#!/usr/bin/env python3
\"\"\"Open the lessons in JupyterLab, the student's view: python lab.py [JupyterLab options].\"\"\"

import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main(argv):
    env = dict(os.environ)
    views = [HERE / "jupyter" / "student", HERE / "jupyter" / "common"]
    paths = [str(p) for p in views] + [p for p in [env.get("JUPYTER_CONFIG_PATH")] if p]
    env["JUPYTER_CONFIG_PATH"] = os.pathsep.join(paths)
    cmd = [sys.executable, "-m", "jupyterlab", "lessons/", *argv]
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in argv:
        cmd.append("--allow-root")
    if os.name == "posix":  # become JupyterLab: Ctrl-C and signals reach it directly
        os.chdir(HERE)
        os.execve(sys.executable, cmd, env)
    return subprocess.call(cmd, cwd=HERE, env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
"""
#: The JupyterLab views the kit ships (the student's, and what both views share).
VIEWS = ("jupyter/student", "jupyter/common")


def _walk(root: Path, top: str, files: dict[str, Path]) -> None:
    for path in sorted((root / top).rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not SKIP_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
            files[rel.as_posix()] = path


def available_lessons(root: Path) -> list[str]:
    """The released lessons under ``root/lessons``."""
    base = root / "lessons"
    return sorted(p.name for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def kit_files(root: Path, lessons: list[str] | None = None) -> dict[str, Path]:
    """``{name in the zip: file}`` for the kit (``lessons``: only these; default all)."""
    files: dict[str, Path] = {}
    for top in ("lessons", "course"):
        if not (root / top).is_dir():
            raise PackageError(f"{root / top}: missing (run `python -m grader release` first)")
    released = available_lessons(root)
    if lessons:
        unknown = sorted(set(lessons) - set(released))
        if unknown:
            raise PackageError(
                f"no released lesson {', '.join(unknown)} in {root / 'lessons'} (released: "
                f"{', '.join(released) or 'none'}; run `python -m grader release` first)"
            )
    for lesson in sorted(set(lessons or released)):
        _walk(root, f"lessons/{lesson}", files)
    _walk(root, "course", files)
    for view in VIEWS:
        if (root / view).is_dir():
            _walk(root, view, files)
    return files


def _toml(value: object) -> str:
    if isinstance(value, list):
        return "[\n" + "".join(f"    {_toml(v)},\n" for v in value) + "]"
    return json.dumps(value)  # a TOML basic string for the strings a pyproject holds


#: What the hosted wheel (:func:`write_course_index`) declares: the distributions ``course/``
#: imports (``psutil`` and ``torchao`` are optional there), unpinned, so that pip, even without
#: ``--no-deps``, keeps what a hosted runtime has (Colab: torch 2.11, ipywidgets 7.7.1) and only
#: adds what it lacks.
HOSTED_DEPENDENCIES = (
    "torch",
    "numpy",
    "matplotlib",
    "ipywidgets",
    "ipython",
    "scikit-learn",
    "cloudpickle",
    "nbformat",
    "nbclient",
    "nbconvert",
    "jupyter-client",
    "jupyter-core",
    "traitlets",
)


def kit_pyproject(root: Path, dependencies: list[str] | tuple[str, ...] | None = None) -> str:
    """The kit's ``pyproject.toml``: the course's project metadata and dependencies, packaging
    ``course`` only (the course's own file also packages ``grader``, which the kit does not hold,
    and declares the instructor's command). ``dependencies``: these instead of the course's
    pinned ones (the hosted wheel's)."""
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    build = data.get("build-system", {})
    project = data.get("project", {})
    lines = [
        "# The student kit's project: the course package and the lessons' dependencies.",
        "[build-system]",
        f"requires = {_toml(build.get('requires', ['setuptools>=77']))}",
        f"build-backend = {_toml(build.get('build-backend', 'setuptools.build_meta'))}",
        "",
        "[project]",
    ]
    for key in ("name", "version", "description", "requires-python", "license"):
        if key in project:
            lines.append(f"{key} = {_toml(project[key])}")
    lines.append('readme = "README.md"')
    if dependencies is None:
        dependencies = project.get("dependencies", [])
    lines.append(f"dependencies = {_toml(list(dependencies))}")
    lines += ["", "[tool.setuptools.packages.find]", 'include = ["course*"]', ""]
    return "\n".join(lines)


def requirements(root: Path) -> str:
    """The course's dependencies, one a line (``requirements.txt``)."""
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return "\n".join(data["project"]["dependencies"]) + "\n"


def build_kit(root: Path, out: Path, lessons: list[str] | None = None) -> list[str]:
    """Write the kit to ``out`` (``lessons``: only these; default all); returns its names."""
    files = kit_files(root, lessons)
    generated = {
        "pyproject.toml": kit_pyproject(root),
        "requirements.txt": requirements(root),
        "README.md": README,
        "lab.py": LAB_PY,
    }
    problems = [f"{view}: missing (the student's JupyterLab view)" for view in VIEWS]
    problems = [p for p, v in zip(problems, VIEWS, strict=True) if not (root / v).is_dir()]
    for name, path in files.items():
        if path.suffix in (".ipynb", ".py", ".md", ".txt", ".toml"):
            text = path.read_text(encoding="utf-8", errors="replace")
            for marker in FORBIDDEN:
                if marker in text:
                    problems.append(f"{name}: contains {marker!r}")
    for name, text in generated.items():
        problems += [f"{name}: contains {m!r}" for m in FORBIDDEN if m in text]
    if problems:
        raise PackageError(
            "the kit would leak solutions or hidden tests, or lacks what students need:\n  "
            + "\n  ".join(problems)
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, path in files.items():
            zf.write(path, f"mixed-precision-course/{name}")
        for name, text in generated.items():
            info = zipfile.ZipInfo(f"mixed-precision-course/{name}", (2026, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(".py") else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, text)
    tmp.replace(out)
    return sorted([*files, *generated])


def write_course_index(dest: Path, root: Path | None = None) -> Path:
    """A wheel of the ``course`` package alone in ``dest``, with an ``index.html`` listing it.

    The wheel is built from the kit's project (:func:`kit_pyproject`: ``course`` only, never
    ``grader``) with its own dependencies, :data:`HOSTED_DEPENDENCIES` (unpinned: not the kit's
    torch==2.13.0 and ipywidgets>=8.1), without network or build isolation, so a hosted notebook
    can install the course's helper package from a folder or a web page beside the lessons
    (``pip install --no-deps --no-index --find-links DEST mixed-precision-course``) and keep its
    runtime's own torch and ipywidgets, even when installed without ``--no-deps``.
    ``index.html`` is a ``--find-links`` page. Returns the wheel's path.
    """
    import hashlib
    import html
    import shutil
    import subprocess
    import sys
    import tempfile

    root = Path(root) if root is not None else Path(__file__).resolve().parent.parent
    files: dict[str, Path] = {}
    _walk(root, "course", files)
    problems = [
        f"{name}: contains {marker!r}"
        for name, path in files.items()
        for marker in FORBIDDEN
        if marker in path.read_text(encoding="utf-8", errors="replace")
    ]
    if problems:
        raise PackageError("the course package would leak:\n  " + "\n  ".join(problems))
    with tempfile.TemporaryDirectory(prefix="course-wheel-") as tmp:
        src = Path(tmp) / "src"
        for name, path in files.items():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, src / name)
        hosted = kit_pyproject(root, HOSTED_DEPENDENCIES)
        (src / "pyproject.toml").write_text(hosted, encoding="utf-8")
        (src / "README.md").write_text(README, encoding="utf-8")
        wheels = Path(tmp) / "wheels"
        cmd = [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-index"]
        cmd += ["--no-build-isolation", "--wheel-dir", str(wheels), str(src)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        built = sorted(wheels.glob("*.whl"))
        if result.returncode != 0 or len(built) != 1:
            raise PackageError(f"could not build the course's wheel:\n{result.stderr[-3000:]}")
        dest.mkdir(parents=True, exist_ok=True)
        for old in dest.glob("*.whl"):
            old.unlink()
        wheel = dest / built[0].name
        shutil.copy2(built[0], wheel)
    with zipfile.ZipFile(wheel) as zf:
        tops = {name.split("/", 1)[0] for name in zf.namelist()}
    if any(not (t == "course" or t.endswith(".dist-info")) for t in tops):
        raise PackageError(f"{wheel.name} holds more than the course package: {sorted(tops)}")
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
    project = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requires = html.escape(project.get("requires-python", ""), quote=True)
    name = html.escape(wheel.name)
    (dest / "index.html").write_text(
        '<!DOCTYPE html>\n<html><head><meta charset="utf-8">'
        f"<title>{html.escape(project['name'])}</title></head><body>\n"
        f"<h1>{html.escape(project['name'])}: the course's helper package</h1>\n"
        f'<a href="{name}#sha256={digest}" data-requires-python="{requires}">{name}</a>\n'
        "</body></html>\n",
        encoding="utf-8",
    )
    return wheel
