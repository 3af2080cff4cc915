"""peerwire's request metadata, sans-I/O: trace context and the caller's time left, per request.

Part of peerwire's extension (level 2), exchanged only between peers that both announced
it at connect. A request's metadata travels in a message of its own, sent right before the
request it belongs to and naming it:

- Gotalk: the notification ``peerwire/meta`` whose payload is
  ``id:4  timeout_ms:u32be  count:u8  { key_len:u8 key  value_len:u16be value }*count``
  (``timeout_ms`` 0xFFFFFFFF: no timeout);
- Chatter: a one-message conversation of type ``PeerwireRpc.Meta`` (the SBS record
  ``{first, timeoutMs: Optional(Integer), entries: Array({key, value})}``, ``first`` the id
  of the request's first message), built by :func:`to_sbs` and read by :func:`from_sbs`.

``timeout_ms`` is the time the caller had left when it sent the request (a duration, so the
two clocks need not agree). Limits, the same on both protocols: at most 32 entries, keys
1-255 bytes and values at most 65535 bytes of UTF-8; encoding past them raises ValueError,
decoding raises :class:`~wire.errors.MalformedMessage`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from wire.errors import MalformedMessage

MAX_ENTRIES = 32
MAX_KEY = 0xFF
MAX_VALUE = 0xFFFF
MAX_TIMEOUT_MS = 0xFFFFFFFE
_NO_TIMEOUT = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """One request's metadata: the caller's time left (ms, None: none) and string entries
    (W3C ``traceparent``/``tracestate``, or anything the application adds)."""

    timeout_ms: int | None = None
    entries: Mapping[str, str] = field(default_factory=dict)


def timeout_ms(seconds: float) -> int:
    """Seconds left -> whole milliseconds for the wire (rounded down, at least 0)."""
    return min(max(int(seconds * 1000), 0), MAX_TIMEOUT_MS)


def _check(meta: RequestMeta) -> list[tuple[bytes, bytes]]:
    entries = meta.entries
    if len(entries) > MAX_ENTRIES:
        raise ValueError(f"at most {MAX_ENTRIES} metadata entries, got {len(entries)}")
    if meta.timeout_ms is not None and not 0 <= meta.timeout_ms <= MAX_TIMEOUT_MS:
        raise ValueError(f"timeout_ms {meta.timeout_ms} out of range")
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
    timeout = _NO_TIMEOUT if meta.timeout_ms is None else meta.timeout_ms
    head = request_id + timeout.to_bytes(4, "big") + bytes((len(entries),))
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
    timeout = int.from_bytes(payload[4:8], "big")
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
            entries[key.decode()] = value.decode()
    except (IndexError, UnicodeDecodeError) as exc:
        raise MalformedMessage(f"bad peerwire/meta payload: {exc}") from None
    if pos != end:
        raise MalformedMessage(f"{end - pos} bytes after the last peerwire/meta entry")
    return request_id, RequestMeta(None if timeout == _NO_TIMEOUT else timeout, entries)


def to_sbs(first: int, meta: RequestMeta) -> dict[str, Any]:
    """The ``PeerwireRpc.Meta`` value for the request whose first message id is ``first``."""
    _check(meta)
    timeout = ("none", None) if meta.timeout_ms is None else ("value", meta.timeout_ms)
    entries = [{"key": key, "value": value} for key, value in meta.entries.items()]
    return {"first": first, "timeoutMs": timeout, "entries": entries}


def from_sbs(value: Any) -> tuple[int, RequestMeta]:
    """(first message id, metadata) of a decoded ``PeerwireRpc.Meta``; MalformedMessage
    past the limits."""
    try:
        first = value["first"]
        kind, timeout = value["timeoutMs"]
        raw = value["entries"]
        entries = {item["key"]: item["value"] for item in raw}
    except (KeyError, TypeError, ValueError) as exc:
        raise MalformedMessage(f"bad PeerwireRpc.Meta: {exc}") from None
    meta = RequestMeta(timeout if kind == "value" else None, entries)
    try:
        _check(meta)
    except ValueError as exc:
        raise MalformedMessage(f"PeerwireRpc.Meta: {exc}") from None
    if len(raw) != len(entries):
        raise MalformedMessage("PeerwireRpc.Meta repeats a key")
    return first, meta
