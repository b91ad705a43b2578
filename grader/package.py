"""The student kit: a zip of what students get, and nothing they must not see.

Contents: ``lessons/`` (the released notebooks and their files), the ``course/`` package,
``pyproject.toml`` (so ``pip install -e .`` installs the course and its dependencies),
``requirements.txt`` (the same dependencies, for a plain ``pip install -r``) and a ``README.md``
for students. Never ``solutions/``, ``grader/``, ``tests/``, gradebooks or submissions. Before the
zip is written every file is checked for nbgrader's solution and hidden-test markers.
"""

from __future__ import annotations

import tomllib
import zipfile
from pathlib import Path

SKIP_PARTS = {"__pycache__", ".ipynb_checkpoints", ".DS_Store"}
FORBIDDEN = ("### BEGIN HIDDEN TESTS", "### BEGIN SOLUTION", "### END SOLUTION")

README = """# Mixed precision training with PyTorch: student kit

1. Install (Python 3.11 or newer):

       python3 -m venv .venv
       .venv/bin/pip install -e .

2. Open the lessons:

       .venv/bin/jupyter lab lessons/

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


def kit_files(root: Path) -> dict[str, Path]:
    """``{name in the zip: file}`` for the kit."""
    files: dict[str, Path] = {}
    for top in ("lessons", "course"):
        base = root / top
        if not base.is_dir():
            raise PackageError(f"{base}: missing (run `python -m grader release` first)")
        for path in sorted(base.rglob("*")):
            rel = path.relative_to(root)
            if path.is_file() and not SKIP_PARTS.intersection(rel.parts) and path.suffix != ".pyc":
                files[rel.as_posix()] = path
    files["pyproject.toml"] = root / "pyproject.toml"
    return files


def requirements(root: Path) -> str:
    data = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    return "\n".join(data["project"]["dependencies"]) + "\n"


def build_kit(root: Path, out: Path) -> list[str]:
    """Write the kit to ``out``; returns the names it holds."""
    files = kit_files(root)
    problems = []
    for name, path in files.items():
        if path.suffix in (".ipynb", ".py", ".md", ".txt", ".toml"):
            text = path.read_text(encoding="utf-8", errors="replace")
            for marker in FORBIDDEN:
                if marker in text:
                    problems.append(f"{name}: contains {marker!r}")
    if problems:
        raise PackageError(
            "the kit would leak solutions or hidden tests:\n  " + "\n  ".join(problems)
        )
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, path in files.items():
            zf.write(path, f"mixed-precision-course/{name}")
        zf.writestr("mixed-precision-course/requirements.txt", requirements(root))
        zf.writestr("mixed-precision-course/README.md", README)
    tmp.replace(out)
    return sorted([*files, "requirements.txt", "README.md"])
