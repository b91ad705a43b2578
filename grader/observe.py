"""The driver side of a hidden test: the observer a test cell records the student's results with.

A hidden test's driver (a lesson's ``inputs.py``, or the hidden part of a test cell in
``solutions/``) builds its inputs from ``course.checks.hidden_seed``, calls the student's functions
through ``obs = __grader_driver__(exercise, seed)`` (``obs.call``, ``obs.raises``,
``obs.record``, ``obs.done``) and so records what they did.
:data:`OBSERVER` (sent to the kernel by the harness) copies each value at once into plain data
serialised with ``torch.save``; the observations leave the kernel as one display output of type
:data:`MIME`, which :mod:`grader.observations` decodes and :mod:`grader.judge` judges outside the
kernel. Where no harness provides ``__grader_driver__`` (an instructor's own run of a solution
notebook), the driver falls back to :data:`local_driver`, which judges in that kernel.
"""

from __future__ import annotations

from typing import Any

from grader.observations import MIME

__all__ = ["MIME", "OBSERVER", "local_driver", "new_observer"]

#: Runs in the kernel (the harness execs it in a namespace of its own): defines
#: ``new_observer(exercise, seed, torch_module)``. It imports nothing itself.
OBSERVER = r'''
def new_observer(exercise, seed, torch, limit=16 * 1024 * 1024):
    import base64, io, json

    Tensor, dtype_type, device_type = torch.Tensor, torch.dtype, torch.device
    save, detach = torch.save, torch.Tensor.detach
    # torch.save's legacy format cannot carry float8 storages: they travel as their bytes.
    view, uint8 = torch.Tensor.view, torch.uint8
    as_bytes = tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
                                                  "float8_e5m2fnuz", "float8_e8m0fnu")
                     if hasattr(torch, n))
    scalars = (bool, int, float, complex, str, bytes, type(None))

    def mro(t):
        return [str(c.__qualname__) for c in type.mro(t)][:20]

    def plain(value, depth=0):
        # Plain data only: what the judge's torch.load(weights_only=True) can build back.
        t = type(value)
        if depth > 20:
            return {"kind": "foreign", "type": "too deeply nested"}
        if t is Tensor:
            copy = detach(value).cpu().clone()
            entry = {"kind": "tensor", "tensor": copy, "device": str(value.device),
                     "requires_grad": bool(value.requires_grad)}
            if copy.dtype in as_bytes:
                entry["tensor"] = view(copy, uint8)
                entry["bytes_of"] = str(copy.dtype).removeprefix("torch.")
            return entry
        if t in scalars:
            return {"kind": "value", "value": value}
        if t is dtype_type:
            return {"kind": "dtype", "name": str(value).removeprefix("torch.")}
        if t is device_type:
            return {"kind": "device", "name": str(value)}
        # A subclass of a builtin: its builtin value, read without calling the subclass's
        # methods, and its type's name (the judge sees a value of another type than the builtin).
        for base, to_plain in ((int, int.__repr__), (float, float.__repr__), (str, str.__str__)):
            if base in type.mro(t):
                text = to_plain(value)
                real = int(text) if base is int else float(text) if base is float else str(text)
                return {"kind": "value", "value": real, "type": str(t.__qualname__)}
        if tuple in type.mro(t) or list in type.mro(t):
            kind = "tuple" if tuple in type.mro(t) else "list"
            items = tuple.__iter__(value) if kind == "tuple" else list.__iter__(value)
            entry = {"kind": kind, "items": [plain(v, depth + 1) for v in items]}
            if t is not tuple and t is not list:
                entry["type"] = str(t.__qualname__)
            return entry
        if t is dict:
            return {"kind": "dict",
                    "items": [[plain(k, depth + 1), plain(v, depth + 1)]
                              for k, v in dict.items(value)]}
        if dict in type.mro(t):  # an OrderedDict (a state_dict): its items, read as a dict's
            return {"kind": "dict", "type": str(t.__qualname__),
                    "items": [[plain(k, depth + 1), plain(v, depth + 1)]
                              for k, v in dict.items(value)]}
        return {"kind": "foreign", "type": str(t.__qualname__), "mro": mro(t)}

    class Observer:
        def __init__(self):
            self.records, self.size, self.finished = [], 0, False

        def _add(self, label, entry):
            buffer = io.BytesIO()
            save(entry, buffer, _use_new_zipfile_serialization=False)  # a fifth of the size
            data = base64.b64encode(buffer.getvalue()).decode("ascii")
            self.size += len(data)
            if self.size > limit:
                raise RuntimeError(f"the observations of {exercise} exceed {limit} bytes")
            self.records.append([str(label), data])

        def call(self, label, fn, *args, **kwargs):
            """Call ``fn`` and record what it returned (its exceptions propagate)."""
            result = fn(*args, **kwargs)
            self._add(label, plain(result))
            return result

        def raises(self, label, fn, *args, **kwargs):
            """Call ``fn`` and record the exception it raised, or what it returned."""
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:
                t = type(exc)
                self._add(label, {"kind": "raised", "type": str(t.__qualname__), "mro": mro(t),
                                  "message": str(BaseException.__str__(exc))[:2000]})
                return None
            self._add(label, plain(result))
            return result

        def record(self, label, value):
            """Record ``value`` as it is now."""
            self._add(label, plain(value))
            return value

        def done(self):
            """The driver ran to its end."""
            self.finished = True

        def bundle(self):
            return json.dumps({"exercise": str(exercise), "seed": int(seed),
                               "done": bool(self.finished), "records": self.records})

    return Observer()
'''


def new_observer(exercise: str, seed: int) -> Any:
    """An observer like the one the harness hands to a test cell (for in-process use)."""
    import torch

    namespace: dict[str, Any] = {}
    exec(compile(OBSERVER, "<grader observer>", "exec"), namespace)  # noqa: S102
    return namespace["new_observer"](exercise, seed, torch)


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
