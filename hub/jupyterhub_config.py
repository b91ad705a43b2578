# JupyterHub configuration of the course's class hub (one machine: PAM accounts, local servers).
# `python -m grader hub` writes the class's settings as JSON and starts JupyterHub with this file
# and COURSE_HUB_SETTINGS naming that JSON; nothing here is specific to one class.
import json
import os

c = get_config()  # noqa: F821 - provided by traitlets when JupyterHub loads this file

S = json.load(open(os.environ["COURSE_HUB_SETTINGS"]))  # noqa: SIM115 - read once at start

# Where the hub listens: loopback by default; with --public and a certificate, HTTPS on all
# interfaces. The hub's own API and the proxy's API stay on loopback.
c.JupyterHub.bind_url = S["bind_url"]
if S.get("ssl_cert"):
    c.JupyterHub.ssl_cert = S["ssl_cert"]
    c.JupyterHub.ssl_key = S["ssl_key"]
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = S["hub_port"]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{S['proxy_api_port']}"
c.ConfigurableHTTPProxy.command = [S["proxy"]]
c.ConfigurableHTTPProxy.pid_file = os.path.join(S["state"], "proxy.pid")
c.JupyterHub.db_url = "sqlite:///" + os.path.join(S["state"], "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(S["state"], "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(S["state"], "jupyterhub.pid")

# Unix accounts with the passwords the command set (PAM); only the roster and the instructor may
# log in (JupyterHub 5+ allows nobody unless told); the instructor is the hub's admin.
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False
c.Authenticator.allowed_users = set(S["students"]) | {S["instructor"]}
c.Authenticator.admin_users = {S["instructor"]}
# The roster is the whole list: with allowed_users set, JupyterHub 5+ would otherwise also allow
# every user already in its database (allow_existing_users), so a removed student would stay.
c.Authenticator.allow_existing_users = False
# Students removed from the roster (their accounts locked by the command): JupyterHub stops their
# servers and revokes their roles when it starts, so an earlier session cookie opens nothing.
c.Authenticator.blocked_users = set(S.get("removed", []))

# Each user's server is a local process under their own account, started from the class
# environment (world-readable, built from the system Python) with the view of their role.
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [os.path.join(S["prefix"], "bin", "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 180
c.Spawner.http_timeout = 180
# LocalProcessSpawner enforces no memory limit: this is only what the server reports to its user
# (MEM_LIMIT); Kubernetes (hub/k8s/values.yaml) enforces singleuser.memory.limit.
c.Spawner.mem_limit = S["mem_limit"]


def _config_path(spawner):
    """The Jupyter config folders of this user's view: the student's or the instructor's."""
    views = S["views"]
    if spawner.user.name == S["instructor"]:
        return os.pathsep.join([views["instructor"], views["common"]])
    return os.pathsep.join([views["student"], views["common"], views["class"]])


c.Spawner.environment = {
    "PATH": os.path.join(S["prefix"], "bin") + ":/usr/local/bin:/usr/bin:/bin",
    "JUPYTER_CONFIG_PATH": _config_path,
    "PYTHONNOUSERSITE": "1",
}


def _instructor_tools(spawner):
    """The instructor's server imports the course directory's ``grader`` (not in the class
    environment, which students share: its judges hold hidden-test logic)."""
    if spawner.user.name == S["instructor"]:
        spawner.environment = {**spawner.environment, "PYTHONPATH": S["course"]}


c.Spawner.pre_spawn_hook = _instructor_tools

# Servers idle for an hour are stopped (jupyterhub-idle-culler, a hub service with just the
# scopes it needs).
c.JupyterHub.services = [
    {
        "name": "idle-culler",
        "command": [
            os.path.join(S["prefix"], "bin", "python"),
            "-m",
            "jupyterhub_idle_culler",
            f"--timeout={S['cull_timeout']}",
        ],
    }
]
c.JupyterHub.load_roles = [
    {
        "name": "idle-culler",
        "scopes": ["list:users", "read:users:activity", "read:servers", "delete:servers"],
        "services": ["idle-culler"],
    }
]
