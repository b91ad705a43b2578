"""One class graded from two machines through one real PostgreSQL gradebook.

A throwaway PostgreSQL server (Debian's ``postgresql`` package: ``initdb`` and ``pg_ctl`` from
``/usr/lib/postgresql/N/bin``, run as the ``postgres`` user when the tests run as root, which they
refuse) listens on a free loopback port for this module only. Two course checkouts, each with the
same ``submitted/`` copy, stand for two machines: ``autograde --shard 1/2`` and ``--shard 2/2``
run at the same time against the one database. Shard 1 is interrupted (Ctrl-C, to its whole
process group) after its first student is merged and then run again. Every student must be
graded exactly once, and ``export`` over the shared gradebook must equal a single-machine run.
"""

from __future__ import annotations

import csv
import glob
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from grader import REPO_ROOT
from grader.autograde import shard_of
from grader.cli import main
from grader.hub import free_port
from grader.tests.conftest import make_course
from grader.tests.corpus import CASES, LESSON, write_case

SOURCE = REPO_ROOT / "grader" / "tests" / "fixtures" / "solutions" / LESSON / f"{LESSON}.ipynb"
#: The class: student -> corpus case. Shard 1 of 2 holds ada and cy; shard 2 holds bo and dee.
CLASS = {
    "ada": "honest-right",
    "cy": "honest-wrong-hidden",
    "bo": "honest-right",
    "dee": "broken-json",
}
#: Both "machines" are this host, so their kernels share the sandbox's per-slot uids with each
#: other and with any grader test running beside them (the corpus's fork bomb fills its slot's uid
#: up to its own --nproc of 128): a higher limit here leaves these kernels room to start.
LIMITS = [
    "--cell-timeout=60",
    "--notebook-timeout=300",
    "--memory-mb=4096",
    "--nproc=1024",
    "--workers=1",
]


def _unavailable(reason: str) -> None:
    """Skip, or fail under CI=true (where ``run.py test`` installs PostgreSQL)."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"PostgreSQL is required in CI: {reason}")
    pytest.skip(reason)


def _server_bin() -> Path | None:
    """The folder holding ``initdb`` and ``pg_ctl``: Debian's newest, else whatever is on PATH."""
    found = glob.glob("/usr/lib/postgresql/*/bin/pg_ctl")
    if found:
        newest = max(found, key=lambda p: int(Path(p).parts[-3]))
        return Path(newest).parent
    on_path = shutil.which("pg_ctl")
    return Path(on_path).parent if on_path and shutil.which("initdb") else None


def _as_owner(cmd: list[str]) -> list[str]:
    """``cmd`` run as ``postgres`` when we are root (initdb and pg_ctl refuse root)."""
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """A database URL on a PostgreSQL server started for this module, stopped at its end."""
    try:
        import psycopg2
    except ImportError:
        _unavailable("psycopg2 is not installed (pip install psycopg2-binary)")
    bindir = _server_bin()
    if bindir is None:
        _unavailable("PostgreSQL's server is not installed (apt-get install postgresql)")
    if os.geteuid() == 0:
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            _unavailable("running as root and there is no 'postgres' user to run the server")
        if not shutil.which("runuser"):
            _unavailable("running as root and runuser is missing")
    # In /tmp itself: pytest's own temporary folders are private to root.
    base = Path(tempfile.mkdtemp(prefix="grader-pg-"))
    data = base / "data"
    if os.geteuid() == 0:
        os.chown(base, owner.pw_uid, owner.pw_gid)

    def tool(*args: str) -> None:
        proc = subprocess.run(
            _as_owner([str(bindir / args[0]), *args[1:]]),
            cwd=base,  # a folder the server's user may enter
            capture_output=True,
            text=True,
            timeout=120,
        )
        if proc.returncode != 0:
            log = (base / "server.log").read_text() if (base / "server.log").exists() else ""
            pytest.fail(f"{args[0]} failed: {proc.stdout}{proc.stderr}{log}")

    port = free_port()
    started = False
    try:
        tool("initdb", "-D", str(data), "-U", "grader", "--auth=trust", "-E", "UTF8")
        options = f"-p {port} -c listen_addresses=127.0.0.1 -k {base} -c fsync=off"
        tool(
            "pg_ctl", "-D", str(data), "-l", str(base / "server.log"), "-o", options, "-w", "start"
        )
        started = True
        conn = psycopg2.connect(host="127.0.0.1", port=port, user="grader", dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE course")
        conn.close()
        # SQLAlchemy 2.1 reads a bare postgresql:// as psycopg 3; the course installs psycopg2.
        yield f"postgresql+psycopg2://grader@127.0.0.1:{port}/course"
    finally:
        if started:
            tool("pg_ctl", "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def _machine(path: Path) -> Path:
    """A course checkout with the class's submissions (the same copy on every machine)."""
    root = make_course(path)
    for student, case_name in CLASS.items():
        case = next(c for c in CASES if c.name == case_name)
        write_case(case, SOURCE, root / "submitted" / student / LESSON, {})
    return root


def _autograde(root: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, "-m", "grader", "autograde", LESSON, "--root", str(root), *LIMITS]
    from grader.sandbox import bwrap_problem

    if bwrap_problem():  # the class is the fixture's own notebooks: trusted code
        cmd.append("--unsandboxed")
    return cmd + list(extra)


def _result_files(root: Path) -> list[Path]:
    """A machine's result files (not the ``.tmp-*`` files they are written through)."""
    return sorted((root / ".grader" / LESSON / "results").glob("[!.]*.json"))


def _results(root: Path) -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in _result_files(root)}


def _stamps(root: Path) -> dict[str, int]:
    return {p.stem: p.stat().st_mtime_ns for p in _result_files(root)}


def _wait_for(predicate, timeout: float, what: str, procs: list[subprocess.Popen]) -> None:
    """Poll ``predicate`` until true; fail if it takes too long or a grader exits with an error."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        for p in procs:
            if p.poll() not in (None, 0):
                p.stdout_log.seek(0)
                pytest.fail(
                    f"a grader exited with {p.returncode} while waiting for {what}:\n"
                    + p.stdout_log.read()[-3000:]
                )
        time.sleep(0.2)


def test_two_shards_grade_one_class_once_through_postgres(postgres_url, tmp_path):
    shard1 = {s for s in CLASS if shard_of(s, 2) == 1}
    shard2 = set(CLASS) - shard1
    assert shard1 == {"ada", "cy"} and shard2 == {"bo", "dee"}, "shard_of changed"
    one, two = _machine(tmp_path / "machine-1"), _machine(tmp_path / "machine-2")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    logs = {name: open(tmp_path / f"{name}.log", "w+") for name in ("one", "two", "again")}

    def start(root: Path, shard: str, log) -> subprocess.Popen:
        cmd = _autograde(root, "--db-url", postgres_url, "--shard", shard)
        # A session of its own: Ctrl-C goes to the grader and its nbgrader child together.
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        proc.stdout_log = log
        return proc

    # Machine 1 starts a moment ahead: it adds the lesson to the gradebook, then builds its
    # scratch template (so the template folder means the lesson is in PostgreSQL).
    first = start(one, "1/2", logs["one"])
    template = one / ".grader" / LESSON / "template"
    _wait_for(template.exists, 120, "the lesson in PostgreSQL", [first])
    second = start(two, "2/2", logs["two"])
    try:
        # Ctrl-C on machine 1 once its first student is merged, while the next one is grading.
        _wait_for(
            lambda: any(r.get("merged") for r in _results(one).values()),
            240,
            "machine 1's first merged result",
            [first, second],
        )
        both_running = second.poll() is None
        os.killpg(first.pid, signal.SIGINT)
        assert first.wait(timeout=120) == 130, "an interrupted grader exits with 130"
        assert second.wait(timeout=300) == 0
    finally:
        for p in (first, second):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    for log in logs.values():
        log.seek(0)
    out_one, out_two = logs["one"].read(), logs["two"].read()
    assert "interrupted: finished submissions are saved" in out_one, out_one

    done = {s for s, r in _results(one).items() if r.get("merged")}
    assert done and done < shard1, f"the interrupt left machine 1 with {sorted(done)} done"
    assert set(_results(two)) == shard2, out_two
    before = {s: (stamp, _results(one)[s]) for s, stamp in _stamps(one).items() if s in done}

    # The same command again finishes machine 1's share and regrades nobody.
    again = subprocess.run(
        _autograde(one, "--db-url", postgres_url, "--shard", "1/2"),
        stdout=logs["again"],
        stderr=subprocess.STDOUT,
        env=env,
        timeout=300,
    )
    logs["again"].seek(0)
    out_again = logs["again"].read()
    assert again.returncode == 0, out_again
    left = len(shard1 - done)
    assert f"| {left}/{left} " in out_again, f"the re-run graded more than the {left} left"
    for student, (stamp, result) in before.items():
        assert _stamps(one)[student] == stamp, f"{student} was graded again"
        assert _results(one)[student] == result
    results = {**_results(one), **_results(two)}
    assert set(_results(one)) == shard1 and set(_results(one)).isdisjoint(_results(two))
    assert set(results) == set(CLASS) and all(r["merged"] for r in results.values())
    assert results["dee"]["status"] == "rejected"
    assert all(results[s]["status"] == "graded" for s in CLASS if s != "dee")
    for root, share in ((one, shard1), (two, shard2)):  # each machine keeps only its own notebooks
        assert {p.name for p in (root / "autograded").iterdir()} == share - {"dee"}

    from nbgrader.api import Gradebook

    with Gradebook(postgres_url) as gb:
        subs = gb.find_assignment(LESSON).submissions
        assert sorted(s.student.id for s in subs) == sorted(CLASS)
        assert gb.find_submission(LESSON, "ada").score == 3.0
        assert gb.find_submission(LESSON, "cy").score == 2.0

    # One machine, one SQLite gradebook, the whole class: the reference.
    single = _machine(tmp_path / "single")
    ref = subprocess.run(
        _autograde(single, "--workers=2", "--no-progress"),
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert ref.returncode == 0, ref.stdout + ref.stderr

    # Machine 2's results travel back to machine 1 (statuses and reasons live there), as the
    # README says; export then reads the shared gradebook.
    for path in _result_files(two):
        shutil.copy2(path, one / ".grader" / LESSON / "results" / path.name)
    shared_csv, single_csv = tmp_path / "shared.csv", tmp_path / "single.csv"
    assert (
        main(["export", "--root", str(one), "--db-url", postgres_url, "--out", str(shared_csv)])
        == 0
    )
    assert main(["export", "--root", str(single), "--out", str(single_csv)]) == 0
    shared_rows = list(csv.DictReader(shared_csv.open()))
    assert shared_csv.read_text() == single_csv.read_text(), (shared_rows, single_csv.read_text())
    assert [r["student_id"] for r in shared_rows] == sorted(CLASS)
    print(f"\nmachines ran concurrently: {both_running}; interrupted after {sorted(done)}")
    print(shared_csv.read_text())
