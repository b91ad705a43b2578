"""The suite's seam, kernel side: a graded test cell runs with globals of its own.

:class:`grader.seam.LessonKernel` imports this module in its kernel and runs each graded test cell
through :func:`test` (:func:`grader.seam.test_call`), as the sandbox's harness does: in a copy of
the notebook's namespace, so names a test binds never replace the notebook's, with
``__grader_driver__`` handing the drivers an observer (:mod:`grader.lessons.observer`); the
observations are published after the test, for :func:`grader.judge.judge_cell`.
"""

from __future__ import annotations

import ast
import linecache
from typing import Any

from grader.observations import MIME


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
