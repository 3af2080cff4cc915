"""Chatter payloads as values: SBS for message types in the schema repository, else as
:mod:`rpc.payload` encodes them (JSON, or bytes as they are).

A received SBS payload is decoded when it arrives, so that a payload that does not decode
fails as a PayloadError for its own message alone, when a handler or caller reads it.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, TypeAlias, final

import hat.sbs

from rpc.payload import PayloadError, encode_value
from wire import schemas


@dataclass(slots=True, frozen=True)
class Reply:
    """A result with a message type of its own (e.g. ``HatEventer.MsgQueryRes``): ``value``
    is SBS-encoded when ``type`` is in the schema repository, else as usual."""

    type: str
    value: Any


@final
@dataclass(slots=True, frozen=True)
class Sbs:
    """A payload already decoded from SBS (as opposed to raw bytes)."""

    value: Any


@final
@dataclass(slots=True, frozen=True)
class Undecodable:
    """A payload whose SBS did not decode: a PayloadError for whoever reads it."""

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
        """A received payload of message type ``op``, as the peer holds it."""
        if op in self.names:
            try:
                return Sbs(self.repo.decode(op, data))
            except schemas.SBS_ERRORS as exc:
                return Undecodable(f"invalid {op} SBS payload: {exc}")
        return data

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
