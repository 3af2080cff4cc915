"""ReconnectingPeer.transitions() iterators (rpc.connection_state): one dropped, read or
not, holds nothing; one kept gets every transition from its creation on. A real server, and
a proxy that drops the connection."""

from __future__ import annotations

import asyncio
import gc

import rpc
from tests.reconnect_helpers import CLOSED, FAST, OPEN, RECONNECTING, named
from tests.rpc_helpers import wait_until
from tests.tcp_proxy import Proxy


async def test_dropped_transition_iterators_are_forgotten() -> None:
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        async with Proxy(server.url.port) as proxy:
            client = await rpc.connect(f"tcp+gotalk://127.0.0.1:{proxy.port}", reconnect=FAST)
            subscribers = client._states._subscribers  # no public count of them
            kept = client.transitions()  # made before any transition, read after them all
            partial = client.transitions()
            for _ in range(1000):
                client.transitions()  # made, never iterated, dropped
            gc.collect()
            assert len(subscribers) == 2

            assert await client.request("who") == "s"
            proxy.drop()
            await wait_until(lambda: client.connects == 2)
            async for transition in partial:  # read in part, then dropped
                assert transition.state is RECONNECTING
                break
            del partial
            gc.collect()
            assert list(subscribers) == [kept]

            assert await client.request("who") == "s"
            await client.close()
            states = [t.state async for t in kept]  # ends after closed
            assert states[0] is RECONNECTING and states[-2:] == [OPEN, CLOSED]
            assert not subscribers


async def test_closed_transition_iterator_ends_a_waiting_reader() -> None:
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=named("s")) as server:
        client = await rpc.connect(str(server.url), reconnect=FAST)
        changes = client.transitions()
        reader = asyncio.create_task(anext(changes, None))
        await asyncio.sleep(0)  # one turn of the loop: the reader runs up to its wait
        assert not reader.done()
        await changes.aclose()
        assert await asyncio.wait_for(reader, 5) is None  # ended, not left waiting
        assert not client._states._subscribers
        await client.close()
        assert [t async for t in changes] == []  # closed before: nothing after
