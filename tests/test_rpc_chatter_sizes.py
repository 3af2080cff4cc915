"""Chatter requests whose payload fits max_size but not with the message's envelope: the
caller gets rpc.PayloadError, as for a payload over max_size (it got the codec's untyped
wire.errors.MessageTooLarge), and the connection stays usable. Real peers, both dialects."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

import rpc
from tests.rpc_helpers import served

MAX = 1 << 16
OPTIONS = rpc.Options(max_size=MAX)
NEAR = b"x" * (MAX - 2)  # within max_size; not with the envelope around it


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("size")
    def size(data: bytes) -> int:
        return len(data)

    @reg.handle_stream("sizes")
    async def sizes(parts: AsyncIterator[bytes]) -> list[int]:
        return [len(p) async for p in parts]

    return reg


@pytest.mark.parametrize("flavour", ["chatter-current", "chatter-legacy"])
async def test_request_too_large_with_its_envelope_is_a_payload_error(flavour: str) -> None:
    async with served(flavour, registry(), options=OPTIONS, client_options=OPTIONS) as (_, peer):
        with pytest.raises(rpc.PayloadError, match=r"size: Chatter message of \d+ bytes"):
            await peer.request("size", NEAR)
        assert await peer.request("size", b"abc") == 3
        with pytest.raises(rpc.PayloadError):
            await peer.request("size", NEAR, timeout=5)  # with a deadline to send along
        assert await peer.request("size", b"abcd", timeout=5) == 4
        with pytest.raises(rpc.PayloadError):
            [x async for x in peer.stream("sizes", parts=[NEAR])]  # the first message
        with pytest.raises(rpc.PayloadError, match="a stream request's part"):
            [x async for x in peer.stream("sizes", parts=[b"a", NEAR])]
        assert [x async for x in peer.stream("sizes", parts=[b"a", b"bc"])] == [[1, 2]]
        assert peer.is_open
        assert not peer._calls
