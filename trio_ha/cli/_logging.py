"""Logging as the command line sets it up: one line per event, with its time and level.

The library only names its loggers (``logging.getLogger(__name__)`` in every module) and
never configures them: an application that embeds a store or a broker decides where its lines
go. The ``trio-ha`` executable is such an application, and an operator reading a node's
output needs to know when each line happened and how much it matters, so it installs one
handler on the root logger: human lines by default, one JSON object per line for log
shippers (``--log-format json``), on stderr or appended to ``--log-file``. Python warnings
go through the same handler, so they carry a time and a level too.

What the nodes log at INFO is chosen for an operator: state changes (a listener bound, a
slave attached or gone, a role or master change, recovery, retention, registration, a node
stopping and stopped), never one line per message — nor one per client connection, which a
tool that polls opens every second: those are DEBUG, with one INFO line a minute saying
connections come (and how many), and abnormal closes at INFO or WARNING, rate-limited.
"""

from __future__ import annotations

import enum
import json
import logging
import sys
import time

#: the human format: ``2026-11-26 18:04:05.123 INFO  trio_ha.store.opening: store ... recovered``
HUMAN_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-5s %(name)s: %(message)s"
HUMAN_DATE_FORMAT = "%Y-%m-%d %H:%M:%S"


class LogFormat(enum.StrEnum):
    human = "human"
    json = "json"


class LogLevel(enum.StrEnum):
    debug = "debug"
    info = "info"
    warning = "warning"
    error = "error"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ``time`` (UTC, ISO 8601, milliseconds), ``level``,
    ``logger``, ``message``, and ``exception`` when the record carries one."""

    def format(self, record: logging.LogRecord) -> str:
        seconds = int(record.created)
        event = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
                    + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            event["exception"] = self.formatException(record.exc_info)
        return json.dumps(event, ensure_ascii=False)


def configure_logging(level: LogLevel = LogLevel.info, fmt: LogFormat = LogFormat.human,
                      file: str | None = None) -> None:
    """Send every logger's records at ``level`` and above to stderr or ``file`` (appended),
    formatted as ``fmt``; replaces what an earlier call installed."""
    handler: logging.Handler
    if file is None:
        handler = logging.StreamHandler(sys.stderr)
    else:
        handler = logging.FileHandler(file, encoding="utf-8")
    if fmt is LogFormat.json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(HUMAN_FORMAT, HUMAN_DATE_FORMAT))
    root = logging.getLogger()
    for old in root.handlers[:]:
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)
