# pyright: strict
"""etcd for the replicated controller (issue 39): a small client, the StateStore, leadership.

Several of our controllers share one state by keeping it in etcd, an existing consensus
engine, instead of a consensus of ours. Three pieces, each small:

- :class:`EtcdClient` speaks etcd's v3 API through its JSON gateway (HTTP/1.1, ``POST
  /v3/...`` with base64 keys and values; 64-bit numbers arrive as strings and zero values are
  left out, as protobuf's JSON mapping does). httpx carries it and runs under trio. A call
  goes to the member that answered last; a member that refuses, errs as unavailable, or says
  nothing within ``request_timeout`` is left for the next one, and a call that no member
  answers within ``call_timeout`` raises :class:`EtcdUnavailable`: a stopped or partitioned
  member costs one ``request_timeout``, never a hang.
- :class:`EtcdStateStore` is the StateStore protocol (``state_store.py``) over the keys under
  one prefix: a record's version is its key's ``mod_revision``, and a commit is one etcd
  transaction whose compares are the versions the rules read (``create_revision == 0`` for
  "must not exist"). Revisions only grow, a deleted and recreated key included, so a
  controller that decided from a stale read always loses to the one that committed first:
  two controllers can never both grant from the same state (two masters for one epoch).
  With a ``fence`` (the leadership), every commit also compares the leader key's
  ``create_revision``, so a deposed leader's late commit fails as :class:`LeadershipLost`.
- :class:`EtcdLeadership` campaigns on etcd's election API with a lease it keeps alive. Its
  leadership is valid locally until the last keepalive's send time plus the lease's TTL, a
  point never later than etcd's own expiry, so a leader cut off from etcd stops granting
  (``is_leader`` turns false, ``wait_deposed`` returns) before any other controller can be
  elected; a revoked or expired lease is noticed at the next keepalive (a third of the TTL).
  Followers read the leader's value, its controller address, for their NOT_LEADER answers.

The request bodies and the decoding of replies are plain functions on JSON values; the trio
parts (retries across members, the keepalive and campaign tasks) are thin around them.
"""

from __future__ import annotations

import base64
import json
import logging
import math
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

if TYPE_CHECKING:
    # Imported where a client opens, not here (see _etcd_http: httpx is slow to import).
    from ._etcd_http import Post

from .._errors import TrioHAError, unwrap_single_exception
from .state_store import CommitConflict, Versioned, Write

__all__ = [
    "ControllerLeadership",
    "EtcdClient",
    "EtcdConfig",
    "EtcdError",
    "EtcdKeys",
    "EtcdLeadership",
    "EtcdRequestError",
    "EtcdStateStore",
    "EtcdUnavailable",
    "KeyValue",
    "LeaderKey",
    "LeadershipLost",
    "TxnResult",
    "open_etcd_client",
    "open_etcd_leadership",
    "parse_endpoints",
]

Json = dict[str, Any]

log = logging.getLogger(__name__)

#: gRPC status codes (the gateway's ``code``) worth another member: UNAVAILABLE (no leader,
#: leader changed, member stopping) and DEADLINE_EXCEEDED (a request timed out in raft)
_RETRIABLE_CODES = frozenset({4, 14})
#: rounds over all the members at most, in one call (the deadline bounds it first, mostly)
_MAX_ROUNDS = 16
#: the pause after the first round in which no member answered; it doubles each round, up to
#: _MAX_ROUND_PAUSE, so a call outlasts etcd electing a leader (a second or two) without
#: knocking every few milliseconds on members that refuse at once
_ROUND_PAUSE = 0.05
_MAX_ROUND_PAUSE = 1.0


class EtcdError(TrioHAError):
    """Something went wrong talking to etcd."""


class EtcdUnavailable(EtcdError, ConnectionError):
    """No etcd member answered within the bounded wait; the message names what each said."""


class EtcdRequestError(EtcdError, RuntimeError):
    """etcd answered, with an error (a bad request, a lease that is gone, ...)."""

    def __init__(self, path: str, code: int, message: str) -> None:
        super().__init__(f"etcd {path}: {message} (code {code})")
        self.path = path
        self.code = code
        self.message = message


class LeadershipLost(EtcdError, RuntimeError):
    """This controller does not lead (any more): a fenced commit wrote nothing."""


# --- configuration ---------------------------------------------------------------------------


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``controllerEtcdEndpoints``: members separated by commas or semicolons, each
    ``host:port`` or ``http://host:port``."""
    endpoints: list[str] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip().rstrip("/")
        if not part:
            continue
        if part.startswith("https://"):
            raise ValueError(f"etcd endpoint {part!r}: TLS to etcd is not supported yet")
        if not part.startswith("http://"):
            part = "http://" + part
        host_port = part[len("http://"):]
        host, _, port = host_port.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"etcd endpoint {part!r} is not host:port")
        endpoints.append(part)
    if not endpoints:
        raise ValueError("no etcd endpoint given")
    return tuple(endpoints)


@attrs.frozen
class EtcdConfig:
    """Where etcd is and how long to wait for it."""

    endpoints: tuple[str, ...] = attrs.field(converter=tuple)
    #: one request to one member: past this it counts as not answering
    request_timeout: float = 2.0
    #: one call across the members, retries included: past this, EtcdUnavailable
    call_timeout: float = 6.0

    def __attrs_post_init__(self) -> None:
        if not self.endpoints:
            raise ValueError("no etcd endpoint given")
        if not 0 < self.request_timeout <= self.call_timeout:
            raise ValueError("etcd timeouts: 0 < request_timeout <= call_timeout")


@attrs.frozen
class EtcdKeys:
    """Where one group of controllers keeps its things in etcd (docs/controller.md, "etcd"):
    its records under ``<prefix>state/``, its election's candidacies under
    ``<prefix>leader/``. Groups with different prefixes share one etcd without meeting."""

    #: ``controllerEtcdKeyPrefix``
    prefix: str = "/trio-ha/controller/"

    def __attrs_post_init__(self) -> None:
        if not self.prefix.endswith("/"):
            raise ValueError(f"an etcd key prefix ends with '/': {self.prefix!r}")

    @property
    def state(self) -> str:
        """The StateStore's prefix: a record named ``k`` is the key ``<prefix>state/k``."""
        return self.prefix + "state/"

    @property
    def election(self) -> str:
        """The election's name: candidacies are ``<prefix>leader/<lease id in hex>``."""
        return self.prefix + "leader"


# --- values and their JSON (pure) ------------------------------------------------------------


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object) -> bytes:
    return base64.b64decode(text) if isinstance(text, str) else b""


def _int(value: object) -> int:
    """A protobuf int64 as the gateway writes it (a string; absent when zero)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int | str):
        return int(value)
    return 0


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


@attrs.frozen
class KeyValue:
    """One key as etcd stores it."""

    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int

    @classmethod
    def from_json(cls, kv: Json) -> KeyValue:
        return cls(_unb64(kv.get("key")), _unb64(kv.get("value")),
                   _int(kv.get("create_revision")), _int(kv.get("mod_revision")),
                   _int(kv.get("version")), _int(kv.get("lease")))


@attrs.frozen
class LeaderKey:
    """Who won an election, as etcd names it: the key (election name, then the lease in
    hex), its create revision and the lease."""

    name: bytes
    key: bytes
    rev: int
    lease: int

    @classmethod
    def from_json(cls, leader: Json) -> LeaderKey:
        return cls(_unb64(leader.get("name")), _unb64(leader.get("key")),
                   _int(leader.get("rev")), _int(leader.get("lease")))

    def to_json(self) -> Json:
        return {"name": _b64(self.name), "key": _b64(self.key), "rev": str(self.rev),
                "lease": str(self.lease)}


@attrs.frozen
class TxnResult:
    """A transaction's outcome: which branch ran, the store's revision after it, and the
    branch's responses (JSON, one per operation)."""

    succeeded: bool
    revision: int
    responses: tuple[Json, ...]
    #: an earlier attempt went unanswered after it may have reached etcd: if it was
    #: applied, this one found its effects (a failed compare, for a conditional write)
    retried: bool = False


def compare_mod_revision(key: bytes, revision: int) -> Json:
    return {"key": _b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": str(revision)}


def compare_create_revision(key: bytes, revision: int) -> Json:
    return {"key": _b64(key), "target": "CREATE", "result": "EQUAL",
            "create_revision": str(revision)}


def op_put(key: bytes, value: bytes, *, lease: int = 0) -> Json:
    put: Json = {"key": _b64(key), "value": _b64(value)}
    if lease:
        put["lease"] = str(lease)
    return {"request_put": put}


def op_delete(key: bytes) -> Json:
    return {"request_delete_range": {"key": _b64(key)}}


def op_range(key: bytes, range_end: bytes | None = None) -> Json:
    body: Json = {"key": _b64(key)}
    if range_end is not None:
        body["range_end"] = _b64(range_end)
    return {"request_range": body}


def _header_revision(reply: Json) -> int:
    header = reply.get("header")
    return _int(cast(Json, header).get("revision")) if isinstance(header, dict) else 0


def _kvs(reply: Json) -> list[KeyValue]:
    kvs = reply.get("kvs")
    if not isinstance(kvs, list):
        return []
    return [KeyValue.from_json(cast(Json, kv)) for kv in cast(list[object], kvs)
            if isinstance(kv, dict)]


# --- the client ------------------------------------------------------------------------------


@attrs.define(eq=False)
class EtcdClient:
    """etcd's v3 API over its JSON gateway, across several members (see the module's
    docstring). Open it with :func:`open_etcd_client`."""

    config: EtcdConfig
    #: POSTs a JSON body to a URL (``_etcd_http``)
    _post: Post
    #: the member that answered last: calls start there
    _preferred: int = 0

    @property
    def endpoint(self) -> str:
        """The member calls go to first."""
        return self.config.endpoints[self._preferred]

    async def call(self, path: str, body: Json, *, request_timeout: float | None = None,
                   call_timeout: float | None = None) -> Json:
        """``POST path`` with ``body`` to the members in turn until one answers; the
        reply's JSON. Raises :class:`EtcdRequestError` for an error etcd means (it is not
        retried), :class:`EtcdUnavailable` when no member answered within ``call_timeout``."""
        reply, _ = await self._call(path, body, request_timeout=request_timeout,
                                    call_timeout=call_timeout)
        return reply

    async def _call(self, path: str, body: Json, *, request_timeout: float | None = None,
                    call_timeout: float | None = None) -> tuple[Json, bool]:
        """:meth:`call`, and whether an attempt before the one answered may have reached
        etcd (it timed out, or its connection broke after it was made): a write sent again
        may find its own first attempt applied."""
        from ._etcd_http import TransportFailure  # loaded by open_etcd_client: a lookup

        payload = json.dumps(body).encode()
        endpoints = self.config.endpoints
        per_request = request_timeout or self.config.request_timeout
        deadline = trio.current_time() + max(call_timeout or self.config.call_timeout,
                                             per_request)
        failures: dict[str, str] = {}
        ambiguous = False
        first = self._preferred
        for attempt in range(_MAX_ROUNDS * len(endpoints)):
            if attempt and attempt % len(endpoints) == 0:
                pause = min(_MAX_ROUND_PAUSE, _ROUND_PAUSE * 2 ** (attempt // len(endpoints)))
                await trio.sleep(min(pause, max(0.0, deadline - trio.current_time())))
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                break
            index = (first + attempt) % len(endpoints)
            endpoint = endpoints[index]
            wait = min(per_request, remaining)
            reply: tuple[int, bytes] | None = None
            with trio.move_on_after(wait):
                try:
                    reply = await self._post(endpoint + path, payload)
                except TransportFailure as exc:
                    failures[endpoint] = str(exc)
                    ambiguous = ambiguous or exc.maybe_sent
                    continue
            if reply is None:
                failures[endpoint] = f"no answer within {wait:.3g} s"
                ambiguous = True
                continue
            status, content = reply
            data = _reply_json(status, content)
            error = data.get("error")
            if status != 200 or error is not None:
                code = _int(data.get("code"))
                message = str(data.get("message") or error or f"HTTP {status}")
                if isinstance(error, dict):  # a streaming call's error line
                    streamed = cast(Json, error)
                    code = _int(streamed.get("grpc_code"))
                    message = str(streamed.get("message") or streamed)
                if code in _RETRIABLE_CODES or status in (502, 503, 504):
                    failures[endpoint] = message
                    ambiguous = True  # "request timed out" may yet be applied
                    continue
                self._preferred = index
                raise EtcdRequestError(path, code, message)
            self._preferred = index
            return data, ambiguous
        await trio.lowlevel.checkpoint()  # a call is a checkpoint even if nothing was awaited
        said = "; ".join(f"{e}: {why}" for e, why in failures.items()) or "no attempt made"
        raise EtcdUnavailable(f"etcd {path}: no member answered within "
                              f"{max(call_timeout or self.config.call_timeout, per_request):g} s"
                              f" ({said})")

    # -- kv --

    async def range(self, key: bytes, range_end: bytes | None = None) -> tuple[int, list[KeyValue]]:
        """The keys from ``key`` up to ``range_end`` (just ``key`` without it): the store's
        revision and the keys. Linearizable: served through the raft leader."""
        body: Json = {"key": _b64(key)}
        if range_end is not None:
            body["range_end"] = _b64(range_end)
        reply = await self.call("/v3/kv/range", body)
        return _header_revision(reply), _kvs(reply)

    async def get_prefix(self, prefix: bytes) -> tuple[int, list[KeyValue]]:
        return await self.range(prefix, prefix_end(prefix))

    async def put(self, key: bytes, value: bytes, *, lease: int = 0) -> int:
        """Write ``key``; the revision that wrote it."""
        body = cast(Json, op_put(key, value, lease=lease)["request_put"])
        return _header_revision(await self.call("/v3/kv/put", body))

    async def delete_range(self, key: bytes, range_end: bytes | None = None) -> int:
        """Delete ``key`` (up to ``range_end``); how many keys went."""
        body = cast(Json, op_range(key, range_end)["request_range"])
        return _int((await self.call("/v3/kv/deleterange", body)).get("deleted"))

    async def txn(self, compare: Sequence[Json], success: Sequence[Json],
                  failure: Sequence[Json] = ()) -> TxnResult:
        """One transaction: ``success`` if every compare holds, else ``failure``."""
        reply, retried = await self._call("/v3/kv/txn", {"compare": list(compare),
                                                         "success": list(success),
                                                         "failure": list(failure)})
        responses = reply.get("responses")
        items = cast(list[object], responses) if isinstance(responses, list) else []
        return TxnResult(reply.get("succeeded") is True, _header_revision(reply),
                         tuple(cast(Json, r) for r in items if isinstance(r, dict)), retried)

    # -- leases --

    async def lease_grant(self, ttl: int) -> tuple[int, int]:
        """A new lease: its id and the TTL etcd granted (it may raise a short one)."""
        reply = await self.call("/v3/lease/grant", {"TTL": str(ttl)})
        return _int(reply.get("ID")), _int(reply.get("TTL"))

    async def lease_keepalive(self, lease: int, *, call_timeout: float | None = None) -> int:
        """Renew ``lease`` once: its TTL from now, 0 if etcd no longer has it."""
        reply = await self.call("/v3/lease/keepalive", {"ID": str(lease)},
                                call_timeout=call_timeout)
        # A streaming call: one request, one ``{"result": ...}`` line.
        result = reply.get("result")
        return _int(cast(Json, result).get("TTL")) if isinstance(result, dict) else 0

    async def lease_revoke(self, lease: int, *, call_timeout: float | None = None) -> None:
        """End ``lease`` now: the keys attached to it go with it."""
        try:
            await self.call("/v3/lease/revoke", {"ID": str(lease)}, call_timeout=call_timeout)
        except EtcdRequestError as exc:
            if "lease not found" not in exc.message:
                raise

    # -- elections --

    async def campaign(self, name: bytes, lease: int, value: bytes, *,
                       wait: float) -> LeaderKey:
        """Wait (at most ``wait`` seconds, on one member) until ``lease``'s candidacy in
        election ``name`` leads; the leader key. Raises EtcdUnavailable if it does not
        within ``wait`` (etcd then withdraws the candidacy; campaign again)."""
        reply = await self.call("/v3/election/campaign",
                                {"name": _b64(name), "lease": str(lease), "value": _b64(value)},
                                request_timeout=wait, call_timeout=wait)
        leader = reply.get("leader")
        if not isinstance(leader, dict):
            raise EtcdError(f"etcd campaign: no leader key in {reply!r}")
        return LeaderKey.from_json(cast(Json, leader))

    async def leader(self, name: bytes) -> KeyValue | None:
        """The leading candidacy of election ``name`` (its value is what it proclaimed), or
        None when there is none."""
        try:
            reply = await self.call("/v3/election/leader", {"name": _b64(name)})
        except EtcdRequestError as exc:
            if exc.message == "election: no leader":
                return None
            raise
        kv = reply.get("kv")
        return KeyValue.from_json(cast(Json, kv)) if isinstance(kv, dict) else None

    async def proclaim(self, leader: LeaderKey, value: bytes) -> None:
        """Change the leader's value without a new election."""
        await self.call("/v3/election/proclaim", {"leader": leader.to_json(),
                                                  "value": _b64(value)})

    async def resign(self, leader: LeaderKey, *, call_timeout: float | None = None) -> None:
        """Give up leading: the next candidate leads."""
        await self.call("/v3/election/resign", {"leader": leader.to_json()},
                        call_timeout=call_timeout)


def _reply_json(status: int, content: bytes) -> Json:
    try:
        data: object = json.loads(content)
    except ValueError:
        text = content[:200].decode(errors="replace")
        return {"error": text or f"HTTP {status}"}
    if not isinstance(data, dict):
        return {"error": f"unexpected reply {content[:200]!r}"}
    return cast(Json, data)


@asynccontextmanager
async def open_etcd_client(
        config: EtcdConfig | Iterable[str]) -> AsyncGenerator[EtcdClient, None]:
    """An :class:`EtcdClient` for ``config`` (or for these endpoints, with the default
    timeouts); its connections close on exit."""
    from ._etcd_http import open_post

    if not isinstance(config, EtcdConfig):
        config = EtcdConfig(tuple(config))
    async with open_post() as post:
        yield EtcdClient(config, post)


# --- the StateStore --------------------------------------------------------------------------


@attrs.define(eq=False)
class EtcdStateStore:
    """The controller's records under ``prefix`` in etcd (see the module's docstring). A
    record's key is ``prefix`` + its name (UTF-8); its version, the key's mod_revision."""

    client: EtcdClient
    prefix: str
    #: when set, commits succeed only while it leads (its leader key still stands)
    fence: EtcdLeadership | None = None

    def _key(self, name: str) -> bytes:
        return (self.prefix + name).encode()

    async def load(self) -> Mapping[str, Versioned]:
        prefix = self.prefix.encode()
        _, kvs = await self.client.get_prefix(prefix)
        return {kv.key[len(prefix):].decode(): Versioned(kv.mod_revision, kv.value)
                for kv in kvs}

    async def commit(self, writes: Sequence[Write]) -> Mapping[str, int]:
        names = [w.key for w in writes]
        if len(set(names)) != len(names):
            raise ValueError(f"a commit writes each record once: {sorted(names)}")
        compares: list[Json] = []
        success: list[Json] = []
        for write in writes:
            key = self._key(write.key)
            if write.expected_version == 0:
                compares.append(compare_create_revision(key, 0))
            else:
                compares.append(compare_mod_revision(key, write.expected_version))
            success.append(op_delete(key) if write.value is None else op_put(key, write.value))
        failure: list[Json] = []
        leader: LeaderKey | None = None
        if self.fence is not None:
            leader = self.fence.leader_key
            if leader is None:
                await trio.lowlevel.checkpoint()
                raise LeadershipLost("not the controller leader: nothing committed")
            compares.append(compare_create_revision(leader.key, leader.rev))
            failure.append(op_range(leader.key))
        if not writes and leader is None:
            await trio.lowlevel.checkpoint()
            return {}
        result = await self.client.txn(compares, success, failure)
        if not result.succeeded:
            if leader is not None and not _leader_stands(result, leader):
                raise LeadershipLost("the controller leadership moved on (its etcd leader key "
                                     "is gone): nothing committed")
            if result.retried:
                landed = await self._landed(writes)
                if landed is not None:
                    return landed
            raise CommitConflict(f"a record changed since it was read (one of "
                                 f"{', '.join(sorted(names))}): nothing committed")
        return {w.key: result.revision for w in writes if w.value is not None}

    async def _landed(self, writes: Sequence[Write]) -> Mapping[str, int] | None:
        """After a commit that failed its compares on a second attempt: whether the first
        attempt was applied after all. It was if the records are now exactly what it wrote,
        in one revision (a transaction's writes share it) past every version it expected;
        the commit's result then, else None. (Another controller writing the very same
        bytes at once would pass too: then both granted the same thing, which is no
        conflict.)"""
        result = await self.client.txn([], [op_range(self._key(w.key)) for w in writes])
        revisions: set[int] = set()
        for write, response in zip(writes, result.responses, strict=True):
            found = response.get("response_range")
            kvs = _kvs(cast(Json, found)) if isinstance(found, dict) else []
            if write.value is None:
                if kvs:
                    return None
                continue
            if len(kvs) != 1 or kvs[0].value != write.value:
                return None
            if kvs[0].mod_revision <= write.expected_version:
                return None
            revisions.add(kvs[0].mod_revision)
        if len(revisions) > 1:
            return None
        return {w.key: revision for w in writes if w.value is not None
                for revision in revisions}


def _leader_stands(result: TxnResult, leader: LeaderKey) -> bool:
    """Whether a failed fenced txn's range (its failure branch) still finds our leader key."""
    for response in result.responses:
        found = response.get("response_range")
        if isinstance(found, dict):
            return any(kv.create_revision == leader.rev for kv in _kvs(cast(Json, found)))
    return False


# --- leadership ------------------------------------------------------------------------------


@attrs.define(eq=False)
class EtcdLeadership:
    """This controller's candidacy in an etcd election (see the module's docstring). Open
    it with :func:`open_etcd_leadership`; it campaigns until it leads, leads while its lease
    lives, and campaigns again with a new lease if it loses it."""

    client: EtcdClient
    #: the election's name (its candidacies are keys under ``election/``)
    election: bytes
    #: our controller address: what followers name in NOT_LEADER answers
    address: str
    #: the lease's TTL in seconds
    ttl: int = 3
    #: how long one campaign request may wait on one member before it is sent again (a
    #: stopped member would otherwise hold a candidate forever)
    campaign_wait: float = 10.0
    _leader: LeaderKey | None = attrs.field(default=None, init=False)
    #: our leadership holds until then (trio's clock): the last keepalive's send time + TTL
    _valid_until: float = attrs.field(default=-math.inf, init=False)
    _changed: trio.Event = attrs.field(factory=trio.Event, init=False)
    #: the running candidacy (one lease): cancelled to start over
    _candidacy: trio.CancelScope | None = attrs.field(default=None, init=False)
    #: times this candidacy was elected (a new term each time)
    terms: int = attrs.field(default=0, init=False)

    @property
    def is_leader(self) -> bool:
        """Whether we lead now: elected, and our lease certainly alive."""
        return self._leader is not None and trio.current_time() < self._valid_until

    @property
    def leader_key(self) -> LeaderKey | None:
        """Our leader key while we lead (what fenced commits compare), else None."""
        return self._leader if self.is_leader else None

    async def wait_leading(self) -> None:
        """Return once we lead."""
        while not self.is_leader:
            await self._changed.wait()
        await trio.lowlevel.checkpoint()

    async def wait_deposed(self) -> None:
        """Return once we do not lead (at once if we do not)."""
        while self.is_leader:
            await self._changed.wait()
        await trio.lowlevel.checkpoint()

    async def leader_address(self) -> str | None:
        """The leading controller's address as etcd has it now (ours when we lead), or None
        while nobody leads."""
        kv = await self.client.leader(self.election)
        return None if kv is None else kv.value.decode(errors="replace")

    def _set_leader(self, leader: LeaderKey | None) -> None:
        if leader is not None:
            self.terms += 1
        self._leader = leader
        self._changed.set()
        self._changed = trio.Event()

    async def run(self) -> None:
        """Lease, campaign, lead; again whenever the lease is lost. Runs until cancelled
        (:func:`open_etcd_leadership` runs it in its nursery)."""
        while True:
            # etcd starts the lease's clock when the grant reaches it, after this instant:
            # validity counted from here ends first.
            asked = trio.current_time()
            try:
                lease, granted = await self.client.lease_grant(self.ttl)
            except EtcdError:
                await trio.sleep(self.ttl / 3)
                continue
            self._valid_until = asked + granted
            try:
                async with trio.open_nursery() as nursery:
                    self._candidacy = nursery.cancel_scope
                    nursery.start_soon(self._keep_alive, lease, granted, nursery.cancel_scope)
                    nursery.start_soon(self._campaign, lease, nursery.cancel_scope)
            finally:
                self._candidacy = None
                self._set_leader(None)
                self._valid_until = -math.inf
                with trio.move_on_after(self.client.config.request_timeout) as scope:
                    scope.shield = True
                    try:  # a lease we stopped renewing: let the next candidate in now
                        await self.client.lease_revoke(lease, call_timeout=scope.deadline
                                                       - trio.current_time())
                    except EtcdError:
                        pass

    async def _keep_alive(self, lease: int, ttl: int, scope: trio.CancelScope) -> None:
        """Renew the lease every third of its TTL; when it is gone (etcd says so, or no
        renewal got through before our validity ran out), cancel ``scope``: the candidacy
        ends and a new one begins."""
        try:
            while True:
                await trio.sleep(max(0.05, ttl / 3))
                renewed = False
                with trio.move_on_at(self._valid_until):
                    while not renewed:
                        sent = trio.current_time()
                        try:
                            remaining = self._valid_until - sent
                            left = await self.client.lease_keepalive(lease,
                                                                     call_timeout=remaining)
                        except EtcdUnavailable:
                            await trio.sleep(0.05)
                            continue
                        if left <= 0:
                            return  # revoked or expired in etcd
                        self._valid_until = sent + left
                        renewed = True
                if not renewed:
                    return  # validity ran out before etcd heard from us
        finally:
            scope.cancel()

    async def _campaign(self, lease: int, scope: trio.CancelScope) -> None:
        """Campaign until elected. etcd refusing the candidacy (its lease gone, mostly)
        cancels ``scope``: the candidacy starts over with a new lease."""
        while True:
            try:
                leader = await self.client.campaign(self.election, lease,
                                                    self.address.encode(),
                                                    wait=self.campaign_wait)
            except EtcdUnavailable:
                continue  # no answer in campaign_wait (also: still a follower): again
            except EtcdRequestError:
                scope.cancel()
                return
            self._set_leader(leader)
            return

    async def resign(self) -> None:
        """Step down: stop leading at once, give the lease back (its candidacy key goes
        with it, so the next candidate leads), and stand again with a new lease, behind
        the candidates already waiting. (To leave for good, leave
        :func:`open_etcd_leadership`.)"""
        self._set_leader(None)
        self._valid_until = -math.inf
        if self._candidacy is not None:
            self._candidacy.cancel()
        await trio.lowlevel.checkpoint()


@asynccontextmanager
async def open_etcd_leadership(client: EtcdClient, election: str, address: str, *,
                               ttl: int = 3,
                               campaign_wait: float = 10.0,
                               ) -> AsyncGenerator[EtcdLeadership, None]:
    """Campaign in ``election`` (a name of its own in etcd's keyspace) as ``address`` for as
    long as the block runs; on exit, stop leading and give the lease back (so the next
    candidate leads at once, not a TTL later)."""
    if ttl < 1:
        raise ValueError("the leadership lease's TTL is at least one second")
    leadership = EtcdLeadership(client, election.encode(), address, ttl, campaign_wait)
    with unwrap_single_exception():
        async with trio.open_nursery() as nursery:
            nursery.start_soon(leadership.run)
            try:
                yield leadership
            finally:
                nursery.cancel_scope.cancel()


# --- the controller's view of the election ----------------------------------------------------

#: how often a follower asks etcd who leads and reads the records again (seconds)
FOLLOW_INTERVAL = 0.5


@attrs.define(eq=False)
class ControllerLeadership:
    """An :class:`EtcdLeadership` as the controller server's ``Leadership`` (is_leader,
    leader_address, leader_id: plain properties, read at every request).

    Two things are added to the candidacy, both done by :meth:`run`:

    - **A term is served only once its records are read.** When the candidacy is elected,
      ``gained`` (the service's ``leadership_gained``: read the records the previous leader
      wrote, restart the start-up grace) runs first; ``is_leader`` stays false until it
      returned for this very term, so no request is decided from the state of before.
    - **A follower knows who leads, and what the leader wrote.** Every
      :data:`FOLLOW_INTERVAL` it asks etcd for the election's leader (the address NOT_LEADER
      names) and calls ``follow`` (the service reads the records again): its heartbeat table
      counts only members of known sets, so a set created after this controller started
      would otherwise go uncounted here, and a new leader would not know who is alive.

    etcd unreachable: the last known leader is kept, and the candidacy's own clock ends our
    leadership (its lease is not renewed); nothing here waits longer than one etcd call."""

    candidacy: EtcdLeadership
    #: controllerDLegerSelfId: GET_METADATA_INFO's controllerLeaderId while we lead
    self_id: str
    _ready_term: int = attrs.field(default=0, init=False)
    _leader_address: str | None = attrs.field(default=None, init=False)

    @property
    def is_leader(self) -> bool:
        return self.candidacy.is_leader and self.candidacy.terms == self._ready_term

    @property
    def leader_address(self) -> str | None:
        if self.is_leader:
            return self.candidacy.address
        return self._leader_address

    @property
    def leader_id(self) -> str | None:
        # Another controller's id is not in the election (its value is the address brokers
        # need): followers name the leader by address alone.
        return self.self_id if self.is_leader else None

    async def lost(self) -> None:
        """A commit found our leader key gone while we believed we led (``LeadershipLost``:
        it was deleted, or our lease expired while we were paused): step down now and stand
        again, rather than go on answering from a term etcd has ended."""
        if self.candidacy.is_leader:
            log.warning("controller: a commit found this controller deposed; standing again")
            await self.candidacy.resign()
        else:
            await trio.lowlevel.checkpoint()

    async def run(self, gained: Callable[[], Awaitable[None]],
                  follow: Callable[[], Awaitable[None]], *,
                  task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Until cancelled: serve each term once ``gained`` returned for it; while not
        leading, keep the leader's address and (``follow``) the records current."""
        candidacy = self.candidacy
        task_status.started()
        while True:  # until cancelled; each round waits or makes one bounded etcd call
            term = candidacy.terms
            if candidacy.is_leader and term != self._ready_term:
                try:
                    await gained()
                except EtcdError as exc:
                    log.warning("controller: elected, but the records could not be read "
                                "(%s); trying again", exc)
                    await trio.sleep(FOLLOW_INTERVAL)
                    continue
                if candidacy.terms == term:
                    self._ready_term = term
                    # the last leader we know, once this term ends, until etcd says who
                    self._leader_address = candidacy.address
                    log.info("controller: leading (term %d) as %s", term, candidacy.address)
                continue
            if self.is_leader:
                with trio.move_on_after(FOLLOW_INTERVAL):
                    await candidacy.wait_deposed()
                if not candidacy.is_leader:
                    log.warning("controller: no longer the leader")
                continue
            try:
                self._leader_address = await candidacy.leader_address()
                if not candidacy.is_leader:
                    await follow()
            except TrioHAError as exc:  # etcd unreachable, or a record damaged
                log.debug("controller: following: %s", exc)
            with trio.move_on_after(FOLLOW_INTERVAL):
                await candidacy.wait_leading()
