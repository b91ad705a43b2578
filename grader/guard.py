"""In-kernel defences the sandboxed runner sends around a student's notebook.

:data:`PRELUDE` runs before any student code, with globals and builtins of its own: it refuses new
audit hooks, keeps pristine copies of what graded tests rely on (the dictionaries of builtins,
torch, numpy, math, warnings; the import machinery; ``sys`` hooks) and a private
``course.checks``. :data:`TEST_CALL` replaces each graded test cell: the test runs in a fork of
the kernel (in the kernel itself where CUDA forbids a fork), after everything captured is put
back and every hook, timer and thread the notebook left is gone, and sends its verdict on a pipe
with a per-test nonce. A graded cell passes only when its reply is ``ok`` and its verdict a pass.
Hidden tests hold nothing secret here: their drivers record through ``__grader_driver__``
(:mod:`grader.observe`) and are judged outside the sandbox (:mod:`grader.judge`). What this
cannot stop, and why: ``docs/grader-design.md``.
"""

from __future__ import annotations

from pathlib import Path

from grader.observe import MIME

#: The grader's code in the kernel (see :mod:`grader.kernel_guard`).
KERNEL_GUARD = Path(__file__).with_name("kernel_guard.py")

#: Sent before any student code runs: compiles the kernel guard's file (``__PATH__``) with globals
#: of its own, whose builtins are a copy taken now, and installs it there.
PRELUDE = (
    "exec(__INNER__, {'__builtins__': dict(vars(__import__('builtins'))), '__name__': '_grader'})\n"
)
INNER = "exec(compile(open(__PATH__, 'rb').read(), __PATH__, 'exec'))\ninstall(__ARGS__)\n"


#: Filled in by :func:`test_call`: the source the kernel runs in place of a graded test cell.
TEST_CALL = (
    'getattr(__import__("sys"), "_grader_" + __TOKEN__).test(__SOURCE__, __INDEX__, __NONCE__)\n'
)

#: Filled in by :func:`verdict_expression`: read back with the test cell's reply.
VERDICT = 'getattr(__import__("sys"), "_grader_" + __TOKEN__).verdict(__NONCE__)'


def prelude(
    token: str, checks_path: str, observer_path: str, guard_path: str, fork: bool = True
) -> str:
    """The prelude's source for this run: ``checks_path``, ``observer_path`` and ``guard_path``
    are where the kernel reads ``course/checks.py``, ``grader/lessons/observer.py`` and
    ``grader/kernel_guard.py`` (``fork=False``: tests run in the kernel itself, as where CUDA is
    initialised; for the tests of that path)."""
    args = ", ".join(map(repr, (token, checks_path, bool(fork), observer_path, MIME)))
    inner = INNER.replace("__PATH__", repr(guard_path)).replace("__ARGS__", args)
    return PRELUDE.replace("__INNER__", repr(inner))


def test_call(token: str) -> str:
    """The template of a graded test cell's replacement (``__SOURCE__``, ``__INDEX__`` and
    ``__NONCE__`` are filled in by the runner, which imports nothing from here)."""
    return TEST_CALL.replace("__TOKEN__", repr(token))


def verdict_expression(token: str) -> str:
    """The template of the expression whose value is a test cell's verdict (``__NONCE__``)."""
    return VERDICT.replace("__TOKEN__", repr(token))
