"""The grader's settings: written once, read by nbgrader's config and the command line alike."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

from grader import REPO_ROOT
from grader.cli import autograde_limits, build_parser
from grader.courseconfig import course_config
from grader.sandbox import Limits
from grader.settings import GraderSettings, default


def _course_with(tmp_path: Path, lines: str) -> Path:
    """A course folder whose grader config sets ``lines`` before the course's own settings."""
    shutil.copy(REPO_ROOT / "nbgrader_config.py", tmp_path)
    (tmp_path / "grader").mkdir()
    own = (REPO_ROOT / "grader" / "nbgrader_config.py").read_text()
    head, rest = own.split("c = get_config()", 1)
    (tmp_path / "grader" / "nbgrader_config.py").write_text(
        head + "c = get_config()\n" + lines + rest
    )
    return tmp_path


def test_a_course_setting_reaches_nbgrader_and_the_command_line(tmp_path):
    root = _course_with(
        tmp_path, "c.GraderSettings.cell_timeout = 77\nc.GraderSettings.memory_mb = 1234\n"
    )
    assert course_config(root).Execute.timeout == 77  # plain `nbgrader autograde` reads it
    args = build_parser().parse_args(["autograde", "01-x"])
    limits = autograde_limits(args, root, None)
    assert (limits.cell_timeout, limits.memory_mb) == (77, 1234)
    assert limits.nproc == default("nproc")
    # An option given wins; a calibration's notebook limit wins over the setting.
    args = build_parser().parse_args(["autograde", "01-x", "--memory-mb", "99"])
    limits = autograde_limits(args, root, {"notebook_limit_s": 42.0})
    assert (limits.memory_mb, limits.notebook_timeout) == (99, 42.0)


def test_the_defaults_are_the_settings_defaults():
    assert course_config(REPO_ROOT).Execute.timeout == default("cell_timeout")
    args = build_parser().parse_args(["autograde", "01-x"])
    assert autograde_limits(args, REPO_ROOT, None) == Limits()
    for name in ("cell_timeout", "notebook_timeout", "memory_mb", "nproc", "max_output"):
        assert getattr(Limits(), name) == GraderSettings().trait_defaults(name)


def test_no_limit_is_written_twice():
    """A limit's value appears beside its name (or in a command line's help) only in
    grader/settings.py: everything else reads it from there."""
    names = list(GraderSettings.class_trait_names(config=True))
    limits = [n for n in names if not n.startswith("calibration")]
    values = {str(default(n)).removesuffix(".0") for n in limits}
    values |= {"1_000_000", "200000"}
    names += [n.replace("_", "-") for n in names] + ["timeout", "Execute"]
    number = re.compile(r"(?<![\w.])(\d[\d_]*)(?:\.0)?(?![\w])")
    found = []
    for path in sorted((REPO_ROOT / "grader").rglob("*.py")):
        if {"tests", "judges"} & set(path.parts) or path.name == "settings.py":
            continue
        for index, line in enumerate(path.read_text().splitlines(), 1):
            if any(n in line for n in names) and set(number.findall(line)) & values:
                found.append(f"{path.relative_to(REPO_ROOT)}:{index}: {line.strip()}")
    assert not found, "limits written outside grader/settings.py:\n" + "\n".join(found)
