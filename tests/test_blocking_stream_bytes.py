"""The blocking facade's stream buffer is bounded in bytes, not only in results: a reader that
falls behind a server sending large results holds at most ``max_buffered_bytes`` (default:
the connection's ``max_size``) of them, the result that passes it included. Before, only
``max_buffered`` (65,536 results) bounded it: 65,536 x ``max_size`` (1 TiB at 16 MiB)."""

from __future__ import annotations

import collections
import json
from typing import Any

import pytest

import rpc
from rpc.blocking import BlockingStream
from tests.test_blocking_stream import serving

KIB = 1024
MAX_SIZE = 1024 * KIB
"""The client connection's ``max_size``: the buffer's default byte bound."""

RESULTS = 64
"""Results the server sends: 64 of 64 KiB or more, 4 MiB or more in all."""


def shaped(shape: str, i: int) -> Any:
    """Result ``i`` of about 64 KiB: one string, or a list of 1,024 strings of 64 bytes."""
    if shape == "str":
        return f"{i:08d}" + "x" * (64 * KIB - 8)
    return [f"{i:08d}"] + ["y" * 64] * 1023


def registry() -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle("shaped")
    async def send(args: list[Any]) -> Any:
        shape, n = args
        for i in range(n):
            yield shaped(shape, i)

    return reg


@pytest.mark.parametrize(
    ("shape", "limit"),
    [("str", None), ("list", None), ("str", 256 * KIB)],
    ids=["strings-max_size", "lists-max_size", "strings-256KiB"],
)
def test_a_reader_that_falls_behind_large_results_holds_at_most_the_byte_bound(
    shape: str, limit: int | None
) -> None:
    """Nothing read after the first result: the pump stops taking once the buffer holds
    the byte bound (1 MiB, the connection's max_size; or 256 KiB as asked), not 64 results
    (4 MiB and more) as before; a string counts its length, a list its strings too. The
    reader then gets every result, in order."""
    options = rpc.Options(max_size=MAX_SIZE)
    bound = MAX_SIZE if limit is None else limit
    size = 64 * KIB  # at least: its strings' length
    kwargs = {} if limit is None else {"max_buffered_bytes": limit}
    with (
        serving(registry()) as url,
        rpc.blocking.connect(url, reconnect=False, options=options) as peer,
        peer.stream("shaped", value=[shape, RESULTS], **kwargs) as results,
    ):
        first = next(results)
        assert results._buffer.pump_waits.wait(10), "the pump never waited for room"
        held = len(results._buffer._items)
        assert held <= bound // size + 1, f"{held} results of {size} bytes buffered"
        assert results.buffered_bytes < bound + 80 * KIB  # less than the bound and one more
        got = [first, *results]
    assert got == [shaped(shape, i) for i in range(RESULTS)]


def test_result_sizes_count_strings_and_containers() -> None:
    """About the encoded size (marshal's), an object shared counted once; values marshal
    refuses (a named tuple, deep nesting) are walked instead, never left uncounted."""
    from rpc.blocking_buffer import result_size

    assert result_size(b"abc") == 3
    assert result_size("abcd") == 4
    received = json.loads(json.dumps(shaped("list", 0)))  # its strings are not shared
    assert 64 * KIB < result_size(received) < 80 * KIB
    records = json.loads(json.dumps([{"id": i, "name": "n" * 100} for i in range(100)]))
    assert 100 * 100 < result_size(records) < 100 * 150
    shared = "x" * 10_000
    assert 10_000 < result_size([shared] * 10) < 10_100
    pair = collections.namedtuple("pair", "a b")
    assert result_size([pair("y" * 1000, ["z" * 1000])]) >= 2000
    nested: list[Any] = ["w" * 1000]
    for _ in range(3000):
        nested = [nested]
    assert result_size(nested) >= 3000 * 8 + 1000


def test_max_buffered_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_buffered_bytes"):
        BlockingStream(max_buffered_bytes=0)
