"""The grader's settings, each written once.

:class:`GraderSettings` holds the limits a submission runs under. It is a traitlets
``Configurable``: a course changes a limit in its ``nbgrader_config.py``
(``c.GraderSettings.cell_timeout = 600``) and the command line's defaults are read from it
(:func:`configured`). Plain ``nbgrader autograde`` reads only ``cell_timeout``, as its
``Execute.timeout`` (``grader/nbgrader_config.py``), when it is set above the line that reads it.
The environment variables that carry settings from the grader to the processes it starts are
named here and nowhere else.
"""

from __future__ import annotations

from pathlib import Path

from traitlets import Float, Int
from traitlets.config import Config, Configurable

#: A :class:`grader.sandbox.Settings` as JSON, from ``autograde`` to its nbgrader process.
SANDBOX_ENV = "GRADER_SANDBOX"
#: A file the nbgrader process writes the run's events and per-cell statuses to.
EVENTS_ENV = "GRADER_EVENTS"
#: The lesson's calibration (JSON), when it has one.
CELL_LIMITS_ENV = "GRADER_CELL_LIMITS"
#: A file each run appends where its time went to (``grader.benchmark``).
TIMING_ENV = "GRADER_TIMING"
#: Moves the range of sandbox uids (two grading runs on one machine never share one).
UID_BASE_ENV = "GRADER_UID_BASE"


class GraderSettings(Configurable):
    """Limits of one submission's execution (``c.GraderSettings.NAME`` in nbgrader_config.py)."""

    cell_timeout = Float(300.0, help="seconds per cell when the lesson has no calibration").tag(
        config=True
    )
    notebook_timeout = Float(
        1800.0, help="seconds per notebook when the lesson has no calibration"
    ).tag(config=True)
    memory_mb = Int(8192, help="address space per process, MiB").tag(config=True)
    nproc = Int(256, help="processes and threads per submission").tag(config=True)
    fsize_mb = Int(64, help="largest file a submission writes, MiB").tag(config=True)
    tmpfs_mb = Int(512, help="size of each of the sandbox's private folders, MiB").tag(config=True)
    max_output = Int(
        1_000_000, help="bytes of output a cell may print; the rest is dropped as it runs"
    ).tag(config=True)
    uid_base = Int(200_000, help="first unprivileged uid of the sandboxes (one per slot)").tag(
        config=True
    )
    calibration_factor = Float(10.0, help="a calibrated limit is FACTOR x measured time").tag(
        config=True
    )
    calibration_floor = Float(20.0, help="the smallest calibrated limit, seconds").tag(config=True)


def default(name: str) -> object:
    """The built-in default of setting ``name`` (a course's config may change it)."""
    return GraderSettings.class_traits()[name].default_value


def configured(root: Path | None = None, config: Config | None = None) -> GraderSettings:
    """The settings of the course at ``root`` (its ``nbgrader_config.py``), or from ``config``."""
    if config is None and root is not None:
        from grader.courseconfig import course_config

        config = course_config(root)
    return GraderSettings(config=config or Config())
