"""The ``trio-ha`` application object and what every command shares: the global options and
running a server until SIGINT/SIGTERM. How a failed or interrupted command ends is
``_failures``' (the app's click group)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import typer

from .. import _backend
from ._failures import EXIT_INTERRUPTED, CommandGroup, run_cancellable, show_tracebacks
from ._logging import LogFormat, LogLevel, configure_logging

app = typer.Typer(cls=CommandGroup, add_completion=False, no_args_is_help=True,
                  help="The ``trio-ha`` command line.",
                  context_settings={"help_option_names": ["-h", "--help"]})

DEFAULT_DATA_DIR = os.path.join(os.getcwd(), "data")


def _print_version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"trio-ha {__version__} (record engine: {_backend.native_backend})")
        raise typer.Exit()


#: the ACL account the client commands sign with (``--access-key``/``--secret-key``)
_CREDENTIALS: Any = None
#: the TLS the client commands connect with (``--tls`` and its files)
_TLS: Any = None


def client_options() -> dict[str, Any]:
    """What every client command opens its client instance with: the ACL account and the
    TLS settings, if given."""
    options: dict[str, Any] = {}
    if _CREDENTIALS is not None:
        options["credentials"] = _CREDENTIALS
    if _TLS is not None:
        options["tls"] = _TLS
    return options


@app.callback()
def _main(
    version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                 help="print the version and exit"),
    debug: bool = typer.Option(False, "--debug", help="show tracebacks of expected failures"),
    log_level: LogLevel = typer.Option(LogLevel.info, "--log-level", case_sensitive=False,
                                       help="the least severe log lines shown"),
    log_format: LogFormat = typer.Option(LogFormat.human, "--log-format", case_sensitive=False,
                                         help="human lines, or one JSON object per line"),
    log_file: str | None = typer.Option(None, "--log-file",
                                        help="append the log here instead of stderr"),
    access_key: str | None = typer.Option(
        None, "--access-key", envvar="TRIO_HA_ACCESS_KEY",
        help="ACL account: client commands sign every request (brokers with aclEnable)"),
    secret_key: str | None = typer.Option(
        None, "--secret-key", envvar="TRIO_HA_SECRET_KEY", show_envvar=True,
        help="the ACL account's secret key (prefer the environment variable)"),
    tls: bool = typer.Option(False, "--tls", envvar="TRIO_HA_TLS",
                             help="client commands connect with TLS (servers' tls.server.mode)"),
    tls_ca: str | None = typer.Option(None, "--tls-ca", envvar="TRIO_HA_TLS_CA",
                                      help="CA file the servers' certificates must come from "
                                           "(default: the system's)"),
    tls_cert: str | None = typer.Option(None, "--tls-cert", envvar="TRIO_HA_TLS_CERT",
                                        help="this client's certificate, for servers that ask"),
    tls_key: str | None = typer.Option(None, "--tls-key", envvar="TRIO_HA_TLS_KEY",
                                       help="the key of --tls-cert"),
) -> None:
    """The ``trio-ha`` command line."""
    global _CREDENTIALS, _TLS
    show_tracebacks(debug)
    if (access_key is None) != (secret_key is None):
        print("trio-ha: --access-key and --secret-key go together", file=sys.stderr)
        raise typer.Exit(2)
    if access_key is not None and secret_key is not None:
        from ..wire.acl import Credentials

        _CREDENTIALS = Credentials(access_key, secret_key)
    if tls:
        from ..config import ConfigError
        from ..remoting.tls import TlsClientConfig

        settings = {"tls.enable": "true", "tls.client.trustCertPath": tls_ca,
                    "tls.client.certPath": tls_cert, "tls.client.keyPath": tls_key}
        try:
            _TLS = TlsClientConfig.from_settings(
                {key: value for key, value in settings.items() if value is not None})
        except ConfigError as exc:  # a file that is not there
            print(f"trio-ha: {exc}", file=sys.stderr)
            raise typer.Exit(2) from None
    try:
        configure_logging(log_level, log_format, log_file)
    except OSError as exc:
        print(f"trio-ha: cannot open the log file: {exc.strerror}: {log_file}", file=sys.stderr)
        raise typer.Exit(1) from None


def print_json_lines(results: Iterable[dict[str, Any]]) -> None:
    """A benchmark's results, one JSON object per line, each as soon as it is measured."""
    for result in results:
        print(json.dumps(result), flush=True)


def run_until_interrupted(main: Callable[[], Awaitable[None]]) -> None:
    """Run a server's ``main`` until it returns or a SIGINT/SIGTERM arrives; then cancel it, so
    that it shuts down gracefully (drain connections, flush, checkpoint, remove the abort
    file). A second signal does not wait for that: the process exits at once, as after a
    crash, and the next start recovers. A Ctrl-C ends the process with 130, as a shell
    expects of an interrupted program; SIGTERM, a service manager's way to stop a server, with
    0 after a clean stop. A failure is raised, for the app's group to report as one line."""

    def announce() -> None:
        print("shutting down ... (a second Ctrl-C forces)", flush=True)

    _, signum = run_cancellable(main, on_signal=announce)
    if signum == signal.SIGINT:
        raise SystemExit(EXIT_INTERRUPTED)
