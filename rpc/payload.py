"""Payload values <-> bytes: JSON through msgspec, raw bytes when asked for.

A handler's first parameter annotation says what it wants: ``bytes`` (raw payload), a
dataclass, a ``msgspec.Struct`` or any type msgspec understands (decoded and validated), or
nothing (any JSON value). Bad input raises :class:`PayloadError`, which the core turns into
an error result that says what is wrong. JSON nested deeper than the interpreter's recursion
limit (about 1,000 levels: msgspec raises RecursionError) is such bad input too.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import msgspec

from rpc.errors import PayloadError

__all__ = ["PayloadError", "convert", "decode_any", "decoder_for", "encode_value"]

_encoder = msgspec.json.Encoder()
_any_decoder = msgspec.json.Decoder()
TOO_DEEP = "JSON payload nested too deeply"
"""The :class:`PayloadError` message for a value msgspec cannot decode or convert without
passing the recursion limit: a peer's payload, never a reason to stop its connection."""


def encode_value(value: Any) -> bytes:
    """Bytes go out as they are; everything else as JSON."""
    if value.__class__ is bytes:  # the common case first: a class test is cheapest
        return value
    if isinstance(value, (bytes, bytearray, memoryview)):  # a tuple: faster than a union
        return bytes(value)
    try:
        return _encoder.encode(value)
    except (TypeError, msgspec.EncodeError) as exc:
        raise PayloadError(f"cannot encode {type(value).__name__} as JSON: {exc}") from None


def decode_any(data: bytes) -> Any:
    """Any JSON value; an empty payload is ``None``."""
    if not data:
        return None
    try:
        return _any_decoder.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise PayloadError(f"invalid JSON payload: {exc}") from None
    except RecursionError:
        raise PayloadError(TOO_DEEP) from None


def decoder_for(annotation: Any) -> Callable[[bytes], Any]:
    """A function that turns payload bytes into a value of ``annotation``."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return decode_any
    if annotation is bytes:
        return bytes
    typed = msgspec.json.Decoder(annotation)

    def decode(data: bytes) -> Any:
        try:
            return typed.decode(data or b"null")
        except msgspec.ValidationError as exc:
            raise PayloadError(f"invalid parameters: {exc}") from None
        except (msgspec.DecodeError, UnicodeDecodeError) as exc:
            raise PayloadError(f"invalid JSON payload: {exc}") from None
        except RecursionError:
            raise PayloadError(TOO_DEEP) from None

    return decode


def convert(value: Any, annotation: Any) -> Any:
    """Validate an already-decoded value (e.g. from SBS) against ``annotation``."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return value
    try:
        return msgspec.convert(value, annotation)
    except msgspec.ValidationError as exc:
        raise PayloadError(f"invalid parameters: {exc}") from None
    except RecursionError:
        raise PayloadError(TOO_DEEP) from None
