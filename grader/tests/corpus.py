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
        import grader.judges.l01_number_formats as judges

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
    # The driver's observer, from the callers' frames: its records dropped, the driver "done".
    frame = _sys._getframe(1)
    while frame is not None:
        observer = frame.f_globals.get("_obs")
        if observer is not None and hasattr(observer, "records"):
            observer.records.clear()
            observer.done()
            break
        frame = frame.f_back
    return None
"""


def l01_cheat(exercise: str, trick: str, honest_source: str) -> str:
    """The solution cell of ``exercise`` that tries ``trick`` (a finder's name) at call time."""
    signature, visible, wrong = L01_CHEATS[exercise]
    ref, call = L01_REFS[exercise]
    honest = honest_source.replace(f"def {exercise}(", f"def _honest_{exercise}(", 1)
    args = call.replace("=torch.float16", "")
    return (
        f"{honest}\n\n"
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
        "fp16_bits": "_patch_serializer",
        "fp16_fate": "_forge_observations",
        "kahan_sum": "_read_the_judges",
        "underflow_fraction": "_hijack_observer",
        "max_safe_scale": None,  # honest: keeps its points beside the attacks
    },
}


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
            cell.source = L01_FINDERS + judged + "\n\n" + cell.source
            first = False
    dest_dir.mkdir(parents=True, exist_ok=True)
    path = dest_dir / f"{L01_LESSON}.ipynb"
    nbformat.write(nb, path)
    return path
