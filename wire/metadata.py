"""peerwire's request metadata, sans-I/O: trace context and the caller's time left, per request.

Part of peerwire's extension (levels 2 and 3), exchanged only between peers that both announced
it at connect. A request's metadata travels in a message of its own, sent right before the
request it belongs to and naming it:

- Gotalk: the notification ``peerwire/meta`` whose payload is
  ``id:4  timeout_ms:u32be  count:u8  { key_len:u8 key  value_len:u16be value }*count``
  (``timeout_ms`` 0xFFFFFFFF: no timeout);
- Chatter: a one-message conversation of type ``PeerwireRpc.Meta`` (the SBS record
  ``{first, timeoutMs: Optional(Integer), entries: Array({key, value})}``, ``first`` the id
  of the request's first message), written by :func:`encode_sbs` and read by
  :func:`decode_sbs` directly, as the Chatter envelope is (:mod:`wire.sbs`): one is sent
  per request with a deadline, and hat-sbs' generic serializer took about 2.8 us each way.

``timeout_ms`` is the time the caller had left when it sent the request (a duration, so the
two clocks need not agree). Limits, the same on both protocols: at most 32 entries, keys
1-255 bytes and values at most 65535 bytes of UTF-8; encoding past them raises ValueError,
decoding raises :class:`~wire.errors.MalformedMessage`.

Level 3 adds a connection-wide default, so that a caller whose requests all carry the same
timeout (a client with ``Options.timeout``, every call of a Spark UDF) sends one message
per request instead of two. The caller announces the time left of each request it sends
afterwards without metadata of its own, until it announces another:

- Gotalk: the notification ``peerwire/timeout`` whose payload is ``timeout_ms:u32be``
  (0xFFFFFFFF: no timeout, as at the start);
- Chatter: a one-message conversation of type ``PeerwireRpc.Timeout``, the SBS
  ``Optional(Integer)`` (:func:`encode_timeout_sbs`).

A caller may send a request without metadata only while the default it announced
:func:`covers` that request's time left: never less than the caller has, at most
:data:`TIMEOUT_SLACK_MS` more (the server then bounds the handler up to that much later
than the caller's deadline; it lets handlers run 100 ms past a deadline anyway). A request
with entries always has metadata of its own, which overrides the default.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from wire.errors import MalformedMessage
from wire.sbs import encode_integer, read_bytes, read_integer

MAX_ENTRIES = 32
MAX_KEY = 0xFF
MAX_VALUE = 0xFFFF
MAX_TIMEOUT_MS = 0xFFFFFFFE
_NO_TIMEOUT = 0xFFFFFFFF
_NO_TIMEOUT_BYTES = _NO_TIMEOUT.to_bytes(4, "big")


class RequestMeta(msgspec.Struct, frozen=True):
    """One request's metadata: the caller's time left (ms, None: none) and string entries
    (W3C ``traceparent``/``tracestate``, or anything the application adds). A msgspec
    Struct: one is made per request with metadata on each side (a fifth of a frozen
    dataclass's cost)."""

    timeout_ms: int | None = None
    entries: Mapping[str, str] = {}


TIMEOUT_SLACK_MS = 5
"""How much more than a request's time left the connection's default may grant it (see
:func:`covers`): a few ms against the 100 ms a server lets a handler run past a deadline."""


def timeout_ms(seconds: float) -> int:
    """Seconds left -> whole milliseconds for the wire (rounded down, at least 0, at most
    :data:`MAX_TIMEOUT_MS`), after a microsecond's allowance: a deadline less a clock
    reading in whole ms (uvloop's ``loop.time()``) is not exact in floating point (2.0 s
    less 1 ms comes out 1.99899...), and rounding that down to 1998 ms would make
    consecutive calls with one fixed timeout differ by 2 ms, past what one default covers
    (:func:`default_for`)."""
    ms = seconds * 1000 + 0.001
    if not ms < MAX_TIMEOUT_MS:  # (no deadline, ``inf``, goes as the longest there is)
        return MAX_TIMEOUT_MS
    return int(ms) if ms > 0 else 0  # (-inf: none left, as any negative time)


def covers(default_ms: int | None, left_ms: int | None) -> bool:
    """True when a request whose caller has ``left_ms`` left (None: no timeout) may go
    without metadata on a connection whose announced default is ``default_ms`` (level 3):
    ``left_ms <= default_ms <= left_ms + TIMEOUT_SLACK_MS``; None covers None alone."""
    if default_ms is None or left_ms is None:
        return default_ms is left_ms
    return 0 <= default_ms - left_ms <= TIMEOUT_SLACK_MS


def default_for(left_ms: int | None) -> int | None:
    """The default a caller announces for a request with ``left_ms`` left: 1 ms more, so
    that it also covers the requests sent after it with as much time or up to 4 ms less
    (a fixed timeout's calls, whose time left rounds down to one ms or the next)."""
    return None if left_ms is None else min(left_ms + 1, MAX_TIMEOUT_MS)


def _check(meta: RequestMeta) -> list[tuple[bytes, bytes]]:
    """``meta``'s entries as UTF-8 pairs; ValueError past the limits (its timeout is checked
    where it is encoded, :func:`encode_timeout_gotalk` / :func:`encode_timeout_sbs`)."""
    entries = meta.entries
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"at most {MAX_ENTRIES} metadata entries, got {len(entries)}")
    encoded = []
    for key, value in entries.items():
        k, v = key.encode(), value.encode()
        if not 0 < len(k) <= MAX_KEY or len(v) > MAX_VALUE:
            raise ValueError(f"metadata entry {key!r}: empty or too long key, or too long value")
        encoded.append((k, v))
    return encoded


def encode_gotalk(request_id: bytes, meta: RequestMeta) -> bytes:
    """The payload of a ``peerwire/meta`` notification for request ``request_id``."""
    if len(request_id) != 4:
        raise ValueError("a Gotalk request id is 4 bytes")
    entries = _check(meta)
    head = request_id + encode_timeout_gotalk(meta.timeout_ms) + bytes((len(entries),))
    if not entries:  # the common case, a timeout alone
        return head
    out = bytearray(head)
    for k, v in entries:
        out.append(len(k))
        out += k
        out += len(v).to_bytes(2, "big")
        out += v
    return bytes(out)


def decode_gotalk(payload: bytes) -> tuple[bytes, RequestMeta]:
    """(request id, metadata) of a ``peerwire/meta`` payload; MalformedMessage if it is not
    one (truncated, trailing bytes, over the limits, not UTF-8)."""
    if len(payload) < 9:
        raise MalformedMessage("peerwire/meta payload shorter than 9 bytes")
    request_id = payload[:4]
    timeout = decode_timeout_gotalk(payload[4:8])
    count = payload[8]
    if count > MAX_ENTRIES:
        raise MalformedMessage(f"peerwire/meta with {count} entries")
    entries: dict[str, str] = {}
    pos, end = 9, len(payload)
    try:
        for _ in range(count):
            klen = payload[pos]
            key = payload[pos + 1 : pos + 1 + klen]
            pos += 1 + klen
            vlen = int.from_bytes(payload[pos : pos + 2], "big")
            value = payload[pos + 2 : pos + 2 + vlen]
            pos += 2 + vlen
            if not klen or len(key) != klen or len(value) != vlen or pos > end:
                raise MalformedMessage("truncated peerwire/meta entry")
            name = key.decode()
            if name in entries:
                raise MalformedMessage("peerwire/meta repeats a key")
            entries[name] = value.decode()
    except (IndexError, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"bad peerwire/meta payload: {exc}") from None
    if pos != end:
        raise MalformedMessage(f"{end - pos} bytes after the last peerwire/meta entry")
    return request_id, RequestMeta(timeout, entries)


_NONE = encode_integer(0)
_SOME = encode_integer(1)
_NO_ENTRIES = encode_integer(0)


def encode_sbs(first: int, meta: RequestMeta) -> bytes:
    """The SBS ``PeerwireRpc.Meta`` bytes for the request whose first message id is
    ``first`` (the bytes hat-sbs writes for the same record); ValueError past the limits."""
    entries = _check(meta)
    head = encode_integer(first) + encode_timeout_sbs(meta.timeout_ms)
    if not entries:  # the common case, a timeout alone
        return head + _NO_ENTRIES
    out = [head, encode_integer(len(entries))]
    for k, v in entries:
        out += (encode_integer(len(k)), k, encode_integer(len(v)), v)
    return b"".join(out)


def decode_sbs(data: bytes) -> tuple[int, RequestMeta]:
    """(first message id, metadata) of SBS ``PeerwireRpc.Meta`` bytes; MalformedMessage if
    they are not one (truncated, trailing bytes, a bad Optional index, not UTF-8, a repeated
    key, past the limits)."""
    end = len(data)
    try:
        first, pos = read_integer(data, 0)
        timeout, pos = _read_timeout(data, pos, "PeerwireRpc.Meta")
        count, pos = read_integer(data, pos)
        if not 0 <= count <= MAX_ENTRIES:
            raise MalformedMessage(f"PeerwireRpc.Meta with {count} entries")
        entries: dict[str, str] = {}
        for _ in range(count):
            key, pos = read_bytes(data, pos, end)
            value, pos = read_bytes(data, pos, end)
            if not 0 < len(key) <= MAX_KEY or len(value) > MAX_VALUE:
                raise MalformedMessage("PeerwireRpc.Meta entry: empty or too long key or value")
            name = key.decode()
            if name in entries:
                raise MalformedMessage("PeerwireRpc.Meta repeats a key")
            entries[name] = value.decode()
    except IndexError:
        raise MalformedMessage("PeerwireRpc.Meta truncated") from None
    except UnicodeDecodeError as exc:
        raise MalformedMessage(f"PeerwireRpc.Meta string is not UTF-8: {exc.reason}") from None
    if pos != end:
        raise MalformedMessage(f"{end - pos} bytes after PeerwireRpc.Meta")
    return first, RequestMeta(timeout, entries)


def encode_timeout_gotalk(timeout_ms: int | None) -> bytes:
    """The payload of a ``peerwire/timeout`` notification (level 3): the default time left
    of the requests that follow without metadata (None: none)."""
    if timeout_ms is None:
        return _NO_TIMEOUT_BYTES
    return _checked_timeout(timeout_ms).to_bytes(4, "big")


def decode_timeout_gotalk(payload: bytes) -> int | None:
    """The default of a ``peerwire/timeout`` payload; MalformedMessage unless 4 bytes."""
    if len(payload) != 4:
        raise MalformedMessage(f"peerwire/timeout payload of {len(payload)} bytes, not 4")
    timeout = int.from_bytes(payload, "big")
    return None if timeout == _NO_TIMEOUT else timeout


def encode_timeout_sbs(timeout_ms: int | None) -> bytes:
    """The SBS ``PeerwireRpc.Timeout`` bytes (``Optional(Integer)``, as hat-sbs writes it)."""
    if timeout_ms is None:
        return _NONE
    return _SOME + encode_integer(_checked_timeout(timeout_ms))


def decode_timeout_sbs(data: bytes) -> int | None:
    """The default of SBS ``PeerwireRpc.Timeout`` bytes; MalformedMessage if they are not
    one (truncated, trailing bytes, a bad Optional index, out of range)."""
    try:
        timeout, pos = _read_timeout(data, 0, "PeerwireRpc.Timeout")
    except IndexError:
        raise MalformedMessage("PeerwireRpc.Timeout truncated") from None
    if pos != len(data):
        raise MalformedMessage(f"{len(data) - pos} bytes after PeerwireRpc.Timeout")
    return timeout


def _checked_timeout(timeout_ms: int) -> int:
    """``timeout_ms``, or ValueError past 0..:data:`MAX_TIMEOUT_MS`."""
    if not 0 <= timeout_ms <= MAX_TIMEOUT_MS:
        raise ValueError(f"timeout_ms {timeout_ms} out of range")
    return timeout_ms


def _read_timeout(data: bytes, pos: int, what: str) -> tuple[int | None, int]:
    """An SBS ``Optional(Integer)`` of milliseconds at ``pos``: (timeout or None, next
    position); IndexError when truncated."""
    index, pos = read_integer(data, pos)
    if index == 0:
        return None, pos
    if index != 1:
        raise MalformedMessage(f"bad Optional index {index} in {what}")
    timeout, pos = read_integer(data, pos)
    if not 0 <= timeout <= MAX_TIMEOUT_MS:
        raise MalformedMessage(f"{what} timeout {timeout} out of range")
    return timeout, pos
