"""Assertions whose failure messages teach (lesson 01; every lesson's tests use them).

The graded test cells call these instead of bare ``assert`` so a failing student sees what was
expected, what they produced, and on which input. The torch functions they rely on are bound when
this module is imported (by each lesson's setup cell), so later patching of ``torch.equal`` or
``torch.allclose`` in a notebook does not change what these checks decide.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from collections.abc import Callable
from typing import Any

import torch

_Tensor = torch.Tensor
_equal = torch.equal
_isnan = torch.isnan
_where = torch.where
_abs = torch.abs
_isclose = torch.isclose
_isnan = torch.isnan
_builtin_isinstance = isinstance
_type = type


#: The grading key and student id, read once when a lesson's setup cell imports this module (before
#: any student code runs) and then removed from the environment, so a submission can neither read
#: the key nor choose its own hidden inputs.
_GRADING_KEY = os.environ.pop("COURSE_GRADING_KEY", None)
_STUDENT_ID = os.environ.pop("COURSE_STUDENT_ID", "")


def hidden_seed(exercise: str) -> int:
    """The seed of ``exercise``'s hidden tests: unpredictable to students, the same on a regrade.

    When the grader sets ``COURSE_GRADING_KEY`` (a secret kept with each release) and
    ``COURSE_STUDENT_ID``, the seed is an HMAC of the student and the exercise under that key, so
    the same submission graded twice sees the same inputs and two students see different ones.
    Without a key (a learner's own run, the test suite), it is fresh from ``os.urandom``.
    Every hidden test cell calls this and prints the seed, so a failure can be reproduced.
    """
    if _GRADING_KEY is None:
        return int.from_bytes(os.urandom(4), "little")
    message = f"{_STUDENT_ID}\0{exercise}".encode()
    digest = hmac.new(_GRADING_KEY.encode(), message, hashlib.sha256).digest()
    return int.from_bytes(digest[:4], "little")


class CheckFailed(AssertionError):
    """A graded check failed; the message says what was expected and why."""


def _short(value: Any, limit: int = 300) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check(condition: bool, message: str) -> None:
    """Fail with ``message`` unless ``condition`` is exactly ``True``."""
    if not (_type(condition) is bool and condition):
        raise CheckFailed(message)


def require_tensor(value: Any, what: str) -> _Tensor:
    """Fail unless ``value`` is a plain ``torch.Tensor`` (subclasses could fake comparisons)."""
    if _type(value) is not _Tensor:
        raise CheckFailed(
            f"{what} should be a torch.Tensor, got {_type(value).__name__}: {_short(value)}"
        )
    return value


def check_dtype(value: Any, dtype: torch.dtype, what: str) -> None:
    """Fail unless ``value`` is a tensor of ``dtype``."""
    tensor = require_tensor(value, what)
    if tensor.dtype != dtype:
        raise CheckFailed(f"{what} should have dtype {dtype}, got {tensor.dtype}")


def check_shape(value: Any, shape: tuple[int, ...] | torch.Size, what: str) -> None:
    """Fail unless ``value`` is a tensor of the given shape."""
    tensor = require_tensor(value, what)
    if tuple(tensor.shape) != tuple(shape):
        raise CheckFailed(f"{what} should have shape {tuple(shape)}, got {tuple(tensor.shape)}")


def check_tensor_equal(
    actual: Any, expected: _Tensor, what: str, inputs: Any = None, check_dtype_: bool = True
) -> None:
    """Fail unless ``actual`` equals ``expected`` element for element (NaN equals NaN).

    ``inputs`` (optional) is shown beside the first mismatching element, to say where it went
    wrong.
    """
    tensor = require_tensor(actual, what)
    if check_dtype_ and tensor.dtype != expected.dtype:
        raise CheckFailed(f"{what} should have dtype {expected.dtype}, got {tensor.dtype}")
    check_shape(tensor, expected.shape, what)
    a = tensor.detach().cpu()
    e = expected.detach().cpu()
    if a.dtype != e.dtype:
        a = a.to(e.dtype)
    same = a == e
    if e.is_floating_point():
        same = same | (_isnan(a) & _isnan(e))
    if bool(same.all()):
        return
    bad = (~same).nonzero()[0].tolist()
    idx = tuple(bad)
    where = f" at index {list(idx)}"
    if inputs is not None and _builtin_isinstance(inputs, _Tensor):
        where += f" (input {inputs.detach().cpu()[idx].item()!r})"
    count = int((~same).sum())
    raise CheckFailed(
        f"{what} is wrong in {count} of {same.numel()} elements; first{where}: "
        f"expected {e[idx].item()!r}, got {a[idx].item()!r}"
    )


def check_close(
    actual: Any,
    expected: _Tensor | float,
    what: str,
    rtol: float = 1e-5,
    atol: float = 1e-8,
) -> None:
    """Fail unless ``actual`` is within ``atol + rtol * |expected|`` of ``expected``."""
    if not _builtin_isinstance(expected, _Tensor):
        value = check_float(actual, what)
        exp = float(expected)
        if math.isnan(exp) and math.isnan(value):
            return
        if not abs(value - exp) <= atol + rtol * abs(exp):
            raise CheckFailed(
                f"{what} should be {exp!r} (within {atol:g} + {rtol:g}*|expected|), got {value!r}"
            )
        return
    tensor = require_tensor(actual, what)
    check_shape(tensor, expected.shape, what)
    a = tensor.detach().cpu().double()
    e = expected.detach().cpu().double()
    ok = _isclose(a, e, rtol=rtol, atol=atol, equal_nan=True)
    if bool(ok.all()):
        return
    err = _where(ok, torch.zeros_like(a), _abs(a - e))
    err = _where(_isnan(err), math.inf, err)  # a NaN where a number was expected is the worst
    idx = tuple((err == err.max()).nonzero()[0].tolist())
    raise CheckFailed(
        f"{what} differs from the reference in {int((~ok).sum())} of {ok.numel()} elements "
        f"(rtol={rtol:g}, atol={atol:g}); worst at index {list(idx)}: expected "
        f"{e[idx].item()!r}, got {a[idx].item()!r}"
    )


def check_float(value: Any, what: str) -> float:
    """Fail unless ``value`` is a real number (a Python, NumPy or 0-d tensor number)."""
    if _type(value) is bool:
        raise CheckFailed(f"{what} should be a number, got a bool: {value!r}")
    if _type(value) is _Tensor:
        if value.numel() != 1:
            raise CheckFailed(f"{what} should be a single number, got a tensor of {value.shape}")
        return float(value.item())
    try:
        result = float(value)
    except (TypeError, ValueError):
        raise CheckFailed(
            f"{what} should be a number, got {_type(value).__name__}: {_short(value)}"
        ) from None
    if _type(result) is not float:
        raise CheckFailed(f"{what} should convert to a float, got {_type(result).__name__}")
    return result


def check_equal(actual: Any, expected: Any, what: str) -> None:
    """Fail unless ``actual`` equals ``expected``, type for type, container for container.

    Lists, tuples and dicts are compared element by element with exact types, so an object
    whose ``__eq__`` always answers True cannot pass for the expected value.
    """
    if _type(actual) is not _type(expected):
        raise CheckFailed(
            f"{what} should be a {_type(expected).__name__} equal to {_short(expected)}, got "
            f"{_type(actual).__name__}: {_short(actual)}"
        )
    if _type(expected) is _Tensor:
        check_tensor_equal(actual, expected, what)
    elif _type(expected) in (list, tuple):
        if len(actual) != len(expected):
            raise CheckFailed(f"{what} should have {len(expected)} items, got {len(actual)}")
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            check_equal(a, e, f"{what}[{i}]")
    elif _type(expected) is dict:
        if sorted(map(repr, actual)) != sorted(map(repr, expected)):
            raise CheckFailed(
                f"{what} should have the keys {sorted(map(repr, expected))}, "
                f"got {sorted(map(repr, actual))}"
            )
        for key, e in expected.items():
            check_equal(actual[key], e, f"{what}[{key!r}]")
    elif not (expected == actual):
        raise CheckFailed(f"{what} should be {_short(expected)}, got {_short(actual)}")


def check_raises(
    exception: type[BaseException], fn: Callable[[], Any], what: str, hint: str = ""
) -> BaseException:
    """Fail unless calling ``fn()`` raises ``exception``; returns the exception raised."""
    try:
        result = fn()
    except exception as exc:
        return exc
    except Exception as exc:  # noqa: BLE001 - the message names what was raised instead
        raise CheckFailed(
            f"{what} should raise {exception.__name__}, but raised "
            f"{_type(exc).__name__}: {exc}. {hint}".strip()
        ) from exc
    raise CheckFailed(
        f"{what} should raise {exception.__name__}, but returned {_short(result)}. {hint}".strip()
    )
