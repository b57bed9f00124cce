"""JupyterHub for a class of the DDP Lab: `make hub` (docs/instructors.md, "A class on JupyterHub").

Everything a class changes is in its settings file, deploy/jupyterhub/class.toml or $DDP_LAB_CLASS
(autograde/course/hub/settings.py says what each setting means); this file turns them into
JupyterHub's configuration. The hub runs as root, from the course's environment: it logs class
members in with their Unix password (PAM) and starts each one's server as that user.
"""
import os
import sys

from autograde.course import sandbox
from autograde.course.assignment import CourseError
from autograde.course.hub import settings as class_settings
from autograde.course.hub import spawners
from autograde.course.withheld import withhold
from autograde.parts.capstone import leaderboard, leaderboard_service

c = get_config()  # type: ignore[name-defined]  # noqa: F821 (JupyterHub provides it)

try:
    s = class_settings.load()
    class_settings.check_open_to_class(s.course / "autograde", spawners.BIN / "python")
except class_settings.SettingsError as err:
    sys.exit(f"error: {err}")
try:  # the course's solutions, tests and history: the instructors' alone (docs/instructors.md)
    print(withhold(s.course, s.instructors_group, s.instructors), flush=True)
except CourseError as err:
    sys.exit(f"error: {err}")
s.state.mkdir(parents=True, exist_ok=True, mode=0o700)
print(sandbox.allow_instructors(s.instructors), flush=True)  # the formgrader grades in a sandbox, as ddp-lab-grader
if s.slurm_conf:  # the hub's own squeue and scancel talk to the same SLURM as the jobs it submits
    os.environ["SLURM_CONF"] = s.slurm_conf

c.JupyterHub.ip = s.ip
c.JupyterHub.port = s.port
c.JupyterHub.hub_port = s.port + 1  # the hub's own API, the proxy's and the leaderboard: the ports after the hub's
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{s.port + 2}"
c.JupyterHub.hub_ip = "0.0.0.0" if s.spawner == "slurm" else "127.0.0.1"  # SLURM nodes call the hub back
if s.hub_connect_ip:
    c.JupyterHub.hub_connect_ip = s.hub_connect_ip
c.JupyterHub.db_url = f"sqlite:///{s.state / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(s.state / "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = str(s.state / "jupyterhub.pid")
c.ConfigurableHTTPProxy.command = [str(spawners.BIN / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(s.state / "proxy.pid")
# A restarted hub (Ctrl-C, then `make hub` again) finds every server where it was: stopping the hub
# stops no server (each runs in a session of its own, or as a SLURM job), and the state above (the
# database: who runs which server where; the cookie secret: who is logged in) is kept. A check
# running in a kernel runs on; learners' pages reconnect once the hub and its proxy are back. To end
# the class, stop the servers first (the admin page's "Stop All"), then the hub.
c.JupyterHub.cleanup_servers = False
# A server that stopped by itself (killed, its job ended, its node lost): its learner is told why on
# the hub's pages (the home page, "server not running") until they start it again.
c.JupyterHub.template_vars = {"announcement": spawners.announcement}
spawners.keep_notes(s.state / "stopped-servers.json")  # a restarted hub still says it

# Class members log in with their Unix user name and password; nobody else does.
c.JupyterHub.authenticator_class = "pam"
c.PAMAuthenticator.open_sessions = False
c.Authenticator.allowed_users = set(s.members)
c.Authenticator.admin_users = set(s.instructors)

c.JupyterHub.spawner_class = spawners.spawner_class(s)
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.start_timeout = 300 if s.spawner == "slurm" else 120  # a job may wait in the queue
c.Spawner.http_timeout = 120
c.Spawner.poll_interval = 10  # notice a server that died within seconds
if s.spawner == "slurm":
    c.Spawner.ip = "0.0.0.0"  # the hub reaches the server on its node


def _boards() -> list[str]:
    """The leaderboard file of each instructor's course folder (one not a user here yet has none)."""
    found = []
    for user in s.instructors:
        try:
            found.append(str(spawners.grading_folder(user) / leaderboard.LEADERBOARD))
        except KeyError:
            pass
    return found


# The capstone's leaderboard (autograde/parts/capstone/leaderboard_service.py), in the hub's Services menu:
# what grading recorded in each instructor's course folder, each class member's own row marked.
c.JupyterHub.services = [{
    "name": "leaderboard",
    "url": f"http://127.0.0.1:{s.port + 3}",
    "command": [str(spawners.BIN / "python"), "-m", leaderboard_service.__name__],
    "environment": {
        leaderboard_service.FILES: os.pathsep.join(_boards()),
        leaderboard_service.INSTRUCTORS: ",".join(s.instructors),
    },
    "display": True,
    "oauth_no_confirm": True,
}]
c.JupyterHub.load_roles = [{"name": "user", "scopes": ["self", "access:services!service=leaderboard"]}]
