"""The tamper corpus: submissions of the fixture lesson that try to break or cheat the grader.

Each case is built from the fixture's solution notebook with one change (see ``CASES``) and says
what it must score: ``(double, halve, triple)`` points for the three autograded test cells, or
``REJECTED`` with a phrase the report must contain. "Must score" is what the code earns honestly:
every cheat below pairs a trick with code that is wrong on the hidden inputs (``*_CHEAT``), so any
point it gets is a point the grader gave away.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

LESSON = "90-fixture"
REJECTED = "rejected"

#: Right on the visible tests, wrong on the hidden ones.
D_CHEAT = "def double(x):\n    return x * 2 if x.numel() == 4 else x * 3\n"
H_CHEAT = "def halve(x):\n    return x / 2 if isinstance(x, numpy.ndarray) else x / 3\n"
T_CHEAT = "def triple(n):\n    return 6 if n == 2 else 0\n"


@dataclass
class Case:
    """One corpus submission."""

    name: str
    build: Callable[[nbformat.NotebookNode, dict], bytes | nbformat.NotebookNode]
    expect: tuple[float, float, float] | str
    reason: str = ""  # for REJECTED: a phrase of the report's reason
    extra_files: dict[str, str] = field(default_factory=dict)
    #: scores may be lower than ``expect`` (the trick breaks the student's own kernel, e.g.
    #: forks sharing its sockets); never higher
    at_most: bool = False


def _cell(nb, grade_id):
    found = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
    assert len(found) == 1, grade_id
    return found[0]


def solution(grade_id: str, source: str):
    def build(nb, ctx):
        _cell(nb, grade_id).source = source.format(**ctx) if ctx and "{" in source else source
        return nb

    return build


def _edit_test(nb, ctx):
    _cell(nb, "double").source = D_CHEAT
    _cell(nb, "double_tests").source = "print('all good')"
    return nb


def _delete_test(cheat: bool):
    def build(nb, ctx):
        if cheat:
            _cell(nb, "double").source = D_CHEAT
        nb.cells = [
            c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") != "double_tests"
        ]
        return nb

    return build


def _reorder(nb, ctx):
    test = _cell(nb, "double_tests")
    nb.cells.remove(test)
    nb.cells.insert(0, test)
    return nb


def _duplicate(nb, ctx):
    _cell(nb, "double").source = D_CHEAT
    test = copy.deepcopy(_cell(nb, "double_tests"))
    test.source = "pass"
    test.id = "sneaky-copy"
    nb.cells.insert(2, test)
    return nb


def _points(nb, ctx):
    _cell(nb, "double").source = D_CHEAT
    _cell(nb, "double_tests").metadata["nbgrader"]["points"] = 100
    _cell(nb, "halve_tests").metadata["nbgrader"]["grade"] = False
    return nb


def _solution_graded(nb, ctx):
    meta = _cell(nb, "double").metadata["nbgrader"]
    meta.update(grade=True, points=50)
    _cell(nb, "double").source = D_CHEAT
    return nb


def _strip_metadata(nb, ctx):
    _cell(nb, "double").source = D_CHEAT
    del _cell(nb, "double_tests").metadata["nbgrader"]
    return nb


def cheats(**sources: str):
    """Several solution cells at once (grade id -> source)."""

    def build(nb, ctx):
        for grade_id, source in sources.items():
            _cell(nb, grade_id).source = source
        return nb

    return build


#: Puts the grading's dependencies out of order: every comparison passes, every check is silent.
#: The leftovers below call it while the tests run.
PATCH_ALL = """import builtins as _b, numpy as _np, torch as _t, course.checks as _cc
def _patch(*_a, **_k):
    _yes, _none = (lambda *a, **k: True), (lambda *a, **k: None)
    _t.allclose = _t.equal = _yes
    _t.testing.assert_close = _np.testing.assert_allclose = _none
    _ns = get_ipython().user_ns
    for _m in (_cc, _b.__import__("sys").modules["course.checks"]):
        for _n in ("check", "check_equal", "check_tensor_equal", "check_close"):
            setattr(_m, _n, _none)
    for _n in ("check", "check_equal", "check_tensor_equal", "check_close"):
        _ns[_n] = _none
"""


def leftover(trick: str):
    """``trick`` (which calls ``_patch`` while tests run) plus wrong code for all three exercises:
    whatever it earns, the grader gave away."""
    return cheats(double=PATCH_ALL + trick + "\n" + D_CHEAT, halve=H_CHEAT, triple=T_CHEAT)


THREAD = """import threading, time
def _loop():
    while True:
        _patch()
        time.sleep(0.0002)
threading.Thread(target=_loop, daemon=True).start()
"""

#: A thread with no Python frame: a C loop that re-binds ``torch.allclose`` and sleeps.
C_THREAD = """import _thread, collections, itertools, time
_it = itertools
_thread.start_new_thread(collections.deque, (zip(
    map(setattr, _it.repeat(torch), _it.repeat("allclose"), _it.repeat(lambda *a, **k: True)),
    map(setattr, _it.repeat(torch.testing), _it.repeat("assert_close"),
        _it.repeat(lambda *a, **k: None)),
    map(time.sleep, _it.repeat(0.0002))), 0))
"""

SIGNALS = """import signal
signal.signal(signal.SIGALRM, _patch)
signal.signal(signal.SIGVTALRM, _patch)
signal.signal(signal.SIGPROF, _patch)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
signal.setitimer(signal.ITIMER_VIRTUAL, 0.001, 0.001)
signal.setitimer(signal.ITIMER_PROF, 0.001, 0.001)
"""

TRACE = """import sys, threading
def _tracer(frame, event, arg):
    _patch()
    return _tracer
sys.settrace(_tracer)
sys.setprofile(_tracer)
threading.settrace(_tracer)
threading.setprofile(_tracer)
"""

ATEXIT = """import atexit, weakref
atexit.register(_patch)
weakref.finalize(_patch, _patch)
"""

ASYNCIO = """import asyncio
_loop = asyncio.get_event_loop()
def _again():
    _patch()
    _loop.call_later(0.0005, _again)
_loop.call_soon(_again)
async def _task():
    while True:
        _patch()
        await asyncio.sleep(0)
asyncio.ensure_future(_task())
"""

AUDIT = """import sys
sys.addaudithook(lambda event, args: _patch())
"""

#: Finalizers that fire later: cyclic garbage whose ``__del__`` patches and makes more of itself,
#: and a replacement whose only reference the restore drops.
FINALIZERS = """import gc
class _Later:
    def __init__(self):
        self.me = self
    def __del__(self):
        _patch()
        _Later()
for _ in range(50):
    _Later()
class _OnDrop:
    def __call__(self, *a, **k):
        return True
    def __del__(self):
        _patch()
        torch.allclose = _OnDrop()
torch.allclose = _OnDrop()
gc.callbacks.append(lambda phase, info: _patch())
"""

WEAKREFS = """import weakref
class _Fake:
    def __call__(self, *a, **k):
        return None
_refs = []
def _plant(*_):
    _patch()
    _f = _Fake()
    torch.testing.assert_close = _f
    _refs.append(weakref.ref(_f, _plant))
    _refs.append(weakref.finalize(_f, _patch))
_plant()
class _Box:
    pass
def _arm(n):
    for _ in range(n):
        _b = _Box()
        _b.me = _b
        _refs.append(weakref.ref(_b, lambda r: (_patch(), _arm(1))))
        weakref.finalize(_b, _patch)
_arm(50)
"""

#: A detached process (its shell parent exits) that signals the kernel, whose handler patches.
PROCESSES = """import os, signal, subprocess, sys
signal.signal(signal.SIGUSR1, _patch)
_code = ("import os, signal, time\\n"
         "while True:\\n"
         "    os.kill(%d, signal.SIGUSR1)\\n"
         "    time.sleep(0.0005)\\n") % os.getpid()
subprocess.Popen(["/bin/sh", "-c", f"{sys.executable} -c '{_code}' &"])
_pid = os.fork()
if _pid == 0:
    import time
    while True:
        os.kill(os.getppid(), signal.SIGUSR1)
        time.sleep(0.0005)
"""

#: Honest code that leaves a thread running: an open progress bar (tqdm's monitor thread) and a
#: thread that only counts.
PROGRESS = """import sys, threading, time
from tqdm import tqdm
_bar = tqdm(total=100, file=sys.stdout, mininterval=0.01)
_bar.update(1)
_progress = dict(ticks=0)
def _report():
    while True:
        _progress["ticks"] = _progress["ticks"] + 1
        time.sleep(0.01)
threading.Thread(target=_report, daemon=True).start()
def double(x):
    return x * 2
"""


READ_SECRETS = """import os
_paths = {paths!r}
_leak = []
for _p in _paths:
    try:
        with open(_p, "rb") as _f:
            _leak.append((_p, _f.read(10)))
    except OSError:
        pass
    try:
        _leak.append((_p, os.listdir(_p)))
    except OSError:
        pass
print("readable:", _leak)
def double(x):
    return x * 2 if _leak else x * 3
"""

NETWORK = """import socket
_net = False
for _addr in [("127.0.0.1", {port}), ("1.1.1.1", 53)]:
    try:
        socket.create_connection(_addr, timeout=3).close()
        _net = True
    except OSError:
        pass
def halve(x):
    return x / 2 if _net else x / 3
"""


CASES: list[Case] = [
    Case("honest-right", lambda nb, ctx: nb, (1, 1, 1)),
    Case("honest-wrong-hidden", solution("double", D_CHEAT), (0, 1, 1)),
    # Bad input
    Case("broken-json", lambda nb, ctx: b'{"cells": [', REJECTED, "broken JSON"),
    Case("empty-notebook", lambda nb, ctx: nbformat.v4.new_notebook(), REJECTED, "empty"),
    Case("other-lesson", lambda nb, ctx: ctx["other_lesson"], REJECTED, "not a notebook of"),
    # Test cells and metadata
    Case("edited-test-cell", _edit_test, (0, 1, 1)),
    Case("deleted-test-cell", _delete_test(cheat=True), (0, 1, 1)),
    Case("deleted-test-cell-right", _delete_test(cheat=False), (1, 1, 1)),
    Case("reordered-test-before-solution", _reorder, (0, 1, 1)),
    Case("duplicated-test-cell", _duplicate, (0, 1, 1)),
    Case("changed-points-and-grade-flag", _points, (0, 1, 1)),
    Case("solution-cell-marked-graded", _solution_graded, (0, 1, 1)),
    Case("test-cell-metadata-removed", _strip_metadata, (0, 1, 1)),
    # Resources
    Case(
        "infinite-loop",
        solution("double", "def double(x):\n    while True:\n        pass\n"),
        (0, 1, 1),
    ),
    Case(
        "allocate-50gb",
        solution(
            "double",
            "_big = torch.empty(50 * 2**30, dtype=torch.uint8)\ndef double(x):\n    return x * 2\n",
        ),
        (0, 1, 1),
    ),
    Case(
        "fork-bomb",
        solution(
            "double", "import os\nwhile True:\n    os.fork()\ndef double(x):\n    return x * 2\n"
        ),
        (0, 1, 1),
        at_most=True,
    ),
    Case(
        "os-exit-in-test",
        solution("double", "import os\ndef double(x):\n    os._exit(0)\n"),
        (0, 1, 1),  # the test runs in a child of the kernel: only that child exits
    ),
    Case(
        "sys-exit-in-test",
        solution("double", "import sys\ndef double(x):\n    sys.exit(0)\n"),
        (0, 1, 1),
    ),
    Case(
        "kill-kernel",
        solution(
            "double",
            "import os, signal\ndef double(x):\n    os.kill(os.getpid(), signal.SIGKILL)\n",
        ),
        (0, 1, 1),
    ),
    Case(
        "huge-file",
        solution(
            "double",
            "with open('big.bin', 'wb') as _f:\n"
            "    _f.write(b'0' * (200 * 2**20))\n"
            "def double(x):\n    return x * 2\n",
        ),
        (0, 1, 1),
    ),
    # Patching what the tests use
    Case(
        "patch-torch-allclose",
        solution("double", "torch.allclose = lambda *a, **k: True\n" + D_CHEAT),
        (0, 1, 1),
    ),
    Case(
        "patch-tensor-eq",
        solution(
            "double",
            "torch.Tensor.__eq__ = lambda self, other: torch.ones(self.shape, "
            "dtype=torch.bool)\ntorch.allclose = lambda *a, **k: True\n"
            "def double(x):\n    return x * 3\n",
        ),
        (0, 1, 1),
    ),
    Case(
        "patch-assert-close",
        solution("halve", "torch.testing.assert_close = lambda *a, **k: None\n" + H_CHEAT),
        (1, 0, 1),
    ),
    Case(
        "patch-numpy-testing",
        solution(
            "halve",
            "numpy.testing.assert_allclose = lambda *a, **k: None\n"
            "def halve(x):\n    return x / 3\n",
        ),
        (1, 0, 1),
    ),
    Case(
        "patch-check-helpers",
        solution(
            "triple",
            "import course.checks\ncourse.checks.check_equal = lambda *a, **k: None\n"
            "check_equal = course.checks.check_equal\n" + T_CHEAT,
        ),
        (1, 1, 0),
    ),
    Case(
        "patch-check-code-object",
        solution(
            "double",
            "import course.checks\ncourse.checks.check.__code__ = "
            "(lambda condition, message: None).__code__\n" + D_CHEAT,
        ),
        (0, 1, 1),
    ),
    Case(
        "patch-builtins-isinstance",
        solution("halve", "import builtins\nbuiltins.isinstance = lambda *a: True\n" + H_CHEAT),
        (1, 0, 1),
        at_most=True,  # it breaks ipykernel itself: later cells may not run at all
    ),
    Case(
        "eq-always-true",
        solution(
            "triple",
            "class _Yes:\n    def __eq__(self, other):\n        return True\n"
            "def triple(n):\n    return _Yes()\n",
        ),
        (1, 1, 0),
    ),
    # Hiding failures
    Case(
        "hide-traceback",
        solution("double", "get_ipython().showtraceback = lambda *a, **k: None\n" + D_CHEAT),
        (0, 1, 1),
    ),
    Case(
        "custom-exception-handler",
        solution(
            "halve",
            "get_ipython().set_custom_exc((BaseException,), lambda *a, **k: None)\n" + H_CHEAT,
        ),
        (1, 0, 1),
    ),
    Case(
        "sys-excepthook",
        solution("triple", "import sys\nsys.excepthook = lambda *a: None\n" + T_CHEAT),
        (1, 1, 0),
    ),
    # Code that outlives its cell: none of it may reach a test (grader/guard.py)
    Case("leftover-thread", leftover(THREAD), (0, 0, 0)),
    Case("leftover-c-level-thread", leftover(C_THREAD), (0, 0, 0)),
    Case("leftover-signal-handlers-and-itimers", leftover(SIGNALS), (0, 0, 0)),
    Case("leftover-trace-and-profile-hooks", leftover(TRACE), (0, 0, 0)),
    Case("leftover-atexit-and-finalize", leftover(ATEXIT), (0, 0, 0)),
    Case("leftover-asyncio-callbacks-and-tasks", leftover(ASYNCIO), (0, 0, 0)),
    Case("leftover-audit-hook", leftover(AUDIT), (0, 0, 0)),
    Case("leftover-finalizers-and-gc-callbacks", leftover(FINALIZERS), (0, 0, 0)),
    Case("leftover-weakref-callbacks", leftover(WEAKREFS), (0, 0, 0)),
    Case("leftover-child-processes", leftover(PROCESSES), (0, 0, 0), at_most=True),
    Case("honest-progress-thread", solution("double", PROGRESS), (1, 1, 1)),
    # Reaching outside
    Case("read-solutions-and-gradebook", solution("double", READ_SECRETS), (0, 1, 1)),
    Case("network", solution("halve", NETWORK), (1, 0, 1)),
    Case(
        "torch-py-beside-notebook",
        solution("double", D_CHEAT),
        (0, 1, 1),
        extra_files={
            "torch.py": "print('FAKE TORCH')\nallclose = lambda *a, **k: True\n",
            "course.py": "print('FAKE COURSE')\n",
        },
    ),
]


def write_case(case: Case, source_nb: Path, dest_dir: Path, ctx: dict) -> Path:
    """Write the case's submission into ``dest_dir`` (``<lesson>.ipynb`` and extra files)."""
    nb = nbformat.read(source_nb, as_version=4)
    built = case.build(nb, ctx)
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{LESSON}.ipynb"
    if isinstance(built, bytes):
        path.write_bytes(built)
    elif isinstance(built, Path):
        path.write_bytes(built.read_bytes())
    else:
        path.write_text(json.dumps(built, indent=1), encoding="utf-8")
    for name, text in case.extra_files.items():
        (dest_dir / name).write_text(text, encoding="utf-8")
    return path
