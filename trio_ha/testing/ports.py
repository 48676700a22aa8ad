"""Ports for test clusters whose nodes must come back where they were after a crash."""

from __future__ import annotations

import os
import random
import socket
import tempfile
import time

#: the lowest port ``free_broker_port`` hands out (above the privileged ones)
_FIRST_TEST_PORT = 1030
#: where ``free_broker_port`` notes the ports it handed out (an empty file per port), for
#: every process of this user on the machine, and for how long a note holds
RESERVATIONS = os.path.join(tempfile.gettempdir(), f"trio-ha-test-ports-{os.getuid()}")
RESERVED_SECONDS = 300.0


def free_broker_port(host: str = "127.0.0.1") -> int:
    """A port p that is free now with p - 2 (the VIP channel) and p + 1 (HA) free as well,
    for a broker that must come back on the same ports after a crash.

    The ports come from below the kernel's ephemeral range: a port in that range can be
    handed to any process's outgoing connection while its broker is down between a kill and
    a restart (a restart failed once that way with two test workers), one below it only to an
    explicit bind.

    Free now is not enough: a node binds its ports a while after they are chosen (a JVM
    seconds later), and meanwhile another test process could choose the same ones (an
    in-process cluster failed to listen so, its port's neighbour handed to a broker of the
    other worker). So each port handed out is noted for RESERVED_SECONDS in RESERVATIONS,
    and no process hands out a port noted there. (A process that is not ours may still bind
    one; good enough on a test machine.)"""
    low = _ephemeral_low()
    for _ in range(200):
        if low > _FIRST_TEST_PORT + 3:
            port = random.randrange(_FIRST_TEST_PORT + 2, low - 1)  # p - 2 .. p + 1 below low
        else:  # no room below the range: a port the kernel picks
            port = _any_free_port(host)
        footprint = (port - 2, port - 1, port, port + 1)
        if _free(host, footprint) and _reserve(footprint):
            return port
    raise RuntimeError("no free broker port")


def _free(host: str, ports: tuple[int, ...]) -> bool:
    probes = []
    try:
        for port in ports:
            probe = socket.socket()
            probes.append(probe)  # closed below even if its bind fails
            probe.bind((host, port))
        return True
    except OSError:
        return False
    finally:
        for probe in probes:
            probe.close()


def _reserve(ports: tuple[int, ...]) -> bool:
    """Note ``ports`` as handed out, all or none: False if another process noted one of
    them less than RESERVED_SECONDS ago (an older note is dropped)."""
    os.makedirs(RESERVATIONS, exist_ok=True)
    made: list[str] = []
    for port in ports:
        path = os.path.join(RESERVATIONS, str(port))
        try:
            os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        except FileExistsError:
            if not _stale(path):
                for note in made:
                    os.unlink(note)
                return False
            os.utime(path)  # an old note: this one now
        made.append(path)
    return True


def _stale(path: str) -> bool:
    try:
        return time.time() - os.stat(path).st_mtime > RESERVED_SECONDS
    except FileNotFoundError:
        return True


def _ephemeral_low() -> int:
    """The first port of the kernel's range for outgoing connections and port 0 (Linux's
    default if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _any_free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return max(s.getsockname()[1], _FIRST_TEST_PORT + 2)
