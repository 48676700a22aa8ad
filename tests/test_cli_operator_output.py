"""What an operator or a newcomer reads: no Python reprs, config errors in the conf file's own
words, a port in use named, help on every option, mistakes caught where they are made, and a
top-level package that shows its public names only."""

from __future__ import annotations

import pathlib
import socket
import subprocess
import sys

import pytest
import typer.main
from typer.core import TyperGroup, TyperOption

import trio_ha
from trio_ha.broker import BrokerConfig
from trio_ha.cli import app
from trio_ha.cli.admin import tps_text
from trio_ha.cli.status import _print_status, lag_text
from trio_ha.config import ConfigError, StoreConfig

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"


def _options(command, path):
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from _options(sub, [*path, name])
    for param in command.params:
        if isinstance(param, TyperOption) and not command.hidden and not param.hidden:
            yield " ".join(path), param


def test_cli_options_without_help_text_none_left():
    options = list(_options(typer.main.get_command(app), ["trio-ha"]))
    assert len(options) > 150  # the walk reaches every command
    missing = [f"{path} {'/'.join(param.opts)}" for path, param in options if not param.help]
    assert missing == []


def test_message_with_a_str_body_is_refused_when_made_not_at_send():
    with pytest.raises(TypeError, match=r"body must be bytes, got str \(encode it"):
        trio_ha.Message("T", "text")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="topic must be a str"):
        trio_ha.Message(b"T", b"text")  # type: ignore[arg-type]
    for body in (b"x", bytearray(b"x"), memoryview(b"x")):
        assert trio_ha.Message("T", body).body == body  # pyright: ignore[reportArgumentType]


def test_mqerror_and_transaction_state_are_in_the_top_level_package_and_dir_has_no_helpers():
    from trio_ha.client import MQError, TransactionState

    assert trio_ha.MQError is MQError and trio_ha.TransactionState is TransactionState
    assert trio_ha.TrioHAError is trio_ha.ConfigError.__mro__[1]
    shown = dir(trio_ha)
    for helper in ("annotations", "importlib", "Any", "TYPE_CHECKING"):
        assert helper not in shown
    for name in trio_ha.__all__:
        assert name in shown and getattr(trio_ha, name) is not None


def test_config_errors_name_the_camel_case_key_not_the_snake_case_field():
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_properties("metricsPort=70000\n")
    assert str(caught.value) == "metricsPort=70000 is outside [0, 65535]"
    with pytest.raises(ConfigError) as caught:
        StoreConfig.from_properties("mappedFileSizeCommitLog=12\n")
    assert str(caught.value).startswith("mappedFileSizeCommitLog=12 is outside [4096, ")


def test_config_errors_report_every_unknown_key_not_only_the_first():
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_properties("lisenPort=1\nbrokerRol=SLAVE\nnoSuchThing=1\n")
    message = str(caught.value)
    assert message.startswith("unknown keys ")
    for words in ("'lisenPort' (did you mean 'listenPort'?)",
                  "'brokerRol' (did you mean 'brokerRole'?)", "'noSuchThing'"):
        assert words in message


def test_config_errors_list_the_valid_enum_values():
    with pytest.raises(ConfigError) as caught:
        BrokerConfig.from_properties("brokerRole=MASTER\n")
    assert str(caught.value) == ("brokerRole: cannot parse 'MASTER' (expected one of "
                                 "ASYNC_MASTER, SYNC_MASTER, SLAVE)")
    with pytest.raises(ConfigError, match=r"flushDiskType: .*ASYNC_FLUSH, SYNC_FLUSH"):
        StoreConfig.from_properties("flushDiskType=SOMETIMES\n")


def test_namesrv_with_its_port_taken_names_the_port(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = subprocess.run(
            [sys.executable, "-m", "trio_ha.cli", "--log-file", str(tmp_path / "namesrv.log"),
             "namesrv", "--port", str(port), "--bind", "127.0.0.1"],
            capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 1
    assert result.stderr == (f"trio-ha: cannot listen on 127.0.0.1:{port}, listenPort: "
                             "Address already in use\n")


def test_status_prints_lag_unknown_not_lag_none_b(capsys):
    assert lag_text(None) == "lag unknown" and lag_text(0) == "lag 0 B"
    _print_status({"time": "now", "truncated": False, "topics": [], "groups": [], "brokers": [
        {"brokerName": "broker-a", "brokerId": 1, "address": "127.0.0.1:1", "role": "SLAVE",
         "minOffset": 0, "maxOffset": 10, "putTps": None, "haState": "connecting",
         "haMaster": None, "lagBytes": None, "lagSeconds": None},
    ]})
    out = capsys.readouterr().out
    assert "lag unknown" in out and "None" not in out


def test_put_tps_is_shown_with_one_decimal_not_15_digits():
    assert tps_text("12.345678901234567 1.0000000000000002 0.0") == "12.3 1.0 0.0"
    assert tps_text(None) is None


def test_readme_no_longer_says_acl_and_tls_are_refused():
    text = " ".join(README.read_text().split())
    assert "messages, ACL, TLS, and DLedger" not in text
    assert "ACL and TLS are supported" in text
