"""The replicated controller's etcd parts (issue 39) against a real 3-member etcd cluster.

The cluster (the ``etcd3`` fixture) starts once for this module; each test uses keys and an
election of its own, and finds every member running when it begins. What is checked: the
StateStore over etcd (round trip, conflicts, two stores racing on one key, deletes, reads
after a member's restart), the leadership (one leader that the other candidate names, a
takeover when the leader's lease is revoked or its process is killed, a leader that stops
leading when etcd is out of reach, fenced commits), and the client's bounded waits (a
stopped member is skipped; all members down is an EtcdUnavailable, not a hang).
"""

import gc
import itertools
import subprocess
import sys
import textwrap

import pytest
import trio

from conftest import wait_until
from trio_ha.controller import CommitConflict, Write
from trio_ha.controller._etcd_http import _Body
from trio_ha.controller.etcd import (
    EtcdKeys,
    EtcdStateStore,
    LeadershipLost,
    open_etcd_leadership,
)
from trio_ha.controller.etcd_client import (
    EtcdConfig,
    EtcdUnavailable,
    open_etcd_client,
    parse_endpoints,
    prefix_end,
)
from trio_ha.testing.etcd import EtcdCluster
from trio_ha.testing.processes import child_env

#: a lease TTL short enough for quick takeovers (etcd's minimum here is about 1.5 s)
TTL = 2
_names = itertools.count()


def fresh(what: str) -> str:
    """A key prefix or election name no other test of this run uses."""
    return f"test/{what}/{next(_names)}/"


def test_parse_endpoints():
    assert parse_endpoints("127.0.0.1:2379, http://h:2380/;x:1") == (
        "http://127.0.0.1:2379", "http://h:2380", "http://x:1")
    for bad in ("", " , ", "h", "h:0", "h:port", "https://h:2379"):
        with pytest.raises(ValueError):  # noqa: PT011 - each of these is refused
            parse_endpoints(bad)


def test_key_scheme_keeps_records_and_candidacies_apart():
    keys = EtcdKeys("/c1/")
    assert keys.state == "/c1/state/"
    assert keys.election == "/c1/leader"
    assert not (keys.election + "/").startswith(keys.state)
    assert EtcdKeys().prefix == "/trio-ha/controller/"
    with pytest.raises(ValueError, match="ends with"):
        EtcdKeys("/c1")


def test_prefix_end():
    assert prefix_end(b"a/") == b"a0"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff") == b"\0"


async def test_state_store_round_trip(etcd3):
    async with open_etcd_client(etcd3.endpoints) as client:
        store = EtcdStateStore(client, fresh("round-trip"))
        assert await store.load() == {}
        versions = await store.commit([Write("a", 0, b"one"), Write("b", 0, b"two")])
        assert set(versions) == {"a", "b"}
        loaded = await store.load()
        assert {k: v.value for k, v in loaded.items()} == {"a": b"one", "b": b"two"}
        assert {k: v.version for k, v in loaded.items()} == versions
        again = await store.commit([Write("a", versions["a"], b"three")])
        assert again["a"] > versions["a"]
        loaded = await store.load()
        assert loaded["a"].value == b"three"
        assert loaded["a"].version == again["a"]
        # A store under another prefix sees none of it.
        assert await EtcdStateStore(client, fresh("round-trip")).load() == {}


async def test_commit_is_all_or_nothing(etcd3):
    async with open_etcd_client(etcd3.endpoints) as client:
        store = EtcdStateStore(client, fresh("conflict"))
        versions = await store.commit([Write("a", 0, b"a1"), Write("b", 0, b"b1")])
        # "b" read at a stale version: neither write happens.
        with pytest.raises(CommitConflict):
            await store.commit([Write("a", versions["a"], b"a2"),
                                Write("b", versions["b"] - 1, b"b2")])
        # "must not exist" on a key that exists.
        with pytest.raises(CommitConflict):
            await store.commit([Write("c", 0, b"c1"), Write("a", 0, b"a3")])
        loaded = await store.load()
        assert {k: (v.version, v.value) for k, v in loaded.items()} == {
            "a": (versions["a"], b"a1"), "b": (versions["b"], b"b1")}
        with pytest.raises(ValueError, match="once"):
            await store.commit([Write("a", versions["a"], b"x"), Write("a", versions["a"], b"y")])


async def test_two_stores_racing_on_one_key(etcd3):
    """Two controllers (two clients, each starting at a different member) read the same
    version and commit at once, round after round: exactly one wins each round, and the
    record holds the winner's value."""
    prefix = fresh("race")
    async with open_etcd_client(etcd3.endpoints) as one, \
            open_etcd_client(etcd3.endpoints[1:] + etcd3.endpoints[:1]) as two:
        stores = [EtcdStateStore(one, prefix), EtcdStateStore(two, prefix)]
        await stores[0].commit([Write("epoch", 0, b"0")])
        for round_ in range(10):
            read = (await stores[0].load())["epoch"]
            outcomes: dict[int, object] = {}
            async with trio.open_nursery() as nursery:
                for i in (0, 1):
                    write = Write("epoch", read.version, f"{round_ + 1} by {i}".encode())
                    nursery.start_soon(_commit_into, outcomes, i, stores[i], write)
            winners = [i for i, o in outcomes.items() if not isinstance(o, CommitConflict)]
            assert len(winners) == 1, outcomes
            now = (await stores[1].load())["epoch"]
            assert now.value == f"{round_ + 1} by {winners[0]}".encode()
            assert now.version == outcomes[winners[0]]["epoch"]  # type: ignore[index]


async def _commit_into(outcomes: dict, i: int, store: EtcdStateStore, write: Write) -> None:
    try:
        outcomes[i] = await store.commit([write])
    except CommitConflict as exc:
        outcomes[i] = exc


async def test_delete_and_recreate(etcd3):
    async with open_etcd_client(etcd3.endpoints) as client:
        store = EtcdStateStore(client, fresh("delete"))
        first = (await store.commit([Write("a", 0, b"1"), Write("b", 0, b"1")]))["a"]
        assert await store.commit([Write("a", first, None)]) == {}
        assert set(await store.load()) == {"b"}
        # Recreated, the key's version is new: a write naming the old one conflicts.
        second = (await store.commit([Write("a", 0, b"2")]))["a"]
        assert second > first
        with pytest.raises(CommitConflict):
            await store.commit([Write("a", first, b"stale")])
        assert (await store.load())["a"].value == b"2"


async def test_load_after_a_member_restarts(etcd3):
    prefix = fresh("restart")
    async with open_etcd_client(etcd3.endpoints) as client:
        store = EtcdStateStore(client, prefix)
        versions = await store.commit([Write("a", 0, b"before")])
        etcd3.kill(0)
        # Two of three members still make a quorum: reads and commits go on.
        versions = await store.commit([Write("a", versions["a"], b"while down")])
        assert (await store.load())["a"].value == b"while down"
    etcd3.restart(0)
    # The restarted member caught up: a client of it alone reads the latest commit.
    async with open_etcd_client([etcd3.endpoints[0]]) as only_zero:
        loaded = await EtcdStateStore(only_zero, prefix).load()
    assert loaded["a"].value == b"while down"
    assert loaded["a"].version == versions["a"]


async def test_a_stopped_member_is_skipped(etcd3):
    """SIGSTOP the member the client talks to: it holds its sockets and answers nothing;
    the call goes to another member after one request timeout."""
    config = EtcdConfig(etcd3.endpoints, request_timeout=1.0, call_timeout=5.0)
    async with open_etcd_client(config) as client:
        store = EtcdStateStore(client, fresh("stopped"))
        versions = await store.commit([Write("a", 0, b"1")])
        assert client.endpoint == etcd3.endpoints[0]
        etcd3.pause(0)
        try:
            versions = await store.commit([Write("a", versions["a"], b"2")])
            assert client.endpoint != etcd3.endpoints[0]
            assert (await store.load())["a"].value == b"2"
        finally:
            etcd3.resume(0)


async def _swallow_replies(listener: trio.SocketListener, target: tuple[str, int]) -> None:
    """A proxy that forwards each request to ``target`` and drops its replies: the
    request is applied, and its sender hears nothing (a reply lost on the way back)."""
    async with trio.open_nursery() as nursery:
        while True:
            client = await listener.accept()
            server = await trio.open_tcp_stream(*target)

            async def forward(client=client, server=server) -> None:
                async with client, server:
                    async with trio.open_nursery() as inner:
                        async def drain() -> None:
                            while await server.receive_some(65536):
                                pass
                        inner.start_soon(drain)
                        while data := await client.receive_some(65536):
                            await server.send_all(data)
                        inner.cancel_scope.cancel()

            nursery.start_soon(forward)


async def test_a_commit_whose_reply_was_lost_is_not_a_conflict(etcd3):
    """The first attempt of a commit is applied but its reply is lost (a member that
    stopped answering after it proposed, a connection cut): the client sends it again to
    another member, whose compares fail on the first attempt's own writes. The store
    recognizes its writes and reports the commit, instead of a conflict that never was."""
    (listener,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    proxy_port = listener.socket.getsockname()[1]
    host, port = etcd3.endpoints[0].removeprefix("http://").rsplit(":", 1)
    endpoints = (f"http://127.0.0.1:{proxy_port}", *etcd3.endpoints[1:])
    async with listener, trio.open_nursery() as nursery:
        nursery.start_soon(_swallow_replies, listener, (host, int(port)))
        config = EtcdConfig(etcd3.endpoints, request_timeout=1.0, call_timeout=5.0)
        async with open_etcd_client(config) as direct, \
                open_etcd_client(EtcdConfig(endpoints, 1.0, 5.0)) as lossy:
            prefix = fresh("lost-reply")
            first = await EtcdStateStore(direct, prefix).commit([Write("a", 0, b"1"),
                                                                  Write("b", 0, b"1")])
            versions = await EtcdStateStore(lossy, prefix).commit(
                [Write("a", first["a"], b"2"), Write("b", first["b"], None)])
            assert lossy.endpoint != endpoints[0]  # it went through another member
            loaded = await EtcdStateStore(direct, prefix).load()
            assert set(loaded) == {"a"}
            assert loaded["a"].value == b"2"
            assert versions == {"a": loaded["a"].version}
            # A real conflict over the lossy path stays a conflict.
            with pytest.raises(CommitConflict):
                await EtcdStateStore(lossy, prefix).commit([Write("a", first["a"], b"3")])
            assert (await EtcdStateStore(direct, prefix).load())["a"].value == b"2"
        nursery.cancel_scope.cancel()


async def test_all_members_down_is_a_clear_error(etcd3):
    config = EtcdConfig(etcd3.endpoints, request_timeout=0.5, call_timeout=2.0)
    async with open_etcd_client(config) as client:
        store = EtcdStateStore(client, fresh("down"))
        for index in range(3):
            etcd3.pause(index)
        try:
            with trio.fail_after(30):  # a bound on the test, far above the call's own
                with pytest.raises(EtcdUnavailable, match="no member answered"):
                    await store.load()
        finally:
            for index in range(3):
                etcd3.resume(index)
        for index in range(3):
            etcd3.kill(index)
        # Refused connections: the same error, from every member.
        with trio.fail_after(30):
            with pytest.raises(EtcdUnavailable) as caught:
                await store.commit([Write("a", 0, b"1")])
        for endpoint in etcd3.endpoints:
            assert endpoint in str(caught.value)


async def test_one_candidate_leads_and_the_other_names_it(etcd3):
    election = fresh("election")
    async with open_etcd_client(etcd3.endpoints) as client_a, \
            open_etcd_client(etcd3.endpoints[::-1]) as client_b:
        async with open_etcd_leadership(client_a, election, "10.0.0.1:9878", ttl=TTL) as a:
            with trio.fail_after(20):
                await a.wait_leading()
            async with open_etcd_leadership(client_b, election, "10.0.0.2:9878", ttl=TTL,
                                            campaign_wait=1.0) as b:
                # b campaigns (and campaigns again) while a's lease stays alive.
                await trio.sleep(TTL * 1.5)
                assert a.is_leader
                assert not b.is_leader
                assert await b.leader_address() == "10.0.0.1:9878"
                assert await a.leader_address() == "10.0.0.1:9878"
            assert a.is_leader
        # a left: it gave its lease back, so nobody leads now.
        assert await _leader_of(client_b, election) is None


async def test_a_leader_that_resigns_hands_over_and_stands_again(etcd3):
    election = fresh("resign")
    async with open_etcd_client(etcd3.endpoints) as client:
        async with open_etcd_leadership(client, election, "a:1", ttl=TTL) as a:
            with trio.fail_after(20):
                await a.wait_leading()
            async with open_etcd_leadership(client, election, "b:1", ttl=TTL) as b:
                await wait_until(lambda: _candidates_are(client, election, 2),
                                 "b to stand", timeout=20)
                await a.resign()
                assert not a.is_leader
                with trio.fail_after(20):
                    await b.wait_leading()
                # a stands again, behind b: a candidacy of its own, not the leader.
                await wait_until(lambda: _candidates_are(client, election, 2),
                                 "a to stand again", timeout=20)
                assert not a.is_leader
                assert a.terms == 1
                assert await a.leader_address() == "b:1"


async def _candidates_are(client, election: str, count: int) -> bool:
    _, kvs = await client.get_prefix(election.encode() + b"/")
    return len(kvs) == count


async def _leader_of(client, election: str) -> str | None:
    kv = await client.leader(election.encode())
    return None if kv is None else kv.value.decode()


async def test_revoked_lease_moves_leadership_and_fences_the_old_leader(etcd3):
    keys = EtcdKeys("/" + fresh("group"))  # one controller group: its records and election
    election, prefix = keys.election, keys.state
    async with open_etcd_client(etcd3.endpoints) as client_a, \
            open_etcd_client(etcd3.endpoints[1:]) as client_b:
        async with open_etcd_leadership(client_a, election, "a:1", ttl=TTL) as a, \
                open_etcd_leadership(client_b, election, "b:1", ttl=TTL) as b:
            with trio.fail_after(20):
                await _either_leads(a, b)
            old, new = (a, b) if a.is_leader else (b, a)
            old_store = EtcdStateStore(old.client, prefix, fence=old)
            versions = await old_store.commit([Write("epoch", 0, b"1")])
            held = old.leader_key
            assert held is not None
            await old.client.lease_revoke(held.lease)
            with trio.fail_after(TTL * 3):  # the next keepalive, a third of the TTL, sees it
                await old.wait_deposed()
            with trio.fail_after(20):
                await new.wait_leading()
            assert await new.leader_address() == new.address
            with pytest.raises(LeadershipLost):
                await old_store.commit([Write("epoch", versions["epoch"], b"2 by old")])
            new_store = EtcdStateStore(new.client, prefix, fence=new)
            await new_store.commit([Write("epoch", versions["epoch"], b"2 by new")])
            # The records hold only records, never the candidacies beside them.
            assert {k: v.value for k, v in (await new_store.load()).items()} == {
                "epoch": b"2 by new"}


async def _either_leads(a, b) -> None:
    async with trio.open_nursery() as nursery:
        async def first(leadership) -> None:
            await leadership.wait_leading()
            nursery.cancel_scope.cancel()
        nursery.start_soon(first, a)
        nursery.start_soon(first, b)


async def test_a_fenced_commit_with_a_stale_leader_key_is_refused(etcd3):
    """The fence compares the leader key in etcd itself: a commit carrying a leader key
    that etcd no longer has fails as LeadershipLost, even if this process still thinks it
    leads (its lease deleted behind its back, between two keepalives)."""
    election = fresh("stale-key")
    async with open_etcd_client(etcd3.endpoints) as client:
        async with open_etcd_leadership(client, election, "a:1", ttl=TTL) as a:
            with trio.fail_after(20):
                await a.wait_leading()
            store = EtcdStateStore(client, fresh("stale-key-store"), fence=a)
            await store.commit([Write("x", 0, b"1")])
            held = a.leader_key
            assert held is not None
            await client.delete_range(held.key)
            with pytest.raises(LeadershipLost):
                await store.commit([Write("y", 0, b"1")])
            assert set(await EtcdStateStore(client, store.prefix).load()) == {"x"}


async def test_leader_out_of_reach_of_etcd_stops_leading(etcd3):
    """All members stopped: no keepalive gets through, and the leader deposes itself when
    its lease's TTL (counted from its last keepalive's send) runs out, before etcd could
    let anyone else lead."""
    election = fresh("unreachable")
    config = EtcdConfig(etcd3.endpoints, request_timeout=0.5, call_timeout=2.0)
    async with open_etcd_client(config) as client:
        async with open_etcd_leadership(client, election, "a:1", ttl=TTL) as a:
            with trio.fail_after(20):
                await a.wait_leading()
            terms = a.terms
            for index in range(3):
                etcd3.pause(index)
            try:
                with trio.fail_after(TTL * 3):
                    await a.wait_deposed()
                assert a.leader_key is None
            finally:
                for index in range(3):
                    etcd3.resume(index)
            # etcd back: the candidacy starts over and leads again.
            with trio.fail_after(30):
                await a.wait_leading()
            assert a.terms > terms  # a new term, not the old one resumed


#: a candidate in a process of its own: campaigns, then leads until it is killed
CANDIDATE = textwrap.dedent("""
    import sys, trio
    from trio_ha.controller.etcd import open_etcd_leadership
    from trio_ha.controller.etcd_client import open_etcd_client

    async def main(endpoints, election, address, ttl):
        async with open_etcd_client(endpoints.split(",")) as client:
            async with open_etcd_leadership(client, election, address, ttl=int(ttl)):
                await trio.sleep_forever()

    trio.run(main, *sys.argv[1:])
""")


async def test_killed_leader_process_is_replaced(etcd3, tmp_path):
    """The leader is another process, SIGKILLed: no resign, no revoke; its lease expires
    after the TTL and the other candidate leads."""
    election = fresh("killed")
    async with open_etcd_client(etcd3.endpoints) as client:
        log_path = tmp_path / "candidate.log"
        with await trio.to_thread.run_sync(open, log_path, "wb") as log:
            process = await trio.lowlevel.open_process(
                [sys.executable, "-c", CANDIDATE, ",".join(etcd3.endpoints), election,
                 "child:1", str(TTL)], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                env=child_env())
        try:
            await wait_until(lambda: _leader_of(client, election), "the child to lead",
                             timeout=30, interval=0.1)
            async with open_etcd_leadership(client, election, "parent:1", ttl=TTL,
                                            campaign_wait=2.0) as me:
                assert await me.leader_address() == "child:1"
                assert process.returncode is None, log_path.read_text()
                assert not me.is_leader
                process.kill()
                with trio.fail_after(10):
                    await process.wait()
                with trio.fail_after(TTL + 15):
                    await me.wait_leading()
                assert await me.leader_address() == "parent:1"
        finally:
            process.kill()
            with trio.fail_after(10):
                await process.wait()


async def test_a_request_body_left_early_leaves_nothing_to_finalize():
    """A call cut off while httpcore sends its body (a follower's campaign renewed, a
    member that stopped answering) leaves the body's iterator half-read. httpx's own body
    stream is an async generator, which trio warns about when it is collected so (an error
    here: this test fails with httpx.ByteStream in place of _Body); ours is a plain
    iterator."""
    body = _Body(b'{"key": "a2V5"}')
    async for chunk in body:
        assert chunk == b'{"key": "a2V5"}'
        break
    del body
    gc.collect()
    await trio.lowlevel.checkpoint()  # trio finalizes a collected generator in a later step


@pytest.mark.usefixtures("etcd_installed")
async def test_a_single_member_cluster_starts_serves_and_stops(tmp_path):
    """The harness's one-member form: it serves, and stopping it leaves no process
    behind."""
    with EtcdCluster.start(tmp_path / "one", size=1) as one:
        (member,) = one.members
        async with open_etcd_client(one.endpoints) as client:
            store = EtcdStateStore(client, fresh("single"))
            await store.commit([Write("a", 0, b"1")])
            assert (await store.load())["a"].value == b"1"
    assert member.process is not None
    assert member.process.poll() is not None
    assert not member.running()
