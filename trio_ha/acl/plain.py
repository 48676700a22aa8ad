"""RocketMQ 4.9's plain ACL: accounts from ``plain_acl.yml``, and the check of every request.

Why this shape. RocketMQ's ACL is stateless per request: a request names its account
(``AccessKey``) and carries a signature (``trio_ha.wire.acl``); the broker looks the account
up, checks the signature, then the permission each resource the request touches needs. So
the whole check is a pure function of (the loaded file, the request, the peer's address):
``PlainAcl.check``. Loading, and reloading when the file changes, is ``trio_ha.acl.watch``.

The order of the checks is RocketMQ's (``PlainPermissionManager.validate``), because an
operator's file means what it means there:

1. a peer address in ``globalWhiteRemoteAddresses`` passes, signed or not;
2. a request without an AccessKey, or with one no account has, is refused;
3. a peer address in the *account's* ``whiteRemoteAddress`` passes without its signature or
   permissions being checked (RocketMQ's trusted-address bypass);
4. the signature must match; then what stops a replay (ours, ``trio_ha.acl.replay``): a
   seal, when there is one, must verify and name the request's code; strict mode wants a
   fresh, unseen seal; default mode wants an unsealed destructive verb in mqadmin's shape;
5. a send to the trace topic passes;
6. admin request codes need an ``admin: true`` account; then every resource needs its
   permission: the account's own entry for it (``topicPerms``, ``groupPerms``), else its
   ``defaultTopicPerm`` / ``defaultGroupPerm``. DENY wins; ANY is PUB or SUB.

One deliberate difference: a refusal is answered NO_PERMISSION with a remark naming what was
refused. RocketMQ 4.9 throws from its RPC hook and answers SYSTEM_ERROR with the exception's
text, which a client cannot tell apart from a broker fault.
"""

from __future__ import annotations

import gc
import ipaddress
import logging
from collections.abc import Mapping
from typing import Any

import attrs
import yaml

from .._errors import TrioHAError
from ..wire import acl as signing
from ..wire.errors import WireError
from ..wire.heartbeat import HeartbeatData
from ..wire.metadata import RETRY_GROUP_TOPIC_PREFIX, TRACE_TOPIC
from ..wire.remoting import RemotingCommand, RequestCode
from .replay import ReplayGuard, legacy_shape_refusal, seal_refusal

__all__ = [
    "ADMIN_CODES", "ANY", "DENY", "NAMESRV_ADMIN_CODES", "PUB", "SUB", "AclConfigError",
    "AddressPattern",
    "PlainAccount", "PlainAcl", "needed_permissions", "parse_permission",
]

log = logging.getLogger(__name__)

# Permission bits (org.apache.rocketmq.acl.common.Permission)
DENY = 1
ANY = 2
PUB = 4
SUB = 8

#: request codes only an admin account may send (Permission.ADMIN_CODE)
ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_BROKER_CONFIG,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_SUBSCRIPTIONGROUP,
})

#: the name server's admin verbs: with ACL on, only an admin account's signed requests (our
#: extension: RocketMQ 4.9's name server checks nothing); its other requests are unchecked,
#: since brokers register and clients look routes up without signing
NAMESRV_ADMIN_CODES = frozenset({
    RequestCode.DELETE_TOPIC_IN_NAMESRV, RequestCode.WIPE_WRITE_PERM_OF_BROKER,
    RequestCode.ADD_WRITE_PERM_OF_BROKER, RequestCode.PUT_KV_CONFIG,
    RequestCode.DELETE_KV_CONFIG, RequestCode.UPDATE_NAMESRV_CONFIG,
})

#: RocketMQ refuses keys this short (AclConstants.ACCESS_KEY_MIN_LENGTH / SECRET_KEY_...)
MIN_KEY_LENGTH = 7
#: the largest plain_acl.yml read. A file is parsed whole, in memory, while the broker
#: serves: PyYAML's C loader takes about 0.7 s and a few hundred bytes of heap per byte of a
#: 1 MiB file on the reference machine (its pure-Python loader 3 s; a 4 MB file 7 s and 32 s),
#: and 1 MiB holds thousands of accounts, where real files hold tens
MAX_FILE_BYTES = 1024 * 1024
#: PyYAML's libyaml-based loader when PyYAML was built with it (wheels are), else its
#: pure-Python one; both safe (plain data only)
_YAML_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
#: the longest AccessKey a refusal's remark quotes
_QUOTED = 64


def _load_yaml(text: str | bytes) -> Any:
    """``text`` as YAML, with Python's cyclic garbage collector paused meanwhile. A parse
    makes hundreds of thousands of short-lived objects, and the full collections they
    trigger hold the GIL for a few hundred milliseconds at a time, in which the broker's
    event loop answers nothing (a 1 MiB file: p99 of signed requests 33 ms, and single
    stalls of 0.3 s, on the reference machine). The parse's garbage is freed by reference
    counting as it goes; what the collector would look for, cycles, YAML makes only through
    aliases, and those wait for the next collection."""
    collecting = gc.isenabled()
    if collecting:
        gc.disable()
    try:
        return yaml.load(text, Loader=_YAML_LOADER)  # a safe loader, either way
    finally:
        if collecting:
            gc.enable()


class AclConfigError(TrioHAError, ValueError):
    """plain_acl.yml is not a valid ACL file; the message names the entry."""


def parse_permission(text: object) -> int:
    """``PUB``, ``SUB``, ``PUB|SUB`` (either order) or ``DENY``; anything else is DENY, as
    Java's ``Permission.parsePermFromString``."""
    if not isinstance(text, str):
        return DENY
    return {"PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}.get(
        text.strip(), DENY)


def permits(needed: int, owned: int) -> bool:
    """Java's ``Permission.checkPermission``."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def _scalar_text(value: object, where: str) -> str | None:
    """A YAML scalar as Java's fastjson hands it to the account's String fields: unquoted
    ``secretKey: 12345678`` (RocketMQ's own sample) is a number to YAML, text to RocketMQ."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    raise AclConfigError(f"{where} must be text, got a {type(value).__name__}")  # not the value


def _retry_topic(group: str | None) -> str | None:
    return None if group is None else RETRY_GROUP_TOPIC_PREFIX + group


# ---- addresses ----------------------------------------------------------------------------------


@attrs.frozen
class AddressPattern:
    """A ``whiteRemoteAddress`` / ``globalWhiteRemoteAddresses`` entry, RocketMQ's forms:
    blank (matches nothing), ``*`` (everything), one address, a comma list, a last-part set
    ``10.0.0.{1,2,3}``, and IPv4 ranges where one part is ``*`` or ``a-b`` (``10.1.*.*``,
    ``10.1.2.1-100``: the parts after it are not compared, as in RocketMQ). IPv6 addresses
    compare in full form; IPv6 ranges are refused (``AclConfigError``)."""

    text: str
    everything: bool = False
    addresses: frozenset[str] = frozenset()
    #: IPv4 range: the parts before the ranged one, its index, and its bounds
    head: tuple[str, ...] | None = None
    low: int = 0
    high: int = -1

    @classmethod
    def parse(cls, text: object) -> AddressPattern:
        if text is None or (isinstance(text, str) and not text.strip()):
            return cls("")
        if not isinstance(text, str):
            raise AclConfigError(f"an address pattern must be text, got {text!r}")
        value = text.strip()
        if value in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(value, everything=True)
        if value.endswith("}"):
            prefix, brace, rest = value.rpartition("{")
            if not brace or not prefix or prefix[-1] not in ".:":
                raise AclConfigError(f"address set {value!r}: the set must be the last part")
            return cls(value, addresses=frozenset(
                _address(prefix + item.strip(), value) for item in rest[:-1].split(",")))
        if "," in value:
            return cls(value, addresses=frozenset(
                _address(item.strip(), value) for item in value.split(",") if item.strip()))
        if "*" in value or "-" in value:
            return cls._range(value)
        return cls(value, addresses=frozenset({_address(value, value)}))

    @classmethod
    def _range(cls, value: str) -> AddressPattern:
        if ":" in value:
            raise AclConfigError(f"IPv6 address ranges ({value!r}) are not supported; list "
                                 "the addresses, or use a comma list")
        parts = [part.strip() for part in value.split(".")]
        if len(parts) != 4:
            raise AclConfigError(f"address range {value!r} must have four parts")
        for index in (1, 2, 3):
            part = parts[index]
            if part == "*":
                low, high = 0, 255
            elif "-" in part:
                first, _, last = part.partition("-")
                if not (first.isdigit() and last.isdigit()):
                    raise AclConfigError(f"address range {value!r}: {part!r} is not a-b")
                low, high = int(first), int(last)
            else:
                continue
            head = tuple(parts[:index])
            if not (0 <= low <= high <= 255) or not all(
                    p.isdigit() and int(p) <= 255 for p in head):
                raise AclConfigError(f"address range {value!r} is out of range")
            return cls(value, head=head, low=low, high=high)
        raise AclConfigError(f"address range {value!r}: no part is * or a-b")

    def match(self, address: str) -> bool:
        if self.everything:
            return True
        if self.head is not None:
            parts = address.split(".")
            index = len(self.head)
            if len(parts) != 4 or tuple(parts[:index]) != self.head:
                return False
            part = parts[index]
            return part.isdigit() and self.low <= int(part) <= self.high
        return _normal(address) in self.addresses


def _address(text: str, pattern: str) -> str:
    try:
        return ipaddress.ip_address(text).exploded
    except ValueError:
        raise AclConfigError(f"{text!r} (in {pattern!r}) is not an IP address") from None


def _normal(address: str) -> str:
    try:
        return ipaddress.ip_address(address).exploded
    except ValueError:
        return address


# ---- accounts -----------------------------------------------------------------------------------


@attrs.frozen(repr=False)
class PlainAccount:
    """One entry of ``accounts``."""

    access_key: str
    secret_key: str
    white_remote_address: AddressPattern
    admin: bool
    default_topic_perm: int
    default_group_perm: int
    #: topics by name, groups by their retry topic (as RocketMQ keys them)
    perms: Mapping[str, int]

    def __repr__(self) -> str:
        return f"PlainAccount(access_key={self.access_key!r}, admin={self.admin})"

    @classmethod
    def from_entry(cls, entry: object, where: str) -> PlainAccount:
        if not isinstance(entry, dict):
            raise AclConfigError(f"{where} must be a mapping")
        access_key = _scalar_text(entry.get("accessKey"), f"{where}.accessKey")
        secret_key = _scalar_text(entry.get("secretKey"), f"{where}.secretKey")
        for name, key in (("accessKey", access_key), ("secretKey", secret_key)):
            if not isinstance(key, str) or len(key) < MIN_KEY_LENGTH:
                raise AclConfigError(
                    f"{where}: {name} must be text of at least {MIN_KEY_LENGTH} characters")
        assert isinstance(access_key, str) and isinstance(secret_key, str)
        perms: dict[str, int] = {}
        for field, is_topic in (("groupPerms", False), ("topicPerms", True)):
            items = entry.get(field) or []
            if not isinstance(items, list):
                raise AclConfigError(f"{where}.{field} must be a list of name=PERM")
            for item in items:
                name, sep, perm = (_scalar_text(item, f"{where}.{field}") or "").partition("=")
                if not sep or not name.strip() or "=" in perm:
                    raise AclConfigError(f"{where}.{field}: {item!r} is not name=PERM")
                name = name.strip()
                perms[name if is_topic else RETRY_GROUP_TOPIC_PREFIX + name] = \
                    parse_permission(perm)
        admin = entry.get("admin", False)
        return cls(
            access_key=access_key, secret_key=secret_key,
            white_remote_address=AddressPattern.parse(
                _scalar_text(entry.get("whiteRemoteAddress"), f"{where}.whiteRemoteAddress")),
            admin=admin is True or (isinstance(admin, str) and admin.lower() == "true"),
            default_topic_perm=parse_permission(entry.get("defaultTopicPerm")),
            default_group_perm=parse_permission(entry.get("defaultGroupPerm")),
            perms=perms,
        )


# ---- requests -----------------------------------------------------------------------------------


def needed_permissions(request: RemotingCommand) -> dict[str, int]:
    """The resources ``request`` touches and the permission each needs, by request code, as
    ``PlainAccessValidator.parse`` works them out (groups as their retry topics; a request
    code not listed there touches none). Raises ``WireError`` for a heartbeat body that is
    not one."""
    ext = request.ext_fields
    code = request.code
    needed: dict[str, int] = {}

    def add(resource: str | None, perm: int) -> None:
        if resource is not None:
            needed[resource] = perm

    if code == RequestCode.SEND_MESSAGE or code == RequestCode.SEND_MESSAGE_V2:
        topic, group = (ext.get("topic"), ext.get("group")) if code == RequestCode.SEND_MESSAGE \
            else (ext.get("b"), ext.get("a"))
        if topic is not None and topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            add(_retry_topic(group), SUB)
        else:
            add(topic, PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        add(_retry_topic(ext.get("group")), SUB)
    elif code == RequestCode.SEND_BATCH_MESSAGE:
        # RocketMQ 4.9 checks nothing for a batch: any account may publish anywhere with one
        add(ext.get("b"), PUB)
    elif code in (RequestCode.PULL_MESSAGE, RequestCode.LITE_PULL_MESSAGE):
        # LITE_PULL_MESSAGE is RocketMQ 5's pull, served here as a pull: checked as one
        add(ext.get("topic"), SUB)
        add(_retry_topic(ext.get("consumerGroup")), SUB)
    elif code == RequestCode.QUERY_MESSAGE:
        add(ext.get("topic"), SUB)
    elif code == RequestCode.HEART_BEAT:
        for consumer in HeartbeatData.decode(request.body).consumer_data_set:
            add(_retry_topic(consumer.group_name), SUB)
            for subscription in consumer.subscription_data_set:
                add(subscription.topic, SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        add(_retry_topic(ext.get("consumerGroup")), SUB)
    elif code == RequestCode.UPDATE_CONSUMER_OFFSET:
        add(_retry_topic(ext.get("consumerGroup")), SUB)
        add(ext.get("topic"), SUB)
    return needed


def _quoted(text: str) -> str:
    return repr(text if len(text) <= _QUOTED else text[:_QUOTED] + "...")


def _resource_text(resource: str) -> str:
    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return f"group {resource[len(RETRY_GROUP_TOPIC_PREFIX):]}"
    return f"topic {resource}"


@attrs.frozen
class PlainAcl:
    """A loaded ``plain_acl.yml``: the accounts by AccessKey, and the global whitelist."""

    accounts: Mapping[str, PlainAccount]
    global_white: tuple[AddressPattern, ...] = ()

    @classmethod
    def parse(cls, text: str | bytes, source: str = "plain_acl.yml") -> PlainAcl:
        """Read a plain_acl.yml's text (RocketMQ's format; an empty file has no accounts)."""
        if len(text) > MAX_FILE_BYTES:
            raise AclConfigError(f"{source} is over {MAX_FILE_BYTES} bytes (the most this "
                                 "broker reads)")
        try:
            data: Any = _load_yaml(text)
        except yaml.YAMLError as exc:
            # where, not what: the offending line may hold a secret key
            mark = getattr(exc, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
            raise AclConfigError(f"{source} is not YAML{where}") from None
        if data is None:
            return cls({})
        if not isinstance(data, dict):
            raise AclConfigError(f"{source} must be a mapping (accounts, "
                                 "globalWhiteRemoteAddresses)")
        white = data.get("globalWhiteRemoteAddresses") or []
        if not isinstance(white, list):
            raise AclConfigError(f"{source}: globalWhiteRemoteAddresses must be a list")
        accounts: dict[str, PlainAccount] = {}
        entries = data.get("accounts") or []
        if not isinstance(entries, list):
            raise AclConfigError(f"{source}: accounts must be a list")
        for index, entry in enumerate(entries):
            account = PlainAccount.from_entry(entry, f"{source}: accounts[{index}]")
            if account.access_key in accounts:  # RocketMQ warns and keeps the first
                log.warning("ACL: %s: accessKey %r is defined twice; the first entry counts",
                            source, account.access_key)
                continue
            accounts[account.access_key] = account
        return cls(accounts, tuple(
            AddressPattern.parse(_scalar_text(item, f"{source}: globalWhiteRemoteAddresses"))
            for item in white))

    def check(self, request: RemotingCommand, peer_host: str,
              admin_codes: frozenset[int] = ADMIN_CODES,
              guard: ReplayGuard | None = None) -> str | None:
        """None when ``request`` from ``peer_host`` may proceed, else the refusal's remark
        (see the module's docstring for the order of the checks). ``admin_codes``: the
        request codes only an admin account may send (the name server has its own).
        ``guard``: strict mode's (``trio_ha.acl.replay``); without it, the default mode's
        defence against a signature replayed as a destructive verb."""
        if any(pattern.match(peer_host) for pattern in self.global_white):
            return None
        ext = request.ext_fields
        access_key = ext.get(signing.ACCESS_KEY)
        if access_key is None:
            return "no AccessKey: this broker has ACL enabled; sign requests with an account"
        account = self.accounts.get(access_key)
        if account is None:
            return f"no ACL account has AccessKey {_quoted(access_key)}"
        if account.white_remote_address.match(peer_host):
            return None
        given = ext.get(signing.SIGNATURE)
        expected = signing.request_signature(ext, request.body, account.secret_key)
        if given is None or not signing.equal_text(given, expected):
            return f"the signature does not match for AccessKey {_quoted(access_key)}"
        seal, refused = seal_refusal(request, account.secret_key)
        if refused is None:
            if guard is not None:
                refused = guard.admit(access_key, seal)
            elif seal is None:
                refused = legacy_shape_refusal(request)
        if refused is not None:
            return f"AccessKey {_quoted(access_key)}: {refused}"
        try:
            needed = needed_permissions(request)
        except WireError as exc:
            return f"cannot work out what the request touches: {exc}"
        if needed.get(TRACE_TOPIC) == PUB:
            return None
        if request.code in admin_codes and not account.admin:
            return (f"request code {request.code} needs an admin account; AccessKey "
                    f"{_quoted(access_key)} is not one")
        if account.admin and not account.perms:  # an admin without perms lists may do all
            return None
        for resource, perm in needed.items():
            owned = account.perms.get(resource)
            if owned is None:
                owned = account.default_group_perm \
                    if resource.startswith(RETRY_GROUP_TOPIC_PREFIX) \
                    else account.default_topic_perm
            if not permits(perm, owned):
                return (f"AccessKey {_quoted(access_key)} has no "
                        f"{'PUB' if perm == PUB else 'SUB'} permission on "
                        f"{_resource_text(resource)}")
        return None
