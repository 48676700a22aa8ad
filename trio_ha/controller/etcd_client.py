# pyright: strict
"""A small etcd v3 client: what our replicated controller asks of etcd, and nothing more.

It speaks etcd's v3 API through the JSON gateway etcd serves on its client port (HTTP/1.1,
``POST /v3/...``; keys and values in base64; 64-bit numbers arrive as strings and zero values
are left out, as protobuf's JSON mapping does). The gateway needs no generated protobuf code
and no gRPC library; HTTP runs under trio, through ``_etcd_http``, the one module that
touches httpx (imported only when a client opens: httpx is slow to import).

It is small because it covers what the controller uses: keys (range, put, delete, and the
transaction a commit is), leases (grant, keepalive, revoke) and the election API (campaign,
leader, proclaim, resign). Watches, auth and TLS are not here.

One call goes to the member that answered last; a member that refuses, errs as unavailable
(gRPC UNAVAILABLE or DEADLINE_EXCEEDED, HTTP 502 to 504) or says nothing within
``request_timeout`` is left for the next one, and a call that no member answers within
``call_timeout`` raises :class:`EtcdUnavailable`: a stopped or partitioned member costs one
``request_timeout``, never a hang. An error etcd means (a bad request, a lease that is gone)
is :class:`EtcdRequestError`, not retried. A write sent again after an attempt that may have
reached etcd says so (``TxnResult.retried``): its compares may find its own first attempt.

The request bodies and the decoding of replies are plain functions on JSON values; the trio
part, the retries across members, is thin around them. What the controller builds on it (its
StateStore, its leadership) is in ``etcd.py``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncGenerator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import attrs
import trio

if TYPE_CHECKING:
    # Imported where a client opens, not here (see _etcd_http: httpx is slow to import).
    from ._etcd_http import Post

from .._errors import TrioHAError

__all__ = [
    "EtcdClient",
    "EtcdConfig",
    "EtcdError",
    "EtcdRequestError",
    "EtcdUnavailable",
    "Json",
    "KeyValue",
    "LeaderKey",
    "TxnResult",
    "compare_create_revision",
    "compare_mod_revision",
    "op_delete",
    "op_put",
    "op_range",
    "open_etcd_client",
    "parse_endpoints",
    "prefix_end",
    "range_response",
]

#: a JSON object, as the gateway sends and takes them
Json = dict[str, Any]

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


def range_response(response: Json) -> list[KeyValue] | None:
    """The keys one of a transaction's responses (:attr:`TxnResult.responses`) found, if it
    is a range's; None for a put's or a delete's."""
    found = response.get("response_range")
    return _kvs(cast(Json, found)) if isinstance(found, dict) else None


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
