"""Sans-I/O codec for the gossip broadcast frame of Chatter, the Elixir broadcast library.

(Chatter v0.0.15 on the wire.)

The layout follows what the reference code emits, not its documentation's prose (which swaps the
checksum and size fields and hashes the compressed bytes)::

    msg    = 0xff | VarInt(len(ct)) | ct
    ct     = AES-256-CTR(key, initial counter block b"-- ScaleSmall --") over pt
    pt     = pad[32] | u32be xxh32(gossip, seed 0) | VarInt(len(gossip)) | snappy_raw(gossip)
    gossip = NetID table | current BroadcastID | [seen BroadcastIDs] | [other NetID refs]
             | [distribution NetID refs] | VarInt payload tag | payload bytes

Security: every message restarts the same CTR keystream and there is no MAC, so anyone who
knows one plaintext can read or forge messages. We speak this frame for compatibility only;
the xxh32 checksum detects corruption and wrong keys, not attackers.

Checks we add beyond the reference's decoder, each raising
:class:`~wire.errors.MalformedMessage` or :class:`~wire.errors.MessageTooLarge` (no frame the
reference encoder writes fails them):

- VarInts longer than 10 bytes or >= 2**64; payload tags >= 2**32 (tags are xxh32 values).
- The plaintext size field must equal snappy's own length prefix (the reference ignores it)
  and so the gossip's real length.
- Both lengths are bounded by ``max_size`` before anything is decompressed or buffered.
- Bytes after the end of a frame (:func:`decode_frame`) or of the snappy block are errors.
- The NetID table must be sorted and de-duplicated, as the reference writes it: payloads may
  refer to it by index, so we cannot re-sort it (see :class:`Gossip`).
- The table holds at most ``max_netids`` entries (:data:`DEFAULT_MAX_NETIDS`, 8192) and
  ``seen`` as many BroadcastIDs; the ``others`` and distribution lists must not repeat a
  NetID, so neither is longer than the table. Snappy shrinks repetition, so without these a
  small frame could carry millions of references for the receiver to walk.
- A stream is framed by start byte + VarInt length (the reference assumes one read = one
  message, which breaks on merged or split TCP reads).

We stay as liberal as the reference where it costs nothing: table entries nothing in the
gossip references are kept (a payload may use them), and VarInts may carry redundant zero
groups (within 10 bytes).
"""

from wire.gossip.body import DEFAULT_MAX_NETIDS, decode_gossip, encode_gossip
from wire.gossip.frame import (
    KEY_FILLER,
    PADDING_SIZE,
    START_BYTE,
    GossipCodec,
    decode_frame,
    derive_key,
    encode_frame,
)
from wire.gossip.messages import BroadcastID, Gossip, NetID, payload_tag
from wire.gossip.varint import BytesLike, decode_varint, encode_varint

__all__ = [
    "DEFAULT_MAX_NETIDS",
    "KEY_FILLER",
    "PADDING_SIZE",
    "START_BYTE",
    "BroadcastID",
    "BytesLike",
    "Gossip",
    "GossipCodec",
    "NetID",
    "decode_frame",
    "decode_gossip",
    "decode_varint",
    "derive_key",
    "encode_frame",
    "encode_gossip",
    "encode_varint",
    "payload_tag",
]
