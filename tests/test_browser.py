"""The course in a real browser: JupyterLab on loopback, driven by headless Chromium.

JupyterLab is launched as ``python3 run.py lab`` launches it (run.py's ``lab_env``). For the
lessons in :data:`LIVE`, in the student's view: open the solution notebook and see it is not
marked modified, run all cells (no news prompt), operate the lesson's widget and see its plot or
table change, and save a screenshot. (Every lesson's widget is operated live in classic Notebook
6.5.7 by tests/test_hosted.py, drawn from its stored state by ipywidgets 8's manager on every
site page by tests/test_site.py, and driven through its Python controls by each topic's tests;
JupyterLab runs the lessons whose controls differ in kind, which is what its front end draws.)
On lesson 01, press nbgrader's Validate and read the verdict. Then the two views on
the released lesson 01: the student's (``run.py lab``) has nbgrader's Validate and assignment list
and nothing of the instructor's, not even /formgrader on the server; the instructor's
(``run.py lab --instructor``) has Create Assignment, Formgrader and the course list. Screenshots
go to $COURSE_TEST_ARTIFACTS/screenshots (default test-artifacts/).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib.util
import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import pytest

from grader import REPO_ROOT
from grader.hub import free_port
from tests.conftest import serving

#: The lessons run live in JupyterLab: one per kind of control the course's widgets use there
#: (an integer slider and nbgrader's Validate; toggle buttons; a log slider with a dropdown; a
#: selection slider with a dropdown). Each costs a whole run of its lesson in the browser.
LIVE = ("01-number-formats", "03-autocast", "04-batchnorm", "05-accumulation")
VALIDATE_LESSONS = {"01-number-formats"}
#: The released lesson the view tests open, as a student gets it.
RELEASED = "01-number-formats"
#: nbgrader's JupyterLab plugins in each view.
NBGRADER = "@jupyter/nbgrader:"
STUDENT_PLUGINS = {NBGRADER + p for p in ("menu", "assignment-list", "validate-assignment")}
INSTRUCTOR_PLUGINS = STUDENT_PLUGINS | {
    NBGRADER + p for p in ("create-assignment", "formgrader", "course-list")
}
NEWS_PROMPT = "Would you like to get notified about official Jupyter news?"
RUN_TIMEOUT_MS = 600_000

#: Each lesson's browser run shares the xdist group of that lesson's grading tests, so lessons
#: (not one long browser queue) are what the workers share out; each worker starts its own
#: JupyterLab and Chromium (session fixtures) the first time it needs them.
pytestmark = [pytest.mark.browser]
VIEWS = pytest.mark.xdist_group(name="browser-views")


def _load_run_py():
    """The repository's run.py as a module: the lab views are launched as it launches them."""
    spec = importlib.util.spec_from_file_location("course_run_py", REPO_ROOT / "run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start_lab(root: Path, instructor: bool):
    """JupyterLab on a free loopback port over ``root``, configured as ``run.py lab`` does."""
    port = free_port()
    token = secrets.token_hex(16)
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env = _load_run_py().lab_env(instructor, env)
    name = "instructor" if instructor else "student"
    cmd = [
        sys.executable,
        "-m",
        "jupyter",
        "lab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        "--LabApp.expose_app_in_browser=True",
        "--ServerApp.port_retries=0",
        # Empty settings and workspaces of its own: the course's defaults are what is tested,
        # and nothing is read from or left in ~/.jupyter.
        f"--LabApp.user_settings_dir={root / f'.settings-{name}'}",
        f"--LabApp.workspaces_dir={root / f'.workspaces-{name}'}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log = root / f"jupyter-{name}.log"
    with serving(cmd, port, log, "JupyterLab", 120, cwd=root, env=env):
        yield f"http://127.0.0.1:{port}", token


@pytest.fixture(scope="session")
def course_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch copy of the course: every solution notebook, and lesson 01 as released."""
    root = tmp_path_factory.mktemp("lab")
    (root / "grader").mkdir()
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", root)
    shutil.copy2(REPO_ROOT / "grader" / "nbgrader_config.py", root / "grader")
    for lesson in LIVE:
        shutil.copytree(REPO_ROOT / "solutions" / lesson, root / lesson)
    shutil.copytree(REPO_ROOT / "lessons" / RELEASED, root / "lessons" / RELEASED)
    return root


@pytest.fixture(scope="session")
def lab(course_copy: Path):
    """The student's view (``python3 run.py lab``)."""
    yield from _start_lab(course_copy, instructor=False)


@pytest.fixture(scope="session")
def instructor_lab(course_copy: Path):
    """The instructor's view (``python3 run.py lab --instructor``)."""
    yield from _start_lab(course_copy, instructor=True)


def _open(page, url: str, token: str, path: str, workspace: str) -> None:
    """Open the notebook at ``path`` and wait until its kernel is idle (it has replied with its
    kernel info, which is when JupyterLab rewrites metadata that differs from the kernel's)."""
    page.goto(f"{url}/lab/workspaces/{workspace}/tree/{path}?reset&token={token}")
    page.wait_for_function(
        "window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')", timeout=120_000
    )
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            const kernel = w && w.sessionContext && w.sessionContext.session
              && w.sessionContext.session.kernel;
            return kernel && kernel.status === 'idle';
        }""",
        timeout=120_000,
        polling=500,
    )
    page.wait_for_timeout(3000)


def _modified(page) -> bool:
    """Whether the notebook on show is marked modified (its model, or its tab's dot)."""
    return page.evaluate(
        """() => window.jupyterapp.shell.currentWidget.context.model.dirty
                 || !!document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')"""
    )


def _view(page) -> dict:
    """What a person sees of nbgrader and JupyterLab's prompts in the page."""
    page.locator("#jp-menu-panel .lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    page.wait_for_selector("#jp-mainmenu-nbgrader", timeout=10_000)
    menu = page.locator("#jp-mainmenu-nbgrader .lm-Menu-itemLabel:visible").all_inner_texts()
    page.keyboard.press("Escape")
    return page.evaluate(
        """(menu) => ({
            plugins: window.jupyterapp.listPlugins().filter(
                p => p.startsWith('@jupyter/nbgrader:') && window.jupyterapp.isPluginActivated(p)),
            sidebars: [...document.querySelectorAll('.jp-SideBar .lm-TabBar-tab')]
              .map(t => t.title || t.innerText),
            validate: [...document.querySelectorAll('.jp-NotebookPanel-toolbar')]
              .some(t => t.innerText.includes('Validate')),
            menu: menu.filter(t => t.trim()),
            text: document.body.innerText,
        })""",
        menu,
    )


def _run_all(page) -> None:
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        """() => {
            const panel = [...document.querySelectorAll('.jp-NotebookPanel')]
              .find(p => p.offsetParent !== null);
            if (!panel) return false;
            const prompts = [...panel.querySelectorAll('.jp-CodeCell .jp-InputArea-prompt')]
              .map(e => e.textContent.trim());
            return prompts.length > 0 && prompts.every(t => /^\\[\\d+\\]:$/.test(t));
        }""",
        timeout=RUN_TIMEOUT_MS,
        polling=1000,
    )


def _panel(page):
    """The notebook panel on show (JupyterLab keeps hidden panels in the page)."""
    return page.locator(".jp-NotebookPanel:visible").first


#: The controls the test knows how to operate, in the order it looks for them.
CONTROLS = {
    "slider": ".widget-slider",
    "dropdown": ".widget-dropdown select",
    "toggle": ".widget-toggle-buttons button.jupyter-button:not(.mod-active)",
    "button": "button.jupyter-button:has-text('Run')",
}


def _widget_cell(page, action: str):
    selector = CONTROLS[action]
    panel = _panel(page)
    control = panel.locator(selector).first
    cell = panel.locator(".jp-CodeCell", has=page.locator(selector)).first
    return control, cell


def _operate(page, lesson: str) -> tuple[str, str]:
    """Operate the lesson's widget; returns its cell's output HTML before and after."""
    action = next((a for a, sel in CONTROLS.items() if _panel(page).locator(sel).count()), None)
    assert action, f"{lesson}: no widget control found on the page"
    control, cell = _widget_cell(page, action)
    control.scroll_into_view_if_needed()
    outputs = cell.locator(".jp-Cell-outputArea").first
    before = outputs.inner_html()
    if action == "slider":
        readout = cell.locator(".widget-readout").first
        current = readout.inner_text().strip()
        readout.click()
        page.keyboard.press("Control+A")
        try:
            new = str(int(float(current)) + 3)
        except ValueError:
            new = "1"
        page.keyboard.type(new)
        page.keyboard.press("Enter")
    elif action == "dropdown":
        options = control.locator("option").all_inner_texts()
        chosen = control.input_value()
        other = next(o for o in options if o != chosen)
        control.select_option(label=other)
    else:  # a toggle to another choice, or a run button
        control.click()
    handle = outputs.element_handle()
    page.wait_for_function(
        "([el, before]) => el.innerHTML !== before && !el.innerHTML.includes('Running')",
        arg=[handle, before],
        timeout=RUN_TIMEOUT_MS,
        polling=500,
    )
    time.sleep(1.0)
    return before, outputs.inner_html()


def _validate(page) -> str:
    _panel(page).locator(".jp-NotebookPanel-toolbar").get_by_text("Validate", exact=True).click()
    dialog = page.locator(".jp-Dialog-content")
    dialog.wait_for(timeout=RUN_TIMEOUT_MS)
    page.wait_for_function(
        "() => !document.querySelector('.jp-Dialog-content').innerText.includes('Validating')",
        timeout=RUN_TIMEOUT_MS,
    )
    return dialog.inner_text()


@pytest.mark.parametrize(
    "lesson", [pytest.param(lesson, marks=pytest.mark.xdist_group(lesson)) for lesson in LIVE]
)
def test_lesson_runs_and_its_widget_responds_in_jupyterlab(lab, browser, shots, lesson):
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    shot = shots / f"{lesson}.png"
    started = time.monotonic()
    try:
        _open(page, url, token, f"{lesson}/{lesson}.ipynb", lesson)
        assert not _modified(page), f"{lesson}: marked modified on opening, before any edit"
        _run_all(page)
        assert NEWS_PROMPT not in page.locator("body").inner_text(), "the news prompt showed"
        stderr = (
            _panel(page)
            .locator(".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")
            .all_inner_texts()
        )
        raised = [t[:300] for t in stderr if "Traceback" in t or "Error" in t]
        assert not raised, f"{lesson}: cells raised in the browser: {raised}"
        before, after = _operate(page, lesson)
        assert before != after, f"{lesson}: the widget's output did not change"
        page.screenshot(path=str(shot))
        if lesson in VALIDATE_LESSONS:
            verdict = _validate(page)
            assert "Success" in verdict and "passes all the tests" in verdict, verdict
        print(
            f"{lesson}: ran, widget responded, screenshot {shot} "
            f"({time.monotonic() - started:.0f} s)"
        )
    except Exception as exc:
        try:
            page.screenshot(path=str(shot))
        except Exception:  # noqa: BLE001 - the page may be gone
            pass
        console = "\n".join(errors[-20:]) or "(none)"
        raise AssertionError(
            f"{lesson} failed in the browser: {exc}\nscreenshot: {shot}\n"
            f"browser console errors:\n{console}"
        ) from exc
    finally:
        page.close()


def _page(browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page, errors


@VIEWS
def test_student_view_has_validate_and_the_assignment_list_only(lab, browser, shots):
    """``run.py lab``: no instructor panels, no news prompt, a lesson opens unmodified."""
    url, token = lab
    page, errors = _page(browser)
    try:
        _open(page, url, token, f"lessons/{RELEASED}/{RELEASED}.ipynb", "student")
        assert not _modified(page), f"{RELEASED} is marked modified on opening, before any edit"
        view = _view(page)
        page.screenshot(path=str(shots / "view-student.png"))
        assert set(view["plugins"]) == STUDENT_PLUGINS, view["plugins"]
        assert view["validate"], "no Validate button on the notebook's toolbar"
        assert view["menu"] == ["Assignment List"], view["menu"]
        assert not any("Create Assignment" in t for t in view["sidebars"]), view["sidebars"]
        assert NEWS_PROMPT not in view["text"], "the Jupyter news prompt showed"
        # The instructor's server side is off too: no formgrader pages for students.
        status = page.request.get(f"{url}/formgrader?token={token}").status
        assert status == 404, f"/formgrader answered {status} in the student's view"
        assert not errors, errors
    finally:
        page.close()


@VIEWS
def test_instructor_view_has_nbgraders_panels(instructor_lab, browser, shots):
    """``run.py lab --instructor``: Create Assignment and Formgrader, still no news prompt."""
    url, token = instructor_lab
    page, errors = _page(browser)
    try:
        _open(page, url, token, f"lessons/{RELEASED}/{RELEASED}.ipynb", "instructor")
        assert not _modified(page), f"{RELEASED} is marked modified on opening, before any edit"
        view = _view(page)
        page.screenshot(path=str(shots / "view-instructor.png"))
        assert set(view["plugins"]) == INSTRUCTOR_PLUGINS, view["plugins"]
        assert view["validate"], "no Validate button on the notebook's toolbar"
        for item in ("Assignment List", "Formgrader", "Create assignment"):
            assert item in view["menu"], view["menu"]
        assert any("Create Assignment" in t for t in view["sidebars"]), view["sidebars"]
        assert NEWS_PROMPT not in view["text"], "the Jupyter news prompt showed"
        status = page.request.get(f"{url}/formgrader?token={token}").status
        assert status == 200, f"/formgrader answered {status} in the instructor's view"
        assert not errors, errors
    finally:
        page.close()


def _run_async(coroutine):
    """Run ``coroutine`` on a thread of its own: Playwright's loop may be running on this one."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


@VIEWS
def test_lab_views_config_without_a_browser(tmp_path):
    """The two views' config folders, and the served language_info, checked without Chromium."""
    from traitlets.config.loader import PyFileConfigLoader

    run_py = _load_run_py()
    student = run_py.lab_env(False, {"PATH": "/usr/bin"})["JUPYTER_CONFIG_PATH"].split(os.pathsep)
    instructor = run_py.lab_env(True, {})["JUPYTER_CONFIG_PATH"].split(os.pathsep)
    jupyter = REPO_ROOT / "jupyter"
    assert student == [str(jupyter / "student"), str(jupyter / "common")]
    assert instructor == [str(jupyter / "common")]
    page = json.loads((jupyter / "student" / "labconfig" / "page_config.json").read_text())
    assert {p for p, off in page["disabledExtensions"].items() if off} == (
        INSTRUCTOR_PLUGINS - STUDENT_PLUGINS
    )

    config = PyFileConfigLoader(
        "jupyter_server_config.py", path=str(jupyter / "common")
    ).load_config()
    manager_class = config.ServerApp.contents_manager_class
    from ipykernel.ipkernel import IPythonKernel

    released = REPO_ROOT / "lessons" / RELEASED / f"{RELEASED}.ipynb"
    shutil.copy2(released, tmp_path / "lesson.ipynb")
    other = json.loads(released.read_text())
    other["metadata"]["language_info"] = {"name": "python", "version": "2.7.18"}
    (tmp_path / "other.ipynb").write_text(json.dumps(other))
    from nbformat.sign import MemorySignatureStore, NotebookNotary

    manager = manager_class(root_dir=str(tmp_path))
    # The default notary keeps a SQLite file in the user's data folder, usable only from the
    # thread that opened it: both reads run in one event loop on one thread, the store in memory.
    manager.notary = NotebookNotary(store_factory=MemorySignatureStore)

    async def read_both():
        return await manager.get("lesson.ipynb"), await manager.get("other.ipynb")

    lesson, other_model = _run_async(read_both())
    served = lesson["content"]["metadata"]["language_info"]
    assert served == IPythonKernel.language_info, served
    # A notebook saved by another Python keeps what it says (JupyterLab will show the change).
    kept = other_model["content"]["metadata"]["language_info"]
    assert kept == {"name": "python", "version": "2.7.18"}
    assert (tmp_path / "lesson.ipynb").read_bytes() == released.read_bytes(), "file rewritten"
