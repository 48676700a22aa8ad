# pyright: strict
"""The journal's bytes, without the files: encoding frames and replaying a journal image.

Why a module of its own: what a crash can leave on disk and what recovery must do with it
are the whole difficulty of a write-ahead file, and both are easiest to get right (and to
test byte by byte) as pure functions over ``bytes``, the way the wire codecs are. The file
handling (``journal.py``) is a thin adapter: it reads the file, calls ``replay``, cuts what
``replay`` calls a torn tail, and appends what ``encode_frame`` returns.

The format (big-endian, like RocketMQ's own files; docs/controller.md has it byte by byte):

- a 16-byte file header: ``FILE_MAGIC`` (8 bytes), the format version (u32) and a CRC of
  those 12 bytes (u32). A journal file is only ever created whole (tmp file, fsync, rename),
  so a bad header is damage, never a crash;
- then frames. A frame is everything one append writes: the records of one commit, or of
  several commits written together (group commit), or a snapshot of every record (the first
  frame after a compaction). Frame: ``FRAME_MAGIC`` (u32), CRC (u32) of everything after
  it, body length (u32), body. Body: kind (u8), sequence (u64: the last version the frame
  gives out), entry count (u32), entries. Entry: op (u8: 1 put, 0 delete), version (u64),
  key length (u16), key (UTF-8), and for a put the value length (u32) and the value.

A record's version is the sequence number of the commit that last wrote it, the way etcd's
``mod_revision`` is the revision of the transaction that last wrote a key. One counter for
all keys means a key deleted and written again never comes back at a version a stale
reader still holds (a per-key counter starting over at 1 would let that reader's
conditional write through). Versions start at 1; 0 means "absent".

Recovery's one judgement, the torn tail: an append that a crash interrupted leaves a frame
cut short, or a frame whose bytes are partly missing (zeros, or old garbage, after a power
loss). Every append is one frame and the next append starts only after the previous one was
fsync'ed, so such damage can only be the last frame of the file, and that frame was never
acknowledged: it is cut off. Damage followed by any whole frame is not a crash: granted state
sits after it, and ``replay`` refuses (``JournalCorrupt``) rather than drop it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from typing import Final

import attrs

import trio_ha._backend as _backend

from .._errors import TrioHAError
from .state_store import Versioned

__all__ = [
    "FILE_HEADER_SIZE", "FILE_MAGIC", "FORMAT_VERSION", "FRAME_HEADER_SIZE", "FRAME_MAGIC",
    "KIND_COMMIT", "KIND_SNAPSHOT", "MAX_BODY", "MAX_KEY_BYTES", "OP_DELETE", "OP_PUT",
    "Entry", "JournalCorrupt", "Replay", "TornTail", "encode_frame", "file_header", "replay",
    "snapshot_entries",
]

FILE_MAGIC: Final = b"TRIOHAJ\n"
FORMAT_VERSION: Final = 1
FILE_HEADER_SIZE: Final = 16
FRAME_MAGIC: Final = 0x4A524E4C  # "JRNL"
FRAME_HEADER_SIZE: Final = 12
#: a frame body's limit: far above any controller's state (a few KiB per broker set), and
#: low enough that a damaged length never makes us believe in a 4 GiB frame.
MAX_BODY: Final = 1 << 30
MAX_KEY_BYTES: Final = 0xFFFF

KIND_COMMIT: Final = 1
KIND_SNAPSHOT: Final = 2
OP_DELETE: Final = 0
OP_PUT: Final = 1

_HEADER = struct.Struct(">8sI")
_U32 = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">III")  # magic, crc, body length
_BODY_HEAD = struct.Struct(">BQI")  # kind, sequence, entry count
_ENTRY_HEAD = struct.Struct(">BQH")  # op, version, key length
_FRAME_MAGIC_BYTES: Final = _U32.pack(FRAME_MAGIC)


class JournalCorrupt(TrioHAError, ValueError):
    """The journal file is damaged somewhere a crash cannot have damaged it (its header, or
    a frame that whole frames follow): the controller refuses to start rather than forget
    state it granted. Restore the directory from a copy, or move it aside knowingly."""


def _crc(data: bytes | memoryview) -> int:
    # The project's CRC-32 (zlib's polynomial, masked to 31 bits as RocketMQ stores it): the
    # native engine computes it with the GIL released.
    return _backend.engine.crc32(data)


@attrs.frozen
class Entry:
    """One record change as the file holds it: ``value`` None is a delete."""

    key: str
    version: int
    value: bytes | None


def file_header() -> bytes:
    """The 16 bytes every journal file starts with."""
    head = _HEADER.pack(FILE_MAGIC, FORMAT_VERSION)
    return head + _U32.pack(_crc(head))


def encode_frame(kind: int, sequence: int, entries: Iterable[Entry]) -> bytes:
    """One frame: ``entries`` in order, ``sequence`` the last version the frame gives out
    (for a snapshot, the journal's sequence when it was taken)."""
    parts: list[bytes] = []
    count = 0
    for entry in entries:
        key = entry.key.encode()
        if not key or len(key) > MAX_KEY_BYTES:
            raise ValueError(f"a journal key is 1 to {MAX_KEY_BYTES} UTF-8 bytes: {entry.key!r}")
        op = OP_DELETE if entry.value is None else OP_PUT
        parts.append(_ENTRY_HEAD.pack(op, entry.version, len(key)))
        parts.append(key)
        if entry.value is not None:
            parts.append(_U32.pack(len(entry.value)))
            parts.append(entry.value)
        count += 1
    body = _BODY_HEAD.pack(kind, sequence, count) + b"".join(parts)
    if len(body) > MAX_BODY:
        raise ValueError(f"a journal frame holds at most {MAX_BODY} bytes, not {len(body)}")
    covered = _U32.pack(len(body)) + body
    return _U32.pack(FRAME_MAGIC) + _U32.pack(_crc(covered)) + covered


@attrs.frozen
class TornTail:
    """What recovery cut: the bytes from ``offset`` to the end of the file."""

    offset: int
    length: int
    reason: str


@attrs.frozen
class Replay:
    """A journal image replayed: the records, the last sequence given out, and where the
    whole frames end (``end``; the file is cut there when ``torn`` is not None)."""

    records: Mapping[str, Versioned]
    sequence: int
    frames: int
    end: int
    torn: TornTail | None


@attrs.frozen
class _Frame:
    kind: int
    sequence: int
    entries: tuple[Entry, ...]
    end: int


def _frame_at(data: bytes, pos: int) -> _Frame | str:
    """The whole, CRC-checked frame at ``pos``, or why there is none."""
    if len(data) - pos < FRAME_HEADER_SIZE:
        return f"{len(data) - pos} bytes, less than a frame header"
    magic, crc, length = _FRAME_HEAD.unpack_from(data, pos)
    if magic != FRAME_MAGIC:
        return f"no frame magic (0x{magic:08x})"
    if length > MAX_BODY or length < _BODY_HEAD.size:
        return f"impossible body length {length}"
    end = pos + FRAME_HEADER_SIZE + length
    if end > len(data):
        return f"body of {length} bytes cut at {len(data) - pos - FRAME_HEADER_SIZE}"
    if _crc(memoryview(data)[pos + 8 : end]) != crc:
        return "CRC mismatch"
    return _parse_body(data, pos + FRAME_HEADER_SIZE, end)


def _parse_body(data: bytes, pos: int, end: int) -> _Frame | str:
    """A body whose CRC matched. Anything wrong inside it is not a torn write (the CRC
    vouches for the bytes) but a writer's bug: the caller treats it as corruption."""
    kind, sequence, count = _BODY_HEAD.unpack_from(data, pos)
    pos += _BODY_HEAD.size
    entries: list[Entry] = []
    for _ in range(count):  # bounded by the count, and each entry by the body's end
        if end - pos < _ENTRY_HEAD.size:
            raise JournalCorrupt(f"journal frame ends inside an entry header at {pos}")
        op, version, key_len = _ENTRY_HEAD.unpack_from(data, pos)
        pos += _ENTRY_HEAD.size
        if end - pos < key_len:
            raise JournalCorrupt(f"journal frame ends inside a key at {pos}")
        try:
            key = data[pos : pos + key_len].decode()
        except UnicodeDecodeError:
            raise JournalCorrupt(f"journal key at {pos} is not UTF-8") from None
        pos += key_len
        value: bytes | None = None
        if op == OP_PUT:
            if end - pos < _U32.size:
                raise JournalCorrupt(f"journal frame ends inside a value length at {pos}")
            (value_len,) = _U32.unpack_from(data, pos)
            pos += _U32.size
            if end - pos < value_len:
                raise JournalCorrupt(f"journal frame ends inside a value at {pos}")
            value = data[pos : pos + value_len]
            pos += value_len
        elif op != OP_DELETE:
            raise JournalCorrupt(f"journal entry at {pos} has unknown op {op}")
        entries.append(Entry(key, version, value))
    if pos != end:
        raise JournalCorrupt(f"journal frame has {end - pos} bytes after its last entry")
    return _Frame(kind, sequence, tuple(entries), end)


def _check_header(data: bytes) -> None:
    if len(data) < FILE_HEADER_SIZE:
        raise JournalCorrupt(
            f"journal file is {len(data)} bytes, shorter than its {FILE_HEADER_SIZE}-byte "
            "header (it is created whole: this is damage, not a crash)"
        )
    magic, version = _HEADER.unpack_from(data, 0)
    (crc,) = _U32.unpack_from(data, 12)
    if magic != FILE_MAGIC or crc != _crc(data[:12]):
        raise JournalCorrupt("not a trio_ha controller journal (bad magic or header CRC)")
    if version != FORMAT_VERSION:
        raise JournalCorrupt(
            f"journal format version {version}; this trio_ha reads version {FORMAT_VERSION}"
        )


def _whole_frame_after(data: bytes, pos: int) -> int | None:
    """The offset of a whole (CRC-checked) frame starting after ``pos``, if there is one.
    Only looked for after damage; bounded by the file's length, one candidate per magic."""
    search = pos + 1
    while True:
        found = data.find(_FRAME_MAGIC_BYTES, search)
        if found < 0:
            return None
        try:
            frame = _frame_at(data, found)
        except JournalCorrupt:
            return found  # its CRC matched but its inside is bad: still a whole frame
        if isinstance(frame, _Frame):
            return found
        search = found + 1


def replay(data: bytes) -> Replay:
    """Replay a whole journal image (see the module's essay for the torn-tail rule)."""
    _check_header(data)
    records: dict[str, Versioned] = {}
    sequence = 0
    frames = 0
    pos = FILE_HEADER_SIZE
    while pos < len(data):  # each turn moves past a whole frame or returns
        frame = _frame_at(data, pos)
        if isinstance(frame, str):
            later = _whole_frame_after(data, pos)
            if later is not None:
                raise JournalCorrupt(
                    f"journal damaged at byte {pos} ({frame}) with a whole frame at {later} "
                    "after it: refusing to start rather than drop granted state"
                )
            torn = TornTail(pos, len(data) - pos, frame)
            return Replay(records, sequence, frames, pos, torn)
        sequence = _apply(records, sequence, frame, first=frames == 0, pos=pos)
        frames += 1
        pos = frame.end
    return Replay(records, sequence, frames, pos, None)


def _apply(
    records: dict[str, Versioned], sequence: int, frame: _Frame, *, first: bool, pos: int
) -> int:
    """Apply one frame; the new sequence. Checks what the writer always guarantees: a
    snapshot only starts a file, and a commit frame's versions are new and in order."""
    if frame.kind == KIND_SNAPSHOT:
        if not first:
            raise JournalCorrupt(f"journal snapshot frame at {pos} is not the first frame")
        for entry in frame.entries:
            if entry.value is None or not 0 < entry.version <= frame.sequence:
                raise JournalCorrupt(f"journal snapshot frame at {pos} has a bad entry")
            records[entry.key] = Versioned(entry.version, entry.value)
        return frame.sequence
    if frame.kind != KIND_COMMIT:
        raise JournalCorrupt(f"journal frame at {pos} has unknown kind {frame.kind}")
    if frame.sequence <= sequence:
        raise JournalCorrupt(
            f"journal frame at {pos} has sequence {frame.sequence}, not above {sequence}"
        )
    last = sequence + 1
    for entry in frame.entries:
        if not last <= entry.version <= frame.sequence:
            raise JournalCorrupt(f"journal frame at {pos} has an entry out of order")
        last = entry.version
        if entry.value is None:
            records.pop(entry.key, None)
        else:
            records[entry.key] = Versioned(entry.version, entry.value)
    return frame.sequence


def snapshot_entries(records: Mapping[str, Versioned]) -> list[Entry]:
    """Every record as a snapshot frame holds it (sorted, so equal states give equal files)."""
    return [Entry(key, records[key].version, records[key].value) for key in sorted(records)]
