"""A small peerwire service: one handler of each kind, on its own registry.

Serve it on both protocols at once (port 0 picks free ports; the bound URLs are printed):

    peerwire serve examples/greet.py --listen tcp+gotalk://127.0.0.1:4000 \\
        --listen tcp+sbs://127.0.0.1:4001

and call it from another shell:

    peerwire call tcp+gotalk://127.0.0.1:4000 greet '{"name": "Ada"}'
    peerwire stream tcp+sbs://127.0.0.1:4001 count '{"to": 3}'
    peerwire stream 'tcp+sbs://127.0.0.1:4001?dialect=HatChatter' sum --part 1 --part 2
    peerwire notify tcp+gotalk://127.0.0.1:4000 log '"hello"'
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import rpc

# `peerwire serve` looks for this attribute; a separate registry keeps these handlers out of
# rpc.default_registry, so importing this module has no effect on other servers.
registry = rpc.Registry()


@dataclass
class GreetParams:
    name: str


@dataclass
class CountParams:
    to: int


@registry.handle("echo")
def echo(value: Any) -> Any:
    """Returns its input unchanged: handy to see how a value survives the round trip."""
    return value


@registry.handle("greet")
def greet(params: GreetParams) -> dict[str, str]:
    """The dataclass annotation makes the core validate the input: bad input is an error
    result that names the problem, not an exception in here."""
    return {"greeting": f"Hello {params.name}"}


@registry.handle("count")
async def count(params: CountParams) -> AsyncIterator[int]:
    """An async generator is a streamed result: every value goes out as one part."""
    for i in range(1, params.to + 1):
        yield i


@registry.handle_stream("sum")
async def sum_parts(parts: AsyncIterator[Any]) -> float:
    """A stream request: the parts arrive one by one; the single result is their sum."""
    total = 0
    async for part in parts:
        total += part
    return total


@registry.handle_notification("log")
def log(value: Any) -> None:
    """A notification gets no reply; flushed so a supervising process sees it at once."""
    print(f"log: {value}", flush=True)
