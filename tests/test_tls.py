"""Issue 15: TLS on remoting, RocketMQ's way (``tls.server.mode`` disabled / permissive /
enforcing, ``tls.server.need.client.auth``, ``tls.enable`` on clients). Certificates are made
at run time by trustme; no key is in the repository. The real Java client with
-Dtls.enable=true is in test_interop_java_client.py."""

from __future__ import annotations

import functools
import socket
import struct

import pytest
import trio
import trio.testing
import trustme

from trio_ha.client import (
    Message,
    MQClientError,
    open_admin,
    open_client_instance,
    open_producer,
)
from trio_ha.config import ConfigError
from trio_ha.remoting import RemotingServer, open_remoting_client
from trio_ha.remoting.client import RemotingError
from trio_ha.remoting.tls import TlsClientConfig, TlsServerConfig
from trio_ha.testing import ClusterConfig, open_cluster
from trio_ha.wire.remoting import RemotingCommand, ResponseCode

ECHO = 9999


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA, a server certificate for 127.0.0.1 and a client certificate, as files."""
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    client = ca.issue_cert("client@example.org")
    paths = {"ca": root / "ca.pem", "cert": root / "server.pem", "key": root / "server.key",
             "client_cert": root / "client.pem", "client_key": root / "client.key"}
    ca.cert_pem.write_to_path(str(paths["ca"]))
    server.private_key_pem.write_to_path(str(paths["key"]))
    with open(paths["cert"], "wb") as out:
        for blob in server.cert_chain_pems:
            out.write(blob.bytes())
    client.private_key_pem.write_to_path(str(paths["client_key"]))
    with open(paths["client_cert"], "wb") as out:
        for blob in client.cert_chain_pems:
            out.write(blob.bytes())
    other = trustme.CA()  # a CA the server's certificate does not come from
    paths["other_ca"] = root / "other-ca.pem"
    other.cert_pem.write_to_path(str(paths["other_ca"]))
    return {name: str(path) for name, path in paths.items()}


def server_settings(pki, mode: str, **extra: str) -> dict[str, str]:
    return {"tls.server.mode": mode, "tls.server.certPath": pki["cert"],
            "tls.server.keyPath": pki["key"], **extra}


def client_tls(pki, **overrides) -> TlsClientConfig:
    values = {"enable": True, "trust_cert_path": pki["ca"], **overrides}
    return TlsClientConfig(**values)


async def echo(request: RemotingCommand, connection) -> RemotingCommand:
    await trio.lowlevel.checkpoint()
    return RemotingCommand.response_to(request, ResponseCode.SUCCESS, body=request.body)


async def start_server(nursery, tls: TlsServerConfig) -> str:
    server = RemotingServer(echo, tls=tls)
    host, port = await nursery.start(functools.partial(server.serve, 0, host="127.0.0.1"))
    return f"{host}:{port}"


async def ask(address: str, tls: TlsClientConfig | None = None) -> bytes:
    async with open_remoting_client(address, tls=tls, connect_timeout=5) as client:
        response = await client.invoke(RemotingCommand.request(ECHO, body=b"ping"), 5)
        return response.body


async def refused(address: str, tls: TlsClientConfig | None = None) -> str:
    """The error of a client the server does not serve: its connection fails at the TLS
    handshake (RemotingConnectError), or the server closes it before answering its first
    call (RemotingError: the connection broke)."""
    try:
        await ask(address, tls)
    except RemotingError as exc:
        return str(exc)
    raise AssertionError("the server served a client it should have refused")


# ---- configuration ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("settings", "message"), [
    ({"tls.server.mode": "enforcing"}, "certPath and tls.server.keyPath are needed"),
    ({"tls.server.mode": "sometimes"}, "expected one of disabled, permissive, enforcing"),
    ({"tls.server.mode": "permissive", "tls.server.certPath": "/nonexistent.pem",
      "tls.server.keyPath": "/nonexistent.key"}, "no such file"),
])
def test_bad_tls_settings_are_config_errors(settings, message):
    with pytest.raises(ConfigError, match=message):
        TlsServerConfig.from_settings(settings)


def test_client_auth_needs_a_trusted_ca(pki):
    with pytest.raises(ConfigError, match="trustCertPath"):
        TlsServerConfig.from_settings(server_settings(
            pki, "enforcing", **{"tls.server.need.client.auth": "require"}))


def test_tls_settings_come_from_the_tls_config_file_under_the_conf_keys(pki, tmp_path):
    from trio_ha.remoting.tls import tls_settings

    path = tmp_path / "tls.properties"
    path.write_text(f"tls.server.mode=permissive\ntls.server.certPath={pki['cert']}\n"
                    f"tls.server.keyPath={pki['key']}\nunrelated=1\n")
    settings = tls_settings({"tls.config.file": str(path), "tls.server.mode": "enforcing"})
    config = TlsServerConfig.from_settings(settings)
    assert config.mode == "enforcing" and config.cert_path == pki["cert"]  # the conf wins


# ---- the three modes -------------------------------------------------------------------------------------


async def test_enforcing_serves_tls_clients_and_closes_plain_ones(nursery, pki):
    address = await start_server(nursery, TlsServerConfig.from_settings(
        server_settings(pki, "enforcing")))
    assert await ask(address, client_tls(pki)) == b"ping"
    why = await refused(address)  # a plain client: closed before a byte is read
    assert why
    assert await ask(address, client_tls(pki)) == b"ping"  # the server keeps serving


@pytest.mark.parametrize("mode", ["permissive", "enforcing"])
async def test_a_connection_reset_before_its_first_byte_costs_only_itself(nursery, pki, mode):
    """A peer that connects and resets (SO_LINGER 0) before sending a byte fails the
    server's peek at the first byte: that connection is closed, and the server serves on
    (before, the error escaped and took the whole server down)."""
    address = await start_server(nursery, TlsServerConfig.from_settings(
        server_settings(pki, mode)))
    host, port = address.rsplit(":", 1)
    for _ in range(20):
        sock = trio.socket.socket()
        await sock.connect((host, int(port)))
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.close()
    await trio.testing.wait_all_tasks_blocked()  # the server has taken and dropped all 20
    assert await ask(address, client_tls(pki)) == b"ping"


async def test_permissive_serves_both(nursery, pki):
    address = await start_server(nursery, TlsServerConfig.from_settings(
        server_settings(pki, "permissive")))
    assert await ask(address, client_tls(pki)) == b"ping"
    assert await ask(address) == b"ping"


async def test_disabled_refuses_a_tls_handshake(nursery, pki):
    address = await start_server(nursery, TlsServerConfig())
    assert await ask(address) == b"ping"
    assert await refused(address, client_tls(pki))


async def test_a_client_verifies_the_servers_certificate_unless_in_test_mode(nursery, pki):
    address = await start_server(nursery, TlsServerConfig.from_settings(
        server_settings(pki, "enforcing")))
    assert "certificate" in (await refused(address, client_tls(pki,
                                                               trust_cert_path=pki["other_ca"])))
    # RocketMQ's tls.test.mode.enable: trust anything (tests only)
    insecure = client_tls(pki, trust_cert_path=pki["other_ca"], test_mode=True)
    assert await ask(address, insecure) == b"ping"


async def test_need_client_auth_require_refuses_a_client_without_a_certificate(nursery, pki):
    address = await start_server(nursery, TlsServerConfig.from_settings(server_settings(
        pki, "enforcing", **{"tls.server.need.client.auth": "require",
                             "tls.server.trustCertPath": pki["ca"]})))
    assert await refused(address, client_tls(pki))
    with_cert = client_tls(pki, cert_path=pki["client_cert"], key_path=pki["client_key"])
    assert await ask(address, with_cert) == b"ping"


# ---- a cluster behind TLS --------------------------------------------------------------------------------


async def test_a_cluster_in_enforcing_mode_serves_our_tls_client(tmp_path, pki):
    """Name server and broker both enforcing (the broker registers over TLS too: useTLS);
    our client sends and an admin creates a topic, every connection TLS."""
    server = server_settings(pki, "enforcing")
    broker = {**server, "useTLS": "true", "tls.client.trustCertPath": pki["ca"]}
    config = ClusterConfig(data_dir=str(tmp_path), slaves=0, master_role="ASYNC_MASTER",
                           properties=broker, namesrv_properties=server)
    async with open_cluster(config) as cluster:
        tls = client_tls(pki)
        async with open_client_instance(cluster.namesrv_addr, tls=tls) as client, \
                open_admin(client) as admin, open_producer(client, "g") as producer:
            await admin.create_topic("Secure", 2, cluster="DefaultCluster")
            result = await producer.send(Message("Secure", b"over TLS"))
            assert result.send_status.name == "SEND_OK"
        # a plain client gets nowhere: the name server closes it before reading a byte
        with pytest.raises(MQClientError, match="no name server answered"):
            async with open_client_instance(cluster.namesrv_addr,
                                            request_timeout=2) as plain, \
                    open_producer(plain, "g") as producer:
                await producer.send(Message("Secure", b"plain"), timeout=3)


def test_the_cli_connects_with_tls_when_asked(pki, tmp_path):
    """``trio-ha --tls --tls-ca CA`` against an enforcing name server and broker; without
    ``--tls`` the command fails with one line, and a CA file that is not there is a usage
    error."""
    import os
    import subprocess
    import sys

    from trio_ha.testing import ProcessCluster

    server = server_settings(pki, "enforcing")
    config = ClusterConfig(data_dir=str(tmp_path), slaves=0, master_role="ASYNC_MASTER",
                           properties={**server, "useTLS": "true",
                                       "tls.client.trustCertPath": pki["ca"]},
                           namesrv_properties=server)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "trio_ha.cli", *args],
                              capture_output=True, text=True, timeout=120,
                              env={k: v for k, v in os.environ.items()
                                   if not k.startswith("TRIO_HA_TLS")})

    with ProcessCluster.start(config) as running:
        create = ("admin", "update-topic", "-n", running.namesrv_addr, "-t", "CliTls",
                  "-r", "2", "-w", "2", "--json")
        plain = cli(*create)
        assert plain.returncode == 1 and "trio-ha:" in plain.stderr, plain.stderr
        secured = cli("--tls", "--tls-ca", pki["ca"], *create)
        assert secured.returncode == 0, secured.stderr
        listed = cli("--tls", "--tls-ca", pki["ca"], "admin", "topic-list", "-n",
                     running.namesrv_addr, "--json")
        assert listed.returncode == 0 and "CliTls" in listed.stdout, listed.stderr
        missing = cli("--tls", "--tls-ca", str(tmp_path / "nope.pem"), *create)
        assert missing.returncode == 2 and "no such file" in missing.stderr
