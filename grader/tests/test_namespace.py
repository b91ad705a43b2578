"""A graded test cell runs with globals of its own: the names it binds never replace the notebook's;
a converted hidden test's driver runs in the kernel and its judge in the grader's process.

Checked on a three-cell notebook whose student helper is named like the test's own helper, in the
sandbox and in the suite's seam. Every lesson's test cells are checked against student globals
named like theirs in ``tests/test_lessons.py`` (one lesson execution each).
"""

from __future__ import annotations

import json

import pytest
from nbformat.v4 import new_code_cell, new_notebook

from grader import REPO_ROOT, sandbox
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


def test_in_the_sandbox_the_students_helper_keeps_its_name():
    """Before, the test's ``_helper`` replaced the student's: ``double`` then tripled (the test
    failed) and the later cell printed 3."""
    need_bwrap()
    limits = Limits(cell_timeout=60, notebook_timeout=180)
    nb = json.loads(json.dumps(_notebook()))
    answer = sandbox.execute(nb, [1], Settings(limits=limits))
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


# -- Converted hidden tests: a driver in the kernel, a judge in the grader's process -------------

LESSON01 = REPO_ROOT / "solutions" / "01-number-formats" / "01-number-formats.ipynb"
SETUP = (
    "import math, torch, course, course.checks\n"
    "from course.checks import check, check_shape, check_tensor_equal\n"
)
RIGHT = (
    "def fp16_bits(x):\n    b = x.view(torch.int16).to(torch.int32) & 0xFFFF\n"
    "    return b >> 15, (b >> 10) & 0x1F, b & 0x3FF\n"
)
#: Right on the visible inputs only (their 8 values), so only the judge can fail it.
WRONG = (
    "def fp16_bits(x):\n    b = x.view(torch.int16).to(torch.int32) & 0xFFFF\n"
    "    return b >> 15, (b >> 10) & 0x1F, (b & 0x3FF) if x.numel() == 8 else b * 0\n"
)


def _lesson01_test_cell() -> str:
    import nbformat

    nb = nbformat.read(LESSON01, as_version=4)
    return next(
        c.source
        for c in nb.cells
        if c.metadata.get("nbgrader", {}).get("grade_id") == "fp16_bits_tests"
    )


def _driver_notebook():
    nb = new_notebook()
    test = _lesson01_test_cell()
    nb.cells = [new_code_cell(s) for s in (SETUP, RIGHT, test, WRONG, test)]
    for i in (2, 4):
        nb.cells[i].metadata["nbgrader"] = {
            "grade": True,
            "solution": False,
            "grade_id": "fp16_bits_tests",
            "points": 2,
        }
    return nb


def test_a_driver_in_the_sandbox_is_judged_in_the_graders_process():
    """The driver's observations come back from the sandbox; the judge here passes the right
    function and fails the one that is right on the visible inputs only, with its message."""
    import nbformat

    from grader.execute import apply_answer
    from grader.judge import apply_judges
    from grader.keys import seed_for
    from grader.observe import MIME

    need_bwrap()
    key = "k" * 64
    limits = Limits(cell_timeout=120, notebook_timeout=300)
    settings = Settings(
        limits=limits,
        kernel_env={"COURSE_GRADING_KEY": key, "COURSE_STUDENT_ID": "s"},
    )
    nb = _driver_notebook()
    answer = sandbox.execute(json.loads(json.dumps(nb)), [2, 4], settings)
    statuses = apply_answer(nb, answer)
    assert statuses[2] == statuses[4] == "ok", answer["events"]
    for i in (2, 4):
        assert sum(MIME in (o.get("data") or {}) for o in nb.cells[i].outputs) == 1
    verdicts = apply_judges(nb, "01-number-formats", lambda exercise: seed_for(key, "s", exercise))
    assert verdicts == {2: "ok", 4: "failed"}
    assert not any(MIME in (o.get("data") or {}) for c in nb.cells for o in c.get("outputs", []))
    error = nb.cells[4].outputs[-1]
    assert error["ename"] == "CheckFailed" and "mantissa" in error["evalue"], error
    nbformat.validate(nb)


def _bundle(exercise: str = "fp16_bits", seed: int = 7) -> str:
    import torch

    from grader.observe import new_observer

    observer = new_observer(exercise, seed)
    gen = torch.Generator().manual_seed(seed)
    for shape in [(4096,), (7, 13), (2, 3, 5), (0,), ()]:
        raw = torch.randint(-32768, 32768, shape, dtype=torch.int32, generator=gen)
        x = raw.to(torch.int16).view(torch.float16)
        b = x.view(torch.int16).to(torch.int32) & 0xFFFF
        observer.call("bits", lambda b=b: (b >> 15, (b >> 10) & 0x1F, b & 0x3FF))
        observer.record("input after", x)
    observer.done()
    return observer.bundle()


def test_the_judge_refuses_observations_it_cannot_trust(tmp_path):
    """Another seed, another exercise, a record out of order, an unfinished driver, a record
    whose pickle would run code: each fails the test (the code never runs)."""
    import base64
    import os
    import pickle

    from grader.judge import judge_bundle
    from grader.observations import ObservationError

    lesson = "01-number-formats"
    judge_bundle(lesson, "fp16_bits_tests", _bundle(), 7)  # the honest observations pass
    with pytest.raises(ObservationError, match="another seed"):
        judge_bundle(lesson, "fp16_bits_tests", _bundle(), 8)
    with pytest.raises(ObservationError, match="observations of"):
        judge_bundle(lesson, "fp16_fate_tests", _bundle(), None)
    data = json.loads(_bundle())
    data["records"] = data["records"][1:]
    with pytest.raises(ObservationError, match="where 'bits' was expected"):
        judge_bundle(lesson, "fp16_bits_tests", json.dumps(data), None)
    data = json.loads(_bundle())
    data["done"] = False
    with pytest.raises(ObservationError, match="did not run to its end"):
        judge_bundle(lesson, "fp16_bits_tests", json.dumps(data), None)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    data = json.loads(_bundle())
    data["records"][0][1] = base64.b64encode(pickle.dumps(Payload(), protocol=2)).decode()
    with pytest.raises(ObservationError, match="could not be read"):
        judge_bundle(lesson, "fp16_bits_tests", json.dumps(data), None)
    assert not marker.exists()


def test_observations_are_copied_when_recorded():
    import torch

    from grader.observations import Foreign, ObservedFloat, decode
    from grader.observe import new_observer

    class Sneaky(float):
        def __eq__(self, other):
            return True

    observer = new_observer("x", 1)
    value = torch.zeros(3)
    observer.record("tensor", value)
    value += 1  # changed after it was recorded
    observer.record("scalars", (Sneaky(0.25), 2, "s", None, torch.float16))
    observer.record("object", object())
    observer.done()
    obs = decode(observer.bundle())
    assert torch.equal(obs.next("tensor"), torch.zeros(3))
    sneaky, *rest = obs.next("scalars")
    assert type(sneaky) is ObservedFloat and sneaky == 0.25 and sneaky != 0.5
    assert rest == [2, "s", None, torch.float16]
    assert obs.next("object") == Foreign("object")
    obs.finish()


def test_the_judges_and_solutions_cannot_be_read_from_the_sandbox():
    from grader.judge import exposed
    from grader.lessons import LESSONS

    need_bwrap()
    assert exposed() is None
    probe = (
        "import importlib.util, os\n"
        f"paths = [{str(LESSONS['01-number-formats'].folder)!r}, "
        f"{str(REPO_ROOT / 'solutions')!r}, {str(LESSON01)!r}]\n"
        "judge = importlib.util.find_spec('grader.lessons.l01_number_formats.judge')\n"
        "print([os.path.exists(p) for p in paths], judge is None)\n"
    )
    nb = new_notebook()
    nb.cells = [new_code_cell(probe)]
    limits = Limits(cell_timeout=60, notebook_timeout=120)
    answer = sandbox.execute(json.loads(json.dumps(nb)), [], Settings(limits=limits))
    assert _text(answer["cells"][0]).strip() == "[False, False, False] True", answer


def test_what_a_test_prints_never_crowds_out_its_observations():
    """A cell that printed more than ``max_output`` still returns its observations (an honest
    function that prints a lot keeps its points); a second set is refused."""
    from grader.execute import apply_answer
    from grader.judge import apply_judges
    from grader.keys import seed_for
    from grader.observe import MIME

    need_bwrap()
    key = "k" * 64
    chatty = RIGHT.replace("def fp16_bits(x):\n", "def fp16_bits(x):\n    print('.' * 5000)\n")
    forged = "from IPython.display import publish_display_data\n" + (
        f"publish_display_data({{{MIME!r}: 'x' * 30000}}, {{}})\n"
    )
    nb = new_notebook()
    test = _lesson01_test_cell()
    nb.cells = [new_code_cell(s) for s in (SETUP, chatty, test, RIGHT, forged + test)]
    for i in (2, 4):
        nb.cells[i].metadata["nbgrader"] = {
            "grade": True,
            "solution": False,
            "grade_id": "fp16_bits_tests",
            "points": 2,
        }
    limits = Limits(cell_timeout=120, notebook_timeout=300, max_output=20000)
    settings = Settings(
        limits=limits, kernel_env={"COURSE_GRADING_KEY": key, "COURSE_STUDENT_ID": "s"}
    )
    answer = sandbox.execute(json.loads(json.dumps(nb)), [2, 4], settings)
    printed = "".join(o.get("text", "") for o in answer["cells"][2]["outputs"])
    assert "[grader: output cut here]" in printed  # the cell printed more than the cap
    apply_answer(nb, answer)
    verdicts = apply_judges(nb, "01-number-formats", lambda exercise: seed_for(key, "s", exercise))
    assert verdicts == {2: "ok", 4: "failed"}, [c.get("outputs", [])[-1:] for c in nb.cells]
