"""The grader's guard inside the kernel; see :mod:`grader.guard`.

The prelude (:func:`grader.guard.prelude`) compiles this file before any student code runs, with
globals of its own whose builtins are a copy taken then, and calls :func:`install`: names the
notebook defines or builtins it replaces later never reach it. Module functions it calls are bound
at install for the same reason. The sandbox mounts it read-only beside the runner.
"""

from __future__ import annotations


def install(
    token: str, checks_path: str, use_fork: bool, observer_path: str, observations_mime: str
) -> None:
    """Install the guard in this kernel: called once, by the prelude, before any student code."""
    import _signal
    import ast
    import builtins
    import ctypes
    import gc
    import importlib
    import io
    import linecache
    import marshal
    import math
    import os
    import sys
    import threading
    import time
    import traceback
    import types
    import warnings

    import numpy
    import numpy.testing
    import torch
    import torch.testing
    from IPython.display import publish_display_data

    def refuse_audit_hooks(event, args):
        # Installed before any student code: audit hooks cannot be removed, so none is added.
        if event == "sys.addaudithook":
            raise RuntimeError("the grader allows no audit hooks in a graded notebook")

    sys.addaudithook(refuse_audit_hooks)
    try:
        _signal.signal(_signal.SIGXFSZ, _signal.SIG_IGN)
    except (AttributeError, ValueError):
        pass
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p not in ("", ".", cwd)]

    # What the grader's own steps call, bound now (C functions: neither rebinding a module
    # attribute nor replacing a code object later changes them).
    fork, pipe, read, write, close = os.fork, os.pipe, os.read, os.write, os.close
    waitpid, kill, exit_now, listdir = os.waitpid, os.kill, os._exit, os.listdir
    wifsignaled, wtermsig = os.WIFSIGNALED, os.WTERMSIG
    to_bytes, from_bytes = marshal.dumps, marshal.loads
    collect, gc_disable, gc_enable = gc.collect, gc.disable, gc.enable
    gc_callbacks, gc_garbage = gc.callbacks, gc.garbage
    settrace, setprofile, gettrace, getprofile = (
        sys.settrace,
        sys.setprofile,
        sys.gettrace,
        sys.getprofile,
    )
    current_frames, sys_modules = sys._current_frames, sys.modules
    set_signal, setitimer, set_wakeup_fd = _signal.signal, _signal.setitimer, _signal.set_wakeup_fd
    sigmask = getattr(_signal, "pthread_sigmask", None)
    SIG_DFL, SIG_IGN = _signal.SIG_DFL, _signal.SIG_IGN
    StringIO, monotonic, sleep = io.StringIO, time.monotonic, time.sleep
    import_module = importlib.import_module
    format_exception, line_cache = traceback.format_exception, linecache.cache
    Expr, Expression, ONLY_AST = ast.Expr, ast.Expression, ast.PyCF_ONLY_AST
    enumerate_threads, get_ident = threading.enumerate, threading.get_ident
    tc = torch._C
    fn_modes, pop_fn_mode = tc._len_torch_function_stack, tc._pop_torch_function_stack
    dispatch_modes, pop_dispatch_mode = tc._len_torch_dispatch_stack, tc._pop_torch_dispatch_stack
    cuda_initialized = getattr(tc, "_cuda_isInitialized", lambda: False)
    set_num_threads, set_default_dtype, set_grad = (
        torch.set_num_threads,
        torch.set_default_dtype,
        torch.set_grad_enabled,
    )
    default_dtype = torch.get_default_dtype()
    try:
        prctl = ctypes.CDLL(None).prctl
    except (OSError, AttributeError):
        prctl = None
    type_set, type_del = type.__setattr__, type.__delattr__

    with open(checks_path, "rb") as fh:
        checks_code = compile(fh.read(), checks_path, "exec", dont_inherit=True)
    # The drivers' observer (grader/lessons/observer.py), compiled now with the grader's own
    # builtins, before any student code runs.
    observer_ns = {"__builtins__": globals()["__builtins__"], "__name__": "_grader_observer"}
    with open(observer_path, "rb") as fh:
        exec(compile(fh.read(), observer_path, "exec", dont_inherit=True), observer_ns)
    new_observer = observer_ns["new_observer"]

    def load_checks():
        # A fresh course.checks from the code compiled above (no file or loader involved).
        module = types.ModuleType("course.checks")
        module.__file__, module.__package__ = checks_path, "course"
        sys_modules["course.checks"] = module
        exec(checks_code, module.__dict__)
        return module

    checks = load_checks()
    grading = (checks._GRADING_KEY, checks._STUDENT_ID)  # popped from the environment just now
    import course

    course.checks = checks

    module_mod = torch.nn.modules.module
    modules = {
        m.__name__: m
        for m in (
            builtins,
            math,
            numpy,
            numpy.testing,
            torch,
            torch.testing,
            sys_modules["torch.nn"],
            sys_modules["torch.nn.functional"],
            course,
            warnings,
        )
    }
    classes = [torch.Tensor, numpy.ndarray.__mro__[0]]
    snap_dicts = {}
    for m in modules.values():
        snap_dicts[id(m)] = (m, dict(vars(m)))
    class_dicts = [
        (c, dict(vars(c))) for c in classes if isinstance(vars(c), types.MappingProxyType)
    ]
    codes = []
    for _, d in list(snap_dicts.values()) + class_dicts:
        for v in d.values():
            f = getattr(v, "__func__", v)
            if isinstance(f, types.FunctionType):
                codes.append((f, f.__code__, f.__defaults__, f.__kwdefaults__))
    meta_path, path_hooks = list(sys.meta_path), list(sys.path_hooks)
    aliases = {
        "torch": "torch",
        "np": "numpy",
        "numpy": "numpy",
        "math": "math",
        "nn": "torch.nn",
        "F": "torch.nn.functional",
        "course": "course",
    }
    sensitive = (
        "isinstance",
        "issubclass",
        "type",
        "len",
        "print",
        "float",
        "int",
        "bool",
        "abs",
        "repr",
        "str",
        "sorted",
        "zip",
        "range",
        "tuple",
        "list",
        "dict",
        "all",
        "any",
        "min",
        "max",
        "sum",
        "hasattr",
        "getattr",
        "callable",
        "round",
        "enumerate",
        "Exception",
        "AssertionError",
        "ValueError",
        "TypeError",
        "RuntimeError",
        "__import__",
    )
    warn_filters = warnings.filters
    warn_filters_now = list(warn_filters)
    sys_hooks = {n: getattr(sys, n) for n in ("excepthook", "unraisablehook", "breakpointhook")}
    module_hooks = {
        n: v
        for n, v in vars(module_mod).items()
        if n.startswith("_global_") and isinstance(v, dict)
    }

    from IPython import get_ipython

    shell = get_ipython()
    try:  # pyzmq's thread for zero-copy sends starts at the first large output: start it now
        from zmq.utils.garbage import gc as zmq_garbage

        if not zmq_garbage.is_alive():
            zmq_garbage.start()
    except Exception:
        pass
    start_threads = set(current_frames()) | {t.ident for t in enumerate_threads()}
    catchable = [s for s in _signal.valid_signals() if s not in (_signal.SIGKILL, _signal.SIGSTOP)]
    signal_reset = {
        _signal.SIGINT: _signal.default_int_handler,
        _signal.SIGPIPE: SIG_IGN,
        _signal.SIGXFSZ: SIG_IGN,
    }
    kernel_handlers = {s: _signal.getsignal(s) for s in catchable}
    kernel_handlers = {s: h for s, h in kernel_handlers.items() if h is not None}
    itimers = [_signal.ITIMER_REAL, _signal.ITIMER_VIRTUAL, _signal.ITIMER_PROF]

    def restore(keep):
        # ``keep`` holds every object this displaces, so that none of them is freed (and no
        # ``__del__`` or weakref callback of the notebook's runs) while the restore is under way.
        user_ns = shell.user_ns
        keep.append((list(sys.meta_path), list(sys.path_hooks)))
        sys.meta_path[:] = meta_path
        sys.path_hooks[:] = path_hooks
        for m, d in snap_dicts.values():
            keep.append(sys_modules.get(m.__name__))
            sys_modules[m.__name__] = m
            cur = vars(m)
            keep.append(dict(cur))
            for k in [k for k in cur if type(k) is not str]:
                del cur[k]
            for k, v in d.items():
                if cur.get(k, d) is not v:
                    cur[k] = v
        for c, d in class_dicts:
            cur = vars(c)
            keep.append(dict(cur))
            for k in [k for k in cur if k not in d]:
                type_del(c, k)
            for k, v in d.items():
                if cur.get(k, d) is not v:
                    type_set(c, k, v)
        for f, code, defaults, kwdefaults in codes:
            keep.append((f.__code__, f.__defaults__, f.__kwdefaults__))
            if f.__code__ is not code:
                f.__code__ = code
            f.__defaults__ = defaults
            f.__kwdefaults__ = kwdefaults
        keep.append((sys_modules.get("course.checks"), dict(user_ns)))
        fresh = load_checks()
        fresh._GRADING_KEY, fresh._STUDENT_ID = grading
        course.checks = fresh
        for name in dir(fresh):
            if name.startswith("check") or name in ("CheckFailed", "require_tensor"):
                user_ns[name] = getattr(fresh, name)
        for name, target in aliases.items():
            if name in user_ns and user_ns[name] is not sys_modules[target]:
                user_ns[name] = sys_modules[target]
        for name in sensitive:
            if name in user_ns and user_ns[name] is not getattr(builtins, name):
                del user_ns[name]
        if "__builtins__" in user_ns and user_ns["__builtins__"] is not builtins:
            user_ns["__builtins__"] = builtins
        warnings.filters = warn_filters
        warn_filters[:] = warn_filters_now
        getattr(warnings, "_filters_mutated", lambda: None)()
        for name, value in sys_hooks.items():
            keep.append(getattr(sys, name, None))
            setattr(sys, name, value)
        torch_globals(keep)
        return fresh

    def torch_globals(keep):
        # Interceptors that torch calls on its own during a test: function and dispatch modes,
        # global module hooks; and the defaults a test's references are computed with.
        for _ in range(64):
            if not fn_modes():
                break
            keep.append(pop_fn_mode())
        for _ in range(64):
            if not dispatch_modes():
                break
            keep.append(pop_dispatch_mode(None))
        for name, hooks in module_hooks.items():
            keep.append((vars(module_mod).get(name), dict(hooks)))
            setattr(module_mod, name, hooks)
            hooks.clear()
        set_default_dtype(default_dtype)
        set_grad(True)

    def pristine():
        # What the restore should have left: a name per difference (empty when all is well).
        bad = [
            m.__name__
            for m, d in snap_dicts.values()
            if sys_modules.get(m.__name__) is not m
            or any(
                vars(m).get(k, d) is not v for k, v in d.items() if m is not course or k != "checks"
            )
        ]
        bad += [
            c.__name__
            for c, d in class_dicts
            if any(vars(c).get(k, d) is not v for k, v in d.items())
        ]
        bad += [f.__qualname__ for f, code, _, _ in codes if f.__code__ is not code]
        bad += [n for n, v in sys_hooks.items() if getattr(sys, n, None) is not v]
        if gettrace() is not None or getprofile() is not None:
            bad.append("trace/profile hooks")
        return bad

    def quiesce_signals(handlers):
        try:
            sigmask(_signal.SIG_SETMASK, ())
        except (TypeError, OSError, ValueError):
            pass
        for timer in itimers:
            try:
                setitimer(timer, 0)
            except (OSError, ValueError):
                pass
        try:
            set_wakeup_fd(-1)
        except (ValueError, OSError):
            pass
        for sig in catchable:
            try:
                set_signal(sig, handlers.get(sig, SIG_DFL))
            except (OSError, ValueError, RuntimeError, TypeError):
                pass

    def clear_hooks():
        settrace(None)
        setprofile(None)
        threading._trace_hook = threading._profile_hook = None
        monitoring = getattr(sys, "monitoring", None)
        if monitoring is not None:  # Python 3.12+
            for tool in range(6):
                try:
                    monitoring.set_events(tool, 0)
                    monitoring.free_tool_id(tool)
                except (ValueError, RuntimeError):
                    pass

    def collect_garbage(keep):
        # Finalizers and weakref callbacks of the notebook's garbage run now, before the
        # restore, never during the test; then the collector stays off until the test ends.
        keep.append(list(gc_callbacks))
        gc_callbacks.clear()
        for _ in range(20):
            if not collect():
                break
        gc_disable()
        keep.append(list(gc_garbage))
        gc_callbacks.clear()

    def foreign_threads():
        frames = current_frames()
        mine = get_ident()
        return sorted(
            t
            for t in set(frames) | {t.ident for t in enumerate_threads()}
            if t not in start_threads and t != mine and t is not None
        )

    def os_threads():
        try:
            return len(listdir("/proc/self/task"))
        except OSError:
            return 1

    def compile_test(text, label):
        # Graded test cells are plain Python (no magics): compiled here, not by IPython.
        line_cache[label] = (len(text), None, text.splitlines(True), label)
        tree = compile(text, label, "exec", ONLY_AST, dont_inherit=True)
        last = None
        if tree.body and isinstance(tree.body[-1], Expr):
            last = Expression(tree.body.pop().value)
        return compile(tree, label, "exec"), (compile(last, label, "eval") if last else None)

    def run_code(code, last, user_ns, observers):
        # The test's own globals: a copy of the notebook's namespace. Whatever the test binds
        # (its helpers, references, inputs) stays in the copy; the notebook's functions keep
        # theirs (their ``__globals__`` is ``user_ns``), so no name a student chose is taken.
        test_ns = dict(user_ns)

        def driver(exercise, seed):
            observer = new_observer(exercise, seed, torch)
            observers.append(observer)
            return observer

        test_ns["__grader_driver__"] = driver
        exec(code, test_ns)
        return eval(last, test_ns) if last is not None else None

    def publish_observations(texts):
        # After the test's own outputs: the judge (grader/judge.py) takes them out again.
        for text in texts or ():
            if type(text) is str:
                publish_display_data({observations_mime: text}, {})

    def prepare(keep, handlers):
        # Everything a test cell relies on, put back; None when that worked, else why not.
        collect_garbage(keep)
        clear_hooks()
        quiesce_signals(handlers)
        fresh = restore(keep)
        for _ in range(3):
            bad = pristine()
            if not bad:
                return fresh, None
            fresh = restore(keep)
        return fresh, "still changed after the restore: " + ", ".join(bad[:5])

    class Refused(Exception):
        pass

    class RestoreFailed(Exception):
        pass

    Refused.__name__ = Refused.__qualname__ = "GraderRefused"
    RestoreFailed.__name__ = RestoreFailed.__qualname__ = "GraderRestoreFailed"

    def plain(data):
        # What marshal can carry of a display's mime bundle (text values only).
        return {str(k): v for k, v in dict(data or {}).items() if type(v) is str}

    def child_main(write_fd, source, label, nonce):
        record = {"nonce": nonce, "outcome": "fail", "stdout": "", "stderr": "", "displays": []}
        keep = []
        begun = monotonic()
        try:
            if prctl is not None:
                prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0: no ptrace, no /proc/PID/mem
            fresh, problem = prepare(keep, signal_reset)
            if problem:
                record.update(outcome="restore-failed", why=problem)
                raise RestoreFailed(problem)
            if os_threads() > 1:
                why = "the notebook's objects started a thread while being collected"
                record.update(outcome="refused", why=why)
                raise Refused(why)
            record["prepare_s"] = monotonic() - begun
            set_num_threads(1)  # OpenMP's pool does not survive fork()
            out, err, displays = StringIO(), StringIO(), record["displays"]
            sys.stdout, sys.stderr = out, err
            shell.display_pub.publish = lambda data, metadata=None, *a, **k: displays.append(
                [plain(data), {}]
            )
            before = set(sys_modules)
            observers = []
            try:
                code, last = compile_test(source, label)
                value = run_code(code, last, shell.user_ns, observers)
                if value is not None:
                    record["result"] = str(repr(value))
                record["observations"] = [str(o.bundle()) for o in observers]
                record["outcome"] = "pass"
            except BaseException as exc:
                tb = exc.__traceback__
                while tb is not None and tb.tb_frame.f_code.co_filename != label:
                    tb = tb.tb_next
                record.update(ename=str(type(exc).__name__), evalue=str(exc))
                record["traceback"] = [str(t) for t in format_exception(type(exc), exc, tb)]
            finally:
                record["stdout"], record["stderr"] = str(out.getvalue()), str(err.getvalue())
                record["imported"] = [str(n) for n in sys_modules if n not in before][:5000]
        except BaseException as exc:
            record.setdefault("why", f"{type(exc).__name__}: {exc}")
        try:
            data = to_bytes(record)
        except ValueError:
            record.update(displays=[], result=None)
            data = to_bytes(record)
        try:
            while data:
                data = data[write(write_fd, data[:65536]) :]
        finally:
            exit_now(0 if record["outcome"] == "pass" else 1)

    def in_child(source, label, nonce):
        read_fd, write_fd = pipe()
        pid = fork()
        if pid == 0:
            try:
                close(read_fd)
                child_main(write_fd, source, label, nonce)
            finally:
                exit_now(1)
        close(write_fd)
        chunks = []
        status = -1
        try:
            while True:
                chunk = read(read_fd, 65536)
                if not chunk:
                    break
                chunks.append(chunk)
            _, status = waitpid(pid, 0)
        except BaseException:
            try:
                kill(pid, _signal.SIGKILL)
                waitpid(pid, 0)
            except OSError:
                pass
            raise
        finally:
            close(read_fd)
        try:
            record = from_bytes(b"".join(chunks))
        except (ValueError, EOFError, TypeError):
            record = None
        if type(record) is not dict or record.get("nonce") != nonce:
            why = "the test's process ended without a verdict"
            if status != -1 and wifsignaled(status):
                why += f" (killed by signal {wtermsig(status)})"
            record = {
                "outcome": "fail",
                "ename": "TestProcessDied",
                "evalue": why,
                "traceback": [f"TestProcessDied: {why}"],
            }
        elif record.get("outcome") == "pass" and status != 0:
            record.update(
                outcome="fail",
                ename="TestProcessDied",
                evalue=f"the test's process exited with status {status}",
                traceback=["TestProcessDied: the test's process did not exit cleanly"],
            )
        if record.get("stdout"):
            sys.stdout.write(record["stdout"])
            sys.stdout.flush()
        if record.get("stderr"):
            sys.stderr.write(record["stderr"])
            sys.stderr.flush()
        for data, metadata in record.get("displays", []):
            publish_display_data(data, metadata)
        if record.get("outcome") == "pass":
            publish_observations(record.get("observations"))
        # What the test imported on first use, imported here too: later children inherit it
        # instead of paying for it again (a kernel running its tests itself pays once).
        for name in record.get("imported") or ():
            if type(name) is str and name not in sys_modules:
                try:
                    import_module(name)
                except Exception:
                    pass
        return record

    def in_kernel(source, label, nonce):
        # Used where fork() cannot be (CUDA initialised): the same steps in the kernel itself,
        # and a test that never runs while a thread the notebook started is alive.
        keep = []
        deadline = monotonic() + 2
        while foreign_threads() and monotonic() < deadline:
            sleep(0.05)
        if foreign_threads():
            return {
                "outcome": "refused",
                "why": f"{len(foreign_threads())} thread(s) started by the notebook still "
                "running (with CUDA in use the test cannot run apart from them)",
            }
        fresh, problem = prepare(keep, kernel_handlers)
        if problem:
            return {"outcome": "restore-failed", "why": problem}
        observers = []
        try:
            code, last = compile_test(source, label)
            value = run_code(code, last, shell.user_ns, observers)
            texts = [str(o.bundle()) for o in observers]
        finally:
            gc_enable()
        publish_observations(texts)
        return {"outcome": "pass", "value": value}

    verdicts = {}

    class Shown:
        def __init__(self, text):
            self.text = text

        def __repr__(self):
            return self.text

    def run_test(source, index, nonce):
        label = f"<test cell {index}>"
        verdicts[nonce] = "fail"
        if cuda_initialized() or not use_fork:
            record = in_kernel(source, label, nonce)
        else:
            record = in_child(source, label, nonce)
        outcome = record.get("outcome", "fail")
        verdicts[nonce] = outcome if type(outcome) is str else "fail"
        if outcome == "refused":
            raise Refused(record.get("why", ""))
        if outcome == "restore-failed":
            raise RestoreFailed(record.get("why", ""))
        if outcome != "pass":
            lines = [str(t) for t in record.get("traceback") or []]
            name = str(record.get("ename") or "TestFailed")
            if not name.isidentifier():
                name = "TestFailed"
            raise type(name, (Exception,), {"_render_traceback_": lambda self: lines})(
                str(record.get("evalue", ""))
            )
        if "value" in record:
            return record["value"]
        return Shown(record["result"]) if record.get("result") is not None else None

    def verdict(nonce):
        return verdicts.get(nonce, "none")  # kept: asked again where a reply was lost

    gc.freeze()  # what exists now is the kernel's: later collections look at the notebook's only
    setattr(sys, "_grader_" + token, types.SimpleNamespace(test=run_test, verdict=verdict))
