"""Expected failures are one line, by construction: every error type the project defines
derives from ``TrioHAError``, and any of them that reaches the command line — however deep in
exception groups — is one line on stderr and exit 1, with the traceback only under --debug.

The walk over the package finds the error types itself, so a new one that forgets the base
fails here, not in front of an operator."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys

import pytest
import trio
from typer.testing import CliRunner

import trio_ha
from trio_ha._errors import TrioHAError
from trio_ha.cli import admin, app


def _modules() -> list[str]:
    names = ["trio_ha"]
    for info in pkgutil.walk_packages(trio_ha.__path__, "trio_ha."):
        if not info.name.endswith(".__main__"):  # importing it runs the program
            names.append(info.name)
    return names


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:  # an optional dependency (pyspark) that is not here
        if exc.name is not None and not exc.name.startswith("trio_ha"):
            return None
        raise


def _our_exception_classes() -> list[type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in _modules():
        module = _import(name)
        if module is None:
            continue
        for value in vars(module).values():
            if (isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__ == name):
                found[f"{name}.{value.__qualname__}"] = value
    return [found[key] for key in sorted(found)]


CLASSES = _our_exception_classes()


def _instance(cls: type[BaseException]) -> BaseException:
    """An instance of ``cls`` built through its own constructor, with plausible arguments."""
    init = cls.__init__
    if init in (Exception.__init__, BaseException.__init__, OSError.__init__,
                ValueError.__init__, RuntimeError.__init__, ImportError.__init__):
        return cls(f"a failure of type {cls.__name__}")
    args = []
    for parameter in list(inspect.signature(init).parameters.values())[1:]:
        if parameter.default is not inspect.Parameter.empty or parameter.kind in (
                inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        annotation = str(parameter.annotation)
        if "int" in annotation:
            args.append(4096)
        elif "float" in annotation:
            args.append(2.5)
        else:
            args.append(f"{parameter.name} of {cls.__name__}")
    return cls(*args)


def test_the_walk_finds_the_error_types():
    names = {cls.__name__ for cls in CLASSES}
    assert {"ConfigError", "SegmentGapError", "AclConfigError", "MQBrokerError",
            "RecordDecodeError", "StoreLockedError"} <= names, names


@pytest.mark.parametrize("cls", CLASSES, ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_every_error_type_of_ours_derives_from_the_one_base(cls):
    if issubclass(cls, Exception):
        assert issubclass(cls, TrioHAError), (
            f"{cls.__module__}.{cls.__qualname__} derives from Exception but not from "
            "trio_ha.TrioHAError: the command line would show it as a traceback")


def _failing_with(monkeypatch, exc: BaseException) -> None:
    """``admin cluster-list`` fails with ``exc``, raised in a task of a nursery inside a
    nursery — the way a failure in a client or a server reaches a command."""

    async def cluster_rows(namesrv: str):
        async def fail() -> None:
            raise exc

        async with trio.open_nursery() as outer:
            async with trio.open_nursery() as inner:
                inner.start_soon(fail)
                outer.start_soon(trio.sleep_forever)
        return []

    monkeypatch.setattr(admin, "cluster_rows", cluster_rows)


@pytest.mark.parametrize("cls", [cls for cls in CLASSES if issubclass(cls, TrioHAError)],
                         ids=lambda cls: f"{cls.__module__}.{cls.__qualname__}")
def test_expected_failures_escape_as_one_line_not_a_traceback(monkeypatch, cls):
    exc = _instance(cls)
    _failing_with(monkeypatch, exc)
    result = CliRunner().invoke(app, ["admin", "cluster-list", "-n", "127.0.0.1:1"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("trio-ha: ") and "Traceback" not in result.stderr
    message = " ".join(str(exc).split())
    if message:
        assert message in lines[0]
    else:  # raised without a message: its name says what it is
        assert cls.__name__ in lines[0]


def test_debug_shows_the_traceback_of_an_expected_failure(monkeypatch):
    from trio_ha.config import ConfigError

    _failing_with(monkeypatch, ConfigError("listenPort must be 0..65535"))
    result = CliRunner().invoke(app, ["--debug", "admin", "cluster-list"])
    assert result.exit_code == 1
    assert isinstance(result.exception, BaseExceptionGroup)  # raised, for the traceback


def test_a_bug_keeps_its_traceback(monkeypatch):
    _failing_with(monkeypatch, ZeroDivisionError("a bug"))
    result = CliRunner().invoke(app, ["admin", "cluster-list"])
    assert result.exit_code == 1
    assert isinstance(result.exception, BaseExceptionGroup)
    assert "trio-ha:" not in result.stderr


def test_expected_failures_escape_as_one_line_from_a_broker_with_a_missing_segment(tmp_path):
    """The issue's case, as an operator meets it: a store whose middle commitlog segment is
    gone. The broker refuses to start, in one line that names the gap."""
    from trio_ha import Message, StoreConfig, open_store

    store = tmp_path / "store"
    segment = 64 * 1024

    async def fill() -> None:
        config = StoreConfig(store_path_root_dir=str(store), mapped_file_size_commit_log=segment)
        async with open_store(config) as opened:
            for _ in range(60):  # about four segments of 16 KiB records
                await opened.put_message(Message("GapTopic", bytes(16000)), queue_id=0)

    trio.run(fill)
    segments = sorted((store / "commitlog").iterdir())
    assert len(segments) >= 3, segments
    segments[1].unlink()
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerRole=ASYNC_MASTER\nlistenPort=0\nhaListenPort=0\n"
                    f"bindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\nnamesrvAddr=127.0.0.1:1\n"
                    f"storePathRootDir={store}\nmappedFileSizeCommitLog={segment}\n")
    broker = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "--log-file", str(tmp_path / "broker.log"),
         "broker", "-c", str(conf)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert broker.returncode == 1, broker.stderr
    assert len(broker.stderr.splitlines()) == 1, broker.stderr
    assert broker.stderr.startswith("trio-ha: ") and "gap between segments" in broker.stderr


def test_expected_failures_escape_as_one_line_from_a_broker_with_a_broken_plain_acl_yml(tmp_path):
    """The issue's other case: a ``plain_acl.yml`` that is not valid YAML stops the broker's
    start with one line naming the file, not 400 lines of traceback."""
    acl = tmp_path / "plain_acl.yml"
    acl.write_text("accounts:\n  - accessKey: [unclosed\n")
    conf = tmp_path / "broker.conf"
    conf.write_text(f"brokerRole=ASYNC_MASTER\nlistenPort=0\nhaListenPort=0\n"
                    f"bindAddress=127.0.0.1\nhaBindAddress=127.0.0.1\nnamesrvAddr=127.0.0.1:1\n"
                    f"storePathRootDir={tmp_path / 'store'}\nmappedFileSizeCommitLog=65536\n"
                    f"aclEnable=true\nplainAclFile={acl}\n")
    broker = subprocess.run(
        [sys.executable, "-m", "trio_ha.cli", "--log-file", str(tmp_path / "broker.log"),
         "broker", "-c", str(conf)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert broker.returncode == 1, broker.stderr
    assert len(broker.stderr.splitlines()) == 1, broker.stderr
    assert broker.stderr.startswith("trio-ha: ") and "plain_acl.yml" in broker.stderr
