"""Chatter payloads as values: SBS for message types in the schema repository, else as
:mod:`rpc.payload` encodes them (JSON, or bytes as they are).

A received SBS payload is kept as bytes and decoded when a handler or a waiting caller
reads it (:attr:`Sbs.value`), never for a message no one takes: a payload that does not
decode fails as a PayloadError for its own message alone. Before hat-sbs sees the bytes,
:func:`wire.schemas.check` walks them, so that a count, a length or a nesting the bytes do
not back is refused at a cost in proportion to the payload's size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias, final

from rpc.payload import PayloadError, convert, decode_any, encode_value
from wire import schemas

if TYPE_CHECKING:
    import hat.sbs

    from rpc.registry import Handler


@dataclass(slots=True, frozen=True)
class Reply:
    """A result with a message type of its own (e.g. ``HatEventer.MsgQueryRes``): ``value``
    is SBS-encoded when ``type`` is in the schema repository, else as usual."""

    type: str
    value: Any


@final
class Sbs:
    """A received payload of a type in the schema repository: its ``data``, decoded on the
    first read of :attr:`value` (PayloadError if it does not decode) and kept."""

    __slots__ = ("_decoded", "_payloads", "data", "op")

    def __init__(self, payloads: SbsPayloads, op: str, data: bytes) -> None:
        self._payloads = payloads
        self.op = op
        self.data = data
        self._decoded: Any = _UNREAD

    @property
    def value(self) -> Any:
        decoded = self._decoded
        if decoded is _UNREAD:
            decoded = self._decoded = self._payloads.decode(self.op, self.data)
        if type(decoded) is Undecodable:
            raise PayloadError(decoded.reason)
        return decoded

    def __repr__(self) -> str:
        return f"Sbs({self.op!r}, {len(self.data)} bytes)"


_UNREAD: Any = object()


@final
@dataclass(slots=True, frozen=True)
class Undecodable:
    """What :meth:`SbsPayloads.decode` gives for bytes that do not decode: a PayloadError
    for whoever reads the payload."""

    reason: str


Incoming: TypeAlias = bytes | Sbs | Undecodable
"""A received payload as the peer holds it until a handler or caller reads it."""


class SbsPayloads:
    """The payloads of one schema repository's message types (see the module doc)."""

    __slots__ = ("names", "repo")

    def __init__(self, repo: hat.sbs.Repository) -> None:
        self.repo = repo
        self.names = _type_names(repo)
        """Every ``Module.Type`` name the repository defines."""

    def incoming(self, op: str, data: bytes) -> Incoming:
        """A received payload of message type ``op``, as the peer holds it: nothing is
        decoded yet (see the module doc)."""
        if op in self.names:
            return Sbs(self, op, data)
        return data

    def decode(self, op: str, data: bytes) -> Any:
        """``data`` decoded as ``op`` (a type in the repository), checked first by
        :func:`wire.schemas.check`; :class:`Undecodable` for bytes that do not fit ``op``
        or that it refuses."""
        try:
            schemas.check(self.repo, op, data)
            return self.repo.decode(op, data)
        except schemas.SBS_ERRORS as exc:
            return Undecodable(f"invalid {op} SBS payload: {exc}")

    def encode(self, op: str, value: Any) -> bytes:
        """The payload of ``value`` as message type ``op``; PayloadError if it does not fit
        ``op``'s schema."""
        if op in self.names:
            try:
                data: bytes = self.repo.encode(op, value)
            except schemas.SBS_ERRORS as exc:
                raise PayloadError(f"cannot encode {op} as SBS: {exc}") from None
            return data
        return encode_value(value)

    def encode_request(self, op: str, value: Any) -> bytes:
        """A request's (or notification's) payload: :meth:`encode` without its call for a
        type outside the repository."""
        if op in self.names:
            return self.encode(op, value)
        if value.__class__ is bytes:  # raw bytes go as they are: encode_value's first case
            return value
        return encode_value(value)

    def encode_result(self, value: Any) -> bytes | Reply:
        """A handler's result: a :class:`Reply` goes as it names, anything else as
        :func:`~rpc.payload.encode_value` encodes it."""
        if isinstance(value, Reply):
            return value
        return encode_value(value)

    def decode_params(self, handler: Handler, payload: Incoming) -> Any:
        """A received request's payload as ``handler`` takes it; PayloadError if it does
        not decode."""
        if payload.__class__ is bytes:  # the common payload first: one check
            return handler.decode(payload)
        if type(payload) is Sbs:
            return convert(payload.value, handler.annotation)
        if type(payload) is Undecodable:
            raise PayloadError(payload.reason)
        return handler.decode(payload)

    def decode_result(self, payload: Incoming) -> Any:
        """A received result as its caller gets it; PayloadError if it does not decode."""
        if type(payload) is Sbs:
            return payload.value
        if type(payload) is Undecodable:
            raise PayloadError(payload.reason)
        return decode_any(payload)


@functools.lru_cache(maxsize=32)
def _type_names(repo: hat.sbs.Repository) -> frozenset[str]:
    """Every ``Module.Type`` name the repository defines; once per repository (a
    repository hashes by identity and does not change), not per connection: it walks the
    repository's JSON form, about 0.2-0.4 ms."""
    return frozenset(
        f"{module['name']}.{type_name}"
        for module in repo.to_json()
        for type_name in module["type_defs"]
    )
