"""The course in a real browser: JupyterLab on loopback, driven by headless Chromium.

For every lesson: open the solution notebook, run all cells, operate the lesson's widget and see
its plot or table change, and save a screenshot. On lesson 01, press nbgrader's Validate and read
the verdict. Screenshots go to $COURSE_TEST_ARTIFACTS/screenshots (default test-artifacts/).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grader import REPO_ROOT
from tests.conftest import LESSON_IDS

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
#: How to operate each lesson's main widget, where the default (first slider) is not it.
WIDGET_ACTION: dict[str, str] = {"09-capstone": "button"}
VALIDATE_LESSONS = {"01-number-formats"}
RUN_TIMEOUT_MS = 600_000

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group(name="browser")]


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required under CI)")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def shots() -> Path:
    base = Path(os.environ.get("COURSE_TEST_ARTIFACTS") or REPO_ROOT / "test-artifacts")
    folder = base / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nscreenshots: {folder}")
    return folder


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory):
    """A JupyterLab server on a free loopback port over a scratch copy of the course."""
    root = tmp_path_factory.mktemp("lab")
    (root / "grader").mkdir()
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", root)
    shutil.copy2(REPO_ROOT / "grader" / "nbgrader_config.py", root / "grader")
    for lesson in LESSON_IDS:
        shutil.copytree(REPO_ROOT / "solutions" / lesson, root / lesson)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = secrets.token_hex(16)
    # Own settings and workspaces: no news prompt, nothing read from or left in ~/.jupyter.
    settings = root / ".lab-settings"
    notification = settings / "@jupyterlab" / "apputils-extension"
    notification.mkdir(parents=True)
    (notification / "notification.jupyterlab-settings").write_text(
        '{"fetchNews": "false", "checkForUpdates": false}'
    )
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    log = open(root / "jupyter.log", "w")  # noqa: SIM115 - closed below
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
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    server = subprocess.Popen(cmd, cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            if server.poll() is not None:
                pytest.fail(f"JupyterLab exited:\n{(root / 'jupyter.log').read_text()[-3000:]}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start within 120 s")
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", token
    finally:
        server.terminate()
        try:
            server.wait(20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()


@pytest.fixture(scope="session")
def browser():
    if not CHROMIUM.exists():
        _missing("Debian's chromium is not installed (apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield b
        b.close()


def _dismiss_news(page) -> None:
    no = page.locator(".jp-Notification-Toast-Close, button:has-text('No')")
    if no.count():
        try:
            no.first.click(timeout=2000)
        except Exception:  # noqa: BLE001 - the toast may vanish by itself
            pass


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
    action = WIDGET_ACTION.get(lesson)
    if action is None:
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


@pytest.mark.parametrize("lesson", LESSON_IDS)
def test_lesson_runs_and_its_widget_responds_in_jupyterlab(lab, browser, shots, lesson):
    url, token = lab
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    shot = shots / f"{lesson}.png"
    started = time.monotonic()
    try:
        page.goto(f"{url}/lab/workspaces/{lesson}/tree/{lesson}/{lesson}.ipynb?reset&token={token}")
        page.wait_for_function(
            "window.jupyterapp && document.querySelector('.jp-Notebook .jp-Cell')",
            timeout=120_000,
        )
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator, .jp-KernelStatus", timeout=120_000)
        page.wait_for_timeout(2000)
        _dismiss_news(page)
        _run_all(page)
        _dismiss_news(page)
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
