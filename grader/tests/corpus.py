"""The tamper corpus: submissions of the fixture lesson that try to break or cheat the grader.

Each case is built from the fixture's solution notebook with one change (see ``CASES``) and says
what it must score: ``(double, halve, triple)`` points for the three autograded test cells, or
``REJECTED`` with a phrase the report must contain. "Must score" is what the code earns honestly:
every cheat below pairs a trick with code that is wrong on the hidden inputs (``*_CHEAT``), so any
point it gets is a point the grader gave away.
"""

from __future__ import annotations

import ast
import copy
import json
import re
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
    # Code that outlives its cell. The fixture's hidden tests are still checks in the kernel (no
    # judges yet), which code left running can defeat now that no in-kernel guard restores them.
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


# -- Attacks on lesson 01's hidden tests -----------------------------------------------------------
#
# Each attack replaces one exercise's solution with code that is right on the visible inputs only
# (``_honest_<name>`` on those, a wrong answer elsewhere) and that, when called by the hidden test,
# looks for the test's reference or expected values and returns their answer if it finds one.
# Where the hidden tests define their references beside the student's code (lesson 01 before its
# drivers and judges) each finds one and earns the exercise's points; with the judge in the
# grader's process there is nothing to find. ``L01_STUDENTS`` batches them, one trick per exercise
# and student, so one autograde run of a few submissions covers every trick on every exercise.

L01_LESSON = "01-number-formats"

#: What each exercise's reference was called in the hidden tests and how it is called.
L01_REFS = {
    "fp16_bits": ("_ref_fp16_bits", "x"),
    "fp16_fate": ("_ref_fate", "x"),
    "kahan_sum": ("_ref_kahan", "values, dtype"),
    "underflow_fraction": ("_ref_underflow", "grads, scale"),
    "max_safe_scale": ("_ref_safe", "grads"),
}

#: The signature, a test of "these are the visible inputs", and a wrong answer for the rest.
L01_CHEATS = {
    "fp16_bits": ("x", "x.numel() == 8", "tuple(p * 0 for p in _honest_fp16_bits(x))"),
    "fp16_fate": ("x", "x.numel() == 11", "torch.zeros(x.shape, dtype=torch.long)"),
    "kahan_sum": (
        "values, dtype=torch.float16",
        "len(values) in (0, 1000)",
        "torch.as_tensor(values, dtype=torch.float64).sum().to(dtype)",
    ),
    "underflow_fraction": (
        "grads, scale",
        "len(grads) == 0 or (len(grads) == 2 and grads[0].numel() == 3)",
        "0.5",
    ),
    "max_safe_scale": ("grads", "sum(g.numel() for g in grads) <= 4", "1.0"),
}

#: Helpers every attack uses, defined with the first exercise's solution.
L01_FINDERS = r"""
import gc as _gc, sys as _sys, threading as _threading, time as _time, types as _types


def _pick(d, name):
    try:
        value = d.get(name)
    except Exception:
        return None
    return value if callable(value) else None


def _by_globals(name, *args):
    return _pick(globals(), name)


def _by_frames(name, *args):
    frame = _sys._getframe(1)
    while frame is not None:
        found = _pick(frame.f_locals, name) or _pick(frame.f_globals, name)
        if found:
            return found
        frame = frame.f_back
    return None


def _by_referrers(name, *args):
    # What refers to my inputs: the caller's namespace, or its frame (whose globals are it).
    for arg in args:
        for holder in _gc.get_referrers(arg):
            if isinstance(holder, _types.FrameType):
                holder = holder.f_globals
            if isinstance(holder, dict) and _pick(holder, name):
                return _pick(holder, name)
    return None


_looked = {}  # the slow finders: what they found, or how often they looked in vain


def _looking(name):
    # True while the slow finders should look again (at most 8 times per reference: a test cell
    # calls the exercise a few times before its hidden part defines the reference).
    tries = _looked.get(name, 0)
    if callable(tries):
        return False
    _looked[name] = tries + 1
    return tries < 8


def _by_defined_after_mine(name, *args):
    # Any function defined after mine: every live function whose name matches.
    if _looking(name):
        for obj in _gc.get_objects():
            if isinstance(obj, _types.FunctionType) and obj.__name__ == name:
                _looked[name] = obj
                break
    found = _looked[name]
    return found if callable(found) else None


def _by_waiting_thread(name, *args):
    # A thread that waits (a fifth of a second) for the reference to appear in any frame.
    if not _looking(name):
        found = _looked[name]
        return found if callable(found) else None
    found = []

    def watch():
        end = _time.monotonic() + 0.2
        while not found and _time.monotonic() < end:
            for frame in list(_sys._current_frames().values()):
                while frame is not None and not found:
                    hit = _pick(frame.f_globals, name) or _pick(frame.f_locals, name)
                    if hit:
                        found.append(hit)
                    frame = frame.f_back
            _time.sleep(0.005)

    watcher = _threading.Thread(target=watch, daemon=True)
    watcher.start()
    watcher.join(0.5)
    if found:
        _looked[name] = found[0]
    return found[0] if found else None
"""

#: The same tricks against the judged tests: the kernel holds drivers and observers only.
L01_JUDGED_TRICKS = r"""
import base64 as _base64, io as _io, json as _json, os as _os, pickle as _pickle


class _Payload:
    # Unpickled anywhere, it would create the marker file: the judge must never run it.
    def __reduce__(self):
        return (_os.system, ("touch " + {marker!r},))


def _poisoned_save(obj, f, *args, **kwargs):
    f.write(_pickle.dumps(_Payload()))


def _patch_serializer(name, *args):
    # A patched torch.save (and the functions it calls): every observation becomes the payload.
    import torch.serialization as _ser

    torch.save = _ser.save = _poisoned_save
    for attr in ("_save", "_legacy_save"):
        setattr(_ser, attr, lambda obj, f, *a, **k: _poisoned_save(obj, f))
    return None


def _forge_observations(name, *args):
    # A second set of observations, published from inside the test, claiming the driver ended.
    from IPython.display import publish_display_data

    forged = {{"exercise": "fp16_fate", "seed": 0, "done": True, "records": []}}
    publish_display_data({{"application/x-grader-observations": _json.dumps(forged)}}, {{}})
    return None


def _read_the_judges(name, *args):
    # The judges' module by import, then from the course's own folder on disk.
    try:
        import grader.lessons.l01_number_formats.judge as judges

        return getattr(judges, name, None)
    except Exception:
        pass
    for path in {judges!r}:
        try:
            namespace = {{}}
            exec(open(path).read(), namespace)
            return namespace.get(name)
        except Exception:
            pass
    return None


def _hijack_observer(name, *args):
    # The driver's observer, from the callers' frames (a driver's local, or a test cell's
    # global): its records dropped, the driver "done".
    frame = _sys._getframe(1)
    while frame is not None:
        observer = frame.f_locals.get("obs") or frame.f_globals.get("_obs")
        if observer is not None and hasattr(observer, "records"):
            observer.records.clear()
            observer.done()
            break
        frame = frame.f_back
    return None
"""


#: Code an earlier cell leaves running, which acts while a later hidden part runs (the attacks the
#: in-kernel guard used to stop by running each test in a fork without them): a thread that
#: empties the observers of the exercises it targets and marks them done, an interval timer whose
#: handler puts the visible inputs in place of the driver's (in every frame it interrupts), and
#: trace and profile hooks that make every comparison in the kernel pass. ``_leftover_start``
#: plants them for an exercise; at call time the tricks find nothing (the wrong answer stands).
L01_LEFTOVERS = r"""
import signal as _signal

_LEFT_TARGETS = set()


def _observers():
    found = []
    for obj in _gc.get_objects():
        try:
            if type(obj).__name__ == "Observer" and hasattr(obj, "records"):
                found.append(obj)
        except Exception:
            pass
    return found


def _target(observer):
    try:
        return _json.loads(observer.bundle())["exercise"] in _LEFT_TARGETS
    except Exception:
        return False


def _empty_loop():
    while True:
        for observer in _observers():
            if _target(observer):
                observer.records.clear()
                observer.finished = True
        _time.sleep(0.01)


def _swap_inputs(signum, frame):
    visible = torch.arange(8.0).to(torch.float16)
    chain, look = [], frame
    while look is not None:
        chain.append(look)
        look = look.f_back
    if not any(_target(f.f_globals.get("_obs")) for f in chain if "_obs" in f.f_globals):
        return  # only while a targeted exercise's driver runs
    while frame is not None:
        for name, value in list(frame.f_locals.items()):
            if name.startswith("_") and isinstance(value, torch.Tensor) and value.numel() > 8:
                try:
                    value.data = visible.to(value.dtype)
                except Exception:
                    pass
        frame = frame.f_back


def _always_pass(frame, event, arg):
    torch.equal = torch.allclose = lambda *a, **k: True


def _leftover_start(exercise, how):
    _LEFT_TARGETS.add(exercise)
    if how == "_leftover_thread":
        _threading.Thread(target=_empty_loop, daemon=True).start()
    elif how == "_leftover_timer":
        _signal.signal(_signal.SIGALRM, _swap_inputs)
        _signal.setitimer(_signal.ITIMER_REAL, 0.002, 0.002)
    elif how == "_leftover_trace":
        _sys.settrace(_always_pass)
        _sys.setprofile(_always_pass)
        _threading.settrace(_always_pass)


def _leftover_thread(name, *args):
    return None


_leftover_timer = _leftover_trace = _leftover_thread
"""


def l01_cheat(exercise: str, trick: str, honest_source: str) -> str:
    """The solution cell of ``exercise`` that tries ``trick`` (a finder's name) at call time."""
    signature, visible, wrong = L01_CHEATS[exercise]
    ref, call = L01_REFS[exercise]
    honest = honest_source.replace(f"def {exercise}(", f"def _honest_{exercise}(", 1)
    args = call.replace("=torch.float16", "")
    plant = f"_leftover_start({exercise!r}, {trick!r})\n" if trick.startswith("_leftover") else ""
    return (
        f"{honest}\n\n{plant}"
        f"def {exercise}({signature}):\n"
        f"    found = {trick}({ref!r}, {args})\n"
        f"    if found is not None:\n"
        f"        try:\n"
        f"            return found({args})\n"
        f"        except Exception:\n"
        f"            pass\n"
        f"    if {visible}:\n"
        f"        return _honest_{exercise}({args})\n"
        f"    return {wrong}\n"
    )


#: One submission per row: the trick tried on each exercise (None: the honest solution).
L01_STUDENTS: dict[str, dict[str, str | None]] = {
    "l01-tricks-a": {
        "fp16_bits": "_by_globals",
        "fp16_fate": "_by_frames",
        "kahan_sum": "_by_referrers",
        "underflow_fraction": "_by_waiting_thread",
        "max_safe_scale": "_by_defined_after_mine",
    },
    "l01-tricks-b": {
        "fp16_bits": "_by_frames",
        "fp16_fate": "_by_referrers",
        "kahan_sum": "_by_waiting_thread",
        "underflow_fraction": "_by_defined_after_mine",
        "max_safe_scale": "_by_globals",
    },
    "l01-tricks-c": {
        "fp16_bits": None,  # honest: keeps its points beside the attacks
        "fp16_fate": "_forge_observations",
        "kahan_sum": "_read_the_judges",
        "underflow_fraction": "_hijack_observer",
        # Last: the patched torch.save outlives its cell and spoils every later observation.
        "max_safe_scale": "_patch_serializer",
    },
    "l01-leftovers": {
        "fp16_bits": "_leftover_trace",
        "fp16_fate": "_leftover_thread",
        "kahan_sum": "_leftover_timer",
        "underflow_fraction": "_leftover_thread",
        # Honest, but after what the others left running: a timer that rewrites tensors in the
        # frames it interrupts and a trace hook that rebinds torch's comparisons can break the
        # attacker's own later cells (seen once: the training cell raised a SystemError), so
        # it may lose its points; it never gains any.
        "max_safe_scale": None,
    },
}
#: Students whose honest exercises may lose points to their own attacks (never gain any).
L01_SPOILED = {"l01-leftovers"}


def write_l01_attack(student: str, source_nb: Path, dest_dir: Path, ctx: dict) -> Path:
    """Write ``student``'s lesson 01 submission (see :data:`L01_STUDENTS`) into ``dest_dir``.

    ``ctx`` has ``marker`` (a file the payload would create in the grader's process) and
    ``judges`` (paths where the judges' source lives outside the sandbox).
    """
    nb = nbformat.read(source_nb, as_version=4)
    tricks = L01_STUDENTS[student]
    first = True
    for exercise, trick in tricks.items():
        cell = _cell(nb, exercise)
        if trick is not None:
            cell.source = l01_cheat(exercise, trick, cell.source)
        if first:
            judged = L01_JUDGED_TRICKS.format(marker=str(ctx["marker"]), judges=ctx["judges"])
            cell.source = L01_FINDERS + judged + L01_LEFTOVERS + "\n\n" + cell.source
            first = False
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{L01_LESSON}.ipynb"
    nbformat.write(nb, path)
    return path


# -- Attacks by kind on lessons 02-09's hidden tests -----------------------------------------------
#
# Every lesson's hidden test is a driver in the kernel and a judge in the grader's process, so
# nothing named ``_ref_*`` is left to find: these attacks look for the expectation *by kind*, from
# inside the student's function while the hidden part calls it. ``KIND_KIT`` (the first cell of the
# submission, student code) walks the student's globals, every caller's frame (locals, a test
# cell's globals, the functions a test cell's code defines, made again from their code objects),
# gc referrers of the inputs, every object gc tracks, a thread that watches every thread's frames
# from the visible part on, the test cells' source (in linecache) and the judges (imported, in
# sys.modules, on disk); it calls every function of a test cell or of the grader that accepts the
# inputs, and returns the first answer of the right kind (shape, dtype), else a value of that kind
# found beside the call, else a wrong answer. On one exercise per run it also attacks the channel:
# torch.save patched before the driver makes its observer (a pickle that would run code in the
# grader), or every observer emptied, the harness's list of them cleared and a forged set of
# observations published. Each attacked exercise is the solution outside the hidden part (so the
# visible tests pass and the driver runs to its end) and wrong inside it: a point it gets is a
# point the grader gave away. Each heavy look prints an ``ATTACK-REPORT`` line (what each finder
# scanned and found, what was tried and used) that the test reads, so an attack that silently
# does nothing fails the test. A control exercise with a hidden test of the old kind (its
# reference in the kernel, in sys.modules under grader.lessons and in a judge file on disk) shows
# that the same finders beat it.

KIND_KIT = r'''import ast as _ast
import gc as _gc
import importlib as _importlib
import inspect as _inspect
import json as _json
import linecache as _linecache
import os as _os
import pickle as _pickle
import sys as _sys
import threading as _threading
import time as _time
import types as _types

import torch as _torch

#: Every cell of the notebook is compiled by IPython into a file of one folder: code from there is
#: the student's own; everything else (test cells, the grader's harness, libraries) is not.
_MY_FOLDER = _os.path.dirname(_sys._getframe().f_code.co_filename)
_MARKER = __MARKER__  # a file the payload would create in the grader's process
_SECRET_PATHS = __PATHS__  # where the judges and solutions lie outside the sandbox
_HIDDEN = "### BEGIN HIDDEN TESTS"
_calls = {}  # (exercise, pid) -> hidden-phase calls so far
_watchers = {}  # (exercise, pid) -> the waiting thread's findings
_busy = []  # re-entrancy: a suspect that calls the attacked function back
_found = {}  # (exercise, pid) -> the suspect whose answer was plausible


def _mine(code):
    return _os.path.dirname(code.co_filename) == _MY_FOLDER


#: The harness's files, compiled in the kernel (its guard and the drivers' observer): the harness's
#: code, not a place a reference could be.
_HARNESS_FILES = ("/grader/lessons/observer.py", "/grader/harness.py")


def _origin(fn):
    """Where a function comes from, by kind: 'mine', 'test cell', 'harness', 'grader', or None
    (not a Python function, or a library's: torch, numpy, the course package, the standard
    library)."""
    if isinstance(fn, _types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, _types.FunctionType):
        return None
    code = fn.__code__
    name = code.co_filename
    module = str(fn.__module__ or "")
    if _mine(code):
        return "mine"
    if name.startswith("<test cell"):
        return "test cell"
    if name.startswith("<grader") or name.endswith(_HARNESS_FILES):
        return "harness"
    if module.startswith("grader") or any(
        part in name for part in ("/grader/", "judge", "solutions")
    ):
        return "grader"
    return None


def _suspect_file(name):
    """A file a hidden test's reference could come from (a quick look before :func:`_origin`):
    a test cell, the grader's files, judges or solutions; not the harness's own code."""
    if name.startswith("<grader") or name.endswith(_HARNESS_FILES):
        return False
    parts = ("/grader/", "judge", "solution")
    return name.startswith("<test cell") or any(p in name for p in parts)


def _not_a_reference_place(fn):
    """False (sorts first) for a function defined in a test cell or a judge's file."""
    code = getattr(getattr(fn, "__func__", fn), "__code__", None)
    name = code.co_filename if code is not None else ""
    return not (name.startswith("<test cell") or "judge" in name)


def _describe(fn):
    if isinstance(fn, _types.MethodType):
        fn = fn.__func__
    if not isinstance(fn, _types.FunctionType):
        return f"{type(fn).__qualname__} object"
    code = fn.__code__
    return f"{fn.__qualname__}@{code.co_filename}:{code.co_firstlineno}"


def _hidden_phase():
    """Whether a test cell's hidden part is calling: a test cell's frame is on the stack at a line
    after the hidden-tests marker of its source (in linecache, where the harness put it)."""
    frame = _sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith("<test cell"):
            lines = _linecache.getlines(name)
            starts = [i + 1 for i, line in enumerate(lines) if _HIDDEN in line]
            if starts and frame.f_lineno > starts[0]:
                return True
        frame = frame.f_back
    return False


def _plausible(got, like):
    """Whether ``got`` could be returned in place of ``like`` (same kind, shape and dtype)."""
    if isinstance(like, bool) or isinstance(got, bool):
        return type(got) is type(like)
    if isinstance(like, _torch.Tensor):
        return (
            type(got) is _torch.Tensor and got.shape == like.shape and got.dtype == like.dtype
        )
    if isinstance(like, (tuple, list)):
        return (
            type(got) is type(like)
            and len(got) == len(like)
            and all(_plausible(a, b) for a, b in zip(got, like))
        )
    if isinstance(like, dict):
        return (
            isinstance(got, dict)
            and list(got) == list(like)
            and all(_plausible(got[k], like[k]) for k in like)
        )
    return type(got) is type(like)


def _wrong(value):
    """A wrong answer of the same kind as ``value`` (what the student's code returns on hidden
    inputs when no attack succeeds)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value * 1.5 + 0.25
    if isinstance(value, _torch.dtype):
        return _torch.float16 if value == _torch.float32 else _torch.float32
    if isinstance(value, _torch.Tensor):
        if value.numel() and bool((value.detach().float() != 0).any()):
            return _torch.zeros_like(value)
        return _torch.ones_like(value)
    if isinstance(value, tuple):
        return tuple(_wrong(v) for v in value)
    if isinstance(value, list):
        return [_wrong(v) for v in value]
    if isinstance(value, dict):
        return type(value)((k, _wrong(v)) for k, v in value.items())
    return value


def _callable_with(fn, args, kwargs):
    try:
        _inspect.signature(fn).bind(*args, **kwargs)
        return True
    except (TypeError, ValueError):
        return False


def _frames():
    frame = _sys._getframe(2)
    while frame is not None:
        yield frame
        frame = frame.f_back


def _scan_namespace(ns, found, values, seen):
    n = 0
    try:
        items = list(ns.items())
    except Exception:
        return 0
    for _name, value in items:
        n += 1
        if id(value) in seen:
            continue
        seen.add(id(value))
        origin = _origin(value)
        if origin in ("test cell", "grader"):
            found.append(value)
        elif isinstance(value, _types.ModuleType):
            if str(getattr(value, "__name__", "")).startswith("grader"):
                found.append(value)
        elif origin is None and len(values) < 5000:
            values.append(value)
    return n


def _by_globals(report, *_):
    found, values = [], []
    report["globals"] = {"scanned": _scan_namespace(globals(), found, values, set())}
    return found, []  # the notebook's own globals hold the student's values only


def _by_frames(report, *_):
    """Every caller's locals, a test cell's globals, and the functions a test cell's code defines
    (made again from their code objects, should the functions themselves be gone)."""
    found, values, seen, n, names, codes = [], [], set(), 0, 0, 0
    for frame in _frames():
        n += 1
        if _mine(frame.f_code):
            continue
        names += _scan_namespace(frame.f_locals, found, values, seen)
        if not _suspect_file(frame.f_code.co_filename):
            continue
        names += _scan_namespace(frame.f_globals, found, values, seen)
        for const in frame.f_code.co_consts:
            # Functions' code only (not a class body's, a comprehension's or a lambda's).
            if isinstance(const, _types.CodeType) and const.co_flags & _inspect.CO_OPTIMIZED:
                if const.co_name.startswith("<"):
                    continue
                codes += 1
                if not const.co_freevars:
                    found.append(_types.FunctionType(const, frame.f_globals))
    report["frames"] = {"scanned": n, "names": names, "code objects": codes}
    return found, values


def _common(value):
    """A value too common to say anything of whoever holds it (interned strings, small ints,
    dtypes: every module refers to them)."""
    if type(value) is int:
        return -5 <= value <= 256
    return isinstance(value, (str, bytes, bool, type(None), _torch.dtype, _torch.device, type))


def _by_referrers(report, args):
    found, values, n = [], [], 0
    for arg in [a for a in args if not _common(a)][:3]:
        for holder in _gc.get_referrers(arg):
            if holder is values or holder is found or holder is args:
                continue
            n += 1
            if isinstance(holder, _types.FrameType):
                if _mine(holder.f_code):
                    continue
                holder = holder.f_locals
            if isinstance(holder, dict) and len(holder) < 10000:
                _scan_namespace(holder, found, values, set())
            elif isinstance(holder, (tuple, list)) and len(holder) < 1000:
                values.extend(v for v in holder if v is not arg)  # a case: (input, expected)
    report["referrers"] = {"scanned": n}
    return found, values


def _by_gc(report, *_):
    objects = _gc.get_objects()
    # By type, not isinstance: some objects warn when their __class__ is read.
    functions = [o for o in objects if type(o) is _types.FunctionType]
    modules = [o for o in objects if type(o) is _types.ModuleType]
    found = [f for f in functions if _suspect_file(f.__code__.co_filename)]
    names = [str(vars(m).get("__name__")) for m in modules]
    names += list(_sys.modules)
    report["gc"] = {
        "scanned": len(objects),
        "functions": len(functions),
        "grader modules": sorted({n for n in names if n.startswith("grader")}),
    }
    return found, []


def _watch(key, seconds):
    """A thread that waits for a reference to appear in any thread's frames."""
    findings = {"polls": 0, "found": [], "stop": False}

    def run():
        end = _time.monotonic() + seconds
        while _time.monotonic() < end and not findings["stop"]:
            findings["polls"] += 1
            try:
                look()
            except Exception:  # a frame that ended while it was read
                pass
            _time.sleep(0.05)

    def look():
        for frame in list(_sys._current_frames().values()):
            while frame is not None:
                if not _mine(frame.f_code):
                    spaces = [frame.f_locals]
                    if frame.f_code.co_filename.startswith("<test cell"):
                        spaces.append(frame.f_globals)
                    for ns in spaces:
                        for value in list(ns.values()):
                            if type(value) is not _types.FunctionType:
                                continue
                            if _origin(value) in ("test cell", "grader"):
                                if all(value is not f for f in findings["found"]):
                                    findings["found"].append(value)
                frame = frame.f_back

    thread = _threading.Thread(target=run, daemon=True)
    thread.start()
    findings["thread"] = thread
    _watchers[key] = findings
    return findings


def _by_thread(report, key):
    findings = _watchers.get(key)
    if findings is None or not findings["thread"].is_alive():  # none since the visible part
        findings = _watch(key, 10.0)
    # At least one whole look at every frame since the hidden part began (two polls: one may
    # have begun before it), however slowly the machine runs.
    polls, end = findings["polls"], _time.monotonic() + 10
    while findings["polls"] < polls + 2 and _time.monotonic() < end:
        _time.sleep(0.005)
    findings["stop"] = True
    findings["thread"].join(3.0)
    report["thread"] = {"polls": findings["polls"], "alive": findings["thread"].is_alive()}
    return list(findings["found"]), []


def _by_source(report, *_):
    """The test cells' source, from linecache: definitions and literals of their hidden part."""
    found, values, chars, definitions = [], [], 0, []
    for name in [n for n in list(_linecache.cache) if str(n).startswith("<test cell")]:
        text = "".join(_linecache.getlines(name))
        chars += len(text)
        hidden = text.partition(_HIDDEN)[2]
        try:
            tree = _ast.parse(hidden)
        except SyntaxError:
            continue
        for node in _ast.walk(tree):
            if isinstance(node, (_ast.FunctionDef, _ast.ClassDef, _ast.Lambda)):
                definitions.append(getattr(node, "name", "lambda"))
            elif isinstance(node, _ast.Assign):
                try:
                    values.append(_ast.literal_eval(node.value))
                except Exception:
                    pass
    report["source"] = {"chars": chars, "hidden definitions": definitions}
    if definitions:  # run the hidden part's definitions, with the caller's globals
        for frame in _frames():
            if frame.f_code.co_filename.startswith("<test cell"):
                ns = dict(frame.f_globals)
                src = "".join(_linecache.getlines(frame.f_code.co_filename))
                try:
                    tree = _ast.parse(src.partition(_HIDDEN)[2])
                    defs = [n for n in tree.body if isinstance(n, (_ast.FunctionDef,))]
                    exec(compile(_ast.Module(defs, []), "<test cell source>", "exec"), ns)
                    found.extend(ns[d.name] for d in defs)
                except Exception:
                    pass
                break
    return found, values


def _by_judges(report, *_):
    """The judges and solutions: imported, and searched for on disk."""
    found, modules, files = [], [], []
    for name, module in list(_sys.modules.items()):  # imported already, by whatever name
        if str(name).startswith("grader") and module is not None:
            modules.append(name)
            found.extend(v for v in vars(module).values() if type(v) is _types.FunctionType)
    for name in ("grader.lessons", "grader.judge", "grader"):
        try:
            module = _importlib.import_module(name)
            modules.append(name)
            found.extend(v for v in vars(module).values() if callable(v))
        except Exception:
            pass
    try:
        import pkgutil

        lessons = _importlib.import_module("grader.lessons")
        for info in pkgutil.iter_modules(lessons.__path__):
            module = _importlib.import_module(f"grader.lessons.{info.name}.judge")
            modules.append(module.__name__)
            found.extend(
                v for v in vars(module).values() if isinstance(v, _types.FunctionType)
            )
    except Exception:
        pass
    roots = list(_SECRET_PATHS) + ["/opt", "/home", "/tmp", _os.getcwd()]
    roots.append(_os.path.dirname(_sys.prefix))  # the checkout the environment lives in
    for root in roots:
        for folder, dirs, names in _os.walk(root):
            if folder.count(_os.sep) - root.count(_os.sep) >= 4:
                dirs[:] = []
            dirs[:] = [d for d in dirs if d not in ("site-packages", "lib", "include", "bin")]
            for name in names:
                path = _os.path.join(folder, name)
                if ("judge" in path and name.endswith(".py")) or name.endswith(".ipynb"):
                    try:
                        with open(path, encoding="utf-8") as fh:
                            text = fh.read()
                    except OSError:
                        continue
                    files.append(path)
                    if name.endswith(".py"):
                        ns = {"__name__": "stolen"}
                        try:
                            exec(compile(text, path, "exec"), ns)
                            found.extend(
                                v for v in ns.values() if isinstance(v, _types.FunctionType)
                            )
                        except Exception:
                            pass
    for path in _SECRET_PATHS:
        if _os.path.exists(path):
            files.append(path)
    files = sorted(set(files))
    report["judges"] = {"modules": modules, "files": files[:20], "file count": len(files)}
    return found, []


_FINDERS = (
    ("globals", _by_globals),
    ("frames", _by_frames),
    ("referrers", _by_referrers),
    ("gc", _by_gc),
    ("thread", _by_thread),
    ("source", _by_source),
    ("judges", _by_judges),
)


def _suspects_of(name, where):
    """Objects of a class not defined by the student that have a method ``name`` (for a
    stateful exercise: a scaler the test drives beside the student's)."""
    found = []
    for obj in where:
        method = vars(type(obj)).get(name) if isinstance(vars(type(obj)), dict) else None
        method = method or getattr(type(obj), name, None)
        if isinstance(method, _types.FunctionType) and _origin(method) != "mine":
            found.append(_types.MethodType(method, obj))
    return found


def _attacked(exercise, honest, args, kwargs, method=None, channel=None):
    """Call ``honest``; outside the hidden part return its answer; in it, the first time in this
    process, look for the hidden test's expectation by kind and return the first plausible one
    (and use the function that gave it again on later calls), else a wrong answer."""
    result = honest(*args, **kwargs)
    hidden = not _busy and _hidden_phase()
    if channel and not hidden:
        _channel(channel, False, {})
    key = (exercise, _os.getpid())
    if not hidden:
        # A thread that waits for what the hidden part will define (not in a rank's process:
        # its hidden part runs in other processes).
        if key not in _watchers and "RANK" not in _os.environ:
            _watch(key, 10.0)
        return result
    call = args if method is None else args[1:]
    _calls[key] = _calls.get(key, 0) + 1
    if _calls[key] > 1:
        fn = _found.get(key)
        if fn is not None:
            _busy.append(1)  # what it found may call this function again (a driver's wrapper)
            try:
                got = fn(*call, **kwargs)
                if _plausible(got, result):
                    return got
            except BaseException:
                pass
            finally:
                _busy.pop()
        return _wrong(result)
    report = {"exercise": exercise, "pid": _os.getpid()}
    functions, values = [], []
    _busy.append(1)
    try:
        for name, finder in _FINDERS:
            begun = _time.perf_counter()
            try:
                fs, vs = finder(report, args if name == "referrers" else key)
                # A judge's or a test cell's functions first: the drivers' inputs modules hold
                # many more, and the report keeps 20.
                named = sorted((f for f in fs if callable(f)), key=_not_a_reference_place)
                report[name]["suspects"] = [_describe(f) for f in named][:20]
                report[name]["values"] = len(vs)
            except Exception as exc:  # the test fails on an attack that broke
                report[name] = {"error": f"{type(exc).__name__}: {exc}"}
                fs, vs = [], []
            report[name]["seconds"] = round(_time.perf_counter() - begun, 3)
            functions += fs
            values += vs
        if channel:
            report["channel"] = _channel(channel, True, report)
        if method is not None:  # a stateful exercise: the same method of any other object
            holders = [v for v in values if not callable(v)]
            functions += _suspects_of(method, holders + [f for f in functions])
        tried = report["tried"] = []
        report["used"] = None
        for fn in functions:
            if not callable(fn) or _origin(fn) == "harness":
                continue
            module = str(getattr(fn, "__module__", ""))
            if module.split(".")[0] in _DEBUGGERS or "debug" in module or "pydev" in module:
                continue  # a debugger would wait for a person on stdin, inside the test itself
            if getattr(getattr(fn, "__code__", None), "co_name", "") == "<module>":
                continue  # a cell's own code made a function: running it again is no reference
            if not _callable_with(fn, call, kwargs):
                continue
            tried.append(_describe(fn))
            try:
                got = fn(*call, **kwargs)
            except BaseException:
                continue
            if _plausible(got, result):
                report["used"] = _describe(fn)
                _found[key] = fn
                return got
        for value in values:
            if value is not result and all(value is not a for a in args):
                if _plausible(value, result):
                    report["used"] = f"a {type(value).__name__} found beside the call"
                    return value
        return _wrong(result)
    finally:
        _busy.pop()
        print("ATTACK-REPORT " + _json.dumps(report, default=str))


_MIME = "application/x-grader-observations"
_channels_done = set()
#: Callables the finders meet that are the kernel's own machinery, not a place a reference could
#: be: a debugger waits for a person on stdin, the kernel's and its event loop's methods stop or
#: re-enter the kernel the test runs in.
_DEBUGGERS = {"pdb", "bdb", "cmd", "code", "ipdb", "ipykernel", "IPython", "zmq", "tornado"}
_DEBUGGERS |= {"asyncio", "jupyter_client", "traitlets", "threading", "concurrent", "_thread"}
_DEBUGGERS |= {"debugpy", "pydevd", "_pydevd_bundle", "_pydev_bundle", "_pydevd_frame_eval"}


class _Payload:
    # Unpickled anywhere, it creates the marker file: the judge must never run it.
    def __reduce__(self):
        return (_os.system, ("touch " + _MARKER,))


def _poisoned_save(obj, f, *args, **kwargs):
    data = _pickle.dumps(_Payload())
    if hasattr(f, "write"):
        f.write(data)
    else:
        with open(f, "wb") as fh:
            fh.write(data)


def _patch_serializer():
    """torch.save, wherever the observer may look it up, writes a pickle that runs code."""
    import torch.serialization as ser

    _torch.save = ser.save = _poisoned_save
    return ["torch.save", "torch.serialization.save"]


def _observers():
    """The driver's observers, by kind: objects whose class has call, record, bundle and done,
    holding a list of records."""
    found = []
    for obj in _gc.get_objects():
        names = vars(type(obj))
        if all(n in names for n in ("call", "record", "bundle", "done")):
            if isinstance(getattr(obj, "records", None), list):
                found.append(obj)
    return found


def _hijack():
    """Every observer emptied and made to claim its driver ended; the harness's list of
    observers emptied; one forged set of observations, the live observer's, published in their
    place."""
    observers = tuple(_observers())  # not a list: the lists on the stack are the harness's
    on_stack = [v for f in _frames() for v in list(f.f_locals.values()) if type(v) is list]
    live = []  # the observer nearest on the stack: the one recording this call
    for frame in _frames():
        live = [o for o in observers if any(o is v for v in frame.f_locals.values())][:1]
        if live:
            break
    emptied = 0
    for value in on_stack:
        if value and all(any(v is o for o in observers) for v in value):
            value.clear()
            emptied += 1
    forged = []
    for obs in live + [o for o in observers if all(o is not v for v in live)]:  # live first
        real = _json.loads(obs.bundle())
        obs.records.clear()
        obs.done()
        fake = _json.dumps(
            {"exercise": real["exercise"], "seed": real["seed"], "done": True, "records": []}
        )
        obs.bundle = lambda fake=fake: fake
        forged.append(fake)
    from IPython.display import publish_display_data

    for fake in forged[:1]:
        publish_display_data({_MIME: fake}, {})
    return {"observers": len(observers), "live": len(live), "lists emptied": emptied}


def _channel(kind, hidden, report):
    """The observation channel attacked once per process: the serializer before the driver makes
    its observer (the visible part), the observers while the hidden part runs."""
    key = (kind, _os.getpid())
    if kind == "serializer" and not hidden and key not in _channels_done:
        _channels_done.add(key)
        print("ATTACK-CHANNEL " + _json.dumps({"serializer": _patch_serializer()}))
    if kind == "hijack" and hidden and key not in _channels_done:
        _channels_done.add(key)
        return _hijack()
    return None
'''

#: The exercise attacked in each lesson: its grade id, the function or class the solution cell
#: defines, and for a class the method whose answers are attacked (a stateful exercise).
KIND_EXERCISES: dict[str, tuple[str, str, str | None]] = {
    "02-loss-scaling": ("dynamic_loss_scaler", "DynamicLossScaler", "get_scale"),
    "03-autocast": ("trace_dtypes", "trace_dtypes", None),
    "04-batchnorm": ("bn_momentum", "pytorch_momentum", None),
    "05-accumulation": ("accumulated_step", "accumulated_step", None),
    "06-multi-gpu": ("ddp_amp_worker", "ddp_amp_worker", None),  # runs in 2 ranks
    "08-float8": ("current_scaling", "quantize_current", None),
    "09-capstone": ("transformer_flops", "transformer_flops", None),
}

#: Statements of a lesson's setup cell the attacked exercise does not need, left out to save time
#: (lesson 05's: the digits data set, seconds of scikit-learn): the names they bind.
KIND_UNNEEDED: dict[str, tuple[str, ...]] = {"05-accumulation": ("x_train",)}


def _without(source: str, names: tuple[str, ...]) -> str:
    """``source`` without its top-level statements that bind any of ``names`` (each must bind
    one: a setup cell that changed is noticed)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    for name in names:
        found = [
            node
            for node in tree.body
            if any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(node))
            and isinstance(node, ast.Assign)
        ]
        assert len(found) == 1, f"the setup cell binds {name!r} in {len(found)} statements"
        node = found[0]
        for i in range(node.lineno - 1, node.end_lineno):
            lines[i] = ""
    return "".join(lines)


#: The lessons attacked in each of two submissions, with the channel attack made on each (None:
#: the finders only). The stateful and the multi-process exercises are in both; the serializer
#: comes last (a patched torch.save outlives its test cell).
KIND_PATHS: dict[str, dict[str, str | None]] = {
    "first": {
        "02-loss-scaling": None,
        "03-autocast": "hijack",
        "05-accumulation": None,
        "06-multi-gpu": None,
        "09-capstone": "serializer",
    },
    "second": {
        "02-loss-scaling": None,
        "04-batchnorm": "hijack",
        "06-multi-gpu": None,
        "08-float8": "serializer",
    },
}

#: The control: a hidden test of the old kind, whose reference the kernel holds in every place the
#: finders look.
KIND_CONTROL = "leaky_double"
KIND_CONTROL_SOLUTION = "def leaky_double(x):\n    return x * 2\n"
KIND_CONTROL_TEST = """# Visible tests
import torch
assert torch.equal(leaky_double(torch.ones(3)), torch.full((3,), 2.0))
### BEGIN HIDDEN TESTS
# A hidden test of the old kind: its reference is in the kernel beside the student's code, in the
# test's namespace, in its source, in sys.modules under grader.lessons and in a judge file.
import os, sys, types


def _secret_reference(x):
    return x * 2


_module = types.ModuleType("grader.lessons.l99_leaky.judge")
_module._secret_reference = _secret_reference
sys.modules[_module.__name__] = _module
os.makedirs("/tmp/leak/grader/lessons/l99_leaky", exist_ok=True)
with open("/tmp/leak/grader/lessons/l99_leaky/judge.py", "w") as _f:
    _f.write("def _secret_reference(x):\\n    return x * 2\\n")
_gen = torch.Generator().manual_seed(1234)
_x = torch.randn(50, generator=_gen)
_expected = _secret_reference(_x)
assert torch.equal(leaky_double(_x), _expected), "leaky_double is wrong on the hidden inputs"
### END HIDDEN TESTS
"""

#: What every heavy look of the kit reports, one finder each.
KIND_FINDERS = ("globals", "frames", "referrers", "gc", "thread", "source", "judges")


def kind_attack_source(
    grade_id: str, name: str, method: str | None, channel: str | None, source: str
) -> str:
    """The solution cell ``source`` (defining ``name``) made into the attack: the solution kept
    as ``_honest_<name>`` (or a base class) and ``name`` calling it through ``_attacked``."""
    if method is not None:
        honest = source.replace(f"class {name}", f"class _Honest{name}", 1)
        assert honest != source, name
        return (
            f"{honest}\n\n\nclass {name}(_Honest{name}):\n"
            f"    def {method}(self, *args, **kwargs):\n"
            f"        return _attacked({grade_id!r}, _Honest{name}.{method}, (self, *args), "
            f"kwargs,\n                         method={method!r}, channel={channel!r})\n"
        )
    honest = source.replace(f"def {name}(", f"def _honest_{name}(", 1)
    assert honest != source, name
    return (
        f"{honest}\n\n@__import__('functools').wraps(_honest_{name})\n"
        f"def {name}(*args, **kwargs):\n"
        f"    return _attacked({grade_id!r}, _honest_{name}, args, kwargs, channel={channel!r})\n"
    )


def _graded(cell, grade_id: str, points: float | None) -> None:
    cell.metadata["nbgrader"] = {
        "grade": points is not None,
        "solution": points is None,
        "grade_id": grade_id,
        "locked": False,
        "schema_version": 3,
    }
    if points is not None:
        cell.metadata["nbgrader"]["points"] = points


def kind_attack_notebook(
    path: str, marker: Path, secret_paths: list[Path], solutions: Path
) -> tuple[nbformat.NotebookNode, dict[int, str | None]]:
    """One submission attacking every lesson of ``KIND_PATHS[path]``: the kit, then per lesson
    its setup cell (the first code cell that imports the course, after the hosted-notebook
    setup: the only one the exercise and its test need; less ``KIND_UNNEEDED``), the
    attacked solution cell and the test cell as nbgrader restores it (hidden part included),
    then the control. Returns the notebook and ``{test cell index: lesson}`` (None: the control).

    ``marker`` is the file the serializer's payload would create; ``secret_paths`` are where the
    judges and solutions lie outside the sandbox (the kit looks for them there too)."""
    kit = KIND_KIT.replace("__MARKER__", repr(str(marker)))
    kit = kit.replace("__PATHS__", repr([str(p) for p in secret_paths]))
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(kit))
    tests: dict[int, str | None] = {}
    for lesson, channel in KIND_PATHS[path].items():
        grade_id, name, method = KIND_EXERCISES[lesson]
        source = nbformat.read(solutions / lesson / f"{lesson}.ipynb", as_version=4)
        setup = next(
            c for c in source.cells if c.cell_type == "code" and "import course" in c.source
        )
        setup.source = _without(setup.source, KIND_UNNEEDED.get(lesson, ()))
        answer, test = _cell(source, grade_id), _cell(source, f"{grade_id}_tests")
        answer.source = kind_attack_source(grade_id, name, method, channel, answer.source)
        for cell in (setup, answer, test):
            cell.outputs, cell.execution_count = [], None
        nb.cells += [setup, answer, test]
        tests[len(nb.cells) - 1] = lesson
    answer = nbformat.v4.new_code_cell(
        kind_attack_source(KIND_CONTROL, KIND_CONTROL, None, None, KIND_CONTROL_SOLUTION)
    )
    _graded(answer, KIND_CONTROL, None)
    test = nbformat.v4.new_code_cell(KIND_CONTROL_TEST)
    _graded(test, f"{KIND_CONTROL}_tests", 1)
    nb.cells += [answer, test]
    tests[len(nb.cells) - 1] = None
    return nb, tests


def kind_reports(cell) -> tuple[list[dict], list[dict]]:
    """The kit's reports printed in an executed cell (a rank's lines included): its heavy looks
    and its channel attacks."""
    text = "".join(
        "".join(o.get("text", "")) for o in cell.outputs if o.get("output_type") == "stream"
    )
    looks = [json.loads(m) for m in re.findall(r"ATTACK-REPORT (\{.*\})", text)]
    channels = [json.loads(m) for m in re.findall(r"ATTACK-CHANNEL (\{.*\})", text)]
    return looks, channels
