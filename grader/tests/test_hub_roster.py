"""The hub reads its roster with intake's CSV reader: one way to parse a roster."""

from __future__ import annotations

import pytest

from grader.hub import read_hub_roster


def test_the_hub_roster_is_read_like_intakes(tmp_path):
    path = tmp_path / "roster.csv"
    # Excel's byte-order mark, padded titles and values, a blank row, a hub_user column.
    path.write_bytes("\ufeff student_id , hub_user \n ann , ann-h \n\n bob ,\n".encode("utf-8"))
    assert read_hub_roster(path) == [
        {"student_id": "ann", "hub_user": "ann-h"},
        {"student_id": "bob", "hub_user": ""},
    ]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("name\nann\n", "needs a student_id column"),
        ("student_id\nann\nann\n", "appears twice"),
        ("student_id\n../x\n", "is not allowed"),
    ],
)
def test_a_roster_the_hub_cannot_use_is_refused_with_why(tmp_path, text, why):
    path = tmp_path / "roster.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=why):
        read_hub_roster(path)
