"""Property tests of request metadata's codecs (wire.metadata): both round-trip every
record within the limits, the SBS one writes the bytes hat-sbs writes, and arbitrary
bytes decode to a record or raise MalformedMessage, never anything else."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from wire import metadata, schemas
from wire.errors import MalformedMessage
from wire.metadata import RequestMeta

timeouts = st.none() | st.integers(min_value=0, max_value=metadata.MAX_TIMEOUT_MS)
keys = st.text(min_size=1, max_size=90).filter(lambda k: len(k.encode()) <= metadata.MAX_KEY)
entries = st.dictionaries(keys, st.text(max_size=40), max_size=metadata.MAX_ENTRIES)
metas = st.builds(RequestMeta, timeouts, entries)
firsts = st.integers(min_value=0, max_value=2**63 - 1)
REPO = schemas.repository()


def as_sbs_value(first: int, meta: RequestMeta) -> dict[str, Any]:
    timeout = ("none", None) if meta.timeout_ms is None else ("value", meta.timeout_ms)
    items = [{"key": key, "value": value} for key, value in meta.entries.items()]
    return {"first": first, "timeoutMs": timeout, "entries": items}


@given(firsts, metas)
def test_sbs_meta_matches_hat_sbs_and_round_trips(first: int, meta: RequestMeta) -> None:
    ours = metadata.encode_sbs(first, meta)
    assert ours == REPO.encode("PeerwireRpc.Meta", as_sbs_value(first, meta))
    assert metadata.decode_sbs(ours) == (first, meta)


@given(st.binary(min_size=4, max_size=4), metas)
def test_gotalk_meta_round_trips(request_id: bytes, meta: RequestMeta) -> None:
    assert metadata.decode_gotalk(metadata.encode_gotalk(request_id, meta)) == (request_id, meta)


@given(firsts, metas, st.binary(min_size=1, max_size=8))
def test_meta_decoders_refuse_trailing_bytes(first: int, meta: RequestMeta, extra: bytes) -> None:
    """hat-sbs reads past trailing bytes; we refuse them (a frame holds one record)."""
    with pytest.raises(MalformedMessage):
        metadata.decode_sbs(metadata.encode_sbs(first, meta) + extra)
    with pytest.raises(MalformedMessage):
        metadata.decode_gotalk(metadata.encode_gotalk(b"abcd", meta) + extra)


# Random bytes alone are never a record (100 of 100 examples refused, so the checks of
# what is accepted never ran): records written by the encoders are drawn too.
sbs_records = st.builds(metadata.encode_sbs, firsts, metas)
gotalk_records = st.builds(metadata.encode_gotalk, st.binary(min_size=4, max_size=4), metas)
sbs_timeouts = st.builds(metadata.encode_timeout_sbs, timeouts)


@given(st.binary(max_size=200) | sbs_records)
def test_sbs_meta_decoder_takes_any_bytes(data: bytes) -> None:
    try:
        first, meta = metadata.decode_sbs(data)
    except MalformedMessage:
        return
    # what we accept, hat-sbs reads as the same record (both take an SBS Integer written
    # longer than it need be, so the bytes need not be the ones we would write)
    assert REPO.decode("PeerwireRpc.Meta", data) == as_sbs_value(first, meta)


@given(st.binary(max_size=200) | gotalk_records)
def test_gotalk_meta_decoder_takes_any_bytes(data: bytes) -> None:
    try:
        request_id, meta = metadata.decode_gotalk(data)
    except MalformedMessage:
        return
    assert metadata.encode_gotalk(request_id, meta) == data  # one way to write each record


def _mutated(data: st.DataObject, encoded: bytes) -> bytes:
    """``encoded`` cut short, with a byte changed, or with bytes added."""
    where = data.draw(st.integers(min_value=0, max_value=len(encoded)))
    how = data.draw(st.sampled_from(["cut", "change", "add"]))
    if how == "cut":
        return encoded[:where]
    if how == "change" and where < len(encoded):
        return encoded[:where] + bytes((data.draw(st.integers(0, 255)),)) + encoded[where + 1 :]
    return encoded[:where] + data.draw(st.binary(min_size=1, max_size=4)) + encoded[where:]


@given(st.data(), firsts, metas)
def test_sbs_meta_decoder_near_valid_records(data: st.DataObject, first: int, meta: Any) -> None:
    damaged = _mutated(data, metadata.encode_sbs(first, meta))
    try:
        first, meta = metadata.decode_sbs(damaged)
    except MalformedMessage:
        return
    assert REPO.decode("PeerwireRpc.Meta", damaged) == as_sbs_value(first, meta)


@given(st.data(), st.binary(min_size=4, max_size=4), metas)
def test_gotalk_meta_decoder_near_valid_records(
    data: st.DataObject, request_id: bytes, meta: Any
) -> None:
    damaged = _mutated(data, metadata.encode_gotalk(request_id, meta))
    try:
        request_id, meta = metadata.decode_gotalk(damaged)
    except MalformedMessage:
        return
    assert metadata.encode_gotalk(request_id, meta) == damaged


# --- the default timeout (level 3) ---------------------------------------------------------------


def as_sbs_timeout(timeout: int | None) -> tuple[str, int | None]:
    return ("none", None) if timeout is None else ("value", timeout)


@given(timeouts)
def test_timeout_codecs_round_trip_and_sbs_matches_hat_sbs(timeout: int | None) -> None:
    sbs = metadata.encode_timeout_sbs(timeout)
    assert sbs == REPO.encode("PeerwireRpc.Timeout", as_sbs_timeout(timeout))
    assert metadata.decode_timeout_sbs(sbs) == timeout
    assert metadata.decode_timeout_gotalk(metadata.encode_timeout_gotalk(timeout)) == timeout


@given(st.binary(max_size=16) | sbs_timeouts)
def test_timeout_decoders_take_any_bytes(data: bytes) -> None:
    try:
        timeout = metadata.decode_timeout_sbs(data)
    except MalformedMessage:
        pass
    else:  # a value hat-sbs reads the same
        assert REPO.decode("PeerwireRpc.Timeout", data) == as_sbs_timeout(timeout)
    try:
        timeout = metadata.decode_timeout_gotalk(data)
    except MalformedMessage:
        return
    assert metadata.encode_timeout_gotalk(timeout) == data
