"""The instructor's tooling: release lessons from solutions, intake, autograde, feedback, export.

nbgrader is the engine (gradebook, checksums, hidden tests, feedback); this package adds what a
course needs around it.
"""

from pathlib import Path

#: The repository root: nbgrader's course directory.
REPO_ROOT = Path(__file__).resolve().parent.parent
