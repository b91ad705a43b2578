"""A JupyterHub for one class on this machine: ``python -m grader hub --roster roster.csv``.

As root, one command installs (pinned) JupyterHub, the idle culler and configurable-http-proxy,
builds a world-readable class environment from the system Python, makes a Unix account per roster
student and for the instructor (PAM; passwords in ``.hub/passwords.csv``), puts the instructor's
course directory in their home (mode 0700), releases the lessons to nbgrader's exchange and
starts the hub with the student and instructor views. Roster ids become Unix names through
:func:`hub_names` (kept in ``hub-users.csv`` for ``intake --exchange``). Re-running with a changed
roster adds students, locks and blocks those removed (their files kept) and restarts the hub.
Nothing anyone wrote is overwritten. Details: docs/grading-a-class.md.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import pwd
import random
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

from grader import REPO_ROOT

JUPYTERHUB = "6.1.1"
IDLE_CULLER = "2.0.0"
PROXY = "5.3.0"  # configurable-http-proxy on npm
NODE_MIN = 20
SOUPSIEVE = "2.8"
COURSE_ID = "mixed-precision"
DEFAULT_PREFIX = Path("/opt/mixed-precision-course")
DEFAULT_EXCHANGE = Path("/usr/local/share/nbgrader/exchange")
STATE = REPO_ROOT / ".hub"
#: The file in the course directory that maps roster ids to hub (Unix) user names.
USERS_FILE = "hub-users.csv"
UNIX_NAME = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")


class HubError(RuntimeError):
    """A prerequisite is missing or a step failed; the message says what to do."""


_STARTED = time.monotonic()


def say(message: str) -> None:
    print(f"[hub {time.monotonic() - _STARTED:6.1f} s] {message}", flush=True)


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, text=True, capture_output=True, **kwargs)
    if proc.returncode != 0:
        raise HubError(
            f"{' '.join(map(str, cmd))} failed (exit {proc.returncode}):\n"
            f"{proc.stdout[-2000:]}{proc.stderr[-3000:]}"
        )
    return proc


# ---------------------------------------------------------------------------------------------
# Roster ids to Unix / hub names


def hub_name(student_id: str, prefix: str = "") -> str:
    """A valid Unix (and JupyterHub) user name for a roster id, readable and stable.

    Lower case; characters Unix names do not allow (``@ . +``, spaces) become ``-``; a name that
    does not start with a letter gets ``s`` in front; ``prefix`` goes first. A name that had to
    change, or is too long, ends with 6 hex digits of the id's hash, so two ids never collide
    (``Ann.Lee`` and ``ann-lee`` differ).
    """
    base = re.sub(r"[^a-z0-9_-]+", "-", student_id.lower()).strip("-") or "s"
    if not re.match(r"[a-z_]", base):
        base = "s" + base
    name = prefix + base
    if name.lower() != prefix + student_id or len(name) > 32:
        digest = hashlib.sha256(student_id.encode()).hexdigest()[:6]
        name = f"{name[:25].rstrip('-')}-{digest}"
    if not UNIX_NAME.match(name):
        raise ValueError(f"roster id {student_id!r}: no valid Unix name (got {name!r})")
    return name


def hub_names(student_ids: list[str], prefix: str = "") -> dict[str, str]:
    """``{student_id: hub user}`` for a roster; refuses two ids with the same name."""
    names: dict[str, str] = {}
    seen: dict[str, str] = {}
    for sid in student_ids:
        name = hub_name(sid, prefix)
        if name in seen:
            raise ValueError(f"roster ids {seen[name]!r} and {sid!r} map to one user {name!r}")
        seen[name] = sid
        names[sid] = name
    return names


def read_hub_roster(path: Path) -> list[dict[str, str]]:
    """The roster's rows with a ``student_id`` (the intake roster; ``lms_id`` is optional here)."""
    from grader.autograde import valid_student_id
    from grader.intake import read_csv

    rows = read_csv(path)
    if rows and "student_id" not in rows[0]:
        raise ValueError(f"{path}: the roster needs a student_id column")
    rows = [r for r in rows if r.get("student_id")]
    for r in rows:
        if not valid_student_id(r["student_id"]):
            raise ValueError(f"{path}: student id {r['student_id']!r} is not allowed")
    ids = [r["student_id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: a student id appears twice")
    return rows


def write_users_file(path: Path, names: dict[str, str]) -> None:
    """Write ``{student_id: hub user}`` as ``hub-users.csv``, keeping rows of students no longer
    on the roster (``intake --exchange`` still maps their earlier submissions)."""
    from grader.intake import read_hub_users

    known = {sid: user for user, sid in (read_hub_users(path.parent) or {}).items()}
    known.update(names)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["student_id", "hub_user"])
        for sid, name in sorted(known.items()):
            w.writerow([sid, name])


# ---------------------------------------------------------------------------------------------
# Prerequisites and installs


def check_node() -> str:
    """Node's version, if it is >= NODE_MIN and npm is there; else a clear error."""
    node, npm = shutil.which("node"), shutil.which("npm")
    hint = (
        f"configurable-http-proxy {PROXY} needs Node.js >= {NODE_MIN} and npm. Debian 12's own "
        f"nodejs package is 18, too old: install Node {NODE_MIN} or newer (e.g. NodeSource's "
        f"nodejs {NODE_MIN}.x package, which brings npm)"
    )
    if not node or not npm:
        raise HubError(f"node or npm not found on PATH. {hint}")
    version = _run([node, "--version"]).stdout.strip()
    major = int(re.match(r"v?(\d+)", version).group(1))
    if major < NODE_MIN:
        raise HubError(f"node {version} at {node} is too old. {hint}")
    return version


def ensure_proxy() -> Path:
    """configurable-http-proxy (pinned) in ``.hub/proxy``; npm runs once, then it is kept."""
    prefix = STATE / "proxy"  # kept in the checkout whatever --state says: npm runs once
    exe = prefix / "node_modules" / ".bin" / "configurable-http-proxy"
    stamp = prefix / ".installed"
    if exe.exists() and stamp.is_file() and stamp.read_text().strip() == PROXY:
        return exe
    say(f"installing configurable-http-proxy {PROXY} from npm into {prefix}")
    prefix.mkdir(parents=True, exist_ok=True)
    npm = shutil.which("npm") or "npm"
    _run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--omit=dev",
         f"configurable-http-proxy@{PROXY}"]
    )  # fmt: skip
    stamp.write_text(PROXY + "\n")
    return exe


def system_python() -> Path:
    """The system's Python 3.11+ (not one under a home folder students cannot enter)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        path = Path(candidate)
        if path.exists() and _world_readable(path.resolve()):
            out = _run([str(path), "-c", "import sys, venv; print(sys.version_info[:2])"]).stdout
            if out.strip() >= "(3, 11)":
                return path
    raise HubError(
        "no system Python 3.11+ that students can run (/usr/bin/python3): install python3 and "
        "python3-venv (Debian: apt-get install python3 python3-venv)"
    )


def _world_readable(path: Path) -> bool:
    """Whether any user can reach ``path``: every parent o+x, the file o+r."""
    try:
        for parent in path.parents:
            if not parent.stat().st_mode & stat.S_IXOTH:
                return False
        return bool(path.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False


def _venv_dirs() -> tuple[Path, Path]:
    venv = Path(sys.prefix)
    site = venv / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"
    return venv, site


SKIP = re.compile(r"^(__editable__|mixed_precision_course|_mixed_precision_course|distutils-p)")


def _link_tree(src: Path, dst: Path) -> int:
    """Hard-link (or copy across file systems) every file of ``src`` into ``dst``."""
    n = 0
    for dirpath, dirnames, filenames in os.walk(src):
        rel = Path(dirpath).relative_to(src)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if not SKIP.match(d)]
            filenames = [f for f in filenames if not SKIP.match(f)]
        target = dst / rel
        target.mkdir(parents=True, exist_ok=True)
        os.chmod(target, 0o755)
        for name in filenames:
            s, d = Path(dirpath) / name, target / name
            if d.exists() or d.is_symlink():
                continue
            if s.is_symlink():
                os.symlink(os.readlink(s), d)
                continue
            try:
                os.link(s, d)
            except OSError:
                shutil.copy2(s, d)
            n += 1
    return n


def _class_env_key(site: Path) -> str:
    """What the class environment is built from: the pins and .venv's packages."""
    h = hashlib.sha256(f"{JUPYTERHUB} {IDLE_CULLER} {SOUPSIEVE} {sys.version_info[:2]}".encode())
    for dist in sorted(p.name for p in site.glob("*.dist-info")):
        h.update(dist.encode())
    return h.hexdigest()


def _course_key() -> str:
    """The course package and the views' config: copied again when they change."""
    h = hashlib.sha256()
    for folder in ("course", "jupyter"):
        for path in sorted((REPO_ROOT / folder).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                h.update(str(path.relative_to(REPO_ROOT)).encode() + path.read_bytes())
    return h.hexdigest()


def _copy_course(prefix: Path, site: Path) -> None:
    """The ``course`` package (not ``grader``: it holds hidden-test judges) and the views."""
    dest = prefix / "lib" / site.parent.name / "site-packages" / "course"
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(REPO_ROOT / "course", dest, ignore=shutil.ignore_patterns("__pycache__"))
    views = prefix / "etc" / "course-views"
    for view in ("common", "student"):
        if (views / view).exists():
            shutil.rmtree(views / view)
        shutil.copytree(REPO_ROOT / "jupyter" / view, views / view)
    _run(["chmod", "-R", "a+rX", str(dest), str(views)])


def ensure_class_env(prefix: Path) -> Path:
    """The students' environment in ``prefix`` (see the module docstring); kept when current."""
    venv, site = _venv_dirs()
    key, course_key = _class_env_key(site), _course_key()
    stamp, course_stamp = prefix / ".course-class-env", prefix / ".course-package"
    if stamp.is_file() and stamp.read_text().strip() == key:
        if not course_stamp.is_file() or course_stamp.read_text().strip() != course_key:
            say(f"updating the course package in {prefix}")
            _copy_course(prefix, site)
            course_stamp.write_text(course_key + "\n")
        return prefix
    _build_class_env(prefix, venv, site)
    _copy_course(prefix, site)
    course_stamp.write_text(course_key + "\n")
    stamp.write_text(key + "\n")
    return prefix


def _build_class_env(prefix: Path, venv: Path, site: Path) -> None:
    python = system_python()
    say(f"building the class environment in {prefix} from {python} (the course's packages)")
    if prefix.exists():
        shutil.rmtree(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    _run([str(python), "-m", "venv", "--without-pip", str(prefix)])
    version = _run([str(prefix / "bin" / "python"), "-c", "import sys; print(sys.version_info[1])"])
    if f"python3.{version.stdout.strip()}" != site.parent.name:
        raise HubError(
            f"the system Python is 3.{version.stdout.strip()} but the course's .venv is "
            f"{site.parent.name}: the class environment needs the same minor version"
        )
    dest_site = prefix / "lib" / site.parent.name / "site-packages"
    _link_tree(site, dest_site)
    for part in ("share", "etc"):
        if (venv / part).is_dir():
            _link_tree(venv / part, prefix / part)
    # .venv's console scripts, pointed at the class environment's Python (nbgrader runs
    # `alembic` from PATH, students run `jupyter` in a terminal).
    own = str(venv / "bin")
    for script in (venv / "bin").iterdir():
        if script.is_symlink() or not script.is_file() or (prefix / "bin" / script.name).exists():
            continue
        if script.name in ("mp-grader", "playwright"):  # the instructor's and the tests' tools
            continue
        try:
            head, _, rest = script.read_bytes().partition(b"\n")
        except OSError:
            continue
        if head.startswith(b"#!") and own.encode() in head:
            out = prefix / "bin" / script.name
            out.write_bytes(f"#!{prefix}/bin/python\n".encode() + rest)
            out.chmod(0o755)
    pip = [str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-input"]
    # soupsieve 3+ (nbconvert's HTML export, so feedback) uses possessive quantifiers that
    # Debian 12's Python 3.11.2 compiles wrongly (fixed in later 3.11 releases): 2.8 does not.
    _run([*pip, f"jupyterhub=={JUPYTERHUB}", f"jupyterhub-idle-culler=={IDLE_CULLER}",
          f"soupsieve=={SOUPSIEVE}"])  # fmt: skip
    _run(["chmod", "-R", "a+rX", str(prefix)])


# ---------------------------------------------------------------------------------------------
# Accounts


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
        return True
    except KeyError:
        return False


def _read_passwords(path: Path) -> dict[str, dict[str, str]]:
    if not path.is_file():
        return {}
    with open(path, newline="", encoding="utf-8") as fh:
        return {r["hub_user"]: r for r in csv.DictReader(fh)}


def ensure_accounts(
    names: dict[str, str], instructor: str, passwords: Path, reset: bool = False
) -> dict[str, list[str]]:
    """Unix accounts for the students and the instructor, each home mode 0700; new accounts
    (and all with ``reset``) get a fresh password, kept in ``passwords`` (CSV, mode 0600).

    Accounts of students no longer on the roster are locked (home and work kept)."""
    known = _read_passwords(passwords)
    wanted = {**{v: k for k, v in names.items()}, instructor: "(instructor)"}
    done: dict[str, list[str]] = {"created": [], "unlocked": [], "locked": []}
    changes = []
    for user, sid in wanted.items():
        if not _user_exists(user):
            _run(["useradd", "--create-home", "--shell", "/bin/bash", "--user-group", user])
            done["created"].append(user)
        home = Path(pwd.getpwnam(user).pw_dir)
        home.chmod(0o700)
        if user not in known or reset or user in done["created"]:
            known[user] = {
                "student_id": sid,
                "hub_user": user,
                "password": secrets.token_urlsafe(9),
            }
            changes.append(f"{user}:{known[user]['password']}")
        if known[user].get("locked"):
            _run(["usermod", "--unlock", "--expiredate", "", user])
            known[user]["locked"] = ""
            done["unlocked"].append(user)
    if changes:
        _run(["chpasswd"], input="\n".join(changes) + "\n")
    for user, row in known.items():
        if user not in wanted and not row.get("locked") and _user_exists(user):
            _run(["usermod", "--lock", "--expiredate", "1", user])
            row["locked"] = "yes"
            done["locked"].append(user)
    passwords.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(passwords, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", newline="", encoding="utf-8") as fh:
        w = csv.DictWriter(fh, ["student_id", "hub_user", "password", "locked"])
        w.writeheader()
        for row in known.values():
            w.writerow({k: row.get(k, "") for k in w.fieldnames})
    os.chmod(passwords, 0o600)
    return done


# ---------------------------------------------------------------------------------------------
# The instructor's course directory and the exchange


def _as(user: str, cmd: list[str], cwd: Path, env: dict[str, str] | None = None):
    """Run ``cmd`` as ``user`` (runuser, from root) in ``cwd``."""
    home = pwd.getpwnam(user).pw_dir
    base = {
        "HOME": home,
        "USER": user,
        "LOGNAME": user,
        "PATH": os.environ.get("COURSE_HUB_PATH", "/usr/local/bin:/usr/bin:/bin"),
    }
    full = [
        "runuser",
        "-u",
        user,
        "--",
        "env",
        "-i",
        *[f"{k}={v}" for k, v in {**base, **(env or {})}.items()],
        *cmd,
    ]  # noqa: E501
    return _run(full, cwd=cwd)


def _copy_missing(src: Path, dst: Path) -> None:
    """Copy the files of ``src`` that ``dst`` lacks (never overwrite what is there)."""
    for path in src.rglob("*"):
        if "__pycache__" in path.parts or ".ipynb_checkpoints" in path.parts:
            continue
        target = dst / path.relative_to(src)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
        elif not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)


def ensure_course_dir(instructor: str, exchange: Path, names: dict[str, str]) -> Path:
    """``~instructor/mixed-precision``: the course (solutions, lessons, grader, course), the
    instructor's alone (mode 0700), configured for this hub's exchange."""
    entry = pwd.getpwnam(instructor)
    course = Path(entry.pw_dir) / COURSE_ID
    course.mkdir(mode=0o700, exist_ok=True)
    for part in ("solutions", "lessons", "course", "grader"):
        _copy_missing(REPO_ROOT / part, course / part)
    shutil.copy2(REPO_ROOT / "nbgrader_config.py", course / "nbgrader_config.py")
    config = (REPO_ROOT / "grader" / "nbgrader_config.py").read_text()
    (course / "grader" / "nbgrader_config.py").write_text(
        config + f"\n# This machine's JupyterHub (python -m grader hub):\n"
        f'c.Exchange.root = "{exchange}"\n'
    )
    write_users_file(course / USERS_FILE, names)
    _run(["chown", "-R", f"{entry.pw_uid}:{entry.pw_gid}", str(course)])
    course.chmod(0o700)
    return course


def ensure_exchange(exchange: Path) -> None:
    """nbgrader's exchange root as its docs set it up: everyone may write (``ugo+rw``)."""
    exchange.mkdir(parents=True, exist_ok=True)
    exchange.chmod(0o777)
    for parent in exchange.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            raise HubError(f"{parent} is not reachable by students (o+x): the exchange can't be")


def write_views(prefix: Path, instructor: str, course: Path, exchange: Path) -> dict[str, str]:
    """The Jupyter config folders of the two views, and the class's nbgrader settings."""
    views = prefix / "etc" / "course-views"
    cls = views / "class"
    cls.mkdir(parents=True, exist_ok=True)
    (cls / "nbgrader_config.py").write_text(
        "# Students' nbgrader settings on this JupyterHub (python -m grader hub).\n"
        "c = get_config()  # noqa: F821\n"
        f'c.Exchange.root = "{exchange}"\n'
        f'c.CourseDirectory.course_id = "{COURSE_ID}"\n'
    )
    mine = views / f"instructor-{instructor}"
    mine.mkdir(parents=True, exist_ok=True)
    (mine / "nbgrader_config.py").write_text(
        "# The instructor's nbgrader settings: the course directory and its configuration.\n"
        "c = get_config()  # noqa: F821\n"
        f'c.CourseDirectory.root = "{course}"\n'
        f'load_subconfig("nbgrader_config.py", path="{course / "grader"}")  # noqa: F821\n'
    )
    _run(["chmod", "-R", "a+rX", str(views)])
    return {
        "common": str(views / "common"),
        "student": str(views / "student"),
        "class": str(cls),
        "instructor": str(mine),
    }


def release_lessons(
    prefix: Path, instructor: str, course: Path, exchange: Path, lessons: list[str]
) -> list[str]:
    """Release ``lessons`` to the exchange as the instructor (those not released yet)."""
    python = str(prefix / "bin" / "python")
    env = {"PATH": f"{prefix}/bin:/usr/bin:/bin"}
    done = []
    for lesson in lessons:
        if (exchange / COURSE_ID / "outbound" / lesson).is_dir():
            continue
        # lessons/ is the release of solutions/ (python -m grader release --check)
        _as(instructor, [python, "-m", "nbgrader", "release_assignment", lesson], course, env)
        done.append(lesson)
    return done


# ---------------------------------------------------------------------------------------------
# The command


@dataclass
class HubOptions:
    roster: Path
    instructor: str = "instructor"
    prefix: Path = DEFAULT_PREFIX
    exchange: Path = DEFAULT_EXCHANGE
    state: Path = STATE
    user_prefix: str = ""
    port: int = 8000
    public: bool = False
    ssl_cert: str | None = None
    ssl_key: str | None = None
    lessons: list[str] = field(default_factory=list)
    mem_limit: str = "4G"
    cull_timeout: int = 3600
    reset_passwords: bool = False
    setup_only: bool = False


def free_port() -> int:
    """A loopback port nothing listens on now, drawn below the kernel's ephemeral range.

    A port asked of the kernel (bind to port 0) is an ephemeral one, and any other socket bound
    to port 0 (a Jupyter kernel's, an outgoing connection's) may take it before the server it was
    chosen for binds it, minutes later for a hub that first builds its class environment: the
    proxy then fails with EADDRINUSE. Ports below the range are only ever taken on purpose."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    draw = random.SystemRandom()
    for _ in range(100):
        port = draw.randrange(max(1024, low - 12000), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # all taken: whatever the kernel gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _repo_open_to_others() -> bool:
    return bool(REPO_ROOT.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH))


def setup(opts: HubOptions) -> dict:
    """Everything but starting JupyterHub; returns the settings hub/jupyterhub_config.py reads."""
    if os.geteuid() != 0:
        raise HubError(
            "the class hub creates Unix accounts, sets their passwords and starts servers as "
            "them: run it as root (sudo python3 run.py hub ...)"
        )
    if opts.public and not (opts.ssl_cert and opts.ssl_key):
        raise HubError("--public serves the class over HTTPS: give --ssl-cert and --ssl-key")
    node = check_node()
    rows = read_hub_roster(opts.roster)
    names = {r["student_id"]: r.get("hub_user") or "" for r in rows}
    generated = hub_names([s for s, n in names.items() if not n], opts.user_prefix)
    names = {s: n or generated[s] for s, n in names.items()}
    if not UNIX_NAME.match(opts.instructor):
        raise HubError(f"--instructor {opts.instructor!r} is not a valid Unix user name")
    if opts.instructor in names.values():
        raise HubError(f"the instructor {opts.instructor!r} is also a student's user name")
    say(f"node {node}; {len(names)} students; instructor {opts.instructor}")
    state = opts.state
    state.mkdir(parents=True, exist_ok=True)
    state.chmod(0o700)
    if _repo_open_to_others():
        # The repository holds solutions/ and the hidden tests: students must not read it.
        REPO_ROOT.chmod(REPO_ROOT.stat().st_mode & ~0o077)
        say(f"made {REPO_ROOT} mode 0700: it holds solutions/ and hidden tests")
    proxy = ensure_proxy()
    prefix = ensure_class_env(opts.prefix)
    accounts = ensure_accounts(
        names, opts.instructor, state / "passwords.csv", opts.reset_passwords
    )
    for key, users in accounts.items():
        if users:
            say(f"accounts {key}: {', '.join(users)}")
    ensure_exchange(opts.exchange)
    course = ensure_course_dir(opts.instructor, opts.exchange, names)
    views = write_views(prefix, opts.instructor, course, opts.exchange)
    lessons = opts.lessons or sorted(
        p.name for p in (REPO_ROOT / "lessons").iterdir() if p.is_dir()
    )
    released = release_lessons(prefix, opts.instructor, course, opts.exchange, lessons)
    if released:
        say(f"released to the exchange: {', '.join(released)}")
    host = "0.0.0.0" if opts.public else "127.0.0.1"
    scheme = "https" if opts.ssl_cert else "http"
    settings = {
        "bind_url": f"{scheme}://{host}:{opts.port}",
        "ssl_cert": opts.ssl_cert,
        "ssl_key": opts.ssl_key,
        "hub_port": free_port(),
        "proxy_api_port": free_port(),
        "proxy": str(proxy),
        "state": str(state),
        "prefix": str(prefix),
        "students": sorted(names.values()),
        "instructor": opts.instructor,
        "views": views,
        "mem_limit": opts.mem_limit,
        "cull_timeout": opts.cull_timeout,
        "course": str(course),
        "exchange": str(opts.exchange),
        "passwords": str(state / "passwords.csv"),
    }
    settings["removed"] = removed_users(state / "passwords.csv")
    (state / "settings.json").write_text(json.dumps(settings, indent=1) + "\n")
    return settings


def removed_users(passwords: Path) -> list[str]:
    """The users whose accounts the command locked (no longer on the roster): blocked on the hub."""
    return sorted(u for u, row in _read_passwords(passwords).items() if row.get("locked"))


def running_hub(state: Path) -> int | None:
    """The pid of a JupyterHub started from ``state`` that still runs (its pid file), else None."""
    try:
        pid = int((state / "jupyterhub.pid").read_text().strip())
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    return pid if any(part.endswith(b"jupyterhub") for part in cmdline[:2]) else None


def stop_running_hub(state: Path, timeout: float = 120.0) -> int | None:
    """Stop the hub started earlier from ``state`` (SIGTERM: JupyterHub stops its users' servers,
    its services and the proxy); returns its pid, or None when none ran."""
    pid = running_hub(state)
    if pid is None:
        return None
    say(f"stopping the hub already running from {state} (pid {pid}) and its users' servers")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while running_hub(state) == pid:
        if time.monotonic() > deadline:
            raise HubError(f"the running hub (pid {pid}) did not stop in {timeout:g} s")
        time.sleep(0.5)
    return pid


def _check_port_free(url: str) -> None:
    """Refuse to start when something listens on the hub's public port: the proxy would fail to
    listen there (EADDRINUSE) while JupyterHub still says it runs, and nothing would answer."""
    parts = urllib.parse.urlsplit(url)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the proxy listens
        try:
            s.bind((parts.hostname, parts.port))
        except OSError as exc:
            raise HubError(
                f"port {parts.port} on {parts.hostname} is in use ({exc.strerror}): stop what "
                "listens there or give another --port"
            ) from None


def start(settings: dict) -> int:
    """Run JupyterHub in the foreground (Ctrl-C stops it and the students' servers)."""
    state = Path(settings["state"])
    env = {
        "PATH": f"{settings['prefix']}/bin:/usr/local/bin:/usr/bin:/bin",
        "HOME": os.environ.get("HOME", "/root"),
        "LANG": "C.UTF-8",
        "COURSE_HUB_SETTINGS": str(state / "settings.json"),
    }
    cmd = [
        str(Path(settings["prefix"]) / "bin" / "jupyterhub"),
        "-f",
        str(REPO_ROOT / "hub" / "jupyterhub_config.py"),
    ]
    stop_running_hub(state)
    _check_port_free(settings["bind_url"])
    if settings.get("removed"):
        say(f"blocked (not on the roster): {', '.join(settings['removed'])}")
    say(f"JupyterHub at {settings['bind_url']} (passwords: {settings['passwords']})")
    say("$ " + " ".join(cmd))
    sys.stdout.flush()
    return subprocess.call(cmd, cwd=state, env=env)


def main(opts: HubOptions) -> int:
    try:
        settings = setup(opts)
    except (HubError, ValueError, OSError) as exc:
        print(f"hub: {exc}", file=sys.stderr)
        return 2
    if opts.setup_only:
        say("set up; not started (--setup-only)")
        if running_hub(opts.state):
            say(
                "a hub from this state is running: it keeps its roster until the command is run "
                "again without --setup-only (which restarts it)"
            )
        return 0
    try:
        return start(settings)
    except HubError as exc:
        print(f"hub: {exc}", file=sys.stderr)
        return 2
