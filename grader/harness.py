"""The grader's code in the student's kernel: a graded test cell runs with globals of its own.

Both the sandbox's kernel (:mod:`grader.kernel`) and the suite's seam (:mod:`grader.seam`) send a
graded test cell as one call to :func:`test`: it runs the cell in a copy of the notebook's
namespace, so names a test binds never replace the notebook's, with ``__grader_driver__`` handing
the drivers an observer (:mod:`grader.lessons.observer`), and publishes each observer's records
after the test as one display output of type :data:`MIME`, for :func:`grader.judge.judge_cell`.
Nothing here decides a grade: a forged or missing observation fails the judge. The sandbox
mounts this file read-only beside the drivers (:func:`grader.lessons.kernel_files`); it imports
nothing of the grader but the observer.
"""

from __future__ import annotations

import ast
import linecache
from typing import Any

#: The mime type of the display output that carries one test cell's observations.
MIME = "application/x-grader-observations"


def call(source: str, label: str) -> str:
    """The code a kernel is sent in place of the graded test cell ``source``."""
    return f"__import__('grader.harness').harness.test({source!r}, {label!r})\n"


def test(source: str, label: str) -> Any:
    """Run the test cell ``source`` (named ``label`` in tracebacks) in a copy of the notebook's
    namespace; its last expression's value is returned (IPython shows it)."""
    import torch
    from IPython import get_ipython
    from IPython.display import publish_display_data

    from grader.lessons.observer import new_observer

    linecache.cache[label] = (len(source), None, source.splitlines(True), label)
    tree = compile(source, label, "exec", ast.PyCF_ONLY_AST, dont_inherit=True)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    observers = []

    def driver(exercise: str, seed: int) -> Any:
        observers.append(new_observer(exercise, seed, torch))
        return observers[-1]

    test_ns = dict(get_ipython().user_ns)
    test_ns["__grader_driver__"] = driver
    exec(compile(tree, label, "exec"), test_ns)  # noqa: S102 - the test cell, as a kernel runs it
    value = eval(compile(last, label, "eval"), test_ns) if last is not None else None  # noqa: S307
    for observer in observers:
        publish_display_data({MIME: observer.bundle()}, {})
    return value
