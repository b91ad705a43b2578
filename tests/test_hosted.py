"""Every lesson on a hosted notebook (Colab, Kaggle), on the runtime's own packages.

The setup cell every lesson opens with is the same in all nine and installs the course's helper
package alone from the site named in pyproject.toml; offline it says what to do. ``check_my_work``
reads a Colab notebook from Colab's front end and, on Kaggle, says how to check a download.

The Colab-profile run (``tests/hosted.py``), every lesson: its solution, hidden tests removed,
opened in classic Notebook 6.5.7 (ipywidgets 7's front end, as Colab's) in headless Chromium with
a kernel of ``.venv-colab/`` (Colab's pins, torch 2.11's view of torch 2.13, the course not
installed, ``COURSE_QUICK`` set so lesson 09 trains a few steps). Run All: its setup cell
installs the course from a loopback copy of the site's ``pkg/`` and must leave torch, numpy,
IPython, ipykernel and ipywidgets as they were (and install nothing else); no cell raises; the
lesson's widget responds when operated. Run All runs every visible test (a failing one raises);
lesson 01 also ends with ``check_my_work()`` (a fresh Colab-profile kernel re-running the saved
notebook), every exercise passing: once is enough for its path, and the lessons' own runs are
the slowest of the suite (lesson 09 twice would cost about 100 s more). Each run's seconds go
to ``test-artifacts/hosted-times.json``, its notebook to ``test-artifacts/hosted/``.
"""

from __future__ import annotations

import ast
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import nbformat
import pytest
import torch

from course import selfcheck
from course.device import (
    DeviceProfile,
    amp_dtype,
    dist_backend,
    float8_gemm,
    limits_sentence,
    needs_scaler,
    ranks_sentence,
    start_method,
    torchrun_ranks,
)
from course.selfcheck import HIDDEN
from tests import hosted
from tests.conftest import LESSON_IDS, LESSONS, SOLUTIONS, serving_folder

NOTEBOOKS = [SOLUTIONS / lesson / f"{lesson}.ipynb" for lesson in LESSON_IDS] + [
    LESSONS / lesson / f"{lesson}.ipynb" for lesson in LESSON_IDS
]


def _source(cell) -> str:
    return cell.source if isinstance(cell.source, str) else "".join(cell.source)


# --------------------------------------------------------------------------------------------
# The setup cell


def test_setup_cell_is_one_cell_the_same_everywhere_naming_the_site():
    sources = set()
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        cell = hosted.setup_cell(nb)
        index = nb.cells.index(cell)
        first_course = next(
            i
            for i, c in enumerate(nb.cells)
            if c.cell_type == "code" and "import course" in c.source
        )
        assert index < first_course, f"{path.name}: the setup cell must come before `import course`"
        assert not any(c.cell_type == "code" for c in nb.cells[:index]), path.name
        assert "nbgrader" not in cell.metadata, f"{path.name}: the setup cell is not graded"
        sources.add(_source(cell))
    assert len(sources) == 1, "the setup cell differs between lessons"
    (source,) = sources
    assert len(source.splitlines()) <= 15
    assert re.findall(r"https?://[^\s\"']+", source) == [hosted.site_url()]
    assert "COURSE_SITE_URL" in source
    # It installs one distribution, without its dependencies, from the site's pkg/ alone.
    assert "--no-deps" in source and "--no-index" in source and '"/pkg/"' in source
    assert f'"{hosted.DIST}"]' in source


def _run_cell(python: str, source: str, site: str, cwd: Path, *flags: str):
    env = dict(os.environ, COURSE_SITE_URL=site)
    return subprocess.run(
        [python, *flags, "-c", source],
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=300,
    )


def test_setup_cell_does_nothing_where_the_course_is_installed(tmp_path):
    nb = nbformat.read(SOLUTIONS / LESSON_IDS[0] / f"{LESSON_IDS[0]}.ipynb", as_version=4)
    source = _source(hosted.setup_cell(nb))
    proc = _run_cell(sys.executable, source, "http://127.0.0.1:9/", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "The course is installed: no setup needed.\n"


@pytest.mark.xdist_group("hosted")
def test_setup_cell_offline_says_what_to_do_instead_of_a_traceback(tmp_path):
    """Where the site cannot be reached (a refused loopback port stands in for a runtime with
    Internet off), the cell stops with one message naming Kaggle's switch, not pip's output.
    It runs in the Colab profile's Python, where the course is not installed."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    nb = nbformat.read(SOLUTIONS / LESSON_IDS[0] / f"{LESSON_IDS[0]}.ipynb", as_version=4)
    source, site = _source(hosted.setup_cell(nb)), f"http://127.0.0.1:{port}/"
    python = hosted.ensure_venv()
    hosted.uninstall_course()
    started = time.monotonic()
    proc = _run_cell(str(python), source, site, tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    message = proc.stderr.strip()
    assert message.startswith(
        "Could not download the course's helper package from http://127.0.0.1"
    )
    assert "switch Internet on" in message and "Traceback" not in message
    assert len(message.splitlines()) == 1
    assert time.monotonic() - started < 120


# --------------------------------------------------------------------------------------------
# check_my_work on Colab and Kaggle


def _tiny_lesson() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    answer = nbformat.v4.new_code_cell("def double(x):\n    return 2 * x")
    answer.metadata["nbgrader"] = {"grade": False, "solution": True, "grade_id": "double"}
    test = nbformat.v4.new_code_cell("assert double(3) == 6")
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "grade_id": "double_tests",
        "points": 2,
    }
    nb.cells = [answer, test, nbformat.v4.new_code_cell("check_my_work()")]
    nb.metadata["colab"] = {"name": "01-number-formats.ipynb"}
    return nb


def _fake_colab(monkeypatch, reply) -> list[tuple]:
    """``google.colab._message`` whose ``blocking_request`` answers ``reply``; returns its calls."""
    calls = []

    def blocking_request(request_type, request="", timeout_sec=5, parent=None):
        calls.append((request_type, timeout_sec))
        return reply

    message = types.ModuleType("google.colab._message")
    message.blocking_request = blocking_request
    colab = types.ModuleType("google.colab")
    colab._message = message
    google = types.ModuleType("google")
    google.colab = colab
    monkeypatch.setitem(sys.modules, "google", google)
    monkeypatch.setitem(sys.modules, "google.colab", colab)
    monkeypatch.setitem(sys.modules, "google.colab._message", message)
    return calls


def test_check_my_work_on_colab_checks_the_notebook_its_front_end_sends(
    monkeypatch, tmp_path, capsys
):
    # As Colab sends it: cell sources as lists of lines.
    content = json.loads(nbformat.writes(_tiny_lesson()))
    calls = _fake_colab(monkeypatch, {"ipynb": content})
    monkeypatch.chdir(tmp_path)  # no notebook file anywhere near
    copies = set(Path(tempfile.gettempdir()).glob("check-my-work-colab-*"))
    results = selfcheck.check_my_work()
    out = capsys.readouterr().out
    assert calls and calls[0][0] == "get_ipynb" and calls[0][1] >= 30
    assert [(r.exercise, r.status, r.points) for r in results] == [("double", "passed", 2.0)]
    assert "Checking 01-number-formats.ipynb as Colab has it now" in out
    assert "1 of 1 exercises pass" in out
    assert not list(tmp_path.iterdir())
    assert set(Path(tempfile.gettempdir()).glob("check-my-work-colab-*")) == copies, "copy left"


def test_check_my_work_on_colab_without_an_answer_falls_back(monkeypatch, tmp_path, capsys):
    _fake_colab(monkeypatch, None)  # the front end did not answer in time
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KAGGLE_KERNEL_RUN_TYPE", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert selfcheck.check_my_work() == []
    assert "Could not tell which notebook this is" in capsys.readouterr().out


def test_check_my_work_on_kaggle_says_how_to_check_a_download(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KAGGLE_KERNEL_RUN_TYPE", "Interactive")
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    assert selfcheck.check_my_work() == []
    out = capsys.readouterr().out
    assert "File > Download Notebook" in out and "check_my_work('/kaggle/input/" in out


# --------------------------------------------------------------------------------------------
# What a T4 (Colab; two on Kaggle) can show


T4 = DeviceProfile(kind="cuda", name="Tesla T4", capability=(7, 5), gpu_count=1, nccl=True)


def test_a_t4_is_float16_with_a_scaler_and_says_what_it_cannot_show():
    assert amp_dtype(T4) == torch.float16 and needs_scaler(T4)
    assert not float8_gemm(T4)[0] and "8.9" in float8_gemm(T4)[1]
    sentence = limits_sentence(T4)
    assert sentence.startswith(
        "On this GPU (compute capability 7.5) the lessons show float16 autocast with a "
        "GradScaler on float16 tensor cores; they cannot show bfloat16 at bfloat16's speed"
    )
    assert "TF32" in sentence and "float8 matrix multiplies (8.9+)" in sentence
    h100 = T4.with_(name="NVIDIA H100 80GB HBM3", capability=(9, 0))
    assert limits_sentence(h100) == "" and amp_dtype(h100) == torch.bfloat16
    a100 = T4.with_(name="NVIDIA A100-SXM4-40GB", capability=(8, 0))
    assert limits_sentence(a100).endswith(
        "they cannot show float8 matrix multiplies (8.9+): lesson 08 shows float8's numerics only"
    )
    assert limits_sentence(DeviceProfile(kind="cpu", name="cpu")) == ""


def test_every_lesson_prints_what_a_t4_cannot_show(monkeypatch, capsys):
    """course.setup, which every lesson calls first, prints the sentence on such a GPU."""
    import course.device as device

    monkeypatch.setattr(device, "pick_device", lambda prefer=None: torch.device("cpu"))
    monkeypatch.setattr(device.DeviceProfile, "of", classmethod(lambda cls, d: T4))
    env = device.setup(seed=0, needs=("float64",))
    out = capsys.readouterr().out.splitlines()
    assert env.amp_dtype == torch.float16
    assert out[0].startswith("Running on CUDA GPU Tesla T4 (compute capability 7.5")
    assert out[1] == limits_sentence(T4) + "."


def test_kaggles_two_t4s_run_lesson_06s_ranks_on_both_with_nccl():
    two = T4.with_(gpu_count=2)
    assert dist_backend(two, 2) == "nccl" and torchrun_ranks(two) == 2
    assert ranks_sentence(two, 2) == "2 ranks on 2 GPUs, backend nccl"
    assert start_method(two, "nccl") == "forkserver"
    assert dist_backend(T4, 2) == "gloo"  # Colab's one T4: CPU ranks


# --------------------------------------------------------------------------------------------
# Every lesson in classic Notebook 6.5.7 (ipywidgets 7's front end, as Colab's), from a bare
# Colab-profile kernel


#: The lesson that ends its Colab-profile run with ``check_my_work()`` (see the module).
CHECKED_LESSON = "01-number-formats"


def _prepared(lesson: str) -> tuple[nbformat.NotebookNode, dict[str, int]]:
    """The lesson's solution as ``check_my_work`` runs it (hidden-test regions removed), in
    the Colab-profile kernel, with cells of the test's own: the installed packages before and
    after the setup cell, which torch the kernel sees, and for :data:`CHECKED_LESSON`
    ``check_my_work()`` at the end. Returns it and the indices of those cells."""
    nb = nbformat.read(SOLUTIONS / lesson / f"{lesson}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = HIDDEN.sub("", cell.source)
    nb.metadata["kernelspec"] = {"name": hosted.KERNEL, "display_name": "Colab profile"}
    at = nb.cells.index(hosted.setup_cell(nb))
    torch_view = nbformat.v4.new_code_cell(
        "import torch.nn.functional as _F\n"
        "print('OLDER_TORCH', getattr(_F.scaled_mm, '__course_older_torch__', False))"
    )
    before, after = (nbformat.v4.new_code_cell(hosted.INVENTORY) for _ in range(2))
    nb.cells[at : at + 1] = [before, nb.cells[at], after, torch_view]
    if lesson == CHECKED_LESSON:
        nb.cells.append(
            nbformat.v4.new_code_cell(
                "from course.selfcheck import check_my_work\nchecked = check_my_work()\n"
                "print('CHECKED', [(r.exercise, r.status) for r in checked])"
            )
        )
    return nb, {"before": at, "setup": at + 1, "after": at + 2, "torch": at + 3, "check": -1}


def _keep(nb: nbformat.NotebookNode, lesson: str) -> None:
    """Keep the executed notebook for a person to read: test-artifacts/hosted/LESSON.ipynb."""
    folder = hosted.ROOT / "test-artifacts" / "hosted"
    folder.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, folder / f"{lesson}.ipynb")


def _record_time(lesson: str, seconds: dict[str, float]) -> None:
    out = hosted.ROOT / "test-artifacts" / "hosted-times.json"
    out.parent.mkdir(exist_ok=True)
    times = json.loads(out.read_text()) if out.is_file() else {}
    times[lesson] = seconds
    out.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")


@pytest.fixture(scope="module")
def classic_notebook(tmp_path_factory):
    """Notebook 6.5.7 of ``.venv-colab/`` on a loopback port over a work folder, with the
    Colab-profile kernel (torch 2.11's view, ``COURSE_QUICK`` set: lesson 09 trains a few
    steps) whose ``COURSE_SITE_URL`` is a loopback copy of the site's ``pkg/``."""
    from grader.hub import free_port
    from tests.conftest import serving

    root = tmp_path_factory.mktemp("colab")
    hosted.ensure_venv()
    hosted.uninstall_course()
    hosted.build_site(root / "site")
    work = root / "work"
    work.mkdir()
    port, token = free_port(), "hosted-test"
    with serving_folder(root / "site") as url:
        jupyter = hosted.write_kernel(root / "jupyter", url)
        env = dict(os.environ, JUPYTER_PATH=str(jupyter), HOME=str(root))
        env["JUPYTER_CONFIG_DIR"] = str(root / "config")
        env["JUPYTER_RUNTIME_DIR"] = str(root / "runtime")
        cmd = [str(hosted.PYTHON), "-m", "notebook", "--no-browser", "--ip=127.0.0.1"]
        cmd += [f"--port={port}", f"--NotebookApp.token={token}", "--allow-root"]
        cmd += [f"--NotebookApp.notebook_dir={work}"]
        with serving(cmd, port, root / "notebook.log", "Notebook 6.5.7", 120, env=env, cwd=work):
            yield types.SimpleNamespace(url=f"http://127.0.0.1:{port}", token=token, work=work)
    hosted.uninstall_course()


#: Run All is over: the last cell has run, or a cell raised (Notebook 6 then skips the rest).
_RUN_OVER = """() => {
    const cells = Jupyter.notebook.get_cells().filter(c => c.cell_type === 'code');
    const raised = cells.some(c => c.output_area.outputs.some(o => o.output_type === 'error'));
    return raised || typeof cells[cells.length - 1].input_prompt_number === 'number';
}"""


def _wait_for_widget_manager(page, console: list[str], timeout: float = 120.0) -> None:
    """Wait until ipywidgets 7's notebook manager has looked for the kernel's widgets.

    Made with the kernel, the manager first asks the kernel's ``jupyter.widget.control`` comm
    for every widget's state; ipywidgets 7.7.1 in the kernel has no such comm, so it logs a
    warning and asks for the list of comms instead (``comm_info_request``), creating a model for
    each widget comm it finds. A widget the lesson creates meanwhile is made twice and fails
    ("Could not create a model"). So: wait for the warning, then for the reply to a
    ``comm_info_request`` of our own, which the kernel answers after the manager's."""
    page.wait_for_function(
        "() => Jupyter.notebook.kernel && Jupyter.notebook.kernel.widget_manager",
        timeout=timeout * 1000,
    )
    deadline = time.monotonic() + timeout
    while not any("jupyter.widget.control" in line for line in console):
        assert time.monotonic() < deadline, "the widget manager never asked the kernel"
        page.wait_for_timeout(200)
    page.evaluate(
        "() => new Promise(done => Jupyter.notebook.kernel.send_shell_message("
        "'comm_info_request', {}, {shell: {reply: done}}))"
    )


#: How to operate each lesson's main widget, where the first control found is not it.
WIDGET_ACTION: dict[str, str] = {"09-capstone": "button"}
#: The controls the test knows how to operate in ipywidgets 7, in the order it looks for them
#: (the lesson's main widget is the first of them, but where WIDGET_ACTION says otherwise).
CLASSIC_CONTROLS = {
    "slider": ".widget-hslider .ui-slider-handle",
    "dropdown": ".widget-dropdown select",
    "toggle": ".widget-toggle-buttons button:not(.mod-active)",
    "button": "button.jupyter-button:has-text('Run')",
}


def _operate_classic(page, lesson: str) -> tuple[str, str]:
    """Operate the lesson's widget as a person would; its cell's output text before and after."""
    action = WIDGET_ACTION.get(lesson) or next(
        (a for a, sel in CLASSIC_CONTROLS.items() if page.locator(sel).count()), None
    )
    assert action, f"{lesson}: no widget control found on the page"
    selector = CLASSIC_CONTROLS[action]
    control = page.locator(selector).first
    cell = page.locator(".cell.code_cell", has=page.locator(selector)).first
    outputs = cell.locator(".output_wrapper").first
    control.scroll_into_view_if_needed()
    before = outputs.inner_html()
    if action == "slider":  # three steps right with the keyboard
        control.focus()
        for _ in range(3):
            page.keyboard.press("ArrowRight")
    elif action == "dropdown":
        chosen = control.input_value()
        other = next(o for o in control.locator("option").all_inner_texts() if o != chosen)
        control.select_option(label=other)
    else:
        control.click()
    page.wait_for_function(
        "([el, before]) => el.innerHTML !== before && !el.innerText.includes('Running')",
        arg=[outputs.element_handle(), before],
        timeout=300_000,
        polling=500,
    )
    time.sleep(1.0)
    return before, outputs.inner_html()


def _executed(page) -> nbformat.NotebookNode:
    """The notebook as the front end holds it now, outputs included."""
    return nbformat.reads(json.dumps(page.evaluate("() => Jupyter.notebook.toJSON()")), 4)


def _raised(nb: nbformat.NotebookNode) -> list[str]:
    return [
        "\n".join(o.get("traceback", [])[-3:])[-1500:]
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.get("output_type") == "error"
    ]


@pytest.mark.browser
@pytest.mark.lesson
@pytest.mark.xdist_group("hosted")
@pytest.mark.parametrize("lesson", LESSON_IDS)
def test_lesson_runs_on_the_colab_profile_and_its_widget_responds(
    lesson, classic_notebook, browser, shots
):
    """In Notebook 6.5.7 in headless Chromium, from a Colab-profile kernel without the course:
    Run All (the setup cell installs the course from the loopback site and nothing else; the
    other packages stay as they were), no cell raises, no widget fails to render, the lesson's
    widget responds when operated, and (lesson 01) ``check_my_work()`` passes every exercise."""
    hosted.uninstall_course()
    nb, at = _prepared(lesson)
    folder = classic_notebook.work / lesson
    folder.mkdir()
    nbformat.write(nb, folder / f"{lesson}.ipynb")
    started = time.monotonic()
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    console: list[str] = []
    page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
    shot = shots / f"colab-profile-{lesson}.png"
    executed = nb
    try:
        page.goto(
            f"{classic_notebook.url}/notebooks/{lesson}/{lesson}.ipynb"
            f"?token={classic_notebook.token}",
            timeout=120_000,
        )
        page.wait_for_function(
            "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel "
            "&& Jupyter.notebook.kernel.is_connected()",
            timeout=120_000,
        )
        _wait_for_widget_manager(page, console)
        page.evaluate("() => Jupyter.notebook.execute_all_cells()")
        page.wait_for_function(_RUN_OVER, timeout=1_200_000, polling=1000)
        ran_s = time.monotonic() - started
        executed = _executed(page)
        raised = _raised(executed)
        assert not raised, f"{lesson}: cells raised on the Colab profile:\n" + "\n".join(raised)
        texts = page.locator(".output_area").all_inner_texts()
        assert not any("Error displaying widget" in t for t in texts), f"{lesson}: a widget failed"
        before, after = _operate_classic(page, lesson)
        assert before != after, f"{lesson}: the widget's output did not change"
        page.screenshot(path=str(shot))
        page.evaluate("() => Jupyter.notebook.session.delete()")  # stop its kernel
    except BaseException as exc:
        try:
            page.screenshot(path=str(shot))
        except Exception:  # noqa: BLE001 - the page may be gone
            pass
        _keep(executed, lesson)
        (shots / f"colab-profile-{lesson}.console").write_text("\n".join(console + errors))
        raise AssertionError(f"{lesson} on the Colab profile: {exc}\nscreenshot: {shot}") from exc
    finally:
        page.close()
        hosted.uninstall_course()
    _keep(executed, lesson)
    cells = executed.cells
    old, new = hosted.inventory(cells[at["before"]]), hosted.inventory(cells[at["after"]])
    assert hosted.DIST not in old, "the course was installed before the setup cell ran"
    assert "Installed the course's helper package from http://127.0.0.1" in "".join(
        o.get("text", "") for o in cells[at["setup"]].outputs
    )
    assert set(new) - set(old) == {hosted.DIST}, "the setup cell installed more than the course"
    changed = {name for name in old if new.get(name) != old[name]}
    assert not changed, f"the setup cell changed {sorted(changed)}"
    for name in hosted.KEPT:
        assert name in old, f"{name} should be in the Colab profile"
    printed = "".join(o.get("text", "") for o in cells[at["torch"]].outputs)
    assert "OLDER_TORCH True" in printed, "the kernel should see torch as 2.11 does"
    if lesson == CHECKED_LESSON:
        text = "".join(
            o.get("text", "") for o in cells[-1].outputs if o.get("output_type") == "stream"
        )
        listed = re.search(r"CHECKED (\[.*\])", text)
        assert listed, text[-3000:]
        statuses = ast.literal_eval(listed.group(1))
        assert statuses and all(s == "passed" for _, s in statuses), text[-3000:]
    assert not [e for e in errors if "widget" in e.lower()], errors
    _record_time(
        lesson, {"run all": round(ran_s, 1), "total": round(time.monotonic() - started, 1)}
    )
