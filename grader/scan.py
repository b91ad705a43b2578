"""A static look at a submission's own cells for code that tampers with the grading.

The sandbox and the judges (see :mod:`grader.judge`) stop the known tricks; what runs
inside the student's process can always go further (frame inspection, rewriting the kernel's
messaging). This scan flags such code so a person can look: it never changes a score.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

#: (flag, pattern) pairs searched in the cells a student may edit.
PATTERNS: list[tuple[str, str]] = [
    ("frame-inspection", r"_getframe|f_back|f_globals|f_locals|inspect\.(stack|currentframe)"),
    ("gc-walk", r"\bgc\.get_(objects|referrers|referents)"),
    (
        "kernel-internals",
        r"ipykernel|\bzmq\b|get_ipython\(\)\.(kernel|showtraceback|set_custom_exc|"
        r"run_cell|events)|set_custom_exc|showtraceback",
    ),
    ("exception-hooks", r"sys\.excepthook|sys\.settrace|sys\.setprofile|sys\.displayhook"),
    (
        "patches-torch",
        r"torch(\.testing)?\.(allclose|equal|isclose|assert_close)\s*=|"
        r"torch\.Tensor\.\w+\s*=|setattr\(\s*torch",
    ),
    ("patches-numpy", r"(numpy|np)\.testing\.\w+\s*=|setattr\(\s*(numpy|np)"),
    ("patches-checks", r"course\.checks|__code__|\bcheck\w*\s*=\s*lambda|CheckFailed\s*="),
    ("patches-builtins", r"\bbuiltins\b|__builtins__|__import__"),
    ("exits-kernel", r"os\._exit|sys\.exit|os\.kill|signal\.SIGKILL|os\.abort"),
    ("always-equal", r"def __eq__"),
    ("reads-grader-files", r"gradebook|solutions/|/autograded|/submitted|\.grader"),
    ("history", r"\b_ih\b|\bIn\[|\b_i\d"),
    ("processes", r"os\.fork|subprocess|multiprocessing|Popen|setsid"),
    # Code that outlives its cell. The judges decide what a hidden test earns whatever runs beside
    # it; these flags only let a person see that a submission left something running.
    ("threads", r"\bthreading\b|\b_thread\b|Thread\(|concurrent\.futures"),
    ("signals", r"\bsignal\.(signal|setitimer|alarm|pthread_kill|set_wakeup_fd)"),
    (
        "hooks",
        r"addaudithook|\batexit\b|gc\.callbacks|weakref\.|def __del__|sys\.monitoring|"
        r"set(trace|profile)\(",
    ),
    ("event-loop", r"\basyncio\b|call_soon|call_later|ensure_future|create_task"),
    ("ctypes", r"\bctypes\b|pythonapi"),
    ("grader-internals", r"_grader|input_transformers|ast_transformers"),
]


def scan_source(source: str) -> list[str]:
    """The flags whose pattern occurs in ``source``."""
    return [flag for flag, pattern in PATTERNS if re.search(pattern, source)]


def scan_notebook(path: Path, known: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """Flags for the code of ``path`` that is the student's: cells that are not locked nbgrader
    cells, lines that are not in ``known`` (the lines of the lesson as released)."""
    try:
        nb = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    flags: set[str] = set()
    for cell in nb.get("cells", []):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if isinstance(meta, dict) and meta.get("locked") and not meta.get("solution"):
            continue  # nbgrader puts the released source back
        source = cell.get("source", "")
        if isinstance(source, list):
            source = "".join(source)
        mine = [ln for ln in str(source).splitlines() if ln.strip() not in known]
        flags.update(scan_source("\n".join(mine)))
    return sorted(flags)
