"""The course's nbgrader configuration, read the way nbgrader reads it.

Settings that nbgrader and the course's own commands share (the exchange's root, the late
policy) are written once, as nbgrader settings in ``grader/nbgrader_config.py``, and read from
there by both.
"""

from __future__ import annotations

from pathlib import Path

from traitlets.config import Config
from traitlets.config.loader import PyFileConfigLoader


def course_config(root: Path) -> Config:
    """The nbgrader ``Config`` of the course at ``root`` (empty when it has no config file)."""
    if not (root / "nbgrader_config.py").is_file():
        return Config()
    return PyFileConfigLoader("nbgrader_config.py", path=str(root)).load_config()


def exchange_root(root: Path) -> Path:
    """nbgrader's ``Exchange.root`` for this course (nbgrader's default when not set)."""
    from nbgrader.exchange.default.exchange import Exchange

    configured = course_config(root).get("Exchange", {}).get("root")
    return Path(configured or Exchange.root.default_value)
