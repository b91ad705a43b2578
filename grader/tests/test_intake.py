"""Intake of LMS zips and nbgrader's exchange: mapping, reports, nothing lost or overwritten."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from grader.autograde import find_submissions, shard_of, valid_student_id
from grader.cli import main
from grader.intake import intake_exchange, intake_zip, parse_lms_name

LESSON = "90-fixture"
NB = b'{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


def _zip(path: Path, entries: dict[str, bytes], dates: dict[str, tuple] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in entries.items():
            info = zipfile.ZipInfo(name, date_time=(dates or {}).get(name, (2026, 11, 1, 12, 0, 0)))
            zf.writestr(info, data)
    return path


@pytest.mark.parametrize(
    "name,expected",
    [
        ("doejane_12345_67890_90-fixture.ipynb", ("12345", 67890, "90-fixture.ipynb")),
        ("doejane_LATE_12345_67891_90-fixture-1.ipynb", ("12345", 67891, "90-fixture-1.ipynb")),
        ("Jane Doe_4242_assignsubmission_file_90-fixture.ipynb", ("4242", 0, "90-fixture.ipynb")),
        ("Jane Doe_4242_assignsubmission_file_/90-fixture.ipynb", ("4242", 0, "90-fixture.ipynb")),
        ("90-fixture.ipynb", None),
        ("notes.txt", None),
    ],
)
def test_lms_names(name, expected):
    assert parse_lms_name(name) == expected


def test_student_ids_with_path_characters_are_refused():
    for bad in ["../x", "a/b", ".hidden", "", "x..y", "a b", "..", "x\\y"]:
        assert not valid_student_id(bad), bad
    for good in ["s123", "jane.doe", "jane_doe-2", "j@uni"]:
        assert valid_student_id(good), good


def test_shards_split_a_class_stably():
    students = [f"s{i:03d}" for i in range(300)]
    shares = [shard_of(s, 3) for s in students]
    assert set(shares) == {1, 2, 3}
    assert all(60 < shares.count(k) < 140 for k in (1, 2, 3))
    assert shares == [shard_of(s, 3) for s in students]


def test_zip_with_roster_maps_reports_and_keeps_everything(tmp_path):
    root = tmp_path / "course"
    roster = tmp_path / "roster.csv"
    roster.write_text("student_id,lms_id,name\nalice,111,Alice\nbob,222,Bob\nevil,333,Eve\n")
    roster.write_text(roster.read_text() + "../x,444,Mallory\n")
    entries = {
        "alice_111_1000_90-fixture.ipynb": NB.replace(b"{}", b'{"a": 1}'),
        "bob_222_1001_90-fixture.ipynb": NB.replace(b"{}", b'{"b": 1}'),
        "bob_222_1005_90-fixture-1.ipynb": NB.replace(b"{}", b'{"b": 2}'),  # later upload wins
        "bob_222_1002_torch.py": b"print('fake torch')",
        "carol_999_1003_90-fixture.ipynb": NB,  # not in the roster
        "mallory_444_1004_90-fixture.ipynb": NB,  # maps to a path
        "README.txt": b"hello",
        "../../escape_555_1006_90-fixture.ipynb": NB,  # zip-slip name
    }
    z = _zip(tmp_path / "download.zip", entries)
    report = intake_zip(root, LESSON, z, roster)
    placed = dict(report.placed)
    assert set(placed) == {"alice", "bob"}
    assert placed["bob"] == "bob_222_1005_90-fixture-1.ipynb"
    assert ("bob", "bob_222_1001_90-fixture.ipynb") in report.superseded
    assert (root / "submitted/bob/90-fixture/90-fixture.ipynb").read_bytes() == entries[
        "bob_222_1005_90-fixture-1.ipynb"
    ]
    assert (root / "submitted/bob/90-fixture/timestamp.txt").is_file()
    assert not (root / "submitted/bob/90-fixture/torch.py").exists()
    reasons = {src: why for src, why in report.unmapped}
    assert "not in the roster" in reasons["carol_999_1003_90-fixture.ipynb"]
    assert "not allowed" in reasons["mallory_444_1004_90-fixture.ipynb"]
    assert "not a notebook" in reasons["bob_222_1002_torch.py"]
    assert "neither" in reasons["README.txt"]
    assert not (tmp_path / "escape_555_1006_90-fixture.ipynb").exists()
    assert not any(p.name.startswith("escape") for p in tmp_path.iterdir())
    # Everything received is in the archive, under safe names inside it.
    archived = list(report.archive.iterdir())
    assert len(archived) == len(entries) + 1  # and the zip itself
    assert all(p.resolve().is_relative_to(report.archive) for p in archived)
    text = "\n".join(report.lines())
    assert "UNMAPPED" in text and "carol" in text


def test_existing_submission_is_never_overwritten_unless_replaced(tmp_path):
    root = tmp_path / "course"
    first = _zip(tmp_path / "a.zip", {"alice_111_1_90-fixture.ipynb": NB})
    second = _zip(tmp_path / "b.zip", {"alice_111_2_90-fixture.ipynb": NB + b" "})
    intake_zip(root, LESSON, first)
    target = root / "submitted/111/90-fixture/90-fixture.ipynb"
    original = hashlib.sha256(target.read_bytes()).hexdigest()
    again = intake_zip(root, LESSON, first)
    assert again.unchanged and not again.placed
    report = intake_zip(root, LESSON, second)
    assert report.kept_existing and not report.placed
    assert hashlib.sha256(target.read_bytes()).hexdigest() == original
    report = intake_zip(root, LESSON, second, replace=True)
    assert report.placed
    assert target.read_bytes() == NB + b" "
    kept = list((root / "intake" / LESSON / "replaced").glob("111-*/90-fixture.ipynb"))
    assert len(kept) == 1 and hashlib.sha256(kept[0].read_bytes()).hexdigest() == original


def test_exchange_takes_each_students_latest(tmp_path):
    root = tmp_path / "course"
    inbound = tmp_path / "exchange" / "mixed-precision" / "inbound"
    for student, stamp, data in [
        ("alice", "2026-11-01 10:00:00.000000 UTC", NB),
        ("alice", "2026-11-02 10:00:00.000000 UTC", NB + b"\n"),
        ("bob", "2026-11-01 09:00:00.000000 UTC", NB),
        ("..", "2026-11-01 09:00:00.000000 UTC", NB),
    ]:
        folder = inbound / f"{student}+{LESSON}+{stamp}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{LESSON}.ipynb").write_bytes(data)
    report = intake_exchange(root, LESSON, tmp_path / "exchange")
    assert sorted(s for s, _ in report.placed) == ["alice", "bob"]
    assert (root / "submitted/alice/90-fixture/90-fixture.ipynb").read_bytes() == NB + b"\n"
    assert report.unmapped and report.superseded
    assert (inbound / f"alice+{LESSON}+2026-11-01 10:00:00.000000 UTC").is_dir()  # untouched


def test_submission_folders_with_bad_ids_become_report_rows(tmp_path):
    root = tmp_path
    (root / "submitted" / "a b" / LESSON).mkdir(parents=True)
    (root / "submitted" / "a b" / LESSON / f"{LESSON}.ipynb").write_bytes(NB)
    (root / "submitted" / "ok1" / LESSON).mkdir(parents=True)
    (root / "submitted" / "ok1" / LESSON / "renamed.ipynb").write_bytes(NB)
    found, bad = find_submissions(root, LESSON)
    assert not found
    assert {o.student for o in bad} == {"a b", "ok1"}
    assert all(o.status == "rejected" and o.reason for o in bad)


def test_intake_command_reports_unmapped_files(tmp_path, capsys):
    z = _zip(tmp_path / "d.zip", {"alice_111_1_90-fixture.ipynb": NB, "junk.bin": b"x"})
    code = main(["intake", LESSON, "--lms-zip", str(z), "--root", str(tmp_path / "c")])
    out = capsys.readouterr().out
    assert code == 1
    assert "placed      111" in out and "UNMAPPED    junk.bin" in out
