"""Observations as the grader reads them: the records a driver made, decoded without running code.

A test cell's driver (its observer: :mod:`grader.lessons.observer`) sends its observations as
one display output of type :data:`MIME`; :func:`decode` loads each record with
``torch.load(weights_only=True)`` (tensors and plain containers only: nothing the student's code
made can run here) and a judge (:mod:`grader.judge`) reads them in the driver's order.
"""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass, field
from typing import Any

from grader.harness import MIME as MIME  # the display output carrying a test's observations


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
