"""The record engine: the native cffi module when it is built, a pure-Python twin otherwise.

Why two: the C module (native/, built as ``trio_ha._native``) encodes straight into a
segment's mmap, scans and CRCs records without per-byte Python work and with the GIL released.
The Python twin exists so the package still works where no compiler is available, and so the
tests can hold the C code against an independent implementation. ``native_backend`` says which
one loaded; with ``TRIO_HA_REQUIRE_NATIVE=1`` (as CI runs) a missing or stale native module is
an import error, never a silent fallback.

One module per part, as the C code is one file per concern: ``_protocol`` (the interface both
engines implement, the values they return, the C header's codes), ``_loader`` (loads and checks
the C module, picks ``engine``), ``_native`` (the engine over the C module), ``_python`` (its
twin) and ``_sync_thread`` (the handle on the C sync thread). Callers import this package only,
and look ``engine`` up on it at each call (``_backend.engine.scan(...)``), so a test can swap
the engine by setting the package's attribute.
"""

from ._loader import (
    NATIVE_VERSION,
    NativeModuleError,
    engine,
    native_backend,
    native_module,
    native_unavailable_reason,
    python_engine,
)
from ._native import MIN_RECORD_SIZE, NativeEngine, NativeGatherer, NativeScanner
from ._protocol import (
    ERR_BAD_ARGUMENT,
    ERR_BATCH_FORMAT,
    ERR_BODY_TOO_LARGE,
    ERR_NO_SPACE,
    ERR_PROPS_TOO_LARGE,
    ERR_TOO_MANY,
    GATHER_ABSENT,
    GATHER_BYTES,
    GATHER_COUNT,
    GATHER_END,
    GATHER_FILTERED,
    GATHER_FOUND,
    GATHER_INVALID,
    GATHER_REMOVED,
    GATHER_SEGMENT,
    GATHER_VERIFY,
    MIN_BATCH_ITEM,
    SCAN_CHECK_CRC,
    SCAN_TAGS,
    STOP_BAD_CRC,
    STOP_BAD_MAGIC,
    STOP_BAD_SIZE,
    STOP_BLANK,
    STOP_END,
    STOP_FULL,
    STOP_NAMES,
    STOP_PARTIAL,
    STOP_TORN,
    Buffer,
    CqRuns,
    Gatherer,
    GatherResult,
    Handle,
    RecordEngine,
    RecordInfo,
    Scanner,
    ScanResult,
)
from ._python import PythonEngine, PythonGatherer, PythonScanner, index_key_hash
from ._sync_thread import NativeSyncThread

__all__ = [
    "NATIVE_VERSION", "native_backend", "ERR_NO_SPACE", "ERR_BAD_ARGUMENT",
    "ERR_BATCH_FORMAT", "ERR_BODY_TOO_LARGE", "ERR_PROPS_TOO_LARGE", "ERR_TOO_MANY",
    "STOP_END", "STOP_PARTIAL", "STOP_BLANK", "STOP_FULL", "STOP_BAD_MAGIC", "STOP_BAD_SIZE",
    "STOP_BAD_CRC", "STOP_TORN", "SCAN_CHECK_CRC", "SCAN_TAGS", "RecordEngine", "Scanner",
    "ScanResult", "CqRuns",
    "RecordInfo", "Handle", "engine", "python_engine", "GATHER_FOUND", "GATHER_REMOVED",
    "GATHER_FILTERED", "GATHER_ABSENT", "GATHER_INVALID", "GATHER_END", "GATHER_COUNT",
    "GATHER_BYTES", "GATHER_SEGMENT", "GATHER_VERIFY", "GatherResult", "Gatherer",
    # Importable from the one module this package replaced, so kept importable here.
    "Buffer", "MIN_BATCH_ITEM", "MIN_RECORD_SIZE", "STOP_NAMES", "NativeModuleError",
    "native_module", "native_unavailable_reason", "NativeEngine", "NativeScanner",
    "NativeGatherer", "NativeSyncThread", "PythonEngine", "PythonScanner", "PythonGatherer",
    "index_key_hash",
]
