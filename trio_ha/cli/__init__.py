"""The ``trio-ha`` command line: one module per group of commands, all on one typer app.

``_app`` holds the application and what every command shares (global options, running until
SIGINT/SIGTERM); ``_failures`` how any command ends when it does not finish (one line and
exit 1 for an error of ours, 130 for Ctrl-C); ``nodes`` runs a name server,
a broker or an embedded store; ``dev`` a whole cluster on loopback; ``admin`` (mqadmin's
verbs and ``message get``; ``admin_controller``, its controller verbs), ``status`` and
``traffic`` (``produce``, ``consume``) talk to a running cluster; ``bench`` and ``spark`` are
sub-command groups.
"""

from __future__ import annotations

import faulthandler
import signal
import sys

# each registers its commands on the app
from . import (  # noqa: F401
    admin,
    admin_controller,
    bench,
    chaos,
    chaos_hostile,
    dev,
    nodes,
    spark,
    status,
    store_tools,
    traffic,
)
from ._app import app

__all__ = ["app", "main"]


def main() -> None:
    # ``kill -USR1 <pid>`` prints every thread's stack to stderr and the process goes on:
    # what an operator (or a test) needs to see where a node or a command that does not
    # stop is stuck, as jstack is for a JVM.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)
