"""The command line: one entry point, --help on every command."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grader.cli import build_parser, main

COMMANDS = ["release", "package", "intake", "autograde", "calibrate", "feedback", "export", "check"]


def test_every_command_is_listed_in_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    for command in COMMANDS:
        assert command in out


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    assert "usage: python -m grader " + command in capsys.readouterr().out


def test_shard_argument_is_checked():
    parser = build_parser()
    assert parser.parse_args(["autograde", "01-x", "--shard", "2/3"]).shard == (2, 3)
    with pytest.raises(SystemExit):
        parser.parse_args(["autograde", "01-x", "--shard", "4/3"])


def test_runs_as_a_module_without_activating_the_venv():
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "--help"],
        capture_output=True,
        text=True,
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "autograde" in proc.stdout


def test_check_runs_its_kernel_without_the_unencrypted_tcp_warning(tmp_path):
    """``grader check``'s kernel is local (IPC sockets): the student sees only the report."""
    import nbformat
    from nbformat.v4 import new_code_cell, new_notebook

    nb = new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3"}})
    nb.cells = [
        new_code_cell("def one():\n    return 1", metadata={"nbgrader": {"grade_id": "one"}}),
        new_code_cell(
            "assert one() == 1",
            metadata={"nbgrader": {"grade": True, "grade_id": "one_tests", "points": 1}},
        ),
    ]
    nbformat.write(nb, tmp_path / "lesson.ipynb")
    proc = subprocess.run(
        [sys.executable, "-m", "grader", "check", str(tmp_path / "lesson.ipynb")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed  one (1 points)" in proc.stdout, proc.stdout
    assert "without encryption" not in proc.stdout + proc.stderr, proc.stderr
    assert proc.stderr.strip() == "", proc.stderr


def test_grading_names_the_course_package_it_uses_when_not_the_installed_one(tmp_path, capsys):
    from grader.cli import _course_note
    from grader.sandbox import installed_course_dir

    (tmp_path / "course").mkdir()
    (tmp_path / "course" / "__init__.py").write_text("")
    _course_note(tmp_path)
    err = capsys.readouterr().err
    assert f"grading with the course package in {tmp_path / 'course'}" in err, err
    assert str(installed_course_dir()) in err
    _course_note(installed_course_dir().parent)
    assert capsys.readouterr().err == ""
