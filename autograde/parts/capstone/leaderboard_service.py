"""The capstone's leaderboard on the hub: a JupyterHub service at /services/leaderboard/, which the hub
starts (deploy/jupyterhub/jupyterhub_config.py) and class members open from the hub's Services menu.

    python -m autograde.parts.capstone.leaderboard_service   (the hub runs it, with the variables below)

Class members log in through the hub (OAuth): the page knows who is looking, marks their row, and
shows the reasons of invalid runs to the instructors and to the learner whose run it was. It reads
the leaderboard files (leaderboard.py) of every instructor's course folder, as they are at each visit.
"""
from __future__ import annotations

import os
import secrets
from pathlib import Path
from urllib.parse import urlparse

from jupyterhub.services.auth import HubOAuthCallbackHandler, HubOAuthenticated
from tornado import ioloop, web

from autograde.parts.capstone import leaderboard

FILES = "DDP_LAB_LEADERBOARD_FILES"  # the leaderboard files, os.pathsep between them
INSTRUCTORS = "DDP_LAB_LEADERBOARD_INSTRUCTORS"  # the instructors' user names, commas between them


class Board(HubOAuthenticated, web.RequestHandler):  # type: ignore[misc]
    @web.authenticated  # type: ignore[misc]
    def get(self) -> None:
        user = self.get_current_user()
        name = str(user["name"])
        files = [Path(p) for p in os.environ.get(FILES, "").split(os.pathsep) if p]
        instructor = name in os.environ.get(INSTRUCTORS, "").split(",") or bool(user.get("admin"))
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.write(leaderboard.page(leaderboard.read(files), name, instructor))


def main() -> None:
    prefix = os.environ["JUPYTERHUB_SERVICE_PREFIX"]
    app = web.Application([(prefix, Board), (prefix + "oauth_callback", HubOAuthCallbackHandler),
                           (prefix.rstrip("/"), web.RedirectHandler, {"url": prefix})],
                          cookie_secret=secrets.token_bytes(32))
    where = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    app.listen(where.port or 80, where.hostname or "127.0.0.1")
    ioloop.IOLoop.current().start()


if __name__ == "__main__":
    main()
