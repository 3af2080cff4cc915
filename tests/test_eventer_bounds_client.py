"""The Eventer client where a connection is lost or never answers.

- ``connect`` to a server that accepts TCP but never answers raised rpc's
  ``RequestTimeout`` ("HatEventer.MsgInitReq: no result within ..."); now
  ``EventerInitTimeout`` (still a RequestTimeout) says the handshake went unanswered."""

from __future__ import annotations

import asyncio

import pytest

import rpc
from rpc import eventer


async def test_a_server_that_never_answers_the_handshake_fails_connect_clearly() -> None:
    held: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, then never a byte: a hung server

    hung = await asyncio.start_server(accept, "127.0.0.1", 0)
    port = hung.sockets[0].getsockname()[1]
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        with pytest.raises(eventer.EventerInitTimeout) as caught:
            await eventer.connect(f"tcp+sbs://127.0.0.1:{port}", "patient", timeout=0.3)
    finally:
        for writer in held:
            writer.close()
        hung.close()
        await hung.wait_closed()
    assert loop.time() - started < 0.3 + 2
    assert str(caught.value) == (
        f"eventer server 127.0.0.1:{port} accepted the connection but did not answer its "
        "handshake (init) within 0.3 s"
    )
    assert isinstance(caught.value, rpc.RequestTimeout)  # what callers caught before
