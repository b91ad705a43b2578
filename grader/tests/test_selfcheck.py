"""Self-check: per exercise passed / FAILED with the check's message / not attempted; hidden
tests are never run or shown."""

from __future__ import annotations

import nbformat

from course.selfcheck import check_notebook, report
from grader.tests.conftest import FIXTURES
from grader.tests.corpus import H_CHEAT

SOURCE = FIXTURES / "solutions" / "90-fixture" / "90-fixture.ipynb"


def _cell(nb, grade_id):
    return next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def test_self_check_reports_each_exercise(tmp_path):
    nb = nbformat.read(SOURCE, as_version=4)
    _cell(nb, "double").source = "def double(x):\n    return x * 3"  # fails a visible test
    _cell(nb, "halve").source = H_CHEAT  # right on visible tests, wrong on hidden ones
    _cell(
        nb, "triple"
    ).source = "def triple(n):\n    # YOUR CODE HERE\n    raise NotImplementedError()"
    nb.cells.append(
        nbformat.v4.new_code_cell("from course.selfcheck import check_my_work\ncheck_my_work()")
    )
    path = tmp_path / "90-fixture.ipynb"
    nbformat.write(nb, path)
    results = {r.exercise: r for r in check_notebook(path)}
    assert results["double"].status == "failed"
    assert results["double"].message.startswith("CheckFailed: double(torch.arange(4.0))")
    assert results["halve"].status == "passed"  # hidden tests are not run by the self-check
    assert results["triple"].status == "not attempted"

    out = report(list(results.values()))
    assert "FAILED  double (1 points)" in out and "passed  halve" in out
    assert "not attempted  triple" in out
    assert "1 of 3 exercises pass" in out
    for secret in ("assert_close", "_seed", "HIDDEN"):
        assert secret not in out


def test_check_command_on_a_missing_notebook(tmp_path, capsys):
    from grader.cli import main as grader_main

    assert grader_main(["check", str(tmp_path / "nope.ipynb")]) == 2
    assert "no such notebook" in capsys.readouterr().err


def test_a_reply_a_poll_missed_is_found_within_a_slice():
    """A channel whose poll misses the wake-up (as pyzmq's can: the message is only seen when
    the poll times out): polled in slices, a reply that arrived after 0.2 s is returned within
    about a second, not at the caller's 30 s timeout; with nothing to read, Empty still comes
    at the timeout."""
    import asyncio
    import time
    from concurrent.futures import ThreadPoolExecutor
    from queue import Empty

    import pytest

    from course.selfcheck import poll_in_slices

    class MissesWakeUps:
        def __init__(self, arrives_after: float | None) -> None:
            self.arrives = None if arrives_after is None else time.monotonic() + arrives_after

        async def get_msg(self, timeout=None):
            await asyncio.sleep(timeout)  # deaf until the timeout, then the events are read
            if self.arrives is not None and time.monotonic() >= self.arrives:
                return {"msg_type": "execute_reply"}
            raise Empty

    def run(coroutine):  # a loop of its own, in a thread: the test's thread may have one running
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, coroutine).result()

    async def timed(channel, timeout):
        start = time.monotonic()
        try:
            return await channel.get_msg(timeout=timeout), time.monotonic() - start
        except Empty:
            return None, time.monotonic() - start

    late = MissesWakeUps(arrives_after=0.2)
    poll_in_slices(late, every=0.5)
    reply, took = run(timed(late, 30.0))
    assert reply == {"msg_type": "execute_reply"} and took < 2.0, took
    silent = MissesWakeUps(arrives_after=None)
    poll_in_slices(silent, every=0.5)
    reply, took = run(timed(silent, 1.2))
    assert reply is None and 1.1 < took < 2.0, took
    unsliced = MissesWakeUps(arrives_after=0.2)
    with pytest.raises(asyncio.TimeoutError):  # what the slices prevent: the wait to the end
        run(asyncio.wait_for(unsliced.get_msg(timeout=30.0), 2.0))


def test_every_way_of_starting_the_kernel_polls_both_channels_in_slices():
    """nbclient's ``setup_kernel`` (how the suite's seam keeps a lesson's kernel) and its
    ``execute`` (how the check runs) both get channels that poll in slices: the seam once
    waited out a cell's whole 900 s limit after lesson 05's widget cell because its sync path
    kept nbclient's own kernel client."""
    import nbformat

    from course.selfcheck import notebook_client

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('ok')")]
    client = notebook_client(nb, kernel_name="python3", timeout=60)
    with client.setup_kernel():
        for channel in (client.kc.shell_channel, client.kc.iopub_channel):
            assert getattr(channel.get_msg, "polls_every", None) == 1.0, channel
        client.execute_cell(nb.cells[0], 0)
    assert nb.cells[0].outputs[0]["text"] == "ok\n"
    seen = []

    class Recording(type(client)):
        async def async_start_new_kernel_client(self):
            kc = await super().async_start_new_kernel_client()
            seen.append(
                [
                    getattr(c.get_msg, "polls_every", None)
                    for c in (kc.shell_channel, kc.iopub_channel)
                ]
            )
            return kc

    Recording(nb, kernel_name="python3", timeout=60).execute()
    assert seen == [[1.0, 1.0]]


def test_the_check_and_the_seam_complete_a_cell_whose_reply_is_lost(tmp_path, monkeypatch):
    """The kernel goes idle for a test cell and its execute_reply never comes (see
    ``LOSE_REPLY``): the check and the suite's seam complete the cell from what IOPub showed
    (here: passed) in seconds, as the grader does, instead of waiting out the cell's limit."""
    import time

    import course.selfcheck
    from grader.seam import LessonKernel
    from grader.tests.conftest import LOSE_REPLY

    monkeypatch.setattr(course.selfcheck, "REPLY_GRACE", 1.0)  # 5 s, twice, in use

    lose = LOSE_REPLY.replace(
        "MATCH(parent)", "'double(3)' in parent['content'].get('code', '')"
    ).replace("HELD_UNTIL_NUDGED", "False")
    nb = nbformat.v4.new_notebook()
    answer = nbformat.v4.new_code_cell("def double(x):\n    return 2 * x")
    answer.metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": "double"}
    test = nbformat.v4.new_code_cell("assert double(3) == 6")
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "grade_id": "double_tests",
        "points": 1,
    }
    nb.cells = [nbformat.v4.new_code_cell(lose), answer, test, nbformat.v4.new_code_cell("6 * 7")]
    path = tmp_path / "90-lost.ipynb"
    nbformat.write(nb, path)
    started = time.monotonic()
    results = check_notebook(path, timeout=120)
    assert [(r.exercise, r.status) for r in results] == [("double", "passed")]
    with LessonKernel(path, timeout=120) as kernel:
        assert kernel.scores()["double_tests"] == (1.0, 1.0, True)
        assert kernel.executed.cells[-1].outputs[0]["data"]["text/plain"] == "42"
    took = time.monotonic() - started
    assert took < 60, f"{took:.0f} s: a lost reply was waited for (the limit is 120 s)"
