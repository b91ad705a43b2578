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
