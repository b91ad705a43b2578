"""A graded test cell runs with globals of its own: the names it binds never replace the notebook's.

Checked on a three-cell notebook whose student helper is named like the test's own helper, in the
sandbox (a fork of the kernel, and the kernel itself as where CUDA forbids a fork) and in the
suite's seam. Every lesson's test cells are checked against student globals named like theirs in
``tests/test_lessons.py`` (one lesson execution each).
"""

from __future__ import annotations

import json

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader import sandbox
from grader.sandbox import Limits, Settings
from grader.seam import LessonKernel, bound_names
from grader.tests.conftest import need_bwrap

SOLUTION = "def _helper(x):\n    return x * 2\n\n\ndef double(x):\n    return _helper(x)\n"
#: The test binds ``_helper`` and ``result`` (as hidden tests bind their references and inputs).
TEST = (
    "import torch\nfrom course.checks import check\n"
    "def _helper(x):\n    return x * 3\n"
    "result = double(torch.ones(2))\n"
    "check(torch.equal(result, torch.full((2,), 2.0)), f'double gave {result}')\n"
    "print('test ran')\n"
)
AFTER = "print('after', _helper(1), 'result' in globals())"


def _notebook():
    nb = new_notebook()
    nb.cells = [new_code_cell(SOLUTION), new_code_cell(TEST), new_code_cell(AFTER)]
    nb.cells[0].metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": "double"}
    nb.cells[1].metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "grade_id": "double_tests",
        "points": 1,
    }
    return nb


def _text(cell: dict) -> str:
    return "".join(o.get("text", "") for o in cell["outputs"] if o.get("output_type") == "stream")


def test_bound_names_covers_every_binding_at_the_top_level():
    source = (
        "import a.b as c\nfrom x import y\nfor i, (j, k) in z: pass\nwith f() as g: q = 1\n"
        "def h(): inner = 1\nclass K: attr = 1\ntry: pass\nexcept E as e: pass\n"
        "[w for w in ()]\n(n := 3)\ndel gone\n"
    )
    assert bound_names(source) == sorted("K c e g gone h i j k n q y".split())


@pytest.mark.parametrize("fork", [True, False])
def test_in_the_sandbox_the_students_helper_keeps_its_name(fork):
    """Before, the test's ``_helper`` replaced the student's: ``double`` then tripled (the test
    failed) and the later cell printed 3."""
    need_bwrap()
    limits = Limits(cell_timeout=60, notebook_timeout=180)
    nb = json.loads(json.dumps(_notebook()))
    answer = sandbox.execute(nb, [1], Settings(limits=limits, fork=fork))
    test, after = answer["cells"][1], answer["cells"][2]
    assert test["status"] == "ok", test
    assert "test ran" in _text(test)
    assert _text(after).strip() == "after 2 False", after


def test_in_the_seam_the_students_helper_keeps_its_name(tmp_path):
    import nbformat

    path = tmp_path / "90-names.ipynb"
    nbformat.write(_notebook(), path)
    with LessonKernel(path, timeout=120) as kernel:
        assert kernel.scores()["double_tests"] == (1.0, 1.0, True)
        assert _text(kernel.executed.cells[2]).strip() == "after 2 False"
        run = kernel.run_exercise("double", SOLUTION)
        assert run.passed, run.error
        assert kernel.run_code("print(_helper(1), 'result' in globals())").strip() == "2 False"
