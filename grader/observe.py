"""Hidden tests split in two: a *driver* beside the student's code, a *judge* in the grader.

A converted hidden test holds nothing secret in the notebook. Its hidden part is a driver: it
builds the inputs from the exercise's seed, calls the student's functions and records what it
observes through an observer the harness hands to the test cell as ``__grader_driver__``::

    _seed = course.checks.hidden_seed("fp16_fate")
    _driver = (globals().get("__grader_driver__")
               or __import__("grader.observe").observe.local_driver)  # one line in the notebook
    _obs = _driver("fp16_fate", _seed)
    _gen = torch.Generator().manual_seed(_seed)
    _x = torch.randn(100, generator=_gen)
    _obs.call("fate", fp16_fate, _x)        # records the result (or lets the error through)
    _obs.raises("empty", max_safe_scale, [])  # records whether and what it raised
    _obs.record("after", _x)                # any value: an input after the call, a state
    _obs.done()

Every value is copied when it is recorded (:data:`OBSERVER` turns it into plain data: tensors,
Python numbers, strings, tuples, lists, dicts, dtypes, with the type each had, and serialises it
with ``torch.save`` at once), so nothing the student's code does later changes it. The
observations leave the kernel as one display output of type :data:`MIME` (JSON, each record
base64 of a ``torch.save``); the grader's process takes it out of the cell's outputs and loads
each record with ``torch.load(weights_only=True)``, which builds tensors and plain containers only
(no object of the student's, no code run), then calls the exercise's judge
(:mod:`grader.judge`), which rebuilds the inputs from the seed, runs the reference and compares.

The observer's code (:data:`OBSERVER`) is sent to the kernel as source by the harness
(``grader/guard.py`` in the sandbox, ``grader/seam.py`` in the test suite), which puts
``__grader_driver__`` in the test cell's own globals. Where no harness does (an instructor running
a solution notebook in Jupyter or with plain nbclient), the driver's second line falls back to
:data:`local_driver`, which judges in that same kernel when ``done()`` is called. The fallback is
never reached in the sandbox (the harness's driver is always there, and ``grader/`` is not mounted)
nor in a student's kit (released notebooks hold no hidden tests, and the kit has no ``grader/``).
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from typing import Any

#: The mime type of the display output that carries one test cell's observations.
MIME = "application/x-grader-observations"

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


class ObservationError(AssertionError):
    """The observations are not what the judge expects (missing, out of order, malformed)."""


@dataclass(frozen=True)
class Raised:
    """What a driver's ``raises`` saw the student's code raise."""

    type: str
    classes: tuple[str, ...]  # the exception's class and its bases, by name
    message: str

    def is_a(self, name: str) -> bool:
        """Whether the exception was of class ``name`` or a subclass of it."""
        return name in self.classes


@dataclass(frozen=True)
class Foreign:
    """A value that is not plain data (an object of the student's, a tensor subclass)."""

    type: str


@dataclass
class Observations:
    """One test cell's observations, decoded in the grader's process (see :func:`decode`)."""

    exercise: str
    seed: int
    done: bool
    records: list[tuple[str, Any]]
    types: dict[int, str] = field(default_factory=dict)
    position: int = 0

    def next(self, label: str) -> Any:
        """The next record's value; it must carry ``label`` (the driver's order)."""
        if self.position >= len(self.records):
            raise ObservationError(f"the observations of {self.exercise} end before {label!r}")
        got, value = self.records[self.position]
        if got != label:
            raise ObservationError(
                f"the observations of {self.exercise} have {got!r} where {label!r} was expected"
            )
        self.position += 1
        return value

    def type_of(self) -> str | None:
        """The type name of the value :meth:`next` returned last, where it was not plain."""
        return self.types.get(self.position - 1)

    def finish(self) -> None:
        """Every record was read and the driver ran to its end."""
        if not self.done:
            raise ObservationError(f"the driver of {self.exercise} did not run to its end")
        if self.position != len(self.records):
            raise ObservationError(f"the observations of {self.exercise} have records left over")


class ObservedInt(int):
    """An ``int`` the student's code returned as an instance of a subclass (``observed_type``)."""

    observed_type = ""


class ObservedFloat(float):
    """A ``float`` the student's code returned as an instance of a subclass."""

    observed_type = ""


class ObservedStr(str):
    """A ``str`` the student's code returned as an instance of a subclass."""

    observed_type = ""


class ObservedTuple(tuple):
    """A ``tuple`` the student's code returned as an instance of a subclass (a named tuple)."""

    observed_type = ""


class ObservedList(list):
    """A ``list`` the student's code returned as an instance of a subclass."""

    observed_type = ""


class ObservedDict(dict):
    """A ``dict`` the student's code returned as an instance of a subclass (an ``OrderedDict``,
    as ``state_dict()`` returns)."""

    observed_type = ""


_SUBCLASSED = {
    int: ObservedInt,
    float: ObservedFloat,
    str: ObservedStr,
    tuple: ObservedTuple,
    list: ObservedList,
    dict: ObservedDict,
}


def _subclassed(value: Any, type_name: Any) -> Any:
    """``value`` as an instance of the judge's own subclass of its builtin type, so that type
    checks see what they saw in the kernel (``isinstance`` passes, ``type(v) is float`` fails);
    every method is the builtin's."""
    if type_name is None:
        return value
    wrapper = _SUBCLASSED.get(type(value))
    if wrapper is None:
        return value
    made = wrapper(value)
    made.observed_type = str(type_name)
    return made


def _decoded(entry: Any) -> tuple[Any, str | None]:
    import torch

    if type(entry) is not dict:
        raise ObservationError("a record is not plain data")
    kind = entry.get("kind")
    if kind == "tensor":
        tensor = entry.get("tensor")
        if type(tensor) is not torch.Tensor:
            raise ObservationError("a tensor record holds no tensor")
        if "bytes_of" in entry:  # a float8 tensor, carried as its bytes
            dtype = getattr(torch, str(entry.get("bytes_of")), None)
            if type(dtype) is not torch.dtype or dtype.itemsize != 1 or tensor.dtype != torch.uint8:
                raise ObservationError("a tensor record holds bytes of an unknown dtype")
            tensor = tensor.view(dtype)
        tensor.requires_grad_(bool(entry.get("requires_grad")))
        return tensor, None
    if kind == "value":
        return _subclassed(entry.get("value"), entry.get("type")), entry.get("type")
    if kind == "dtype":
        dtype = getattr(torch, str(entry.get("name")), None)
        if type(dtype) is not torch.dtype:
            raise ObservationError("an unknown dtype")
        return dtype, None
    if kind == "device":
        return torch.device(str(entry.get("name"))), None
    if kind in ("tuple", "list"):
        items = [_decoded(v)[0] for v in entry.get("items") or []]
        value = tuple(items) if kind == "tuple" else items
        return _subclassed(value, entry.get("type")), entry.get("type")
    if kind == "dict":
        value = {_decoded(k)[0]: _decoded(v)[0] for k, v in entry.get("items") or []}
        return _subclassed(value, entry.get("type")), entry.get("type")
    if kind == "raised":
        mro = tuple(str(m) for m in entry.get("mro") or ())
        return Raised(str(entry.get("type")), mro, str(entry.get("message", ""))), None
    if kind == "foreign":
        return Foreign(str(entry.get("type"))), str(entry.get("type"))
    raise ObservationError(f"an unknown record kind {kind!r}")


def decode(text: str) -> Observations:
    """Observations from the JSON text a driver's observer produced (``bundle()``).

    Each record is loaded with ``torch.load(weights_only=True)``: tensors and plain containers
    only, so nothing the student's code made can run here.
    """
    import torch

    try:
        data = json.loads(text)
        records = []
        types = {}
        for index, (label, b64) in enumerate(data["records"]):
            raw = base64.b64decode(b64, validate=True)
            entry = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
            value, type_name = _decoded(entry)
            records.append((str(label), value))
            if type_name:
                types[index] = type_name
        return Observations(
            str(data["exercise"]), int(data["seed"]), data["done"] is True, records, types
        )
    except ObservationError:
        raise
    except Exception as exc:  # noqa: BLE001 - anything malformed fails the test, never more
        raise ObservationError(
            f"the observations could not be read ({type(exc).__name__})"
        ) from exc


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
