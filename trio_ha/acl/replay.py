"""What stops a signed request from being sent again, or sent again as another request.

Why this module. RocketMQ 4.9's signature (``trio_ha.wire.acl``) covers the values of the
extFields and the body: not the request code, not the keys, not a time. Whoever sees one
signed request (no TLS, a shared network) can send it again as often as they like, and can
send it *as another request*: the values of a read of ``{topic: T}`` are the values of
DELETE_TOPIC_IN_BROKER of ``{topic: T}``, so a topic lookup's signature deletes the topic.
Real clients sign that way and must keep working, so two defences, one per mode:

* **The seal, when a request has one** (our client always adds it): ``AclSeal`` carries the
  request code, a time and a nonce, and an HMAC over them and every field's key and value.
  A sealed request whose seal does not verify, or names another code, is refused in either
  mode. Taking the seal off to make a destructive verb does not work either: its bytes would
  have to land in fields that verb does not carry (below) or in a topic or group name, which
  its ``:`` cannot be part of.
* **Default mode, a request without a seal** (RocketMQ's clients, mqadmin): the verbs that
  destroy or change the broker's configuration must have exactly the shape mqadmin sends
  (``LEGACY_SHAPES``): only their own header's fields, typed values (a count is digits, a
  flag ``true``/``false``), no ``SecurityToken`` and no body where the verb has none. An
  attacker who splices a captured request's values into a delete has nowhere to put the
  values the delete does not carry. What remains, as in RocketMQ: a captured request whose
  values *are* such a verb's (a read of exactly ``{topic}``, replayed as a delete of that
  topic) still verifies. Only the seal tells them apart, and mqadmin does not send one.
* **Strict mode** (``aclRequireFreshness=true``): a signed request must be sealed, its
  time within ``aclFreshnessWindowSeconds`` of the broker's clock, and its nonce unseen in
  that window (``NonceCache``). Real RocketMQ clients, which cannot seal, are refused.

None of this hides a request from whoever can read the network: with TLS off, an observer
still learns topics and bodies, and in default mode can still replay. The README recommends
strict mode with TLS.
"""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Mapping

import attrs

from ..ratelog import RateLimitedLog
from ..wire import acl as signing
from ..wire.remoting import RemotingCommand, RequestCode

__all__ = [
    "DEFAULT_FRESHNESS_WINDOW", "DEFAULT_NONCE_CACHE", "LEGACY_SHAPES", "LegacyShape",
    "NonceCache", "ReplayGuard", "legacy_shape_refusal", "seal_refusal",
]

log = logging.getLogger(__name__)
_limited = RateLimitedLog(log)

#: aclFreshnessWindowSeconds: how far a seal's time may be from the broker's clock (either
#: way: clocks drift); five minutes is the usual allowance for signed-request schemes
DEFAULT_FRESHNESS_WINDOW = 300
#: aclNonceCacheSize: the nonces remembered at once (about 200 bytes each); a broker that
#: sees more sealed requests in one window refuses the excess rather than forget a nonce
DEFAULT_NONCE_CACHE = 1_000_000

_TEXT, _INT, _BOOL = "text", "int", "bool"


@attrs.frozen
class LegacyShape:
    """What an unsealed request of a destructive verb may carry: its header's fields (the
    value kind of each) and whether it has a body."""

    fields: Mapping[str, str]
    body: bool = False


#: the destructive verbs, as the mqadmin of RocketMQ 4.9.7 and of 5.3.3 sends them (their
#: request headers' fields; 5's ``attributes``, ``force``, ``cleanOffset`` and its flag
#: ``lo``, which it sends only when set)
LEGACY_SHAPES: Mapping[int, LegacyShape] = {
    RequestCode.DELETE_TOPIC_IN_BROKER: LegacyShape({"topic": _TEXT, "lo": _BOOL}),
    RequestCode.DELETE_SUBSCRIPTIONGROUP: LegacyShape(
        {"groupName": _TEXT, "removeOffset": _BOOL, "cleanOffset": _BOOL}),
    RequestCode.UPDATE_AND_CREATE_TOPIC: LegacyShape({
        "topic": _TEXT, "defaultTopic": _TEXT, "readQueueNums": _INT,
        "writeQueueNums": _INT, "perm": _INT, "topicFilterType": _TEXT,
        "topicSysFlag": _INT, "order": _BOOL, "attributes": _TEXT, "force": _BOOL,
        "lo": _BOOL}),
    RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: LegacyShape({}, body=True),
    RequestCode.UPDATE_BROKER_CONFIG: LegacyShape({}, body=True),
    # the controller's (RocketMQ 5.3.3's ElectMasterRequestHeader, as a broker and as
    # mqadmin's electMaster send it; CleanControllerBrokerDataRequestHeader; the properties)
    RequestCode.CONTROLLER_ELECT_MASTER: LegacyShape({
        "clusterName": _TEXT, "brokerName": _TEXT, "brokerId": _INT, "designateElect": _BOOL,
        "invokeTime": _INT}),
    RequestCode.CLEAN_BROKER_DATA: LegacyShape({
        "clusterName": _TEXT, "brokerName": _TEXT, "brokerControllerIdsToClean": _TEXT,
        "isCleanLivingBroker": _BOOL, "invokeTime": _INT}),
    RequestCode.UPDATE_CONTROLLER_CONFIG: LegacyShape({}, body=True),
}

#: the account's own fields, which every signed request has
_ACCOUNT_FIELDS = frozenset({signing.ACCESS_KEY, signing.SIGNATURE})


def _kind_fits(kind: str, value: str) -> bool:
    if kind == _INT:
        digits = value[1:] if value.startswith("-") else value
        return 0 < len(digits) <= 19 and digits.isascii() and digits.isdigit()
    if kind == _BOOL:
        return value in ("true", "false")
    return True


def legacy_shape_refusal(request: RemotingCommand) -> str | None:
    """None when ``request`` (signed, not sealed) may be what it says it is; else why not:
    a destructive verb with a field, a value or a body mqadmin never sends with it."""
    shape = LEGACY_SHAPES.get(request.code)
    if shape is None:
        return None
    for key, value in request.ext_fields.items():
        if key in _ACCOUNT_FIELDS:
            continue
        kind = shape.fields.get(key)
        if kind is None or not _kind_fits(kind, value):
            shown = key if len(key) <= 40 else key[:40] + "..."
            return (f"request code {request.code} signed without a seal may carry only its "
                    f"own header's fields; {shown!r} is not one of them or has the wrong kind "
                    "of value (a replayed signature?)")
    if request.body and not shape.body:
        return (f"request code {request.code} signed without a seal carries no body "
                "(a replayed signature?)")
    return None


def seal_refusal(request: RemotingCommand, secret_key: str) -> tuple[signing.Seal | None,
                                                                      str | None]:
    """The request's seal and None when it has none or it verifies; else why it is
    refused."""
    text = request.ext_fields.get(signing.SEAL)
    if text is None:
        return None, None
    seal = signing.Seal.parse(text)
    if seal is None:
        return None, f"{signing.SEAL} is not a seal"
    expected = signing.seal_mac(secret_key, seal.code, seal.time_ms, seal.nonce,
                                request.ext_fields)
    if not signing.equal_text(seal.mac, expected):
        return None, f"{signing.SEAL} does not match the request's fields"
    if seal.code != request.code:
        return None, (f"the request is sealed for request code {seal.code}, not "
                      f"{request.code} (a replayed signature?)")
    return seal, None


@attrs.define(eq=False)
class NonceCache:
    """The nonces of the sealed requests accepted in the last window, at most ``capacity``.

    Each is kept until its seal's time is a window old (after which the seal is stale and
    refused anyway), oldest-expiring first from a heap. When full of unexpired nonces it
    refuses new ones: forgetting one early would let its request be replayed."""

    capacity: int
    _seen: set[tuple[str, str]] = attrs.field(factory=set)
    _expiry: list[tuple[float, tuple[str, str]]] = attrs.field(factory=list)

    def __len__(self) -> int:
        return len(self._seen)

    def add(self, key: tuple[str, str], expires: float, now: float) -> str | None:
        """Remember ``key`` until ``expires``; None, or why it cannot be: seen already, or
        the cache is full."""
        expiry, seen = self._expiry, self._seen
        while expiry and expiry[0][0] <= now:
            seen.discard(heapq.heappop(expiry)[1])
        if key in seen:
            return "its nonce was seen already (a replayed request?)"
        if len(seen) >= self.capacity:
            return (f"the broker holds {len(seen)} nonces of the last window "
                    "(aclNonceCacheSize): try again later")
        seen.add(key)
        heapq.heappush(expiry, (expires, key))
        return None


@attrs.define(eq=False)
class ReplayGuard:
    """Strict mode (``aclRequireFreshness``): every signed request sealed, fresh, unseen."""

    window: float = DEFAULT_FRESHNESS_WINDOW
    nonces: NonceCache = attrs.field(factory=lambda: NonceCache(DEFAULT_NONCE_CACHE))

    @classmethod
    def of(cls, window: float, capacity: int) -> ReplayGuard:
        return cls(window, NonceCache(capacity))

    def admit(self, access_key: str, seal: signing.Seal | None,
              now: float | None = None) -> str | None:
        """None when the (verified) ``seal`` makes a fresh, first request; else why not."""
        if seal is None:
            return (f"this broker wants sealed requests (aclRequireFreshness=true): sign "
                    f"with trio_ha's client; a request without {signing.SEAL} is refused")
        now = time.time() if now is None else now
        sealed_at = seal.time_ms / 1000
        if abs(now - sealed_at) > self.window:
            return (f"the request was sealed {now - sealed_at:.0f} s from the broker's clock, "
                    f"outside aclFreshnessWindowSeconds={self.window:g} (a replay, or a "
                    "clock to fix)")
        refused = self.nonces.add((access_key, seal.nonce), sealed_at + self.window, now)
        if refused is not None and "aclNonceCacheSize" in refused:
            _limited.log(logging.WARNING, "nonce cache full",
                         "ACL: sealed requests refused: %s", refused)
        return refused
