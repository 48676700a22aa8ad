"""How a command ends when it does not finish: a failure of ours is one line and exit 1, a
Ctrl-C is exit 130 and at most one line, and only a bug keeps its traceback.

Why once, here, for every command: commands used to catch "their" expected errors by list
(``run_client`` caught three types, the node commands three others, the store tools one more),
so every error type nobody had listed — a missing segment, a broken ``plain_acl.yml`` — came out
as a 200-line traceback of nested ExceptionGroups, and a Ctrl-C inside ``trio.run`` came out as
a KeyboardInterrupt wrapped in one, past click's own handler. Now every command runs under one
click group whose ``invoke`` looks at whatever escapes: it flattens exception groups to their
leaves, and when every leaf is an error of ours (``TrioHAError``, the base all of them share),
an operator's OSError (a port taken, no room, no permission) or the cancellation that came with
them, it prints the first one as ``trio-ha: <message>`` and exits 1. A KeyboardInterrupt among
them is exit 130, silently. Anything else is a bug and keeps its traceback; ``--debug`` shows
the traceback of an expected failure too.

The commands that talk to a cluster or serve one run under ``run_cancellable``: the first
SIGINT/SIGTERM cancels the command's work, so its cleanup runs (a consumer commits its offsets,
a broker drains and flushes) and it can say what it got done before the process exits 128 +
the signal; a second signal exits at once.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import trio
import typer
import typer.core
import typer.exceptions

from .._errors import TrioHAError

__all__ = [
    "EXIT_FAILURE", "EXIT_INTERRUPTED", "CommandGroup", "leaves", "one_line", "run_cancellable",
    "show_tracebacks", "tracebacks_shown",
]

_T = TypeVar("_T")

#: exit status of an expected failure (a bad option is click's 2)
EXIT_FAILURE = 1
#: exit status after a Ctrl-C: 128 + SIGINT, what a shell reports for a program it interrupted
EXIT_INTERRUPTED = 128 + signal.SIGINT
#: errnos of failures an operator fixes (a port taken, no room, no permission, read-only, a
#: peer that is not there)
_OPERATOR_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES, errno.EPERM,
                              errno.ENOSPC, errno.EROFS, errno.EMFILE, errno.ENOENT,
                              errno.ENOTDIR, errno.ECONNREFUSED, errno.ECONNRESET,
                              errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH})


def leaves(exc: BaseException) -> Iterable[BaseException]:
    """The exceptions inside ``exc``'s (nested) exception groups, or ``exc`` itself."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from leaves(inner)
    else:
        yield exc


def _oserror_line(exc: OSError) -> str:
    if exc.strerror is None:
        return str(exc)
    filename = f": {exc.filename}" if exc.filename is not None else ""
    return f"{exc.strerror}{filename}"


def _message(exc: BaseException) -> str:
    """The one line an operator reads for ``exc``: its message with its line breaks folded;
    for an error raised without one, its type and what its docstring says it means."""
    text = _oserror_line(exc) if isinstance(exc, OSError) else str(exc)
    if not text.strip():
        doc = (type(exc).__doc__ or "").strip().split("\n\n")[0]
        text = f"{type(exc).__name__}: {doc}" if doc else type(exc).__name__
    return " ".join(text.split())


def _is_expected(exc: BaseException) -> bool:
    return isinstance(exc, TrioHAError) or (
        isinstance(exc, OSError) and exc.errno in _OPERATOR_ERRNOS)


def _is_interruption(exc: BaseException) -> bool:
    return isinstance(exc, (KeyboardInterrupt, trio.Cancelled))


def one_line(exc: BaseException) -> str | None:
    """The line to print for ``exc`` when it is a failure of ours or an operator's (every
    leaf an error of ours, an operator's OSError, or a cancellation that came with it), or None
    when it holds anything else — a bug, whose traceback must be seen."""
    found = list(leaves(exc))
    if not all(_is_expected(leaf) or _is_interruption(leaf) for leaf in found):
        return None
    expected = [leaf for leaf in found if _is_expected(leaf)]
    return _message(expected[0]) if expected else None


def _interrupted(exc: BaseException) -> bool:
    """``exc`` is a Ctrl-C: a KeyboardInterrupt, alone or with cancellations and errors of
    ours that it caused."""
    found = list(leaves(exc))
    return any(isinstance(leaf, KeyboardInterrupt) for leaf in found) and all(
        _is_interruption(leaf) or _is_expected(leaf) for leaf in found)


#: show the traceback of an expected failure too (``--debug``, set by the app's callback)
_show_tracebacks = False


def show_tracebacks(flag: bool) -> None:
    global _show_tracebacks
    _show_tracebacks = flag


def tracebacks_shown() -> bool:
    return _show_tracebacks


class CommandGroup(typer.core.TyperGroup):
    """The click group of the ``trio-ha`` app: whatever a command lets escape ends here, as
    one line and exit 1 (ours), exit 130 (Ctrl-C) or a traceback (a bug)."""

    def invoke(self, ctx: Any) -> Any:  # (click's Context: typer vendors click privately)
        try:
            return super().invoke(ctx)
        except (typer.Exit, typer.Abort, typer.exceptions.TyperException, SystemExit):
            raise  # click's own way out: a chosen exit status, or a usage error it prints
        except BaseException as exc:
            found = list(leaves(exc))
            if all(isinstance(leaf, (typer.Exit, SystemExit)) for leaf in found):
                raise found[0] from None  # an exit chosen inside a task, as if chosen here
            if _show_tracebacks:
                raise
            if _interrupted(exc):
                raise SystemExit(EXIT_INTERRUPTED) from None
            line = one_line(exc)
            if line is None:
                raise
            print(f"trio-ha: {line}", file=sys.stderr, flush=True)
            raise SystemExit(EXIT_FAILURE) from None


def run_cancellable(
    work: Callable[[], Awaitable[_T]],
    *,
    on_signal: Callable[[], None] | None = None,
    forgive_after_signal: bool = False,
    stop: trio.CancelScope | None = None,
) -> tuple[_T | None, int | None]:
    """Run ``work`` under trio until it returns or a SIGINT/SIGTERM arrives; the signal
    cancels it, so that its cleanup runs (``on_signal`` is called first, to say so). Returns
    ``(result, None)``, or ``(None, signum)`` when a signal stopped it. A second signal does not
    wait for the cleanup: the process exits at once with 128 + the signal.

    ``stop``, if given, is what the signal cancels instead of all of ``work``: a scope inside
    it around the part that may be cut short (a consumer's loop), so that what it opened
    around that part (the client, whose connections must still carry the final offset
    commits) closes in the ordinary way.

    A failure is raised, also during the cleanup after a signal (a server's final flush that
    found no room must not pass for a clean stop) — unless ``forgive_after_signal``: a client
    whose request was cancelled mid-way may fail on the way out (the connection it was using
    closed), and that is part of the interruption, not news."""
    signalled: list[int] = []

    async def runner() -> _T | None:
        work_scope = trio.CancelScope()
        result: _T | None = None
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:

                async def watch_signals() -> None:
                    async for signum in signals:
                        if not signalled:
                            signalled.append(signum)
                            if on_signal is not None:
                                on_signal()
                            (stop or work_scope).cancel()
                        else:
                            print("trio-ha: forced to stop; the next start recovers",
                                  file=sys.stderr, flush=True)
                            os._exit(128 + signum)

                nursery.start_soon(watch_signals)
                try:
                    with work_scope:
                        result = await work()
                finally:
                    nursery.cancel_scope.cancel()
        return result

    try:
        result = trio.run(runner)
    except BaseException as exc:
        # a bug is news either way
        found = list(leaves(exc))
        if not signalled and _interrupted(exc):
            # a Ctrl-C before the signal receiver was up: trio raised it as KeyboardInterrupt
            return None, signal.SIGINT
        if signalled and all(_is_interruption(leaf) or (forgive_after_signal and _is_expected(leaf))
                             for leaf in found):
            return None, signalled[0]
        raise
    return (None, signalled[0]) if signalled else (result, None)
