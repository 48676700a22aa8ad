"""Access control: RocketMQ 4.9's plain ACL (``plain_acl.yml`` accounts, signed requests).

``PlainAcl`` decides whether a request may proceed; ``AclFile`` keeps it loaded from the
file and reloads it on change; ``replay`` is what stops a signed request from being sent
again, or as another request. What a client signs is ``trio_ha.wire.acl``.
"""

from .plain import (
    ADMIN_CODES,
    NAMESRV_ADMIN_CODES,
    AclConfigError,
    AddressPattern,
    PlainAccount,
    PlainAcl,
    needed_permissions,
)
from .replay import ReplayGuard
from .watch import AclFile, acl_file_path

__all__ = [
    "ADMIN_CODES", "NAMESRV_ADMIN_CODES", "AclConfigError", "AclFile", "AddressPattern",
    "PlainAccount", "PlainAcl", "ReplayGuard", "acl_file_path", "needed_permissions",
]
