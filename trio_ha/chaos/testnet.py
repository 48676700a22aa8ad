"""Test hosts: each node of a chaos run on a network of its own, so network faults are real.

A loopback proxy can stall or cut one TCP stream, but it cannot make a machine unreachable:
the node still answers everyone else, and a broken connection is always a clean close or a
clean stall. Real partitions lose packets in flight, leave connections half-open until a
timeout notices, and cut a node off from its name server and its clients as well as from its
peer. So each node runs in a network namespace of its own (a *test host*), with one end of a
veth pair; the other ends hang on a bridge in the harness's namespace, which holds the
*gateway* address (where the producers, consumers and fault proxies live). Nothing leaves
the bridge's private /24: the machine's own network is not touched.

Faults are rules in the hosts' own nftables tables (this kernel has nf_tables but neither
netem nor tc filters):

* :meth:`TestNetwork.block`: drop the packets between two sets of addresses, one way or both
  (a partition, or a one-way blackhole);
* :meth:`TestNetwork.isolate`: a host loses every packet but its loopback;
* :meth:`TestNetwork.lose`: a host drops a share of its packets at random, both ways;
* :meth:`TestNetwork.throttle`: a token bucket (``tbf``) on both ends of a host's link, so
  its traffic crawls and queues (the nearest thing to delay without netem).

Each fault returns a :class:`Rule` that :meth:`TestNetwork.heal` removes, and only it: faults
overlap and heal in any order. Every fault lives in its own nftables chain, so healing one is
deleting its chains.

Making namespaces needs root, ``ip`` (iproute2) and ``nft`` (nftables); :func:`unavailable`
says why not when one is missing, and the harness then runs without these faults and says so.
"""

from __future__ import annotations

import functools
import itertools
import os
import secrets
import shutil
import subprocess

import attrs

from .._errors import TrioHAError

__all__ = ["Host", "Rule", "TestNetwork", "TestNetworkError", "unavailable"]

#: the table every fault's chains live in, inside each host's namespace
TABLE = "chaos"


class TestNetworkError(TrioHAError, RuntimeError):
    """A command that builds or changes the test network failed: the command and its words."""


@functools.cache
def unavailable() -> str | None:
    """Why test hosts cannot be made here, or None when they can (asked once per process:
    the probe makes and deletes a namespace)."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables")):
        if shutil.which(tool) is None:
            return f"no {tool} on PATH (Debian package {package})"
    probe = f"trioha-probe-{secrets.token_hex(3)}"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "exec", probe, "nft", "add", "table", "inet", TABLE])
    except TestNetworkError as exc:
        return f"cannot make a test host: {exc}"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True, check=False)
    return None


def _run(command: list[str], stdin: str | None = None) -> str:
    done = subprocess.run(command, input=stdin, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise TestNetworkError(f"{' '.join(command)}: {done.stderr.strip() or done.stdout}")
    return done.stdout


@attrs.frozen
class Host:
    """One test host: a network namespace with one address on the test network."""

    name: str
    netns: str
    address: str
    #: the veth end on the bridge (in the harness's namespace)
    outer_link: str

    def command(self, argv: list[str]) -> list[str]:
        """``argv`` run inside this host."""
        return ["ip", "netns", "exec", self.netns, *argv]


@attrs.frozen
class Rule:
    """One fault in force: the chains it added (host -> chain names) and the links it
    throttled; :meth:`TestNetwork.heal` takes them away."""

    label: str
    chains: tuple[tuple[str, str], ...] = ()
    throttled: tuple[str, ...] = ()


@attrs.define(eq=False)
class TestNetwork:
    """A bridge, a gateway address on it, and test hosts hanging on it.

    Made with :meth:`create`, taken down with :meth:`close` (which tolerates what is
    already gone). The names carry a random tag, so runs side by side do not meet; a
    harness killed outright leaves its ``trioha-<tag>-*`` namespaces and ``thb<tag>``
    bridge behind for ``ip netns del`` / ``ip link del``.
    """

    __test__ = False  # (a name pytest would otherwise take for a test class)

    tag: str
    bridge: str
    #: the harness's address on the test network (clients and fault proxies bind here)
    gateway: str
    prefix: str
    hosts: dict[str, Host] = attrs.field(factory=dict)
    #: extra gateway-side addresses handed out by :meth:`add_gateway_address`
    extra_addresses: list[str] = attrs.field(factory=list)
    _numbers: itertools.count = attrs.field(factory=lambda: itertools.count(1))

    @classmethod
    def create(cls, names: list[str]) -> TestNetwork:
        """A network with one host per name (``names`` short and distinct)."""
        tag = secrets.token_hex(3)
        # A /24 in 10.0.0.0/8 that no interface of this machine uses yet.
        used = _run(["ip", "-4", "-o", "addr", "show"])
        for _ in range(64):
            prefix = f"10.{secrets.randbelow(54) + 200}.{secrets.randbelow(256)}"
            if f" {prefix}." not in used:
                break
        else:  # pragma: no cover - 64 collisions in a private /8
            raise TestNetworkError("no free /24 in 10.200.0.0/13 for the test network")
        network = cls(tag=tag, bridge=f"thb{tag}", gateway=f"{prefix}.1", prefix=prefix)
        try:
            _run(["ip", "link", "add", network.bridge, "type", "bridge"])
            _run(["ip", "addr", "add", f"{network.gateway}/24", "dev", network.bridge])
            _run(["ip", "link", "set", network.bridge, "up"])
            for number, name in enumerate(names, 2):
                network._add_host(name, number)
        except BaseException:
            network.close()
            raise
        return network

    def _add_host(self, name: str, number: int) -> None:
        netns = f"trioha-{self.tag}-{name}"
        outer = f"th{self.tag}h{number}"
        inner = f"th{self.tag}i{number}"
        address = f"{self.prefix}.{number}"
        _run(["ip", "netns", "add", netns])
        self.hosts[name] = Host(name, netns, address, outer)
        _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
        _run(["ip", "link", "set", inner, "netns", netns])
        _run(["ip", "link", "set", outer, "master", self.bridge])
        _run(["ip", "link", "set", outer, "up"])
        inside = ["ip", "-n", netns]
        _run([*inside, "link", "set", "lo", "up"])
        _run([*inside, "link", "set", inner, "name", "eth0"])
        _run([*inside, "addr", "add", f"{address}/24", "dev", "eth0"])
        _run([*inside, "link", "set", "eth0", "up"])
        _run(["ip", "netns", "exec", netns, "nft", "add", "table", "inet", TABLE])

    def add_gateway_address(self) -> str:
        """One more address of the harness's on the test network (from .100 up): a fault
        proxy bound to it is told apart from the clients by the hosts' rules."""
        address = f"{self.prefix}.{100 + len(self.extra_addresses)}"
        _run(["ip", "addr", "add", f"{address}/24", "dev", self.bridge])
        self.extra_addresses.append(address)
        return address

    def close(self) -> None:
        """Take every host and the bridge down (what is already gone is skipped)."""
        for host in self.hosts.values():
            subprocess.run(["ip", "netns", "del", host.netns], capture_output=True, check=False)
            subprocess.run(["ip", "link", "del", host.outer_link], capture_output=True,
                           check=False)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True, check=False)
        self.hosts.clear()

    # ---- faults ----------------------------------------------------------------------------

    def _chains(self, host: Host, rules: dict[str, list[str]]) -> tuple[str, str]:
        """Add one base chain per hook (``input``/``output``) to ``host``'s table, holding
        ``rules``; returns ``(host name, chain prefix)`` for :meth:`heal`."""
        name = f"f{next(self._numbers)}"
        script = []
        for hook, lines in rules.items():
            chain = f"{name}_{hook}"
            script.append(f"add chain inet {TABLE} {chain} "
                          f"{{ type filter hook {hook} priority 0; policy accept; }}")
            script.extend(f"add rule inet {TABLE} {chain} {line}" for line in lines)
        _run(host.command(["nft", "-f", "-"]), "\n".join(script) + "\n")
        return host.name, name

    def block(self, host: str, peers: list[str], *, inbound: bool = True,
              outbound: bool = True) -> Rule:
        """``host`` drops what it sends to (``outbound``) and what it receives from
        (``inbound``) each address in ``peers``: with both, a partition between them; with
        one, a one-way blackhole."""
        if not peers or not (inbound or outbound):
            raise ValueError("block needs peers and a direction")
        target = self.hosts[host]
        addresses = "{ " + ", ".join(peers) + " }"
        rules: dict[str, list[str]] = {}
        if outbound:
            rules["output"] = [f"ip daddr {addresses} drop"]
        if inbound:
            rules["input"] = [f"ip saddr {addresses} drop"]
        way = "<->" if inbound and outbound else ("->" if outbound else "<-")
        return Rule(f"{host} {way} {', '.join(peers)} blocked",
                    (self._chains(target, rules),))

    def isolate(self, host: str) -> Rule:
        """``host`` loses every packet in and out but its loopback's."""
        target = self.hosts[host]
        drop = ['oifname != "lo" drop']
        chains = self._chains(target, {"output": drop,
                                                 "input": ['iifname != "lo" drop']})
        return Rule(f"{host} isolated", (chains,))

    def lose(self, host: str, percent: int) -> Rule:
        """``host`` drops ``percent`` % of its packets, each way, at random."""
        if not 0 < percent <= 100:
            raise ValueError("percent must be within 1..100")
        target = self.hosts[host]
        line = f'{{direction}}ifname != "lo" numgen random mod 100 < {percent} drop'
        chains = self._chains(target, {"output": [line.format(direction="o")],
                                               "input": [line.format(direction="i")]})
        return Rule(f"{host} loses {percent}%", (chains,))

    def throttle(self, host: str, kbit: int) -> Rule:
        """Both directions of ``host``'s link limited to ``kbit`` kbit/s (a token bucket,
        with up to a second's worth queued before packets drop)."""
        target = self.hosts[host]
        burst = max(1600, kbit * 1000 // 8 // 50)  # 20 ms of tokens, at least a packet
        limit = max(burst * 2, kbit * 1000 // 8)  # about a second's worth of queue
        tbf = ["root", "tbf", "rate", f"{kbit}kbit", "burst", str(burst), "limit", str(limit)]
        rule = Rule(f"{host} throttled to {kbit} kbit/s", throttled=(host,))
        _run(["tc", "qdisc", "replace", "dev", target.outer_link, *tbf])
        try:
            _run(target.command(["tc", "qdisc", "replace", "dev", "eth0", *tbf]))
        except TestNetworkError:
            self.heal(rule)  # (not half a throttle)
            raise
        return rule

    def heal(self, rule: Rule) -> None:
        """Take ``rule`` away (its own chains and throttles only)."""
        for host_name, name in rule.chains:
            host = self.hosts.get(host_name)
            if host is None:
                continue
            listing = _run(host.command(["nft", "list", "table", "inet", TABLE]))
            script = [f"{verb} chain inet {TABLE} {name}_{hook}"
                      for hook in ("input", "output") if f"chain {name}_{hook} " in listing
                      for verb in ("flush", "delete")]
            if script:
                _run(host.command(["nft", "-f", "-"]), "\n".join(script) + "\n")
        for host_name in rule.throttled:
            host = self.hosts.get(host_name)
            if host is None:
                continue
            subprocess.run(["tc", "qdisc", "del", "dev", host.outer_link, "root"],
                           capture_output=True, check=False)
            subprocess.run(host.command(["tc", "qdisc", "del", "dev", "eth0", "root"]),
                           capture_output=True, check=False)
