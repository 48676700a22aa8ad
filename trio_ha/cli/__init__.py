"""The ``trio-ha`` command line: one module per group of commands, all on one typer app.

``_app`` holds the application and what every command shares (global options, the one-line
report of an expected failure, running until SIGINT/SIGTERM); ``nodes`` runs a name server,
a broker or an embedded store; ``dev`` a whole cluster on loopback; ``bench`` and ``spark``
are sub-command groups.
"""

from __future__ import annotations

import sys

from . import bench, dev, nodes, spark  # noqa: F401  (each registers its commands on the app)
from ._app import app

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
