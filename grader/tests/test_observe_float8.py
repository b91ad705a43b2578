"""Float8 tensors cross from a driver to its judge with their dtype and bytes (lesson 08).

torch.save's legacy format, which the observer uses, cannot carry a float8 storage; the observer
sends such a tensor as its bytes and the judge's side views them back as the dtype they had.
"""

from __future__ import annotations

import pytest
import torch

from grader.observations import ObservationError, decode
from grader.observe import new_observer

FLOAT8 = [torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e8m0fnu]


@pytest.mark.parametrize("dtype", FLOAT8, ids=str)
def test_a_float8_tensor_arrives_bit_for_bit_with_its_dtype(dtype):
    raw = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    value = raw.clone().view(dtype).reshape(16, 16)
    observer = new_observer("x", 1)
    observer.record("grid", value)
    observer.record("0-d", value[3, 4])
    observer.record("transposed", (value.t(), torch.ones(2)))
    value.view(torch.uint8).zero_()  # changed after it was recorded
    observer.done()
    obs = decode(observer.bundle())
    grid = obs.next("grid")
    assert type(grid) is torch.Tensor and grid.dtype == dtype and grid.shape == (16, 16)
    assert torch.equal(grid.view(torch.uint8).flatten(), raw)
    point = obs.next("0-d")
    assert point.dtype == dtype and point.shape == () and int(point.view(torch.uint8)) == 52
    transposed, ones = obs.next("transposed")
    assert torch.equal(transposed.view(torch.uint8), raw.reshape(16, 16).t())
    assert torch.equal(ones, torch.ones(2))
    obs.finish()


def test_bytes_of_an_unknown_or_wider_dtype_are_refused():
    import base64
    import io
    import json

    for name, payload in (
        ("int32", torch.zeros(2, dtype=torch.uint8)),
        ("float8_e4m3fn", torch.zeros(2, dtype=torch.int16)),
        ("no_such_dtype", torch.zeros(2, dtype=torch.uint8)),
    ):
        entry = {
            "kind": "tensor",
            "tensor": payload,
            "device": "cpu",
            "requires_grad": False,
            "bytes_of": name,
        }
        buffer = io.BytesIO()
        torch.save(entry, buffer, _use_new_zipfile_serialization=False)
        record = base64.b64encode(buffer.getvalue()).decode("ascii")
        text = json.dumps({"exercise": "x", "seed": 1, "done": True, "records": [["t", record]]})
        with pytest.raises(ObservationError):
            decode(text)
