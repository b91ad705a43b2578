"""The course's static site (``python3 run.py site``): no answer on it, and it works offline.

The unit tests here need nothing built. The site's own tests build it once, with ``--executed``
from the notebooks the suite already executed (``COURSE_SITE_EXECUTED``: a folder of
``NN-x/NN-x.executed.ipynb`` as the suite writes them with ``COURSE_TEST_ARTIFACTS``), and with
``--results`` from a made-up GPU run (an executed solution notebook whose setup line names a
GPU), so that no lesson is executed again. ``python3 run.py test`` runs them after the suite.
Then:

- the leak test reads every file the site serves (archives unpacked, HTML as text, JSON strings
  decoded) for any line of a solution region, written answer, hidden test, ``grader/`` module,
  judge or example answer that students do not get anyway (as a line or inside one), for the
  outputs the pages must leave out (the answers' cells, the exercises' test cells), for planted
  answers and observations in the GPU run's hidden cells, and for lesson 03's answer value;
- one headless Chromium opens the landing page and every lesson page from a loopback server: no
  console error, no request leaving loopback, a widget control rendered from stored state, the
  Colab and Kaggle links naming the lesson's notebook, the download being the release's file, and
  Sphinx's search finding lesson 05 by "accumulation", and pip installing the course's package
  from the served ``pkg/`` page.

The build's time and size and the browser test's time are printed.
"""

from __future__ import annotations

import contextlib
import copy
import html
import json
import os
import re
import subprocess
import sys
import textwrap
import time
import tomllib
import zipfile
from pathlib import Path

import nbformat
import pytest

from grader import REPO_ROOT
from grader.observe import MIME as OBSERVATIONS
from grader.package import write_course_index
from tests.conftest import serving_folder
from website import leaks, pages
from website.build import find_notebook, lesson_ids

LESSONS = lesson_ids(REPO_ROOT)
EXECUTED = os.environ.get("COURSE_SITE_EXECUTED")
HOW = (
    "the site's tests build it from the notebooks the suite executed: run `python3 run.py test` "
    "(it runs them after a full run that passed), or set COURSE_SITE_EXECUTED=DIR, DIR holding "
    "NN-x/NN-x.executed.ipynb as the suite writes them with COURSE_TEST_ARTIFACTS=DIR"
)
FAKE_GPU = "CUDA GPU FAKE-TEST-GPU (compute capability 9.0, 80 GiB), torch 2.11.0+cu128"
CANARY = "CANARY: an answer printed by a hidden cell of the GPU run"
RESULTS_LESSON = "03-autocast"
CONTROLS = ".widget-slider, .widget-dropdown, .widget-toggle-buttons, .widget-button, button"
#: A term of lesson 05 that search must find there.
SEARCH_TERM, SEARCH_LESSON = "accumulation", "05-accumulation"


def _nb(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def _forbidden() -> set[str]:
    return leaks.forbidden(REPO_ROOT)


# -- unit tests: no site needed ---------------------------------------------------------------


def _a_solution_line() -> str:
    """A real line of a solution region that students never get."""
    lines = set()
    for path in sorted((REPO_ROOT / "solutions").rglob("*.ipynb")):
        for cell in _nb(path)["cells"]:
            lines |= leaks.region_lines("".join(cell["source"]))
    secret = sorted(lines - leaks.allowed(REPO_ROOT), key=lambda s: (-len(s), s))
    assert secret, "no solution line found in solutions/"
    return secret[0]


def test_leak_finder_finds_a_solution_line_however_the_site_holds_it(tmp_path):
    """The leak test can fail: a solution line in a highlighted code block, in a widget's
    stored state and inside a served wheel is found in each, and a clean site passes."""
    forbidden = _forbidden()
    line = _a_solution_line()
    assert line in forbidden
    site = tmp_path / "site"
    site.mkdir()
    (site / "clean.html").write_text("<p>a page with nothing to hide in it at all</p>")
    assert leaks.find_leaks(site, forbidden) == {}
    words = "".join(f'<span class="n">{html.escape(w)}</span> ' for w in line.split())
    (site / "code.html").write_text(f"<pre>{words}</pre>\n")
    state = {"state": {"m": {"state": {"value": f"<b>x</b>\n{line}\n"}}}}
    (site / "widget.html").write_text(
        f'<script type="application/vnd.jupyter.widget-state+json">{json.dumps(state)}</script>'
    )
    (site / "pkg").mkdir()
    with zipfile.ZipFile(site / "pkg" / "x-1-py3-none-any.whl", "w") as zf:
        zf.writestr("course/x.py", f"def f():\n    {line}\n")
    # An IPython traceback quoting the line: colour codes, an arrow and a line number around it,
    # as the stored notebook holds it (a JSON string) and as a page shows it (HTML).
    frame = f"\x1b[0;32m----> 7\x1b[0m     \x1b[38;5;28m{line}\x1b[39;00m  \x1b[38;5;66m# here"
    (site / "tb.ipynb").write_text(json.dumps({"outputs": [{"traceback": [frame]}]}))
    (site / "tb.html").write_text(f"<pre>{html.escape(frame)}</pre>")
    found = leaks.find_leaks(site, forbidden)
    assert set(found) == {line}
    assert found[line] == {
        "code.html",
        "widget.html",
        "pkg/x-1-py3-none-any.whl!course/x.py",
        "tb.ipynb",
        "tb.html",
    }
    traceback = nbformat.v4.new_output("error", ename="E", evalue="e", traceback=[frame])
    assert pages.leaks_in(pages.output_text([traceback]), forbidden) == {line}


def test_leak_finder_passes_what_students_get_and_torch_source():
    """No false alarms from substring matching: a solution line that a lesson's prose spells
    out with inline code (lesson 05's ``if `max_grad_norm` is not `None`:``) is not forbidden,
    and a traceback through torch quoting a line that torch's source holds is not a leak."""
    forbidden = _forbidden()
    prose = "if max_grad_norm is not None:"
    solution = (REPO_ROOT / "solutions" / "05-accumulation" / "05-accumulation.ipynb").read_text()
    assert f'"    {prose}' in solution and prose not in forbidden
    torch_line = 'raise RuntimeError("unscale_() is being called after step().")'
    assert torch_line in forbidden, "a solution line that torch's GradScaler also holds"
    frame = f"\x1b[0;32m--> 406\x1b[0m     {torch_line}"
    assert pages.leaks_in(frame, forbidden) == set()
    assert leaks.in_torch_source({torch_line, _a_solution_line()}) == {torch_line}


def test_written_answers_are_forbidden(tmp_path):
    """Each lesson's written-question model answer (a markdown cell marked as an nbgrader
    solution, a placeholder in the release) is forbidden, and found on a page that shows it."""
    forbidden = _forbidden()
    answers = {}
    for path in sorted((REPO_ROOT / "solutions").rglob("*.ipynb")):
        for cell in _nb(path)["cells"]:
            meta = cell["metadata"].get("nbgrader", {})
            if cell["cell_type"] == "markdown" and meta.get("solution"):
                lines = leaks.not_given(leaks._lines("".join(cell["source"])), REPO_ROOT)
                answers[path.stem] = sorted(lines, key=len)[-1] if lines else None
    assert set(answers) == set(LESSONS), "one written answer per lesson"
    assert all(answers.values()), f"a written answer with no line of its own: {answers}"
    assert set(answers.values()) <= forbidden
    site = tmp_path / "site"
    site.mkdir()
    answer = answers["04-batchnorm"]
    (site / "page.html").write_text(f"<p>{html.escape(answer)}</p>")
    assert set(leaks.find_leaks(site, forbidden)) == {answer}


def test_lesson_03_answer_cells_are_left_out():
    """Lesson 03: the "your CUDA prediction" table (it prints ``predict_cuda_dtypes``, the
    answer) and every solution and test cell lose their outputs; the experiment that calls the
    learner's ``trace_dtypes`` keeps them."""
    lesson = "03-autocast"
    release = _nb(REPO_ROOT / "lessons" / lesson / f"{lesson}.ipynb")
    solution = _nb(REPO_ROOT / "solutions" / lesson / f"{lesson}.ipynb")
    hidden = pages.hidden_cells(release, solution)
    source = {c["id"]: "".join(c["source"]) for c in release["cells"]}
    table = [i for i, s in source.items() if '"your CUDA prediction": predict_cuda_dtypes' in s]
    assert table and hidden.get(table[0]) == pages.NOTE_ANSWER
    graded = [
        c["id"]
        for c in release["cells"]
        if c["cell_type"] == "code" and c["metadata"].get("nbgrader", {}).get("grade_id")
    ]
    assert graded and all(i in hidden for i in graded)
    experiment = [i for i, s in source.items() if s.startswith("attn_model = row_attention")]
    assert experiment and experiment[0] not in hidden


def _widget(model: str, children: list[str] = ()) -> dict:
    return {
        "model_name": "VBoxModel" if children else "IntSliderModel",
        "model_module": "@jupyter-widgets/controls",
        "model_module_version": "2.0.0",
        "state": {"children": [f"IPY_MODEL_{c}" for c in children], "value": 3},
    }


def test_compose_leaves_out_answers_and_their_widgets():
    """A cell that reads an exercise's value shows a note instead of its output; a cell that
    prints exercise code too; only the shown widgets' state (with their children) is kept."""
    release = nbformat.v4.new_notebook()
    solved = nbformat.v4.new_notebook()
    cells = [
        ("sol", "answer = None  # YOUR CODE HERE", "answer = 42", {"solution": True}),
        ("show", "print(answer)", "print(answer)", {}),
        ("code", "show_source()", "show_source()", {}),
        ("w1", "explorer.widget", "explorer.widget", {}),
        ("w2", "other(answer).widget", "other(answer).widget", {}),
    ]
    forbidden = {"return 6 * 7 # the solution's own line"}
    printed = {
        "sol": [],
        "show": [nbformat.v4.new_output("stream", name="stdout", text="42 is the answer\n")],
        "code": [
            nbformat.v4.new_output(
                "stream", name="stdout", text="def f():\n  return 6 * 7  # the solution's own line"
            )
        ],
        "w1": [_view("a")],
        "w2": [_view("c")],
    }
    for cid, student, solution, meta in cells:
        extra = {"nbgrader": {**meta, "grade": False, "grade_id": cid}} if meta else {}
        release.cells.append(nbformat.v4.new_code_cell(student, id=cid, metadata=dict(extra)))
        ran = nbformat.v4.new_code_cell(solution, id=cid, metadata=dict(extra))
        ran.outputs = printed[cid]
        solved.cells.append(ran)
    state = {"a": _widget("a", ["b"]), "b": _widget("b"), "c": _widget("c")}
    solved.metadata["widgets"] = {pages.WIDGET_STATE: {"state": state, "version_major": 2}}
    page = pages.compose(release, solved, forbidden)
    out = {c.get("id"): c.get("outputs") for c in page.notebook.cells if c.cell_type == "code"}
    note = {cid: out[cid][0]["data"]["text/plain"] if out[cid] else None for cid in out}
    assert note["show"] == pages.NOTE_ANSWER and note["w2"] == pages.NOTE_ANSWER
    assert note["code"] == pages.NOTE_CODE
    assert out["sol"] == [] and out["w1"][0]["data"][pages.WIDGET_VIEW]["model_id"] == "a"
    kept = page.notebook.metadata["widgets"][pages.WIDGET_STATE]["state"]
    assert set(kept) == {"a", "b"}
    assert "42 is the answer" not in json.dumps(page.notebook)


def _notebooks(cells: list[tuple[str, str, dict, list[dict]]]) -> tuple[dict, dict]:
    """A release and its executed solution from ``(id, source, nbgrader metadata, outputs)``."""
    release, solved = nbformat.v4.new_notebook(), nbformat.v4.new_notebook()
    for cid, source, meta, outputs in cells:
        extra = {"nbgrader": {**meta, "grade": False, "grade_id": cid}} if meta else {}
        release.cells.append(nbformat.v4.new_code_cell(source, id=cid, metadata=dict(extra)))
        ran = nbformat.v4.new_code_cell(source, id=cid, metadata=dict(extra))
        ran.outputs = outputs
        solved.cells.append(ran)
    return release, solved


def _print(text: str) -> list[dict]:
    return [nbformat.v4.new_output("stream", name="stdout", text=text + "\n")]


def test_hiding_follows_names_bound_from_an_answer():
    """A name bound in a left-out cell from an exercise's value (``t = table(answer)``) is left
    out in later cells too, and so on down the chain; a name bound elsewhere is not."""
    release, solved = _notebooks(
        [
            ("sol", "answer = {'matmul': 'float16'}", {"solution": True}, []),
            ("t", "t = dtype_table(answer)\nrows = 3", {}, []),
            ("show-t", "print(t)", {}, []),
            ("u", "u = t.upper()", {}, []),
            ("show-u", "u", {}, []),
            ("other", "v = dtype_table({})\nprint(v)", {}, []),
        ]
    )
    hidden = pages.hidden_cells(release, solved)
    assert set(hidden) == {"sol", "t", "show-t", "u", "show-u"}
    assert all(hidden[c] == pages.NOTE_ANSWER for c in hidden)


def test_a_shown_output_repeating_a_left_out_line_stops_the_build():
    """A shown cell printing a line that a left-out cell printed (the answer reached it in a
    way the rules missed) makes compose refuse, naming both cells; the device line and object
    reprs that every cell may print are not repeats."""
    device = "CPU Test (1 threads), torch 2.13.0+cpu"
    row = "matmul        float16    (your CUDA prediction)"
    cells = [
        ("setup", "setup()", {}, _print(f"Running on {device}; seed 0.")),
        ("sol", "answer = {'matmul': 'float16'}", {"solution": True}, []),
        (
            "table",
            "show(answer)",
            {},
            _print(f"on {device}:\n{row}\n<Figure size 8x3 with 1 Axes>"),
        ),
        ("same-device", "other()", {}, _print(f"on {device}:\n<Figure size 8x3 with 1 Axes>")),
    ]
    release, solved = _notebooks(cells)
    page = pages.compose(release, solved, set())
    assert page.hidden.get("table") == pages.NOTE_ANSWER and "same-device" not in page.hidden
    release, solved = _notebooks(
        [*cells, ("sneaky", "print(open('t.txt').read())", {}, _print(row))]
    )
    with pytest.raises(pages.RepeatError, match=r"cell sneaky \(cell 5 .*left-out cell table"):
        pages.compose(release, solved, set())
    gpu = copy.deepcopy(solved)
    gpu.cells[-1].outputs = _print(row)
    solved.cells[-1].outputs = _print("nothing to see")
    with pytest.raises(pages.RepeatError, match="from CUDA GPU X"):
        pages.compose(release, solved, set(), [pages.Results("CUDA GPU X", gpu)])


def _view(model: str) -> dict:
    return nbformat.v4.new_output(
        "display_data",
        data={
            pages.WIDGET_VIEW: {"model_id": model, "version_major": 2, "version_minor": 0},
            "text/plain": "VBox()",
        },
    )


def _course_imports() -> set[str]:
    """The third-party modules ``course/`` imports unconditionally (an import inside a ``try``
    that catches ImportError is optional)."""
    import ast

    found: set[str] = set()
    for path in sorted((REPO_ROOT / "course").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        optional = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Try) and any(
                "ImportError" in ast.unparse(h.type or ast.Name("BaseException"))
                for h in node.handlers
            ):
                optional |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
        for node in ast.walk(tree):
            if id(node) in optional:
                continue
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "course"}


def _distributions(module: str) -> set[str]:
    import importlib.metadata

    dists = importlib.metadata.packages_distributions().get(module, [module])
    return {d.lower().replace("_", "-") for d in dists}


def test_course_index_serves_the_course_package_alone(tmp_path):
    """``write_course_index``: a wheel of ``course/`` only, listed by a --find-links page, that
    pip installs with no index and no dependencies."""
    dest = tmp_path / "pkg"
    wheel = write_course_index(dest)
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = zf.read(meta).decode()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {
        "course"
    }
    assert "course/__init__.py" in names and not any("grader" in n for n in names)
    index = (dest / "index.html").read_text()
    assert f'href="{wheel.name}#sha256=' in index
    # Its metadata: what course/ imports, unpinned, so pip keeps a hosted runtime's torch.
    requires = [
        line.split(":", 1)[1].strip()
        for line in metadata.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    pinned = [r for r in requires if any(op in r for op in "=<>~!;[")]
    assert requires and not pinned, f"the hosted wheel pins {pinned}"
    names = {r.lower().replace("_", "-") for r in requires}
    imported = _course_imports()
    missing = sorted(m for m in imported if not names & _distributions(m))
    assert not missing, f"course/ imports {missing}, which the wheel does not declare"
    target = tmp_path / "target"
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    cmd += ["--find-links", str(dest), "--target", str(target), "mixed-precision-course"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    assert (target / "course" / "__init__.py").is_file()
    assert not (target / "grader").exists()


# -- the built site ---------------------------------------------------------------------------


def _fake_results(executed: Path, folder: Path) -> Path:
    """A GPU check's ``--save`` folder made from this run's executed solution of lesson 03: its
    setup line names a GPU, and its hidden cells print a canary and display grader observations,
    neither of which may reach the site."""
    path = find_notebook(executed, RESULTS_LESSON)
    nb = _nb(path)
    release = _nb(REPO_ROOT / "lessons" / RESULTS_LESSON / f"{RESULTS_LESSON}.ipynb")
    hidden = pages.hidden_cells(release, nb)
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text = "".join(out["text"])
                out["text"] = pages.RUNNING_ON.sub(f"Running on {FAKE_GPU}; seed 0.", text)
        if cell.get("id") in hidden:
            cell.setdefault("outputs", []).append(
                nbformat.v4.new_output("stream", name="stdout", text=CANARY + "\n")
            )
            cell["outputs"].append(
                nbformat.v4.new_output(
                    "display_data", data={OBSERVATIONS: json.dumps({"canary": CANARY})}
                )
            )
    folder.mkdir(parents=True)
    (folder / f"{RESULTS_LESSON}.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    return folder


def _say(request, line: str) -> None:
    """Print ``line`` on the terminal even while pytest captures output (the figures asked for)."""
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(f"\n{line}", flush=True)


class Site:
    def __init__(self, out: Path, executed: Path, results: Path, seconds: float) -> None:
        self.out, self.executed, self.results, self.seconds = out, executed, results, seconds
        self.figures = 0  # how many figures the browser test read the alt text of


@pytest.fixture(scope="module")
def site(tmp_path_factory, request) -> Site:
    """The site, built once by ``python -m website`` (run.py site's command) from the suite's
    executed notebooks and a made-up GPU run."""
    if not EXECUTED:
        pytest.skip(HOW)
    executed = Path(EXECUTED)
    missing = [lesson for lesson in LESSONS if find_notebook(executed, lesson) is None]
    assert not missing, f"{executed} has no executed notebook for {missing} ({HOW})"
    tmp = tmp_path_factory.mktemp("site")
    results = _fake_results(executed, tmp / "results")
    out = tmp / "_site"
    cmd = [sys.executable, "-m", "website", "--executed", str(executed)]
    cmd += ["--results", str(results), "--out", str(out)]
    started = time.perf_counter()
    # pyproject.toml's [tool.course] settings, whatever this shell's environment overrides
    env = dict(os.environ)
    for key in ("COURSE_REPOSITORY", "COURSE_BRANCH", "COURSE_SITE_URL"):
        env.pop(key, None)
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    files = sum(1 for p in out.rglob("*") if p.is_file())
    line = (
        f"site: built in {seconds:.1f} s, {size / 2**20:.1f} MiB in {files} files "
        f"({len(LESSONS)} lessons)"
    )
    _say(request, line)
    return Site(out, executed, results, seconds)


def _output_lines(executed: dict, release: dict) -> tuple[set[str], set[str]]:
    """``(left out, shown)``: the lines the page's left-out cells and its shown cells printed
    (lines with a letter or digit in them)."""
    hidden = pages.hidden_cells(release, executed)
    kept, left = set(), set()
    for cell in executed.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        text = pages.output_text(cell.get("outputs", []))
        lines = {
            n
            for n in map(leaks.normalise, text.splitlines())
            if len(n) >= leaks.MIN_LENGTH and any(ch.isalnum() for ch in n)
        }
        (left if cell.get("id") in hidden else kept).update(lines)
    return left, kept


def test_no_answer_anywhere_on_the_site(site):
    """No solution, hidden test, grader, judge or example-answer line, no output of a left-out
    cell (the CPU run's or the GPU run's) and no grader observation anywhere in the site."""
    forbidden = _forbidden()
    allowed = leaks.allowed(REPO_ROOT)
    left, shown = {leaks.normalise(CANARY)}, set()
    for lesson in LESSONS:
        release = _nb(REPO_ROOT / "lessons" / lesson / f"{lesson}.ipynb")
        hidden, kept = _output_lines(_nb(find_notebook(site.executed, lesson)), release)
        left |= hidden
        shown |= kept
    assert len(left) > 1, "no left-out cell printed anything: the check would prove nothing"
    outputs = leaks.not_given(left - shown - allowed, REPO_ROOT)
    found = leaks.find_leaks(site.out, forbidden | outputs | {OBSERVATIONS})
    shown = {line: sorted(files)[:3] for line, files in sorted(found.items())[:20]}
    assert not found, f"{len(found)} forbidden lines on the site: {json.dumps(shown, indent=1)}"
    # Grader observations (their own output type) in no page's notebook: the pages composed as
    # the build composes them, from the same executed notebooks and the same GPU run.
    matcher = leaks.Matcher(forbidden)
    gpu = _nb(site.results / f"{RESULTS_LESSON}.ipynb")
    planted = [
        o for c in gpu["cells"] for o in c.get("outputs", []) if OBSERVATIONS in o.get("data", {})
    ]
    assert planted, "the GPU run holds no observations: the check would prove nothing"
    for lesson in LESSONS:
        release = _nb(REPO_ROOT / "lessons" / lesson / f"{lesson}.ipynb")
        runs = [pages.Results(FAKE_GPU, gpu)] if lesson == RESULTS_LESSON else []
        page = pages.compose(release, _nb(find_notebook(site.executed, lesson)), matcher, runs)
        mimes = {
            m for c in page.notebook.cells for o in c.get("outputs", []) for m in o.get("data", {})
        }
        assert OBSERVATIONS not in mimes, f"{lesson}: a page shows grader observations"
    served = [p for p in site.out.rglob("*") if p.suffix in (".whl", ".zip")]
    assert served, "the site serves no wheel under pkg/"
    for archive in served:
        with zipfile.ZipFile(archive) as zf:
            assert not any(n.startswith("grader/") for n in zf.namelist()), archive


def _answer_values() -> dict[str, list[tuple[str, str]]]:
    """``{lesson/name: [(key, value), ...]}`` for each exercise that asks for a dict value
    (lesson 03's ``predict_cuda_dtypes``), from its solution region: each entry's key and the
    last name of its value (``torch.float16`` -> ``float16``)."""
    import ast

    found = {}
    for lesson in LESSONS:
        solution = _nb(REPO_ROOT / "solutions" / lesson / f"{lesson}.ipynb")
        _, values = pages.exercise_names(solution)
        for cell in solution["cells"]:
            source = "".join(cell["source"])
            if "### BEGIN SOLUTION" not in source:
                continue
            region = source.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
            try:
                tree = ast.parse(textwrap.dedent(region))
            except SyntaxError:  # a region inside a function's body: no top-level value
                continue
            for node in tree.body:
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)):
                    continue
                names = {t.id for t in node.targets if isinstance(t, ast.Name)} & values
                pairs = [
                    (k.value, ast.unparse(v).rsplit(".", 1)[-1])
                    for k, v in zip(node.value.keys, node.value.values, strict=True)
                    if isinstance(k, ast.Constant)
                ]
                found.update({f"{lesson}/{name}": pairs for name in names})
    return found


def _holds_value(text: str, pairs: list[tuple[str, str]]) -> bool:
    """Whether ``text`` holds every entry of a dict value, in any formatting: each key as a
    word followed on its line by its value as a word (``conv | float16``,
    ``'conv': torch.float16``), in any order."""
    return all(
        re.search(
            rf"(?<![\w.]){re.escape(k)}(?![\w.])[^\n]{{0,60}}?(?<![\w]){re.escape(v)}(?!\w)", text
        )
        for k, v in pairs
    )


def test_answer_values_finder_can_fail():
    """The value finder sees lesson 03's answer as a table and as a dict's repr, and not in a
    table of the CPU's dtypes (bfloat16) nor in half of the answer."""
    (pairs,) = _answer_values().values()
    assert len(pairs) >= 10 and {v for _, v in pairs} == {"float16", "float32"}
    table = "\n".join(f"{k:<12}| {v}" for k, v in reversed(pairs))
    assert _holds_value(table, pairs)
    assert _holds_value(repr({k: f"torch.{v}" for k, v in pairs}).replace("'torch", "torch"), pairs)
    cpu = table.replace("float16", "bfloat16")
    assert not _holds_value(cpu, pairs)
    assert not _holds_value("\n".join(table.splitlines()[: len(pairs) // 2]), pairs)


def test_no_answer_value_on_the_site(site):
    """Each value exercise's answer (every entry of lesson 03's ``predict_cuda_dtypes``) is in
    no file the site serves, in any formatting (:func:`_holds_value`)."""
    values = _answer_values()
    assert "03-autocast/predict_cuda_dtypes" in values
    found = []
    for path in sorted(p for p in site.out.rglob("*") if p.is_file()):
        rel = path.relative_to(site.out).as_posix()
        for name, text in leaks.text_views(rel, path.read_bytes()):
            found += [(name, v) for v, pairs in values.items() if _holds_value(text, pairs)]
    assert not found, f"an exercise's answer value on the site: {sorted(set(found))[:5]}"


def test_site_in_a_browser(site, browser, shots, request):
    """Landing page and every lesson page offline in Chromium (see the module's doc)."""
    started = time.perf_counter()
    served = contextlib.ExitStack()
    base = served.enter_context(serving_folder(site.out))
    # The links as the course's settings say (pyproject.toml [tool.course]), spelled out here.
    course = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["course"]
    cfg = (course["repository"].removeprefix("https://github.com/"), course["branch"])
    problems: list[str] = []
    context = browser.new_context()
    page = context.new_page()
    errors: list[str] = []
    outside: list[str] = []
    page.on("console", lambda m: m.type == "error" and errors.append(m.text))
    page.on("pageerror", lambda e: errors.append(f"page error: {e}"))
    local = (base, "data:", "blob:")  # data: and blob: URLs never leave the page
    page.on("request", lambda r: not r.url.startswith(local) and outside.append(r.url))
    page.on("response", lambda r: r.status >= 400 and errors.append(f"{r.status} {r.url}"))
    try:
        for name in ["index.html", *(f"lessons/{lesson}.html" for lesson in LESSONS)]:
            errors.clear()
            outside.clear()
            page.goto(base + name, wait_until="load")
            page.wait_for_load_state("networkidle")
            lesson = name.removeprefix("lessons/").removesuffix(".html")
            if name != "index.html":
                _check_lesson(page, base, lesson, cfg, site, problems)
                widget = page.locator(f".jupyter-widgets :is({CONTROLS})")
                if widget.count():
                    widget.first.scroll_into_view_if_needed()
                page.screenshot(path=str(shots / f"site-{lesson}.png"))
            else:
                hrefs = page.locator("article a[href^='lessons/']").evaluate_all(
                    "links => links.map(a => a.getAttribute('href'))"
                )
                unlinked = [x for x in LESSONS if f"lessons/{x}.html" not in hrefs]
                if unlinked:
                    problems.append(f"index.html's text links no page of {unlinked}")
                _check_landing(page, problems)
            problems += [f"{name}: console: {e}" for e in errors]
            problems += [f"{name}: request outside loopback: {u}" for u in outside]
        errors.clear()
        page.goto(base + f"search.html?q={SEARCH_TERM}")
        hit = page.locator(f"#search-results a[href*='{SEARCH_LESSON}']")
        try:
            hit.first.wait_for(timeout=30_000)
        except Exception:  # noqa: BLE001 - reported below with what the page showed
            problems.append(
                f"search for {SEARCH_TERM!r} found no link to {SEARCH_LESSON}: "
                f"{page.locator('#search-results').inner_text()[:300]!r}"
            )
        problems += [f"search: console: {e}" for e in errors]
        if not site.figures:
            problems.append("no lesson page has a figure: the alt-text check saw nothing")
        # On a phone (390 px wide) the landing page's pip command wraps inside the page.
        phone = context.new_page()
        phone.set_viewport_size({"width": 390, "height": 844})
        phone.goto(base + "index.html", wait_until="load")
        pip_code = phone.locator("article code", has_text="find-links")
        if not pip_code.count():
            problems.append("index.html: no pip command with --find-links")
        for box in [pip_code.nth(i).bounding_box() for i in range(pip_code.count())]:
            if box is None or box["x"] + box["width"] > 390 + 1:
                problems.append(f"index.html: the pip command overflows a 390 px screen: {box}")
        phone.close()
        # What a hosted notebook's setup runs: the course's wheel from the served pkg/ page.
        target = site.out.parent / "pip-target"
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
        cmd += ["--find-links", base + "pkg/", "--target", str(target), "mixed-precision-course"]
        pip = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if pip.returncode != 0 or not (target / "course" / "__init__.py").is_file():
            problems.append(f"pip did not install the course from {base}pkg/: {pip.stderr[-500:]}")
    finally:
        context.close()
        served.close()
    seconds = time.perf_counter() - started
    _say(request, f"site: browser test {seconds:.1f} s")
    assert not problems, "\n".join(problems)


def _check_lesson(page, base: str, lesson: str, cfg, site: Site, problems: list[str]) -> None:
    notebook = f"lessons/{lesson}/{lesson}.ipynb"
    where = f"lessons/{lesson}.html"
    widget = page.locator(f".jupyter-widgets :is({CONTROLS})")
    try:
        widget.first.wait_for(state="visible", timeout=20_000)
    except Exception:  # noqa: BLE001 - reported as a problem of this page
        problems.append(f"{where}: no widget control visible")
    repo, branch = cfg
    github = f"https://github.com/{repo}/blob/{branch}/{notebook}"
    for css, expected in (
        (
            "a.course-colab",
            f"https://colab.research.google.com/github/{repo}/blob/{branch}/{notebook}",
        ),
        ("a.course-kaggle", f"https://kaggle.com/kernels/welcome?src={github}"),
    ):
        href = page.locator(css).first.get_attribute("href")
        if href != expected:
            problems.append(f"{where}: {css} is {href!r}, not {expected!r}")
    href = page.locator("a.course-download").first.get_attribute("href")
    got = page.request.get(base + "lessons/" + href).body()
    release = (REPO_ROOT / notebook).read_bytes()
    if got != release:
        problems.append(f"{where}: the download ({href}) is not {notebook}")
    for marker in ("### BEGIN SOLUTION", "### BEGIN HIDDEN TESTS", "### END SOLUTION"):
        if marker.encode() in got:
            problems.append(f"{where}: the download holds {marker!r}")
    text = page.locator("article").inner_text()
    if "when this site was built" in text or "before this site was built" not in text:
        problems.append(f"{where}: built from given notebooks, yet says they ran at build time")
    # The figures of the page's outputs (a widget's own images are drawn by the widget manager)
    alts = page.locator("article img[src*='_images/']").evaluate_all("i => i.map(x => x.alt)")
    site.figures += len(alts)
    bad = [a for a in alts if not a.startswith("Figure drawn by") or a.endswith(".png")]
    if bad:
        problems.append(f"{where}: figures without a meaningful alt text: {bad[:3]}")
    measured = pages.setup_line(_nb(find_notebook(site.executed, lesson)))
    if not measured or measured not in text:
        problems.append(f"{where}: does not say where its outputs were measured ({measured!r})")
    if lesson == RESULTS_LESSON:
        # The GPU run's outputs beside the cells that show it, each under its own label.
        labels = page.locator("article .course-run-gpu").all_inner_texts()
        expected = _cells_with_gpu_outputs(site, lesson)
        if len(labels) != expected or any(FAKE_GPU not in t for t in labels):
            problems.append(
                f"{where}: {len(labels)} GPU-run output blocks labelled {FAKE_GPU!r} "
                f"(expected {expected}, one per shown cell the GPU run printed in)"
            )


def _check_landing(page, problems: list[str]) -> None:
    """The landing page says the outputs came from a run before the build (``--executed``) and
    names the GPU run of ``--results`` with a link to its lesson's page."""
    text = page.locator("article").inner_text()
    if "when this site was built" in text or "before this site was built" not in text:
        problems.append("index.html: built from given notebooks, yet says they ran at build time")
    gpu = page.locator("article p", has_text=FAKE_GPU)
    if not gpu.count() or not gpu.first.locator(f"a[href='lessons/{RESULTS_LESSON}.html']").count():
        problems.append(f"index.html: does not name the GPU run ({FAKE_GPU}) beside its lesson")


def _cells_with_gpu_outputs(site: Site, lesson: str) -> int:
    """How many of the page's shown cells the GPU run printed something in (a widget's view
    aside: that run stored no widget state)."""
    release = _nb(REPO_ROOT / "lessons" / lesson / f"{lesson}.ipynb")
    executed = _nb(find_notebook(site.executed, lesson))
    hidden = pages.hidden_cells(release, executed)
    gpu = {c.get("id"): c for c in _nb(site.results / f"{lesson}.ipynb")["cells"]}
    count = 0
    for cell in release["cells"]:
        if cell["cell_type"] != "code" or cell.get("id") in hidden:
            continue
        outputs = gpu.get(cell.get("id"), {}).get("outputs", [])
        views = [set(o.get("data", {})) - {"text/plain"} == {pages.WIDGET_VIEW} for o in outputs]
        if not all(views):
            count += 1
    return count


def test_header_and_landing_say_how_the_outputs_were_computed():
    """Built from given executed notebooks, the pages do not claim the build ran them; a GPU
    run given with ``--results`` is named on the landing page beside its lesson."""
    from website.build import header, landing, settings

    cfg = settings(REPO_ROOT)
    page = pages.Page(notebook=nbformat.v4.new_notebook(), measured_on="CPU X (1 thread)")
    given = header(cfg, RESULTS_LESSON, page, [FAKE_GPU], given=True)
    built = header(cfg, RESULTS_LESSON, page, [], given=False)
    assert "before this site was built" in given and "when this site was built" not in given
    assert "when this site was built" in built and FAKE_GPU in given
    measured = {lesson: "CPU X (1 thread)" for lesson in LESSONS}
    text = landing(REPO_ROOT, cfg, LESSONS, measured, {RESULTS_LESSON: FAKE_GPU}, given=True)
    gpu = [line for line in text.splitlines() if FAKE_GPU in line]
    assert gpu and f"(lessons/{RESULTS_LESSON}.ipynb)" in gpu[0]
    assert "before this site was built" in text and "@@" not in text
    assert FAKE_GPU not in landing(REPO_ROOT, cfg, LESSONS, measured)


def test_pages_workflow_builds_the_site_and_publishes_it():
    """``.github/workflows/site.yml``: builds with run.py site, the repository and Pages address
    from the workflow's context, and deploys what it built."""
    import yaml

    flow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "site.yml").read_text())
    steps = flow["jobs"]["build"]["steps"]
    build = next(s for s in steps if "run.py site" in s.get("run", ""))
    out = build["run"].split("--out", 1)[1].split()[0] if "--out" in build["run"] else "_site"
    assert "github.repository" in build["env"]["COURSE_REPOSITORY"]
    assert "steps.pages.outputs.base_url" in build["env"]["COURSE_SITE_URL"]
    upload = next(s for s in steps if s.get("uses", "").startswith("actions/upload-pages-artifact"))
    assert upload["with"]["path"] == out
    deploy = flow["jobs"]["deploy"]
    assert deploy["needs"] == "build"
    assert any(s.get("uses", "").startswith("actions/deploy-pages") for s in deploy["steps"])
    assert flow["permissions"] == {"contents": "read", "pages": "write", "id-token": "write"}


def test_vendor_fetch_fails_loudly(tmp_path, monkeypatch):
    """A widget manager that cannot be downloaded stops the build with what to do; a tarball
    whose checksum is not the pinned one is refused."""
    from website import vendor

    monkeypatch.setattr(vendor, "REGISTRY", f"http://127.0.0.1:{_closed_port()}")
    with pytest.raises(vendor.VendorError, match="registry.npmjs.org once"):
        vendor.ensure_vendor(tmp_path / "cache", (vendor.HTML_MANAGER,))
    assert not (tmp_path / "cache" / "static").exists()
    tarball = tmp_path / "pkg.tgz"
    tarball.write_bytes(b"not the package")
    monkeypatch.setattr(vendor.urllib.request, "urlopen", lambda url, timeout: tarball.open("rb"))
    with pytest.raises(vendor.VendorError, match="is not the registry's"):
        vendor.ensure_vendor(tmp_path / "cache", (vendor.HTML_MANAGER,))


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settings_come_from_pyproject_then_environment_then_options(monkeypatch):
    """The repository, branch and site URL: ``[tool.course]``, overridden by the environment,
    overridden by ``run.py site``'s options; the launch links follow them."""
    from website.build import settings

    for key in ("COURSE_REPOSITORY", "COURSE_BRANCH", "COURSE_SITE_URL"):
        monkeypatch.delenv(key, raising=False)
    course = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["tool"]["course"]
    assert settings(REPO_ROOT).repository == course["repository"]
    monkeypatch.setenv("COURSE_REPOSITORY", "https://github.com/someone/fork")
    monkeypatch.setenv("COURSE_SITE_URL", "https://someone.github.io/fork")
    cfg = settings(REPO_ROOT, branch="dev")
    assert (cfg.repository, cfg.branch, cfg.site_url) == (
        "https://github.com/someone/fork",
        "dev",
        "https://someone.github.io/fork/",
    )
    nb = "lessons/01-number-formats/01-number-formats.ipynb"
    assert cfg.colab(nb) == f"https://colab.research.google.com/github/someone/fork/blob/dev/{nb}"
    assert cfg.kaggle(nb) == (
        f"https://kaggle.com/kernels/welcome?src=https://github.com/someone/fork/blob/dev/{nb}"
    )
    assert settings(REPO_ROOT, repository="https://github.com/a/b").owner_repo == "a/b"
