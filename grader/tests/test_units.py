"""Small pieces: hidden-test stripping, the code scan, the student kit."""

from __future__ import annotations

import time
import zipfile

import nbformat
import pytest

from grader import REPO_ROOT
from grader.feedback import StripHiddenTests, strip_hidden
from grader.package import PackageError, build_kit
from grader.scan import scan_source

TEST_CELL = """check(f(1) == 2, "f(1)")
### BEGIN HIDDEN TESTS
def _ref(x):
    return 2 * x
check(f(5) == _ref(5), "f(5)")
### END HIDDEN TESTS
print("done")
"""


def test_hidden_tests_are_stripped_from_feedback():
    out = strip_hidden(TEST_CELL)
    assert "_ref" not in out and "HIDDEN TESTS" not in out
    assert out.startswith('check(f(1) == 2, "f(1)")') and out.rstrip().endswith('print("done")')
    cell = nbformat.v4.new_code_cell(TEST_CELL)
    cell.metadata["nbgrader"] = {"grade": True, "grade_id": "f_tests"}
    cell.outputs = [
        nbformat.v4.new_output(
            "error",
            ename="CheckFailed",
            evalue="f(5) is 9",
            traceback=["---", "check(f(5) == _ref(5))", "..."],
        )
    ]
    cell, _ = StripHiddenTests().preprocess_cell(cell, {}, 0)
    assert "_ref" not in cell.source
    assert cell.outputs[0]["traceback"] == ["CheckFailed: f(5) is 9"]


@pytest.mark.parametrize(
    "code,flag",
    [
        ("torch.allclose = lambda *a: True", "patches-torch"),
        ("import sys\nf = sys._getframe(1).f_globals['_ref']", "frame-inspection"),
        ("get_ipython().showtraceback = None", "kernel-internals"),
        ("course.checks.check = print", "patches-checks"),
        ("os._exit(0)", "exits-kernel"),
        ("open('/srv/course/gradebook.db')", "reads-grader-files"),
    ],
)
def test_scan_flags_tampering(code, flag):
    assert flag in scan_source(code)


def test_scan_is_quiet_on_ordinary_code():
    assert scan_source("def f(x):\n    return torch.where(x > 0, x, 0).sum()") == []


def test_student_kit_has_lessons_and_course_but_no_solutions(tmp_path):
    out = tmp_path / "kit.zip"
    names = build_kit(REPO_ROOT, out)
    assert "lessons/01-number-formats/01-number-formats.ipynb" in names
    assert "course/checks.py" in names and "course/selfcheck.py" in names
    with zipfile.ZipFile(out) as zf:
        listed = zf.namelist()
        assert all(n.startswith("mixed-precision-course/") for n in listed)
        assert not any("/solutions/" in n or "/grader/" in n or "/tests/" in n for n in listed)
        for n in listed:
            text = zf.read(n).decode("utf-8", errors="replace")
            assert "### BEGIN HIDDEN TESTS" not in text and "### BEGIN SOLUTION" not in text
        assert "torch==" in zf.read("mixed-precision-course/requirements.txt").decode()


def test_student_kit_refuses_to_leak(tmp_path):
    root = tmp_path / "repo"
    (root / "lessons" / "01-x").mkdir(parents=True)
    (root / "course").mkdir()
    (root / "lessons" / "01-x" / "01-x.ipynb").write_text("### BEGIN SOLUTION\n")
    (root / "pyproject.toml").write_text('[project]\ndependencies = ["torch"]\n')
    with pytest.raises(PackageError, match="01-x.ipynb"):
        build_kit(root, tmp_path / "kit.zip")
    assert not (tmp_path / "kit.zip").exists()


def test_benchmark_counts_every_sign_of_a_stall(tmp_path):
    import json

    from grader.benchmark import lost_replies, stalls

    timing = tmp_path / "timing.jsonl"
    runs = [{"cell_seconds": {"3": 1.0 + i / 10, "7": 2.0}} for i in range(5)]
    runs[2]["cell_seconds"]["7"] = 40.0  # 38 s past the median of cell 7
    timing.write_text("".join(json.dumps(r) + "\n" for r in runs))
    results = tmp_path / "results"
    results.mkdir()
    (results / "s001.json").write_text(
        json.dumps({"events": ["cell 9: still running after 60 s: execute_reply not received"]})
    )
    (results / "s002.json").write_text(json.dumps({"events": ["other"], "timeouts": ["cell 4"]}))
    (results / "s003.json").write_text(json.dumps({"events": [], "timeouts": []}))
    found = stalls(results, timing)
    assert found == [
        "cell 7: 40.0 s (median 2.0 s)",
        "s001: cell 9: still running after 60 s: execute_reply not received",
        "s002: ran out of time: cell 4",
    ]
    assert stalls(results / "none", None) == []
    (results / "s004.json").write_text(
        json.dumps({"events": ["cell 5: its execute_reply never came (...)", "cell 6: x"]})
    )
    assert lost_replies(results) == ["s004: cell 5: its execute_reply never came (...)"]


#: Long strings of Python the grader keeps on purpose: files it writes, never code for a kernel.
WRITTEN_FILES = {("package.py", "LAB_PY")}


def _grader_modules():
    """Each module of grader/ and its syntax tree, but the tests and the variants (students'
    answers, as written)."""
    import ast

    for path in sorted((REPO_ROOT / "grader").rglob("*.py")):
        if "tests" not in path.parts and path.name != "variants.py":
            yield path, ast.parse(path.read_text(encoding="utf-8"))


def test_no_code_over_20_lines_is_kept_as_a_string():
    """Code the grader runs in a kernel lives in modules (linted, type-checked, covered) and is
    compiled there from its file; what is sent as a string is a call of a few lines."""
    import ast

    found = []
    for path, tree in _grader_modules():
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        names = {
            id(node.value): target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Constant) or not isinstance(node.value, str):
                continue
            if id(node) in docstrings or node.value.count("\n") < 20:
                continue
            try:
                code = ast.parse(node.value)
            except SyntaxError:
                continue  # text, not Python
            if (path.name, names.get(id(node))) not in WRITTEN_FILES and code.body:
                found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not found, f"Python code kept as a string (make it a module): {found}"


def test_a_kill_spares_a_process_that_is_no_longer_the_one_listed():
    """The kernel's processes are listed before its shutdown and killed after: a PID the system
    gave to another process in between (its start time differs) is left alone."""
    import subprocess
    import sys

    from grader.kernel import _kill, _stat, descendants

    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time;subprocess.Popen(['sleep', '60']); time.sleep(60)",
        ]
    )
    try:
        for _ in range(100):
            tree = descendants(parent.pid)
            if tree:
                break
            time.sleep(0.05)
        ((child, started),) = tree.items()
        _kill({child: str(int(started) + 1)})  # as if the PID now named a later process
        time.sleep(0.2)
        assert _stat(child)[0] not in ("Z", "X"), "a process that was not listed was killed"
        _kill(tree)
        for _ in range(100):
            if _stat(child)[:1] in ([], ["Z"]):  # gone, or dead and not yet reaped
                break
            time.sleep(0.05)
        assert _stat(child)[:1] in ([], ["Z"])
    finally:
        _kill(descendants(parent.pid))  # the sleep too, should an assertion stop the test early
        parent.kill()
        parent.wait()


def test_no_function_of_the_grader_is_over_150_lines():
    """A function a maintainer reads in one sitting: split what grows past 150 lines."""
    import ast

    found = []
    for path, tree in _grader_modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 150:
                    found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno} {node.name} {lines}")
    assert not found, f"functions over 150 lines: {found}"
