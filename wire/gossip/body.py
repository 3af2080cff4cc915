"""The uncompressed gossip body: NetID table, BroadcastIDs, NetID references, tag, payload."""

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


def decode_gossip(data: BytesLike) -> Gossip:
    """Parse an uncompressed gossip; the payload is whatever follows the tag."""
    data = bytes(data)
    count, off = _read_count(data, 0, 6, "NetID table")
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
    seen = []
    for _ in range(count):
        bid, off = _read_bid(table, data, off)
        seen.append(bid)
    refs: list[list[NetID]] = [[], []]
    for what, out in zip(("other NetID", "distribution NetID"), refs, strict=True):
        count, off = _read_count(data, off, 1, what)
        for _ in range(count):
            netid, off = _read_ref(table, data, off)
            out.append(netid)
    tag, off = decode_varint(data, off)
    if tag >= U32_LIMIT:
        raise MalformedMessage(f"payload tag {tag} is not a 32-bit xxh32 value")

    g = object.__new__(Gossip)
    _set(g, "current", current)
    _set(g, "seen", tuple(seen))
    _set(g, "others", tuple(refs[0]))
    _set(g, "distribution", tuple(refs[1]))
    _set(g, "tag", tag)
    _set(g, "payload", data[off:])
    _set(g, "table", tuple(table))
    return g
