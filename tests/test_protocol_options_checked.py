"""``serve`` and ``connect`` refuse a keyword the protocol's peer does not take at the call,
with a TypeError naming it (and where it belongs, when it is an ``Options`` field or the
Chatter dialect): before, ``serve`` took it and failed every connection as it came (over
TCP the client saw the connection closed before its first byte; over WebSocket the
handshake's error left the client connected to nothing that answered)."""

from __future__ import annotations

import pytest

import rpc
from rpc import workers

URLS = ["tcp+gotalk://127.0.0.1:0", "ws+gotalk://127.0.0.1:0/rpc", "tcp+sbs://127.0.0.1:0"]


@pytest.mark.parametrize("url", URLS)
async def test_serve_refuses_an_options_field_given_as_a_keyword(url: str) -> None:
    with pytest.raises(TypeError, match=r"'max_concurrent'.*options=rpc.Options\(max_concurrent"):
        rpc.serve(url, registry=rpc.Registry(), max_concurrent=1)


@pytest.mark.parametrize("url", URLS)
async def test_connect_refuses_an_unknown_keyword(url: str) -> None:
    with pytest.raises(TypeError, match="takes no keyword 'heartbeat'"):
        await rpc.connect(url, reconnect=False, heartbeat=5)


async def test_the_chatter_dialect_belongs_in_the_url() -> None:
    with pytest.raises(TypeError, match=r"\?dialect=Hat"):
        rpc.serve("tcp+sbs://127.0.0.1:0", dialect=None)


async def test_protocol_options_a_peer_takes_still_serve() -> None:
    async with rpc.serve(
        "tcp+gotalk://127.0.0.1:0", registry=rpc.Registry(), heartbeat_interval=5.0
    ) as server:
        async with rpc.connect(str(server.url), reconnect=False, read_timeout=60.0) as client:
            assert client.is_open


def test_serve_workers_refuses_it_before_forking() -> None:
    """Checked in the parent: before, each worker failed at start and the parent gave up
    after BOOT_ATTEMPTS starts (WorkerBootFailed, 2.75 s) (review 212 of 62fab15)."""
    with pytest.raises(TypeError, match="takes no keyword 'heartbeat'"):
        workers.serve_workers("tcp+gotalk://127.0.0.1:0", workers=2, heartbeat=5)


@pytest.mark.parametrize("name", ["url", "sock"])
def test_serve_workers_refuses_what_it_gives_each_worker_itself(name: str) -> None:
    """Before, each worker's serve() got it twice and failed: WorkerBootFailed after five
    starts (review 213 of b2126db)."""
    with pytest.raises(TypeError, match=f"sets rpc.serve's '{name}'"):
        workers.serve_workers("tcp+gotalk://127.0.0.1:0", workers=1, **{name: None})
