"""Request metadata waiting for its request is bounded in bytes as well as in records
(rpc.request_meta.MAX_PENDING_BYTES, MAX_PENDING): review 187 of 1e4d305, which bounded it
in records only.

One record may carry 32 entries of a 255-byte key and a 65,535-byte value (docs/urls.md),
about 2 MiB on the wire, and CPython stores each value at the width of its widest
character: one four-byte character makes a 64 KiB value take 256 KiB. Before 1e4d305 a
connection held one such record (about 8 MiB at worst); now it holds 16, none counted in
``max_request_bytes`` or any other bound, for as long as the peer keeps the connection
open (it sends the metadata and never the requests). A raw Gotalk client at extension
level 2 over a real socket on 127.0.0.1."""

from __future__ import annotations

import sys
from typing import Any

import rpc
from rpc import gotalk_peer
from rpc.request_meta import MAX_PENDING, MAX_PENDING_BYTES, MetaState, record_size
from tests.gotalk_raw import RawGotalk
from wire import gotalk, metadata

RECORDS = MAX_PENDING

LIMIT = 16 * 1024 * 1024
"""What a connection may hold for metadata waiting for requests: its ``max_size`` (one
message's worth; before 1e4d305 one record, at most about 8 MiB of memory)."""


def _held(pending: Any) -> int:
    """The bytes the waiting records' entries take in memory."""
    records = [meta for meta, _, _ in pending.values()]
    return sum(
        sys.getsizeof(key) + sys.getsizeof(value)
        for meta in records
        for key, value in meta.entries.items()
    )


async def test_metadata_waiting_for_requests_that_never_come_holds_at_most_max_size() -> None:
    value = "\U0001f600" + "a" * (metadata.MAX_VALUE - 4)  # 65,535 bytes of UTF-8
    entries = {f"{i:02d}" + "k" * (metadata.MAX_KEY - 2): value for i in range(32)}
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=rpc.Registry()) as server:
        raw = await RawGotalk.connect(server.url.port, level=b"2")
        try:
            for rid in range(1, RECORDS + 1):  # their requests never come
                meta = metadata.encode_gotalk(
                    rid.to_bytes(4, "little"), metadata.RequestMeta(60_000, entries)
                )
                raw.writer.write(raw.notification(gotalk_peer.META, meta))
            raw.request_alone(b"\xff\0\0\0", "fence", b"null")  # answered once all is read
            await raw.writer.drain()
            answer = await raw.answer()
            assert isinstance(answer, gotalk.ErrorResult)  # unknown operation: all was read
            [served] = server.peers
            held = _held(served.adapter.meta.pending)  # type: ignore[attr-defined]
            assert held <= LIMIT, f"{held / 2**20:.0f} MiB held for metadata of no request"
        finally:
            await raw.close()


def test_records_past_the_byte_bound_go_oldest_first_the_newest_always_kept() -> None:
    state: MetaState[int] = MetaState()
    big = metadata.RequestMeta(500, {"k": "v" * (MAX_PENDING_BYTES // 3 - 100)})
    for key in range(4):
        state.received(key, big, float(key))
    assert list(state.pending) == [1, 2, 3]  # three fit, a fourth pushes the first out
    assert state.pending_bytes == 3 * record_size(big) <= MAX_PENDING_BYTES
    huge = metadata.RequestMeta(500, {"k": "\U0001f600" * MAX_PENDING_BYTES})
    state.received(9, huge, 9.0)  # over the bound alone: kept, the rest go
    assert list(state.pending) == [9] and state.pending_bytes == record_size(huge)
    assert state.take(9, 10.0) == (huge, 9.0)
    assert state.pending_bytes == 0 and not state.pending
