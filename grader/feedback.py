"""Feedback HTML for students, through ``nbgrader generate_feedback``, without hidden tests.

nbgrader's feedback shows each test cell as it ran, hidden tests included, and hidden tests hold
the reference implementations. :class:`StripHiddenTests` (registered in
``grader/nbgrader_config.py`` for every ``generate_feedback`` of this course) replaces each
``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS`` region with one comment line, and shortens
error tracebacks of graded cells to their last line (``CheckFailed: <the teaching message>``),
since a traceback quotes the code around the failing line.
"""

from __future__ import annotations

import re

from nbconvert.preprocessors import Preprocessor
from traitlets import Bool

HIDDEN = re.compile(
    r"^[ \t]*### BEGIN HIDDEN TESTS.*?^[ \t]*### END HIDDEN TESTS[^\n]*\n?", re.S | re.M
)
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def strip_hidden(source: str) -> str:
    """``source`` with every hidden-test region replaced by a one-line note."""
    return HIDDEN.sub("# (hidden tests ran here; their code is not shown)\n", source)


class StripHiddenTests(Preprocessor):
    """Remove hidden test code and tracebacks that could quote it from graded cells."""

    enabled = Bool(True).tag(config=True)

    def preprocess_cell(self, cell, resources, index):
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell.cell_type == "code" and (meta.get("grade") or "### BEGIN HIDDEN" in cell.source):
            cell.source = strip_hidden(cell.source)
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out.get('evalue', '')}"]
        return cell, resources
