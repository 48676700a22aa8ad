"""The ``trio-ha`` command line: one module per group of commands, all on one typer app.

``_app`` holds the application and what every command shares (global options, the one-line
report of an expected failure, running until SIGINT/SIGTERM); ``nodes`` runs name servers,
brokers and the dev cluster; ``bench`` and ``spark`` are their sub-commands.
"""

from __future__ import annotations

import sys

from . import bench, nodes, spark  # noqa: F401  (each registers its commands on the app)
from ._app import app

__all__ = ["app", "main"]


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
