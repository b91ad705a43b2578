"""The observer a hidden test's driver records the student's results with, in the kernel.

Each value is copied at once into plain data serialised with ``torch.save`` (what the judge's
``torch.load(weights_only=True)`` builds back); the observations leave the kernel as one display
output of type ``grader.observations.MIME``, decoded by :mod:`grader.observations` and judged
outside the kernel by :mod:`grader.judge`.

The grader's harness (:mod:`grader.harness`) makes one per driver. It names no global but
builtins and takes torch as an argument; the sandbox mounts it read-only beside the drivers
(:func:`grader.lessons.kernel_files`). Nothing in the kernel is trusted: a forged or emptied
observation fails the judge.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from types import ModuleType


def new_observer(
    exercise: str, seed: int, torch: ModuleType, limit: int = 16 * 1024 * 1024
) -> object:
    """The observer of ``exercise`` at ``seed``: ``call``, ``raises``, ``record`` and ``done``,
    then ``bundle()``, the JSON the harness publishes. ``torch`` is the kernel's torch module,
    passed in; the observations stop at ``limit`` bytes."""
    import base64
    import io
    import json

    Tensor, dtype_type, device_type = torch.Tensor, torch.dtype, torch.device
    save, detach = torch.save, torch.Tensor.detach
    # torch.save's legacy format cannot carry float8 storages: they travel as their bytes.
    view, uint8 = torch.Tensor.view, torch.uint8
    as_bytes = tuple(
        getattr(torch, n)
        for n in (
            "float8_e4m3fn",
            "float8_e5m2",
            "float8_e4m3fnuz",
            "float8_e5m2fnuz",
            "float8_e8m0fnu",
        )
        if hasattr(torch, n)
    )
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
            entry = {
                "kind": "tensor",
                "tensor": copy,
                "device": str(value.device),
                "requires_grad": bool(value.requires_grad),
            }
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
            return {
                "kind": "dict",
                "items": [[plain(k, depth + 1), plain(v, depth + 1)] for k, v in dict.items(value)],
            }
        if dict in type.mro(t):  # an OrderedDict (a state_dict): its items, read as a dict's
            return {
                "kind": "dict",
                "type": str(t.__qualname__),
                "items": [[plain(k, depth + 1), plain(v, depth + 1)] for k, v in dict.items(value)],
            }
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
                self._add(
                    label,
                    {
                        "kind": "raised",
                        "type": str(t.__qualname__),
                        "mro": mro(t),
                        "message": str(BaseException.__str__(exc))[:2000],
                    },
                )
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
            return json.dumps(
                {
                    "exercise": str(exercise),
                    "seed": int(seed),
                    "done": bool(self.finished),
                    "records": self.records,
                }
            )

    return Observer()
