"""Fixtures for the grader's tests: a scratch course holding the small fixture lesson."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from grader import REPO_ROOT

FIXTURES = Path(__file__).parent / "fixtures"


def make_course(dest: Path) -> Path:
    """A course directory with the repo's nbgrader config and the fixture lesson's solutions."""
    (dest / "grader").mkdir(parents=True, exist_ok=True)
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", dest / "nbgrader_config.py")
    shutil.copy2(
        REPO_ROOT / "grader" / "nbgrader_config.py", dest / "grader" / "nbgrader_config.py"
    )
    shutil.copytree(FIXTURES / "solutions", dest / "solutions", dirs_exist_ok=True)
    return dest


@pytest.fixture
def course(tmp_path: Path) -> Path:
    return make_course(tmp_path / "course")


def need_bwrap() -> None:
    """Skip (or fail under CI=true) when bubblewrap cannot sandbox here."""
    from grader.sandbox import bwrap_problem

    problem = bwrap_problem()
    if problem:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the grader's sandbox is required in CI: {problem}")
        pytest.skip(problem)


# A kernel that loses one execute_reply, as ipykernel 7 rarely does (the grader's benchmark saw
# one cell in 200 submissions go idle and never reply): the patch makes the kernel's session
# hold back (or drop) the first reply that matches, its own cell's included.
LOSE_REPLY = """
import functools
_kernel = get_ipython().kernel
_send, _held = _kernel.session.send, []

def _losing_send(stream, msg_type, *args, **kwargs):
    parent = args[1] if len(args) > 1 else kwargs.get("parent") or {}
    if msg_type == "execute_reply" and not _held and MATCH(parent):
        _held.append((stream, msg_type, args, kwargs))
        return {"content": args[0]}
    if msg_type == "kernel_info_reply" and _held and HELD_UNTIL_NUDGED and _held[0]:
        stream_, type_, args_, kwargs_ = _held[0]
        _held[0] = None
        _send(stream_, type_, *args_, **kwargs_)
    return _send(stream, msg_type, *args, **kwargs)

_kernel.session.send = _losing_send
"""
