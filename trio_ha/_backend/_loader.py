"""Which record engine this process uses: the native one when ``trio_ha._native`` is built and
current, the Python twin otherwise.

The C module carries a version (TH_NATIVE_VERSION in native/trio_ha_native.h), checked here at
import against NATIVE_VERSION: a build older than this Python code is "stale", as unusable as
a missing one. Either falls back to the twin, and ``native_backend`` says which engine loaded;
with ``TRIO_HA_REQUIRE_NATIVE=1`` (as CI runs) a missing or stale native module is an import
error, never a silent fallback.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from .._errors import TrioHAError
from ._native import NativeEngine
from ._protocol import RecordEngine
from ._python import PythonEngine

# Must equal TH_NATIVE_VERSION in native/trio_ha_native.h.
NATIVE_VERSION = 6


class NativeModuleError(TrioHAError, ImportError):
    """The native module is required (TRIO_HA_REQUIRE_NATIVE=1) but missing or stale."""


def _load_native() -> tuple[ModuleType | None, str | None]:
    try:
        # By name, not `from .. import _native`: the checkers then need no built module.
        _native = importlib.import_module("trio_ha._native")
    except ImportError as exc:
        return None, f"not built ({exc})"
    found = _native.lib.th_version()
    if found != NATIVE_VERSION:
        return None, f"stale build: C version {found}, Python expects {NATIVE_VERSION}"
    return _native, None


#: the cffi module ``trio_ha._native`` when it loaded and matches NATIVE_VERSION, else None
native_module, native_unavailable_reason = _load_native()
if native_module is None and os.environ.get("TRIO_HA_REQUIRE_NATIVE") == "1":
    raise NativeModuleError(
        f"TRIO_HA_REQUIRE_NATIVE=1 but trio_ha._native is unusable: {native_unavailable_reason}; "
        "reinstall the package (pip install -e .) with a C compiler and zlib headers"
    )

#: "native" or "python": which record engine this process uses.
native_backend = "native" if native_module is not None else "python"

#: the engine this process uses (see ``native_backend``)
engine: RecordEngine = NativeEngine(native_module) if native_module is not None else PythonEngine()
#: the Python twin, always available (the native tests compare against it)
python_engine: RecordEngine = PythonEngine()
