"""Intake of LMS zips and nbgrader's exchange: mapping, reports, nothing lost or overwritten."""

from __future__ import annotations

import csv
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from grader.autograde import find_submissions, shard_of, valid_student_id
from grader.cli import main
from grader.intake import (
    identities_path,
    intake_exchange,
    intake_zip,
    parse_lms_name,
    sheet_copy_path,
)

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
        # Moodle >= 4.1, "download as folders": no underscore after the plugin's name
        ("Bob Smith_202_assignsubmission_file/nb.ipynb", ("202", 0, "nb.ipynb")),
        ("x/Bob Smith_202_assignsubmission_file/sub/nb.ipynb", ("202", 0, "nb.ipynb")),
        ("Bob Smith_202_assignsubmission_onlinetext/nb.ipynb", None),
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


def test_moodle_41_folders_are_taken_in(tmp_path):
    root = tmp_path / "course"
    z = _zip(
        tmp_path / "m.zip",
        {
            "Bob Smith_202_assignsubmission_file/90-fixture.ipynb": NB,
            "Ann Lee_203_assignsubmission_file/notes.txt": b"x",
        },
    )
    report = intake_zip(root, LESSON, z)
    assert report.placed == [("202", "Bob Smith_202_assignsubmission_file/90-fixture.ipynb")]
    assert (root / "submitted/202/90-fixture/90-fixture.ipynb").read_bytes() == NB
    seen = json.loads(identities_path(root, LESSON).read_text())
    assert seen["202"]["lms"] == "moodle" and seen["202"]["name"] == "Bob Smith"
    assert seen["202"]["prefix"] == "Bob Smith_202_"
    assert "not a notebook" in dict(report.unmapped)["Ann Lee_203_assignsubmission_file/notes.txt"]


WORKSHEET = [
    "Identifier",
    "Full name",
    "Email address",
    "Status",
    "Grade",
    "Maximum Grade",
    "Grade can be changed",
    "Last modified (submission)",
    "Last modified (grade)",
    "Feedback comments",
]


def _worksheet(path: Path, rows: list[tuple[str, str, str]], header=WORKSHEET) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for ident, name, when in rows:
            w.writerow([ident, name, "x@uni.example", "", "", "100.00", "Yes", when, "-", ""])
    return path


def test_moodle_submission_times_come_from_its_worksheet(tmp_path):
    """Moodle's zip has no time: the worksheet's, read in the LMS's zone, goes to nbgrader."""
    root = tmp_path / "course"
    z = _zip(
        tmp_path / "m.zip",
        {
            "Bob Smith_202_assignsubmission_file/90-fixture.ipynb": NB,
            "Ann Lee_203_assignsubmission_file_90-fixture.ipynb": NB + b" ",
        },
    )
    sheet = _worksheet(
        tmp_path / "w.csv",
        [
            ("Participant 202", "Bob Smith", "Friday, 20 November 2026, 9:30 AM"),
            ("Participant 203", "Ann Lee", "Saturday, 21 November 2026, 11:05 PM"),
        ],
    )
    report = intake_zip(root, LESSON, z, sheet=sheet, timezone="Europe/Berlin")
    stamps = {
        s: (root / f"submitted/{s}/{LESSON}/timestamp.txt").read_text() for s in ("202", "203")
    }
    assert stamps == {
        "202": "2026-11-20 08:30:00.000000 UTC",
        "203": "2026-11-21 22:05:00.000000 UTC",
    }
    from nbgrader.utils import parse_utc

    assert parse_utc(stamps["202"]).isoformat() == "2026-11-20T08:30:00"  # nbgrader: naive UTC
    assert "Moodle worksheet" in report.times["202"]
    assert sheet_copy_path(root, LESSON, "moodle").is_file()
    # Without the worksheet the report warns that the time is not Moodle's.
    other = intake_zip(tmp_path / "c2", LESSON, z)
    assert any("no submission time" in w for w in other.warnings)


def test_a_non_english_worksheet_is_refused_clearly(tmp_path):
    german = [
        "Bezeichner",
        "Vollständiger Name",
        "E-Mail-Adresse",
        "Status",
        "Bewertung",
        "Bestwertung",
        "Bewertung kann geändert werden",
        "Zuletzt geändert (Abgabe)",
        "Zuletzt geändert (Bewertung)",
        "Feedback als Kommentar",
    ]
    sheet = _worksheet(tmp_path / "w.csv", [("Teilnehmer/in 202", "B", "-")], header=german)
    z = _zip(tmp_path / "m.zip", {"Bob Smith_202_assignsubmission_file/90-fixture.ipynb": NB})
    with pytest.raises(ValueError, match="English"):
        intake_zip(tmp_path / "c", LESSON, z, sheet=sheet)
    code = main(
        [
            "intake",
            LESSON,
            "--lms-zip",
            str(z),
            "--roster",
            str(sheet),
            "--root",
            str(tmp_path / "c"),
        ]
    )
    assert code == 2


def test_canvas_late_mark_is_kept(tmp_path):
    root = tmp_path / "course"
    z = _zip(
        tmp_path / "c.zip",
        {
            "doejane_LATE_12345_67891_90-fixture.ipynb": NB,
            "roebob_12346_67892_90-fixture.ipynb": NB,
        },
    )
    intake_zip(root, LESSON, z)
    seen = json.loads(identities_path(root, LESSON).read_text())
    assert (seen["12345"]["late"], seen["12346"]["late"]) == ("yes", "no")
    assert seen["12345"]["prefix"] == "doejane_LATE_12345_67891_"


def test_exchange_keeps_nbgraders_files_verbatim(tmp_path):
    """release_feedback needs submission_secret.txt; the timestamp stays nbgrader's own text."""
    root = tmp_path / "course"
    stamp = "2026-11-02 10:00:00.123456 UTC"
    folder = tmp_path / "exchange" / "mixed-precision" / "inbound" / f"alice+{LESSON}+{stamp}+ab12"
    folder.mkdir(parents=True)
    (folder / f"{LESSON}.ipynb").write_bytes(NB)
    (folder / "timestamp.txt").write_text(stamp)
    (folder / "submission_secret.txt").write_text("s3cr3t-value")
    report = intake_exchange(root, LESSON, tmp_path / "exchange")
    dest = root / "submitted" / "alice" / LESSON
    assert (dest / "timestamp.txt").read_text() == stamp
    assert (dest / "submission_secret.txt").read_text() == "s3cr3t-value"
    assert report.placed
    seen = json.loads(identities_path(root, LESSON).read_text())
    assert seen["alice"]["lms"] == "exchange"


def test_exchange_resubmission_of_the_same_notebook_keeps_its_new_secret(tmp_path):
    """Each nbgrader submit writes a new secret; the one beside the notebook is the latest's,
    as is its timestamp, even when the notebook did not change."""
    root = tmp_path / "course"
    inbound = tmp_path / "exchange" / "mixed-precision" / "inbound"
    for stamp, secret in (
        ("2026-11-02 10:00:00.1 UTC", "first"),
        ("2026-11-03 10:00:00.1 UTC", "second"),
    ):
        folder = inbound / f"alice+{LESSON}+{stamp}+ab12"
        folder.mkdir(parents=True)
        (folder / f"{LESSON}.ipynb").write_bytes(NB)
        (folder / "timestamp.txt").write_text(stamp)
        (folder / "submission_secret.txt").write_text(secret)
        report = intake_exchange(root, LESSON, tmp_path / "exchange")
    dest = root / "submitted" / "alice" / LESSON
    assert report.unchanged and (dest / "submission_secret.txt").read_text() == "second"
    assert (dest / "timestamp.txt").read_text() == "2026-11-03 10:00:00.1 UTC"


def test_roster_submitted_at_not_iso_names_the_student(tmp_path):
    root = tmp_path / "course"
    z = tmp_path / "c.zip"
    with zipfile.ZipFile(z, "w") as zf:
        zf.writestr(f"doejane_12345_67890_{LESSON}.ipynb", NB)
    roster = tmp_path / "r.csv"
    roster.write_text("student_id,lms_id,submitted_at\njane,12345,20/11/2026 23:59\n")
    with pytest.raises(ValueError, match="jane: submitted_at '20/11/2026 23:59'"):
        intake_zip(root, LESSON, z, roster)
    roster.write_text("student_id,lms_id,submitted_at\njane,12345,2026-11-20 23:59 UTC\n")
    report = intake_zip(root, LESSON, z, roster, timezone="Europe/Berlin")
    assert report.times["jane"].startswith("2026-11-20 23:59:00")


def test_exchange_root_is_nbgraders_one_setting(tmp_path, capsys):
    from nbgrader.exchange.default.exchange import Exchange

    from grader import REPO_ROOT
    from grader.courseconfig import exchange_root

    assert exchange_root(REPO_ROOT) == Path(Exchange.root.default_value)
    root = tmp_path / "course"
    (root / "grader").mkdir(parents=True)
    (root / "nbgrader_config.py").write_text(
        'c = get_config()\nload_subconfig("grader/nbgrader_config.py")\n'
    )
    (root / "grader" / "nbgrader_config.py").write_text(
        f'c = get_config()\nc.Exchange.root = "{tmp_path / "hub-exchange"}"\n'
    )
    report = intake_exchange(root, LESSON)
    assert str(tmp_path / "hub-exchange") in dict(report.unmapped).popitem()[0]
    from grader.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    assert "/usr/local/share/nbgrader/exchange" in sub["intake"].format_help()
    assert "/srv/nbgrader" not in sub["intake"].format_help()
    assert "postgresql+psycopg2://" in sub["autograde"].format_help()


def test_intake_takes_one_roster_and_one_lms_download(tmp_path, capsys):
    roster = tmp_path / "r.csv"
    roster.write_text("student_id,lms_id\nalice,111\n")
    z = _zip(tmp_path / "d.zip", {"alice_111_1_90-fixture.ipynb": NB})
    args = ["intake", LESSON, "--lms-zip", str(z), "--root", str(tmp_path / "c")]
    assert main([*args, "--roster", str(roster), "--roster", str(roster)]) == 2
    assert "a second roster" in capsys.readouterr().err
    assert not (tmp_path / "c" / "submitted").exists()
