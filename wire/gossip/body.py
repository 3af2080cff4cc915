"""The uncompressed gossip body: NetID table, BroadcastIDs, NetID references, tag, payload.

Snappy shrinks repeated bytes, so a small frame can carry a body of millions of one-byte
references; every list the decoder builds is therefore bounded by ``max_netids`` (the
table's size) before it is read, not by the body's length alone.
"""

from __future__ import annotations

from wire.errors import MalformedMessage
from wire.gossip.messages import (
    U32_LIMIT,
    BroadcastID,
    Gossip,
    NetID,
    trusted_bid,
    trusted_netid,
)
from wire.gossip.varint import BytesLike, decode_varint, encode_varint

DEFAULT_MAX_NETIDS = 8192
"""Entries a NetID table may hold (the default ``max_netids``), and BroadcastIDs a ``seen``
list. A frame's table names its sender, the origins it saw (a few), a few other nodes and
its distribution list, which is at most half the group: 8192 serves groups of 16,000."""

# decode_gossip's own checks guarantee what Gossip.__post_init__ would re-check.
_set = object.__setattr__


def encode_gossip(g: Gossip) -> bytes:
    """The uncompressed gossip, with ``g.table`` (sorted, de-duplicated) as the NetID table."""
    table = g.table
    index = {netid: i for i, netid in enumerate(table)}
    varint = encode_varint
    parts = [varint(len(table))]
    parts.extend(netid.packed for netid in table)
    parts.append(varint(index[g.current.origin]))
    parts.append(varint(g.current.seq))
    parts.append(varint(len(g.seen)))
    for bid in g.seen:
        parts.append(varint(index[bid.origin]))
        parts.append(varint(bid.seq))
    for refs in (g.others, g.distribution):
        parts.append(varint(len(refs)))
        parts.extend(varint(index[netid]) for netid in refs)
    parts.append(varint(g.tag))
    parts.append(g.payload)
    return b"".join(parts)


def _read_ref(table: list[NetID], data: bytes, off: int) -> tuple[NetID, int]:
    index, off = decode_varint(data, off)
    if index >= len(table):
        raise MalformedMessage(f"NetID index {index} out of range (table has {len(table)})")
    return table[index], off


def _read_bid(table: list[NetID], data: bytes, off: int) -> tuple[BroadcastID, int]:
    origin, off = _read_ref(table, data, off)
    seq, off = decode_varint(data, off)
    return trusted_bid(origin, seq), off


def _read_count(data: bytes, off: int, min_entry: int, what: str) -> tuple[int, int]:
    """Read a list count and reject it before allocating if the entries cannot fit."""
    count, off = decode_varint(data, off)
    if count * min_entry > len(data) - off:
        raise MalformedMessage(f"{what} count {count} does not fit in the remaining bytes")
    return count, off


def _read_refs(table: list[NetID], data: bytes, off: int, what: str) -> tuple[list[NetID], int]:
    """A NetID list: no repeats, so never longer than the table (checked before reading)."""
    count, off = _read_count(data, off, 1, what)
    size = len(table)
    if count > size:
        raise MalformedMessage(f"{what} list of {count} repeats a NetID (table has {size})")
    indices: list[int] = []
    for _ in range(count):
        index, off = decode_varint(data, off)
        if index >= size:
            raise MalformedMessage(f"NetID index {index} out of range (table has {size})")
        indices.append(index)
    if len(set(indices)) != count:
        raise MalformedMessage(f"{what} list repeats a NetID")
    return [table[i] for i in indices], off


def decode_gossip(data: BytesLike, *, max_netids: int = DEFAULT_MAX_NETIDS) -> Gossip:
    """Parse an uncompressed gossip; the payload is whatever follows the tag.

    The table may hold at most ``max_netids`` entries (default 8192), ``seen`` as many
    BroadcastIDs; ``others`` and ``distribution`` must not repeat a NetID. Raises
    :class:`~wire.errors.MalformedMessage` otherwise.
    """
    data = bytes(data)
    count, off = _read_count(data, 0, 6, "NetID table")
    if count > max_netids:
        raise MalformedMessage(f"NetID table of {count} entries exceeds max_netids {max_netids}")
    table: list[NetID] = []
    previous = b""
    for i in range(off, off + 6 * count, 6):
        packed = data[i : i + 6]
        # Payloads may hold table indices, so a table we would re-sort cannot be accepted.
        if packed <= previous:
            raise MalformedMessage("NetID table is not sorted and de-duplicated")
        table.append(trusted_netid(packed))
        previous = packed
    off += 6 * count

    current, off = _read_bid(table, data, off)
    count, off = _read_count(data, off, 2, "seen BroadcastID")
    if count > max_netids:
        raise MalformedMessage(f"{count} seen BroadcastIDs exceed max_netids {max_netids}")
    seen = []
    for _ in range(count):
        bid, off = _read_bid(table, data, off)
        seen.append(bid)
    others, off = _read_refs(table, data, off, "other NetID")
    distribution, off = _read_refs(table, data, off, "distribution NetID")
    tag, off = decode_varint(data, off)
    if tag >= U32_LIMIT:
        raise MalformedMessage(f"payload tag {tag} is not a 32-bit xxh32 value")

    g = object.__new__(Gossip)
    _set(g, "current", current)
    _set(g, "seen", tuple(seen))
    _set(g, "others", tuple(others))
    _set(g, "distribution", tuple(distribution))
    _set(g, "tag", tag)
    _set(g, "payload", data[off:])
    _set(g, "table", tuple(table))
    return g
