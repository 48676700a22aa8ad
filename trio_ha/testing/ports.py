"""Ports for test clusters whose nodes must come back where they were after a crash."""

from __future__ import annotations

import random
import socket

#: the lowest port ``free_broker_port`` hands out (above the privileged ones)
_FIRST_TEST_PORT = 1030


def free_broker_port(host: str = "127.0.0.1") -> int:
    """A port p that is free now with p - 2 (the VIP channel) and p + 1 (HA) free as well,
    for a broker that must come back on the same ports after a crash.

    The ports come from below the kernel's ephemeral range: a port in that range can be
    handed to any process's outgoing connection while its broker is down between a kill and
    a restart (a restart failed once that way with two test workers), one below it only to an
    explicit bind. (Free now: another process may still bind it; good enough on a test
    machine.)"""
    low = _ephemeral_low()
    for _ in range(200):
        if low > _FIRST_TEST_PORT + 3:
            port = random.randrange(_FIRST_TEST_PORT + 2, low - 1)  # p - 2 .. p + 1 below low
        else:  # no room below the range: a port the kernel picks
            port = _any_free_port(host)
        probes = []
        try:
            for p in (port - 2, port, port + 1):
                probe = socket.socket()
                probes.append(probe)  # closed below even if its bind fails
                probe.bind((host, p))
            return port
        except OSError:
            continue
        finally:
            for probe in probes:
                probe.close()
    raise RuntimeError("no free broker port")


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
