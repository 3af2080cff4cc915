"""The gossip codec tests' shared data: the reference test vectors (V1, V2) layer by
layer, and frames built around arbitrary plaintexts to reach the checks past the cipher.
"""

from __future__ import annotations

import cramjam
import xxhash
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from wire.gossip import BroadcastID, Gossip, NetID, derive_key, encode_varint

ZERO_PAD = bytes(32)
IV = b"-- ScaleSmall --"

# Vectors from the notes (gossip-vectors.txt), cross-checked there against the Elixir reference.
V1_KEY = b"01234567890123456789012345678901"
V1_GOSSIP = bytes.fromhex(
    "037f000001752f7f00000175317f000001753200010000020102f9ef81d80f776f726c64"
)
V1_XXH32 = 692022943
V1_SNAPPY = bytes.fromhex("2418037f000001752f050600310506443200010000020102f9ef81d80f776f726c64")
V1_PLAINTEXT = ZERO_PAD + bytes.fromhex(
    "293f6e9f242418037f000001752f050600310506443200010000020102f9ef81d80f776f726c64"
)
V1_KEYSTREAM = bytes.fromhex(
    "9d2ee39f863c320c323c9a23c4f4f8f0d08693ef02e400904a6068e8b9f79821"
    "76134511704e79354d1cd4ad1e5019eb1e13004d53d9ea192d9a951d8935778eae5ce5f738bc4f"
)
V1_MESSAGE = bytes.fromhex(
    "ff479d2ee39f863c320c323c9a23c4f4f8f0d08693ef02e400904a6068e8b9f798215f2c2b8e546a6136"
    "321cd4ac6b7f1ced1e22054b17ebea182d9a971c8bcc980f765392984ad02b"
)
# Same gossip and key, laid out as the protocol's prose description says (size, then xxh32
# of the COMPRESSED bytes): the reference rejects it, so must we.
V1_DOC_MESSAGE = bytes.fromhex(
    "ff479d2ee39f863c320c323c9a23c4f4f8f0d08693ef02e400904a6068e8b9f798215200304f1e6a6136"
    "321cd4ac6b7f1ced1e22054b17ebea182d9a971c8bcc980f765392984ad02b"
)

V2_KEY = b"secret"
V2_GOSSIP = bytes.fromhex(
    "04010203040001c0a80161752fc0a80164752fc0a80186752f01040202030301010203010203a5e29cf903006f"
)
V2_XXH32 = 3457015744
V2_SNAPPY = bytes.fromhex(
    "2d4004010203040001c0a80161752fc0a8016405065886752f01040202030301010203010203a5e29cf903006f"
)
V2_PLAINTEXT = ZERO_PAD + bytes.fromhex(
    "ce0ddfc02d2d4004010203040001c0a80161752fc0a8016405065886752f01040202030301010203010203"
    "a5e29cf903006f"
)
V2_KEYSTREAM = bytes.fromhex(
    "42b539cacaf7f987e55f4c399f98d26e96730f62a89920bd984b1bf30bb50af2a9b3efb6087af8ebab1e1a29"
    "e3a371dfe7dbc560775d7ef18a23fd7e50be63ea51faae98147683a2514edc76096717eb4112"
)
V2_MESSAGE = bytes.fromhex(
    "ff5242b539cacaf7f987e55f4c399f98d26e96730f62a89920bd984b1bf30bb50af267be30762557b8efaa"
    "1c192de3a2b177e6bab04fb7f57f958f25a5f8259162ee53f8ad9b157781a1504cdfd3ebfbeee8417d"
)

N_29999 = NetID("127.0.0.1", 29999)
N_30001 = NetID("127.0.0.1", 30001)
N_30002 = NetID("127.0.0.1", 30002)
V1 = Gossip(
    current=BroadcastID(N_29999, 1),
    seen=(),
    others=(),
    distribution=(N_30001, N_30002),
    tag=4211111929,
    payload=b"world",
)

N_1234 = NetID("1.2.3.4", 1)
N_97 = NetID("192.168.1.97", 29999)
N_100 = NetID("192.168.1.100", 29999)
N_134 = NetID("192.168.1.134", 29999)
V2 = Gossip(
    current=BroadcastID(N_97, 4),
    seen=(BroadcastID(N_100, 3), BroadcastID(N_134, 1)),
    others=(N_100,),
    distribution=(N_97, N_100, N_134),
    tag=1059533093,
    payload=b"\x00\x6f",  # a broadcast_id payload: NetID table index 0 (1.2.3.4:1), seq 111
    table=(N_1234,),
)


def aes_ctr(key32: bytes, data: bytes) -> bytes:
    """Independent of the codec: the reference's cipher, built straight from cryptography."""
    enc = Cipher(algorithms.AES(key32), modes.CTR(IV)).encryptor()
    return enc.update(data) + enc.finalize()


def frame_around(plaintext: bytes, key: bytes) -> bytes:
    """A frame around an arbitrary plaintext, to reach checks past the cipher."""
    ct = aes_ctr(derive_key(key), plaintext)
    return b"\xff" + encode_varint(len(ct)) + ct


def plaintext_of(gossip: bytes, *, checksum: int | None = None, size: int | None = None) -> bytes:
    cksum = xxhash.xxh32_intdigest(gossip) if checksum is None else checksum
    return b"".join(
        (
            ZERO_PAD,
            cksum.to_bytes(4, "big"),
            encode_varint(len(gossip) if size is None else size),
            bytes(cramjam.snappy.compress_raw(gossip)),
        )
    )
