"""nbgrader from multiprocessing's fork server (grader.autograde.run_nbgrader): each run is a fresh
child that sees its own folder, environment and modules, and a run past its time is killed alone."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from grader.autograde import run_nbgrader
from grader.nbtools import tool_env

# nbgrader (any command but --version) loads ./nbgrader_config.py: it reports what the child
# saw, and imports a module of the course folder as nbgrader's config imports the course's
# ``grader`` package.
CONFIG = """
import json, os, sys
import localmod
with open(os.environ["MARK"], "w") as fh:
    json.dump({"cwd": os.getcwd(), "pid": os.getpid(), "value": localmod.VALUE,
               "grader_loaded": "grader" in sys.modules, "sleep": os.environ.get("SLEEP")}, fh)
if os.environ.get("SLEEP"):
    import time
    time.sleep(float(os.environ["SLEEP"]))
"""


def course(tmp_path, value: str):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "nbgrader_config.py").write_text(CONFIG)
    (tmp_path / "localmod.py").write_text(f"VALUE = {value!r}\n")
    return tmp_path


def test_each_run_is_a_fresh_process_in_its_own_folder(tmp_path):
    seen = []
    for name in ("one", "two"):
        folder = course(tmp_path / name, name)
        mark = tmp_path / f"{name}.json"
        proc = run_nbgrader(["autograde", "nope"], folder, tool_env({"MARK": str(mark)}), 60)
        assert proc.returncode == 1, proc.stdout  # no such assignment, after the config loaded
        seen.append(json.loads(mark.read_text()))
    assert [s["value"] for s in seen] == ["one", "two"]  # each folder's own module, not cached
    assert [s["cwd"] for s in seen] == [str(tmp_path / "one"), str(tmp_path / "two")]
    assert seen[0]["pid"] != seen[1]["pid"]
    assert not seen[0]["grader_loaded"]  # the course folder's grader is the one imported


def test_exit_status_and_output_come_back(tmp_path):
    folder = course(tmp_path / "c", "x")
    proc = run_nbgrader(["autograde", "nope"], folder, tool_env({"MARK": str(tmp_path / "m")}), 60)
    assert proc.returncode == 1
    assert f"{folder}/submitted/*/nope" in proc.stdout


def test_a_run_past_its_time_is_killed_and_the_next_runs(tmp_path):
    folder = course(tmp_path / "slow", "s")
    env = tool_env({"MARK": str(tmp_path / "slow.json"), "SLEEP": "60"})
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_nbgrader(["autograde", "nope"], folder, env, 3)
    assert time.monotonic() - start < 20
    again = run_nbgrader(["--version"], folder, tool_env({"MARK": str(tmp_path / "m")}), 60)
    assert again.returncode == 0
