"""The start of every hidden test's driver: the observer it records an exercise with.

A hidden test's driver lives in its lesson's ``inputs.py``, beside the input builders that its
judge calls too; the hidden part of a test cell is one call to it. The sandbox mounts this file and
the lessons' ``inputs.py`` read-only (never a judge): nothing here is secret, the inputs come from
the student's seed and the judge (:mod:`grader.judge`) decides outside the kernel.
"""

from __future__ import annotations

from typing import Any


def observer(exercise: str, namespace: dict[str, Any]) -> tuple[Any, int]:
    """The observer of ``exercise`` and its seed, for a test cell whose globals are ``namespace``.

    The grader's harness puts ``__grader_driver__`` there; without one (an instructor's own run of
    a solution notebook) the observations are judged in the kernel when the driver is done.
    """
    import course.checks

    seed = course.checks.hidden_seed(exercise)
    driver = namespace.get("__grader_driver__")
    if driver is None:
        from grader.observe import local_driver as driver
    return driver(exercise, seed), seed
