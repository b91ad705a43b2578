"""Every lesson on a hosted notebook (Colab, Kaggle), on the runtime's own packages.

The setup cell every lesson opens with is the same in all nine and installs the course's helper
package alone from the site named in pyproject.toml; offline it says what to do. ``check_my_work``
reads a Colab notebook from Colab's front end and, on Kaggle, says how to check a download.

The Colab-profile run (``tests/hosted.py``): a lesson's solution, hidden tests removed, runs
from a kernel of ``.venv-colab/`` (Colab's pins, torch 2.11's view of torch 2.13, the course not
installed); its setup cell installs the course from a loopback copy of the site's ``pkg/``, must
leave torch, numpy, IPython, ipykernel and ipywidgets as they were (and install nothing else),
and the lesson ends with ``check_my_work()``, every exercise passing. The suite runs lesson 01
this way; ``COURSE_HOSTED_ALL=1`` runs all nine (one at a time: ``-n 0``), and each run's
seconds are added to ``test-artifacts/hosted-times.json``.
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
from course.selfcheck import HIDDEN, notebook_client
from tests import hosted
from tests.conftest import LESSON_IDS, LESSONS, SOLUTIONS, serving_folder

#: The lessons the suite runs on the Colab profile (the others with COURSE_HOSTED_ALL=1).
IN_SUITE = ("01-number-formats",)
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
# The Colab-profile run


def _solution_without_hidden_tests(lesson: str) -> nbformat.NotebookNode:
    """The lesson's solution as ``check_my_work`` runs it: hidden-test regions removed."""
    nb = nbformat.read(SOLUTIONS / lesson / f"{lesson}.ipynb", as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = HIDDEN.sub("", cell.source)
    return nb


def _lesson_param(lesson: str):
    marks = [pytest.mark.lesson, pytest.mark.xdist_group("hosted")]
    if lesson not in IN_SUITE:
        marks.append(
            pytest.mark.skipif(
                not os.environ.get("COURSE_HOSTED_ALL"),
                reason="the suite runs lesson 01 on the Colab profile; COURSE_HOSTED_ALL=1 all",
            )
        )
    return pytest.param(lesson, marks=marks)


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


@pytest.mark.parametrize("lesson", [_lesson_param(lesson) for lesson in LESSON_IDS])
def test_lesson_runs_on_the_colab_profile(lesson, tmp_path, monkeypatch):
    started = time.monotonic()
    hosted.ensure_venv()
    hosted.uninstall_course()
    venv_s = time.monotonic() - started
    nb = _solution_without_hidden_tests(lesson)
    setup = hosted.setup_cell(nb)
    at = nb.cells.index(setup)
    before = nbformat.v4.new_code_cell(hosted.INVENTORY)
    after = nbformat.v4.new_code_cell(hosted.INVENTORY)
    torch_view = nbformat.v4.new_code_cell(
        "import torch.nn.functional as _F\n"
        "print('OLDER_TORCH', getattr(_F.scaled_mm, '__course_older_torch__', False))"
    )
    nb.cells[at : at + 1] = [before, setup, after, torch_view]
    check = nbformat.v4.new_code_cell(
        "from course.selfcheck import check_my_work\nchecked = check_my_work()\n"
        "print('CHECKED', [(r.exercise, r.status) for r in checked])"
    )
    nb.cells.append(check)
    work = tmp_path / "work"
    work.mkdir()
    path = work / f"{lesson}.ipynb"
    nbformat.write(nb, path)

    hosted.build_site(tmp_path / "site")
    try:
        with serving_folder(tmp_path / "site") as url:
            monkeypatch.setenv("JUPYTER_PATH", str(hosted.write_kernel(tmp_path / "jupyter", url)))
            run_started = time.monotonic()
            client = notebook_client(
                nb,
                timeout=1800,
                kernel_name=hosted.KERNEL,
                resources={"metadata": {"path": str(work)}},
            )
            client.execute()
            run_s = time.monotonic() - run_started
    except BaseException:
        _keep(nb, lesson)
        raise
    finally:
        hosted.uninstall_course()
    _keep(nb, lesson)
    old, new = hosted.inventory(before), hosted.inventory(after)
    assert hosted.DIST not in old, "the course was installed before the setup cell ran"
    assert "Installed the course's helper package from http://127.0.0.1" in "".join(
        o.get("text", "") for o in setup.outputs
    )
    assert set(new) - set(old) == {hosted.DIST}, "the setup cell installed more than the course"
    changed = {name for name in old if new.get(name) != old[name]}
    assert not changed, f"the setup cell changed {sorted(changed)}"
    for name in hosted.KEPT:
        assert name in old, f"{name} should be in the Colab profile"
    printed = "".join(o.get("text", "") for o in torch_view.outputs)
    assert "OLDER_TORCH True" in printed, "the kernel should see torch as 2.11 does"
    text = "".join(o.get("text", "") for o in check.outputs if o.get("output_type") == "stream")
    listed = re.search(r"CHECKED (\[.*\])", text)
    assert listed, text[-3000:]
    statuses = ast.literal_eval(listed.group(1))
    assert statuses and all(s == "passed" for _, s in statuses), text[-3000:]
    _record_time(lesson, {"venv": round(venv_s, 1), "lesson and check": round(run_s, 1)})


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
# A widget in classic Notebook 6.5.7 (ipywidgets 7's front end, as Colab's)

#: The last cell of the notebook, once it has run, says the run is over.
_ALL_RAN = """() => {
    const cells = Jupyter.notebook.get_cells().filter(c => c.cell_type === 'code');
    const last = cells[cells.length - 1];
    return typeof last.input_prompt_number === 'number';
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


@pytest.mark.browser
@pytest.mark.xdist_group("hosted")
def test_lesson_01_widget_responds_in_classic_notebook(tmp_path, browser, shots):
    """Lesson 01 from a bare Colab-profile kernel in Notebook 6.5.7 with ipywidgets 7.7.1's
    front end, in headless Chromium: Run All (its setup cell installs the course from the
    loopback site), then the loss-scale slider, moved with the keyboard, changes the fractions
    the widget prints; no widget fails to render."""
    from tests.conftest import free_port, serving

    lesson = "01-number-formats"
    hosted.ensure_venv()
    hosted.uninstall_course()
    nb = _solution_without_hidden_tests(lesson)
    nb.metadata["kernelspec"] = {"name": hosted.KERNEL, "display_name": "Colab profile"}
    work = tmp_path / "work"
    work.mkdir()
    nbformat.write(nb, work / f"{lesson}.ipynb")
    hosted.build_site(tmp_path / "site")
    port, token = free_port(), "hosted-test"
    try:
        with serving_folder(tmp_path / "site") as url:
            jupyter = hosted.write_kernel(tmp_path / "jupyter", url)
            env = dict(os.environ, JUPYTER_PATH=str(jupyter), HOME=str(tmp_path))
            env["JUPYTER_CONFIG_DIR"] = str(tmp_path / "config")
            env["JUPYTER_RUNTIME_DIR"] = str(tmp_path / "runtime")
            cmd = [str(hosted.PYTHON), "-m", "notebook", "--no-browser", "--ip=127.0.0.1"]
            cmd += [f"--port={port}", f"--NotebookApp.token={token}", "--allow-root"]
            cmd += [f"--NotebookApp.notebook_dir={work}"]
            log = tmp_path / "notebook.log"
            with serving(cmd, port, log, "Notebook 6.5.7", 120, env=env, cwd=work):
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                console: list[str] = []
                page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
                try:
                    page.goto(
                        f"http://127.0.0.1:{port}/notebooks/{lesson}.ipynb?token={token}",
                        timeout=120_000,
                    )
                    page.wait_for_function(
                        "() => window.Jupyter && Jupyter.notebook && Jupyter.notebook.kernel "
                        "&& Jupyter.notebook.kernel.is_connected()",
                        timeout=120_000,
                    )
                    _wait_for_widget_manager(page, console)
                    page.evaluate("() => Jupyter.notebook.execute_all_cells()")
                    page.wait_for_function(_ALL_RAN, timeout=900_000, polling=1000)
                    page.screenshot(path=str(shots / "hosted-notebook6-01-ran.png"))
                    (shots / "hosted-notebook6-01.html").write_text(page.content())
                    (shots / "hosted-notebook6-01.console").write_text("\n".join(console + errors))
                    outputs = page.locator(".output_area").all_inner_texts()
                    assert not any("Error displaying widget" in o for o in outputs)
                    assert any("Installed the course's helper package" in o for o in outputs)
                    slider = page.locator(".widget-hslider .ui-slider-handle").first
                    slider.scroll_into_view_if_needed()
                    stats = slider.locator("xpath=ancestor::div[contains(@class, 'widget-vbox')]")
                    html = stats.first.locator(".widget-html-content").first
                    before = html.inner_text()
                    assert "underflow" in before and "overflow" in before
                    plot = stats.first.locator("img").first
                    plot_before = plot.get_attribute("src")
                    slider.focus()
                    for _ in range(12):
                        page.keyboard.press("ArrowRight")
                    # Twelve steps right: log2(scale) 0 -> 12, the scale 4096.
                    page.wait_for_function(
                        "(el) => el.innerText.includes('= 4096')",
                        arg=html.element_handle(),
                        timeout=120_000,
                    )
                    after = html.inner_text()
                    page.wait_for_function(
                        "([img, old]) => img.getAttribute('src') !== old",
                        arg=[plot.element_handle(), plot_before],
                        timeout=120_000,
                    )
                    page.screenshot(path=str(shots / "hosted-notebook6-01.png"), full_page=False)
                finally:
                    page.close()
    finally:
        hosted.uninstall_course()
    assert "= 4096" in after and after != before
    assert not [e for e in errors if "widget" in e.lower()], errors
