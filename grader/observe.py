"""The driver side of a hidden test: the observer a test cell records the student's results with.

A hidden test's driver (a lesson's ``inputs.py``, or the hidden part of a test cell in
``solutions/``) builds its inputs from ``course.checks.hidden_seed``, calls the student's functions
through ``obs = __grader_driver__(exercise, seed)`` (``obs.call``, ``obs.raises``,
``obs.record``, ``obs.done``) and so records what they did.
The observer (``grader/lessons/observer.py``, which the harness imports in the kernel) copies each
value at once into plain data serialised with ``torch.save``; the observations leave the kernel as
one display output of type :data:`MIME`, which :mod:`grader.observations` decodes and
:mod:`grader.judge` judges outside the kernel. Where no harness provides ``__grader_driver__``
(an instructor's own run of a solution notebook), the driver falls back to :data:`local_driver`,
which judges in that kernel.
"""

from __future__ import annotations

from typing import Any

from grader.observations import MIME

__all__ = ["MIME", "local_driver", "new_observer"]


def new_observer(exercise: str, seed: int) -> Any:
    """An observer like the one the harness hands to a test cell (for in-process use)."""
    import torch

    from grader.lessons.observer import new_observer as make

    return make(exercise, seed, torch)


class _LocalDriver:
    """A driver for a kernel without the harness: judges when ``done()`` is called."""

    def __init__(self, lesson: str | None) -> None:
        self.lesson = lesson

    def __call__(self, exercise: str, seed: int) -> Any:
        from grader.judge import judge_bundle

        observer = new_observer(exercise, seed)
        finish = observer.done

        def done() -> None:
            finish()
            judge_bundle(self.lesson, f"{exercise}_tests", observer.bundle(), seed)

        observer.done = done
        return observer


#: ``__grader_driver__`` where no harness provides one (an instructor's own run of a solution
#: notebook, plain nbclient): the observations are judged in that kernel when ``done()`` is called.
local_driver = _LocalDriver(None)
