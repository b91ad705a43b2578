"""The class on JupyterHub, end to end: ``python -m grader hub`` and two students in Chromium.

The hub command is started on a free loopback port with a two-student roster (ids that are not
Unix names: capitals, ``@ . +``, a leading digit) and accounts made for this test (a random
prefix); its class environment (``--prefix``), exchange and state are in a temporary folder.
Accounts and folder are removed afterwards, even on failure, and the checkout's mode (which the
command narrows) is put back. Everyone logs in through JupyterHub's PAM authenticator with the
passwords the command set. The instructor sees lesson 01 released (formgrader) and the idle
culler running; each student, in their own browser context, fetches the lesson from the
Assignment List, fills in one exercise (one right, one wrong), one of them presses Validate, both
submit. The instructor (their own Unix account, the class environment) runs ``intake
--exchange``, ``calibrate``, sandboxed ``autograde`` (with the calibrated limits), ``feedback``
with nbgrader's ``release_feedback`` and ``export`` (roster ids); each student fetches their
feedback and sees their own score and messages, not the other's. Then the isolation: from a
student's account, another student's files, the instructor's course directory (solutions, hidden
tests, gradebook, grading key, grades), the exchange's inbound listing and another user's server
URL are all refused. Last, the command runs again with one student removed and one added: it
restarts the hub, the removed student's password and earlier session are refused, the added
student logs in. Screenshots go to $COURSE_TEST_ARTIFACTS/screenshots (default
test-artifacts/screenshots, where the hub-*.png are kept in git).
"""

from __future__ import annotations

import csv
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nbformat
import psutil
import pytest

from grader import REPO_ROOT
from grader.hub import NODE_MIN, free_port, hub_name

pytestmark = [pytest.mark.browser, pytest.mark.xdist_group("hub")]

LESSON = "01-number-formats"
EXERCISE = "fp16_bits"  # 2 points
RIGHT = """def fp16_bits(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return bits >> 15, (bits >> 10) & 0x1F, bits & 0x3FF
"""
WRONG = """def fp16_bits(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    bits = x.view(torch.int16).to(torch.int32) & 0xFFFF
    return bits >> 15, (bits >> 10) & 0x1F, bits & 0x1FF
"""
TIMES: dict[str, float] = {}
_MARK = [time.monotonic()]


def _phase(name: str) -> None:
    """Record how long the step that just ended took."""
    now = time.monotonic()
    TIMES[name] = TIMES.get(name, 0.0) + now - _MARK[0]
    _MARK[0] = now


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"{reason} (required under CI)")
    pytest.skip(reason)


def _prerequisites() -> None:
    if os.geteuid() != 0:
        _missing("the class hub makes Unix accounts: it needs root")
    for tool in ("useradd", "userdel", "chpasswd", "runuser", "node", "npm"):
        if not shutil.which(tool):
            _missing(f"{tool} is not installed (the hub needs it)")
    out = subprocess.run(["node", "--version"], capture_output=True, text=True).stdout
    if int(re.match(r"v?(\d+)", out).group(1)) < NODE_MIN:
        _missing(f"node {out.strip()} is older than {NODE_MIN}")
    if not Path("/usr/bin/python3").exists():
        _missing("no system Python at /usr/bin/python3 for the class environment")
    if not shutil.which("bwrap"):
        _missing("bubblewrap is not installed (the sandboxed autograde)")


def _remove_accounts(users: list[str]) -> None:
    """Stop every process of the test's accounts (by pid) and delete them with their homes."""
    uids = set()
    for user in users:
        try:
            uids.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            pass
    for _ in range(3):
        procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real in uids]
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        if not procs:
            break
        psutil.wait_procs(procs, timeout=5)
    for user in users:
        subprocess.run(["userdel", "--remove", "--force", user], capture_output=True)


def _launch(cmd: list[str], log_path: Path, url: str) -> subprocess.Popen:
    """Start the hub command (its output to ``log_path``) and wait until the hub it started says
    it runs and answers (a hub started before may answer until the command stops it)."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            cmd, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None:
            pytest.fail(f"the hub command exited {proc.returncode}:\n{log_path.read_text()}")
        text = log_path.read_text()
        if "EADDRINUSE" in text:  # the proxy could not listen: the hub would never answer
            _stop(proc)
            pytest.fail(f"the hub's proxy could not listen on its port:\n{text[-4000:]}")
        try:
            if "JupyterHub is now running at" in text:
                with urllib.request.urlopen(f"{url}/hub/health", timeout=2) as r:
                    if r.status == 200:
                        return proc
        except OSError:
            pass
        if time.monotonic() > deadline:
            _stop(proc)
            pytest.fail(f"the hub did not answer in 600 s:\n{log_path.read_text()[-4000:]}")
        time.sleep(1)


def _stop(proc: subprocess.Popen) -> None:
    """Stop a hub command (SIGTERM: JupyterHub stops the servers and the proxy)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture(scope="module")
def hub():
    _prerequisites()
    tag = "zq" + secrets.token_hex(2)
    roster_ids = ["Ada.Lovelace@uni", "2Grace+H"]
    names = {sid: hub_name(sid, f"{tag}-") for sid in [*roster_ids, "Carol.new"]}
    instructor = f"{tag}-teach"
    users = [*names.values(), instructor]
    for user in users:
        assert not re.search(r"[^a-z0-9_-]", user) and len(user) <= 32, user
    # Everything the hub command makes for this test is in one temporary folder (the class
    # environment, the exchange, the hub's state), removed afterwards with the accounts; the
    # checkout's mode, which the command narrows to 0700, is put back.
    work = Path(tempfile.mkdtemp(prefix=f"{tag}-"))
    work.chmod(0o755)  # the class environment and the exchange must be reachable by everyone
    state = work / "state"
    repo_mode = REPO_ROOT.stat().st_mode & 0o7777
    roster = work / "roster.csv"
    roster.write_text("student_id,lms_id,name\n" + "".join(f"{s},{i},{s}\n" for i, s in
                      enumerate(roster_ids)))  # fmt: skip
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "grader", "hub", "--roster", str(roster), "--instructor",
        instructor, "--user-prefix", f"{tag}-", "--port", str(port), "--lesson", LESSON,
        "--prefix", str(work / "class-env"), "--exchange", str(work / "exchange"),
        "--state", str(state), "--cull-timeout", "900",
    ]  # fmt: skip
    logs = work / "logs"
    logs.mkdir()
    hub = {
        "url": url,
        "names": names,
        "instructor": instructor,
        "roster": roster,
        "cmd": cmd,
        "logs": logs,
        "log": logs / "hub.log",
        "procs": [],
        "sessions": {},
    }
    try:
        started = time.monotonic()
        hub["procs"].append(_launch(cmd, hub["log"], url))
        TIMES["hub command to a working hub"] = time.monotonic() - started
        print(f"hub up in {TIMES['hub command to a working hub']:.1f} s")
        settings = json.loads((state / "settings.json").read_text())
        with open(settings["passwords"], newline="") as fh:
            passwords = {r["hub_user"]: r["password"] for r in csv.DictReader(fh)}
        hub.update(
            passwords=passwords,
            settings=settings,
            course=Path(settings["course"]),
            exchange=Path(settings["exchange"]),
            prefix=Path(settings["prefix"]),
        )
        assert hub["prefix"] == work / "class-env"
        yield hub
    finally:
        for proc in hub["procs"]:
            _stop(proc)
        kept = Path(os.environ.get("COURSE_TEST_ARTIFACTS") or REPO_ROOT / "test-artifacts")
        kept.mkdir(parents=True, exist_ok=True)
        for log in logs.glob("*.log"):
            shutil.copy2(log, kept / log.name)
        print(f"the hub's logs: {kept}/hub*.log")
        _remove_accounts(users)
        shutil.rmtree(work, ignore_errors=True)
        REPO_ROOT.chmod(repo_mode)
        print("times:", json.dumps({k: round(v, 1) for k, v in TIMES.items()}))


def _as(hub, user: str, *cmd: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``cmd`` run as ``user`` with the environment of their hub terminal (the class
    environment first on PATH; for the instructor the course directory on PYTHONPATH)."""
    home = pwd.getpwnam(user).pw_dir
    env = [f"HOME={home}", f"USER={user}", f"PATH={hub['prefix']}/bin:/usr/bin:/bin"]
    if user == hub["instructor"]:
        env.append(f"PYTHONPATH={hub['course']}")
    return subprocess.run(
        ["runuser", "-u", user, "--", "env", "-i", *env, *cmd],
        cwd=cwd or home,
        capture_output=True,
        text=True,
        timeout=900,
    )


def _grader(hub, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m grader ARGS`` as the instructor types it in the course directory."""
    start = time.monotonic()
    proc = _as(hub, hub["instructor"], "python", "-m", "grader", *args, cwd=hub["course"])
    TIMES[f"grader {args[0]}"] = time.monotonic() - start
    print(f"$ python -m grader {' '.join(args)}\n{proc.stdout}{proc.stderr}")
    assert proc.returncode == 0, proc.stderr
    return proc


def _submit_login(browser, hub, user: str):
    """Log ``user`` in through the hub's login form (PAM) in a browser context of their own;
    the hub then starts their server (waited for by :func:`_wait_lab`)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.goto(f"{hub['url']}/hub/login")
    page.fill("#username_input", user)
    page.fill("#password_input", hub["passwords"][user])
    page.click("#login_submit", no_wait_after=True)
    return context, page


def _wait_lab(page, user: str) -> None:
    page.wait_for_url(re.compile(rf"/user/{user}/lab"), timeout=240_000)
    page.wait_for_selector("#jp-menu-panel .lm-MenuBar-itemLabel", timeout=120_000)


def _nbgrader_menu(page) -> list[str]:
    page.locator("#jp-menu-panel .lm-MenuBar-itemLabel", has_text="Nbgrader").click()
    page.wait_for_selector("#jp-mainmenu-nbgrader", timeout=10_000)
    items = page.locator("#jp-mainmenu-nbgrader .lm-Menu-itemLabel:visible").all_inner_texts()
    return [t.strip() for t in items if t.strip()]


def _assignment_list(page):
    """Open nbgrader's Assignment List (Nbgrader menu) and wait for it to load."""
    _nbgrader_menu(page)
    page.locator("#jp-mainmenu-nbgrader .lm-Menu-itemLabel", has_text="Assignment List").click()
    page.wait_for_selector("#released_assignments_list", timeout=30_000)
    page.wait_for_function(
        "() => !document.querySelector('#released_assignments_list_loading')"
        " || document.querySelector('#released_assignments_list_loading').offsetParent === null",
        timeout=60_000,
    )
    return page


def _fill(page, hub, user: str, source: str) -> None:
    """Open the fetched lesson, type ``source`` into the exercise's cell, save."""
    page.goto(f"{hub['url']}/user/{user}/lab/tree/{LESSON}/{LESSON}.ipynb")
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
    cell = page.locator(".jp-CodeCell", has_text="def fp16_bits").filter(has_text="YOUR CODE").first
    cell.scroll_into_view_if_needed()
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+A")
    page.keyboard.insert_text(source.strip())
    page.keyboard.press("Control+S")
    page.wait_for_function(
        "() => !document.querySelector('.lm-TabBar-tab.jp-mod-current.jp-mod-dirty')",
        timeout=30_000,
    )


def _contents(context, hub, user: str, path: str):
    return context.request.get(f"{hub['url']}/user/{user}/api/contents/{path}")


def test_a_class_on_jupyterhub(hub, browser, shots):
    started = _MARK[0] = time.monotonic()
    url, names, teacher = hub["url"], hub["names"], hub["instructor"]
    ada, grace = names["Ada.Lovelace@uni"], names["2Grace+H"]

    # Everyone logs in at once (their servers start side by side), each in their own context.
    t_ctx, t_page = _submit_login(browser, hub, teacher)
    logged_in = {user: _submit_login(browser, hub, user) for user in (ada, grace)}
    # The instructor: the instructor view (formgrader), lesson 01 released to the exchange.
    _wait_lab(t_page, teacher)
    menu = _nbgrader_menu(t_page)
    t_page.keyboard.press("Escape")
    assert {"Assignment List", "Formgrader", "Create assignment"} <= set(menu), menu
    fg = t_ctx.request.get(f"{url}/user/{teacher}/formgrader/manage_assignments")
    assert fg.status == 200, fg.status
    released = hub["exchange"] / "mixed-precision" / "outbound" / LESSON / f"{LESSON}.ipynb"
    assert released.is_file()
    t_page.goto(f"{url}/user/{teacher}/formgrader")
    row = t_page.locator("tr", has_text=LESSON).first
    row.wait_for(timeout=60_000)
    # formgrader's status label: "released" (from the exchange's outbound/), not "draft"
    row.locator(".label", has_text="released").wait_for(timeout=30_000)
    assert row.locator(".label").inner_text().strip() == "released"
    t_page.screenshot(path=str(shots / "hub-instructor-formgrader.png"))
    # The idle culler runs as a hub service with a working token: its process is alive and its
    # first request to the users API was answered.
    services = t_ctx.request.get(f"{url}/hub/api/services").json()
    culler = services["idle-culler"]
    assert culler["pid"] and "--timeout=900" in culler["command"], culler
    cmdline = Path(f"/proc/{culler['pid']}/cmdline").read_bytes().split(b"\0")
    assert b"jupyterhub_idle_culler" in cmdline, cmdline
    answered = re.compile(r"200 GET /hub/api/users\S* \(idle-culler@")
    deadline = time.monotonic() + 30
    while not answered.search(hub["log"].read_text()):
        assert time.monotonic() < deadline, "the idle culler's request is not in the hub's log"
        time.sleep(1)
    _phase("instructor: login, server, formgrader")

    # Two students, each in their own browser context: fetch, fill in, (Validate), submit.
    students = {}
    for user, source in ((ada, RIGHT), (grace, WRONG)):
        ctx, page = logged_in[user]
        _wait_lab(page, user)
        menu = _nbgrader_menu(page)
        page.keyboard.press("Escape")
        assert menu == ["Assignment List"], f"{user}'s view: {menu}"
        assert ctx.request.get(f"{url}/user/{user}/formgrader").status == 404
        _assignment_list(page)
        row = page.locator("#released_assignments_list .list_item", has_text=LESSON)
        row.wait_for(timeout=60_000)
        row.get_by_role("button", name="Fetch").click()
        page.locator("#fetched_assignments_list .list_item", has_text=LESSON).first.wait_for(
            timeout=60_000
        )
        if user == ada:
            page.screenshot(path=str(shots / "hub-student-assignment-list.png"))
        _phase("students: login, server, fetch")
        _fill(page, hub, user, source)
        students[user] = (ctx, page)
        _phase("students: fill in, save")

    page = students[ada][1]
    page.locator(".jp-NotebookPanel-toolbar").get_by_text("Validate", exact=True).click()
    dialog = page.locator(".jp-Dialog-content")
    dialog.wait_for(timeout=300_000)
    page.wait_for_function(
        "() => !document.querySelector('.jp-Dialog-content').innerText.includes('Validating')",
        timeout=300_000,
    )
    verdict = dialog.inner_text()
    print("Validate:", verdict[:1500])
    # Her exercise passes its visible tests; the first one she left unfilled is what fails.
    assert "a few numbers whose bits" not in verdict and "fp16_fate(x)" in verdict, verdict[:1500]
    page.screenshot(path=str(shots / "hub-student-validate.png"))
    page.keyboard.press("Escape")
    _phase("Validate")

    for _ctx, page in students.values():
        _assignment_list(page)
        fetched = page.locator("#fetched_assignments_list .list_item", has_text=LESSON).first
        fetched.get_by_role("button", name="Submit").click()
        page.locator("#submitted_assignments_list .list_item", has_text=LESSON).first.wait_for(
            timeout=60_000
        )

    _phase("students: submit")
    # The instructor grades from the exchange, in their own account.
    intake = _grader(hub, "intake", LESSON, "--exchange")
    assert "Ada.Lovelace@uni" in intake.stdout and "2Grace+H" in intake.stdout
    course = hub["course"]
    assert (course / "submitted" / "Ada.Lovelace@uni" / LESSON / f"{LESSON}.ipynb").is_file()
    _phase("instructor: intake")
    # Per-cell limits measured from the solution on this machine, then used by autograde.
    _grader(hub, "calibrate", LESSON, "--workers", "2")
    assert (course / ".grader" / LESSON / "calibration.json").is_file()
    _phase("instructor: calibrate")
    graded = _grader(hub, "autograde", LESSON, "--no-progress", "--workers", "2")
    assert f"calibrated limits from {course / '.grader' / LESSON / 'calibration.json'}" in (
        graded.stderr
    ), graded.stderr
    _phase("instructor: autograde")
    _grader(hub, "feedback", LESSON, "--deliver", "exchange")
    _phase("instructor: feedback")
    # The grades go out under the roster's ids, not the hub's Unix names.
    _grader(hub, "export", "--lesson", LESSON, "--out", "grades.csv")
    with open(course / "grades.csv", newline="") as fh:
        totals = {r["student_id"]: float(r["total"]) for r in csv.DictReader(fh)}
    assert totals == {"Ada.Lovelace@uni": 2.0, "2Grace+H": 0.0}, totals
    assert list((hub["exchange"] / "mixed-precision" / "feedback").glob("*.html"))

    pages = {}
    for user, (ctx, page) in students.items():
        page.reload()
        page.wait_for_selector("#jp-menu-panel .lm-MenuBar-itemLabel", timeout=120_000)
        _assignment_list(page)
        sub = page.locator("#submitted_assignments_list .list_item", has_text=LESSON).first
        sub.get_by_role("button", name="Fetch Feedback").click()
        page.get_by_text("(view feedback)").first.wait_for(timeout=60_000)
        if user == ada:
            page.screenshot(path=str(shots / "hub-student-assignment-list-feedback.png"))
        listing = _contents(ctx, hub, user, f"{LESSON}/feedback").json()
        (stamp,) = [e["name"] for e in listing["content"]]
        page.goto(f"{url}/user/{user}/files/{LESSON}/feedback/{stamp}/{LESSON}.html")
        page.wait_for_selector("text=Score", timeout=30_000)
        pages[user] = page.inner_text("body")
        page.get_by_text("def fp16_bits").first.scroll_into_view_if_needed()
        page.screenshot(path=str(shots / f"hub-feedback-{'right' if user == ada else 'wrong'}.png"))
    ada_text, grace_text = pages[ada], pages[grace]
    assert f"{LESSON} (Score: 2.0 / 14.0)" in ada_text, ada_text[:2000]
    assert f"{LESSON} (Score: 0.0 / 14.0)" in grace_text, grace_text[:2000]
    assert "the mantissa of" in grace_text, "the failing check's message is in her feedback"
    assert "the mantissa of" not in ada_text
    assert "Ada.Lovelace" not in grace_text and "2Grace" not in ada_text
    assert "BEGIN HIDDEN TESTS" not in ada_text + grace_text
    _phase("students: fetch and read feedback")
    TIMES["browser and grading"] = time.monotonic() - started

    # Isolation, from a student's account.
    other_nb = Path(pwd.getpwnam(grace).pw_dir) / LESSON / f"{LESSON}.ipynb"
    assert other_nb.is_file()
    keys = list(course.glob(".grading-key*"))
    assert keys, "autograde made the course's grading key"
    secrets_of_course = [
        course / "solutions" / LESSON / f"{LESSON}.ipynb",
        course / "gradebook.db",
        course / "submitted" / "2Grace+H" / LESSON / f"{LESSON}.ipynb",
        course / "grader" / "lessons",
        course / "grades.csv",
        *keys,
        REPO_ROOT / "solutions" / LESSON / f"{LESSON}.ipynb",
    ]
    for path in [other_nb, *secrets_of_course]:
        assert path.exists(), path
        got = _as(hub, ada, "cat" if path.is_file() else "ls", str(path))
        assert got.returncode != 0 and "Permission denied" in got.stderr, (path, got.stdout[:200])
    inbound = hub["exchange"] / "mixed-precision" / "inbound"
    got = _as(hub, ada, "ls", str(inbound))
    assert got.returncode != 0 and "Permission denied" in got.stderr, got.stdout
    assert oct(course.stat().st_mode & 0o777) == "0o700"
    ada_ctx = students[ada][0]
    for path in ("api/contents", f"api/contents/{LESSON}/{LESSON}.ipynb"):
        resp = ada_ctx.request.get(f"{url}/user/{grace}/{path}", max_redirects=0)
        assert resp.status == 403 and "fp16_bits" not in resp.text(), (path, resp.status)
    resp = ada_ctx.request.get(f"{url}/user/{grace}/lab", max_redirects=0)
    assert resp.status in (302, 403) and "fp16_bits" not in resp.text(), resp.status
    assert ada_ctx.request.get(f"{url}/user/{ada}/api/contents").status == 200

    # The sessions the roster-change test tries again after the hub's restart.
    for user, ctx in ((ada, ada_ctx), (grace, students[grace][0]), (teacher, t_ctx)):
        assert ctx.request.get(f"{url}/hub/api/user").json()["scopes"], user
        hub["sessions"][user] = ctx.storage_state()
    for ctx in [t_ctx, *(c for c, _ in students.values())]:
        ctx.close()


def _login(browser, hub, user: str, password: str):
    """POST the hub's login form (PAM) without following the redirect (no server is started);
    returns the response's status and the context holding the session cookie, if any."""
    ctx = browser.new_context()
    form = ctx.request.get(f"{hub['url']}/hub/login").text()
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', form).group(1)
    resp = ctx.request.post(
        f"{hub['url']}/hub/login",
        form={"_xsrf": xsrf, "username": user, "password": password},
        max_redirects=0,
    )
    return resp.status, ctx


def test_a_changed_roster_restarts_the_hub_blocking_the_removed_student(hub, browser):
    """The command again with a changed roster: one student added, one removed. It stops the
    running hub and starts it with the new roster; the removed student's account is locked, their
    work kept, their earlier session opens nothing; the added student can log in."""
    url, names, teacher = hub["url"], hub["names"], hub["instructor"]
    ada, grace, carol = names["Ada.Lovelace@uni"], names["2Grace+H"], names["Carol.new"]
    assert set(hub["sessions"]) == {ada, grace, teacher}, "the class test ran first"
    roster = hub["roster"].with_name("roster2.csv")
    roster.write_text("student_id,lms_id\nAda.Lovelace@uni,0\nCarol.new,2\n")
    cmd = [c if c != str(hub["roster"]) else str(roster) for c in hub["cmd"]]
    first = hub["procs"][-1]
    log = hub["logs"] / "hub-restarted.log"
    started = time.monotonic()
    hub["procs"].append(_launch(cmd, log, url))
    TIMES["roster change: command to a restarted hub"] = time.monotonic() - started
    first.wait(60)  # the first command ends with the hub it started
    out = log.read_text()
    assert f"accounts created: {carol}" in out and f"accounts locked: {grace}" in out, out[:3000]
    assert "stopping the hub already running" in out, out[:3000]
    assert f"blocked (not on the roster): {grace}" in out, out[:3000]
    assert f"Removing blocked user {grace} from roles: user" in out

    # The removed student: no password login (PAM: locked), and the session cookie from before
    # the restart still names her but carries no permission: no server can be started or opened.
    status, _ = _login(browser, hub, grace, hub["passwords"][grace])
    assert status == 403, status
    old = browser.new_context(storage_state=hub["sessions"][grace])
    me = old.request.get(f"{url}/hub/api/user")
    assert me.status == 200 and me.json()["name"] == grace and me.json()["scopes"] == [], me.text()
    assert old.request.get(f"{url}/hub/spawn", max_redirects=0).status == 403
    assert old.request.get(f"{url}/hub/api/users/{grace}").status == 403
    resp = old.request.get(f"{url}/user/{grace}/api/contents", max_redirects=0)
    assert resp.status != 200 and "fp16_bits" not in resp.text(), resp.status
    old.close()
    uid = pwd.getpwnam(grace).pw_uid
    assert not [p for p in psutil.process_iter(["uids"]) if p.info["uids"].real == uid]
    # The added student logs in; the student who stayed keeps her session.
    with open(hub["settings"]["passwords"], newline="") as fh:
        passwords = {r["hub_user"]: r["password"] for r in csv.DictReader(fh)}
    status, ctx = _login(browser, hub, carol, passwords[carol])
    assert status == 302, status
    assert ctx.request.get(f"{url}/hub/api/user").json()["name"] == carol
    ctx.close()
    kept = browser.new_context(storage_state=hub["sessions"][ada])
    assert kept.request.get(f"{url}/hub/api/user").json()["scopes"]
    kept.close()

    shadow = subprocess.run(["passwd", "--status", grace], capture_output=True, text=True)
    assert shadow.stdout.split()[1] == "L", shadow.stdout
    home = Path(pwd.getpwnam(grace).pw_dir)
    nb = nbformat.read(home / LESSON / f"{LESSON}.ipynb", 4)
    assert any("0x1FF" in c.source for c in nb.cells), "the removed student's work is kept"
    users = (hub["course"] / "hub-users.csv").read_text()
    assert f"Carol.new,{carol}" in users and f"2Grace+H,{grace}" in users


# Without a hub: the name map, intake through it, and the Kubernetes files as far as this machine
# checks them.


def test_roster_ids_become_valid_distinct_unix_names():
    from grader.hub import UNIX_NAME, hub_names

    ids = ["Ada.Lovelace@uni", "ada-lovelace-uni", "2Grace+H", "bob", "Bob", "x" * 60]
    names = hub_names(ids, "c1-")
    assert len(set(names.values())) == len(ids)
    for sid, name in names.items():
        assert UNIX_NAME.match(name) and len(name) <= 32, (sid, name)
    assert names["bob"] == "c1-bob", "an id that is already a Unix name stays readable"
    assert names["Bob"] != names["bob"] and names["Bob"].startswith("c1-bob-")
    assert names["2Grace+H"].startswith("c1-s2grace-h-")
    with pytest.raises(ValueError, match="map to one user"):
        hub_names(["bob", "bob"])


def test_intake_maps_hub_users_back_to_roster_ids(tmp_path):
    from grader.hub import write_users_file
    from grader.intake import intake_exchange

    root, exchange = tmp_path / "course", tmp_path / "exchange"
    root.mkdir()
    names = {"Ada.Lovelace@uni": hub_name("Ada.Lovelace@uni"), "bob": "bob"}
    write_users_file(root / "hub-users.csv", names)
    inbound = exchange / "mixed-precision" / "inbound"
    stamp = "2026-12-01 10:00:00.000000 UTC"
    for user in [*names.values(), "mallory"]:
        entry = inbound / f"{user}+{LESSON}+{stamp}+abc"
        entry.mkdir(parents=True)
        (entry / f"{LESSON}.ipynb").write_text(f'{{"who": "{user}"}}')
        (entry / "timestamp.txt").write_text(stamp)
        (entry / "submission_secret.txt").write_text(f"secret-{user}")
    report = intake_exchange(root, LESSON, exchange)
    assert sorted(s for s, _ in report.placed) == ["Ada.Lovelace@uni", "bob"]
    assert [why for _, why in report.unmapped] == ["hub user 'mallory' is not in hub-users.csv"]
    placed = root / "submitted" / "Ada.Lovelace@uni" / LESSON
    assert names["Ada.Lovelace@uni"] in (placed / f"{LESSON}.ipynb").read_text()
    assert (placed / "submission_secret.txt").read_text() == f"secret-{names['Ada.Lovelace@uni']}"
    idents = json.loads((root / "intake" / LESSON / "identities.json").read_text())
    assert idents["Ada.Lovelace@uni"]["lms_id"] == names["Ada.Lovelace@uni"]
    write_users_file(root / "hub-users.csv", {"carol": "carol"})  # a later roster keeps the rows
    assert "Ada.Lovelace@uni" in (root / "hub-users.csv").read_text()


def _as_root_with_no_setup(monkeypatch, after: str) -> None:
    """Pretend to be root for the command's checks; ``after`` (a grader.hub function the
    command calls once the check under test has passed) fails the test instead of running."""
    import grader.hub

    def reached(*args, **kwargs):
        raise AssertionError(f"the command went on to {after}: the check did not refuse")

    monkeypatch.setattr(grader.hub.os, "geteuid", lambda: 0)
    monkeypatch.setattr(grader.hub, after, reached)


def test_an_old_node_is_refused_with_what_to_install(tmp_path, monkeypatch, capsys):
    from grader.cli import main

    for tool, out in (("node", "v18.19.0"), ("npm", "9.2.0")):
        (tmp_path / tool).write_text(f"#!/bin/sh\necho {out}\n")
        (tmp_path / tool).chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    _as_root_with_no_setup(monkeypatch, "read_hub_roster")
    code = main(["hub", "--roster", str(tmp_path / "roster.csv"), "--state", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"node v18.19.0 at {tmp_path / 'node'} is too old" in err, err
    assert f"needs Node.js >= {NODE_MIN} and npm" in err and "Debian 12's own" in err, err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("given", [[], ["--ssl-cert", "c.pem"], ["--ssl-key", "k.pem"]])
def test_public_without_a_certificate_and_key_is_refused(tmp_path, monkeypatch, capsys, given):
    from grader.cli import main

    _as_root_with_no_setup(monkeypatch, "check_node")
    code = main(["hub", "--roster", "roster.csv", "--public", "--state", str(tmp_path), *given])
    err = capsys.readouterr().err
    assert (
        code == 2 and "--public serves the class over HTTPS: give --ssl-cert and --ssl-key" in err
    )


def test_the_hub_config_allows_the_roster_only_and_blocks_removed_students(tmp_path, monkeypatch):
    """hub/jupyterhub_config.py read as JupyterHub reads it, with the command's settings."""
    from traitlets.config import Config

    settings = {
        "bind_url": "http://127.0.0.1:8000", "hub_port": 1, "proxy_api_port": 2, "proxy": "chp",
        "state": str(tmp_path), "prefix": "/opt/x", "students": ["ann", "bob"],
        "instructor": "teach", "views": {}, "mem_limit": "4G", "cull_timeout": 60,
        "course": "/home/teach/mixed-precision", "removed": ["grace"],
    }  # fmt: skip
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    monkeypatch.setenv("COURSE_HUB_SETTINGS", str(tmp_path / "settings.json"))
    c = Config()
    path = REPO_ROOT / "hub" / "jupyterhub_config.py"
    exec(compile(path.read_text(), str(path), "exec"), {"get_config": lambda: c})
    auth = c.Authenticator
    assert auth.allowed_users == {"ann", "bob", "teach"} and auth.admin_users == {"teach"}
    assert auth.allow_existing_users is False, "the hub's database must not keep users allowed"
    assert auth.blocked_users == {"grace"}
    (culler,) = c.JupyterHub.services
    assert "--timeout=60" in culler["command"]


def test_a_pid_file_naming_another_program_is_not_taken_for_a_running_hub(tmp_path):
    from grader.hub import removed_users, running_hub, stop_running_hub

    assert running_hub(tmp_path) is None
    (tmp_path / "jupyterhub.pid").write_text(f"{os.getpid()}\n")  # this pytest, not a hub
    assert running_hub(tmp_path) is None and stop_running_hub(tmp_path) is None
    (tmp_path / "passwords.csv").write_text(
        "student_id,hub_user,password,locked\na,ann,x,\nb,bob,y,yes\n"
    )
    assert removed_users(tmp_path / "passwords.csv") == ["bob"]


def test_the_kubernetes_values_mount_one_shared_exchange_and_limit_memory():
    import yaml

    values = yaml.safe_load((REPO_ROOT / "hub" / "k8s" / "values.yaml").read_text())
    pvc = yaml.safe_load((REPO_ROOT / "hub" / "k8s" / "exchange-pvc.yaml").read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and pvc["spec"]["accessModes"] == [
        "ReadWriteMany"
    ]
    single = values["singleuser"]
    (volume,) = single["storage"]["extraVolumes"]
    assert volume["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]
    (mount,) = single["storage"]["extraVolumeMounts"]
    assert mount["name"] == volume["name"]
    assert mount["mountPath"] == "/usr/local/share/nbgrader/exchange"
    assert single["memory"]["limit"] and values["cull"]["enabled"]
    auth = values["hub"]["config"]["Authenticator"]
    assert auth["allowed_users"] and auth["admin_users"]
    assert values["hub"]["config"]["JupyterHub"]["authenticator_class"] != "dummy"
    for name, code in values["hub"]["extraConfig"].items():
        compile(code, name, "exec")  # the hub's Python config parses


def test_the_single_user_dockerfile_is_pinned_and_carries_no_solutions():
    from grader.hub import JUPYTERHUB

    lines, joined = [], ""
    for raw in (REPO_ROOT / "hub" / "Dockerfile").read_text().splitlines():
        if raw.strip().startswith("#") or not raw.strip():
            continue
        joined += raw.rstrip("\\").strip() + " "
        if not raw.rstrip().endswith("\\"):
            lines.append(joined.strip())
            joined = ""
    known = {"FROM", "ARG", "ENV", "RUN", "COPY", "USER", "WORKDIR", "EXPOSE", "ENTRYPOINT", "CMD"}
    ops = [line.split()[0] for line in lines]
    assert set(ops) <= known, set(ops) - known
    assert ops[0] == "FROM" and re.match(r"FROM \S+:\d+\.\d+\.\d+-", lines[0]), lines[0]
    assert ops[-1] == "CMD" and "USER" in ops[ops.index("COPY") :], "the image runs as a user"
    sources = [src for line in lines if line.startswith("COPY") for src in line.split()[1:-1]]
    assert sources and not [s for s in sources if s.split("/")[0] in ("solutions", "grader", ".")]
    pip = next(line for line in lines if "pip install" in line)
    assert f"jupyterhub=={JUPYTERHUB}" in pip
    for src in sources:
        assert (REPO_ROOT / src).exists(), src


def test_the_hub_refuses_a_public_port_in_use_and_draws_its_ports_below_the_ephemeral_range():
    """Something listening on ``--port`` stops the command with a sentence (the proxy would fail
    there while JupyterHub said it ran); the ports the hub and the tests pick are never ones a
    socket bound to port 0 (a kernel's) can take first."""
    import socket

    from grader.hub import HubError, _check_port_free

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(HubError, match=f"port {port} on 127.0.0.1 is in use"):
            _check_port_free(f"http://127.0.0.1:{port}")
    _check_port_free(f"http://127.0.0.1:{port}")
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert all(1024 <= free_port() < low for _ in range(20))
