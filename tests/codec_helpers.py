"""Helpers shared by the codec tests."""

from __future__ import annotations

from typing import Any


def fed_by_missing(conn: Any, stream: bytes, cut: int) -> list[Any]:
    """Feed ``stream`` to ``conn`` (a Gotalk or Chatter connection): first ``cut`` bytes,
    then one byte short of what ``missing`` says is held in part (which must complete
    nothing and leave one byte missing), that byte, and one byte when nothing is held.
    The messages it gave."""
    got = conn.receive_data(stream[:cut])
    pos = cut
    while pos < len(stream):
        missing = conn.missing
        assert (missing > 0) == (conn.buffered > 0), (missing, conn.buffered)
        if missing > 1:
            assert conn.receive_data(stream[pos : pos + missing - 1]) == []
            pos += missing - 1
            assert conn.missing == 1
        got += conn.receive_data(stream[pos : pos + 1])
        pos += 1
    assert conn.missing == conn.buffered == 0
    return got
