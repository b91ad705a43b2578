"""In-kernel defences run by the sandboxed executor around a student's notebook.

Two pieces of code are sent to the kernel as silent executions (they never appear in the
notebook):

* :data:`PRELUDE`, before any student code: it captures pristine copies of what the graded
  tests rely on (the ``__dict__`` of ``builtins``, ``torch``, ``torch.testing``, ``torch.Tensor``,
  ``numpy``, ``numpy.testing``, ``math``; the code objects of their Python functions; the import
  machinery; ``sys.modules`` entries), loads a private copy of ``course.checks`` from its file,
  removes the working folder from ``sys.path`` and ignores ``SIGXFSZ`` (an oversized write then
  raises ``OSError`` instead of killing the kernel).
* :data:`RESTORE`, before every graded test cell: it puts all of that back, reloads
  ``course.checks`` from a fresh module object, rebinds the check helpers and the module aliases
  (``torch``, ``np``...) in the notebook's namespace, drops notebook globals that shadow builtins
  the tests use, and clears trace/profile hooks. Then the test cell runs.

Pass/fail is decided from the kernel's ``execute_reply`` status as well as from error outputs
(nbgrader's Execute preprocessor adds an error output when the reply says ``error``), so hiding
tracebacks earns nothing. If the restore itself fails (the student broke the import system, say),
the following test cell is marked as failed without being run.

What this cannot stop: everything here lives in the student's own process. Code that finds the
restore function (it is stored under a random name, but Python lets one enumerate everything),
rewrites ipykernel's messaging, or inspects the calling test's frame (``sys._getframe``) to call a
hidden reference implementation is not prevented; :mod:`grader.scan` flags such code for a human.
"""

from __future__ import annotations

#: Filled in by :func:`prelude` (a random token per run, the file of course/checks.py).
PRELUDE = r"""
def _grader_install(token, checks_path):
    import builtins, importlib.util, math, os, signal, sys, threading, types
    import numpy, numpy.testing, torch, torch.testing

    try:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except (AttributeError, ValueError):
        pass
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]

    def load_checks():
        spec = importlib.util.spec_from_file_location("course.checks", checks_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    checks = load_checks()
    grading = (checks._GRADING_KEY, checks._STUDENT_ID)  # popped from the environment just now
    import course
    sys.modules["course.checks"] = checks
    course.checks = checks

    modules = {m.__name__: m for m in (builtins, math, numpy, numpy.testing, torch,
                                        torch.testing, sys.modules["torch.nn"],
                                        sys.modules["torch.nn.functional"], course)}
    classes = [torch.Tensor, numpy.ndarray.__mro__[0]]
    snap_dicts = {}
    for m in modules.values():
        snap_dicts[id(m)] = (m, dict(vars(m)))
    class_dicts = [(c, dict(vars(c))) for c in classes
                   if isinstance(vars(c), types.MappingProxyType)]
    codes = []
    for owner, d in list(snap_dicts.values()) + class_dicts:
        for v in d.values():
            f = getattr(v, "__func__", v)
            if isinstance(f, types.FunctionType):
                codes.append((f, f.__code__, f.__defaults__, f.__kwdefaults__))
    meta_path, path_hooks = list(sys.meta_path), list(sys.path_hooks)
    set_attr = object.__setattr__
    type_set = type.__setattr__
    type_del = type.__delattr__
    aliases = {"torch": "torch", "np": "numpy", "numpy": "numpy", "math": "math",
               "nn": "torch.nn", "F": "torch.nn.functional", "course": "course"}
    sensitive = ("isinstance", "issubclass", "type", "len", "print", "float", "int", "bool",
                 "abs", "repr", "str", "sorted", "zip", "range", "tuple", "list", "dict", "all",
                 "any", "min", "max", "sum", "hasattr", "getattr", "callable", "round",
                 "enumerate", "Exception", "AssertionError", "ValueError", "TypeError",
                 "RuntimeError", "__import__")

    from IPython import get_ipython
    shell = get_ipython()

    def restore():
        user_ns = shell.user_ns
        sys.settrace(None)
        sys.setprofile(None)
        threading.settrace(None)
        sys.meta_path[:] = meta_path
        sys.path_hooks[:] = path_hooks
        for m, d in snap_dicts.values():
            sys.modules[m.__name__] = m
            cur = vars(m)
            for k, v in d.items():
                if cur.get(k, d) is not v:
                    cur[k] = v
        for c, d in class_dicts:
            cur = vars(c)
            for k in [k for k in cur if k not in d]:
                type_del(c, k)
            for k, v in d.items():
                if cur.get(k, d) is not v:
                    type_set(c, k, v)
        for f, code, defaults, kwdefaults in codes:
            if f.__code__ is not code:
                f.__code__ = code
            f.__defaults__ = defaults
            f.__kwdefaults__ = kwdefaults
        fresh = load_checks()
        fresh._GRADING_KEY, fresh._STUDENT_ID = grading
        sys.modules["course.checks"] = fresh
        course.checks = fresh
        for name in dir(fresh):
            if name.startswith("check") or name in ("CheckFailed", "require_tensor"):
                user_ns[name] = getattr(fresh, name)
        for name, target in aliases.items():
            if name in user_ns and user_ns[name] is not sys.modules[target]:
                user_ns[name] = sys.modules[target]
        for name in sensitive:
            if name in user_ns and user_ns[name] is not getattr(builtins, name):
                del user_ns[name]
        if "__builtins__" in user_ns and user_ns["__builtins__"] is not builtins:
            user_ns["__builtins__"] = builtins
        return token

    setattr(sys, "_grader_" + token, restore)


_grader_install(__TOKEN__, __CHECKS__)
del _grader_install
"""

#: Filled in by :func:`restore`. Its reply status must be ``ok`` for the next test cell to run.
RESTORE = 'getattr(__import__("sys"), "_grader_" + __TOKEN__)()\n'


def prelude(token: str, checks_path: str) -> str:
    """The prelude's source for this run."""
    return PRELUDE.replace("__TOKEN__", repr(token)).replace("__CHECKS__", repr(checks_path))


def restore(token: str) -> str:
    """The restore call's source for this run."""
    return RESTORE.replace("__TOKEN__", repr(token))
