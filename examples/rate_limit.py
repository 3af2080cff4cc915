"""Per-peer rate limiting middleware that answers with retry results.

    python examples/rate_limit.py

Each connection gets a token bucket (``rate`` calls per second, bursts of ``burst``) kept in
``peer.state``, so it lives exactly as long as the connection. A call that finds the bucket
empty is answered with a retry result saying how long to wait; peerwire clients (and Go
gotalk clients) wait that long, with jitter, and send it again. The demo fires 12 requests
at once at a server allowing 20/s in bursts of 4 and shows every one succeeding.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import rpc


@dataclass
class Bucket:
    tokens: float
    at: float


def rate_limit(rate: float, burst: int) -> rpc.Middleware:
    """Middleware allowing each peer ``rate`` calls/s on average, ``burst`` at once."""

    async def limit(call: rpc.Call, call_next: Any) -> Any:
        if call.side == "client":
            return await call_next(call)
        now = time.monotonic()
        bucket = call.peer.state.setdefault("rate_limit", Bucket(float(burst), now))
        bucket.tokens = min(float(burst), bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens < 1.0:
            raise rpc.RetryLater("rate limit", (1.0 - bucket.tokens) / rate)
        bucket.tokens -= 1.0
        return await call_next(call)

    return limit


registry = rpc.Registry()
refused: list[str] = []


async def count_refusals(call: rpc.Call, call_next: Any) -> Any:
    """Outside the limiter: sees the retry results it sends (for the demo's figures)."""
    try:
        return await call_next(call)
    except rpc.RetryLater:
        refused.append(call.op)
        raise


registry.use(count_refusals)
registry.use(rate_limit(rate=20.0, burst=4))


@registry.handle("work")
def work(n: int) -> int:
    return n * n


async def main(requests: int = 12) -> tuple[list[int], int, float]:
    """Fire ``requests`` at once; return (results, retry results sent, seconds taken)."""
    refused.clear()
    options = rpc.Options(retries=20, timeout=10.0)  # patient callers
    async with rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry) as server:
        async with rpc.connect(str(server.url), options=options) as peer:
            start = time.monotonic()
            results = await asyncio.gather(*(peer.request("work", i) for i in range(requests)))
            return list(results), len(refused), time.monotonic() - start


if __name__ == "__main__":
    results, retries, seconds = asyncio.run(main())
    print(f"{len(results)} results {results} in {seconds:.2f} s after {retries} retry results")
