"""wire.sbs: the one SBS Integer/Bytes reader (Chatter envelope and Eventer splicer)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rpc.eventer import common
from wire import MalformedMessage, schemas
from wire.chatter import Dialect, Msg, decode_msg, encode_msg
from wire.sbs import INT64_MAX, INT64_MIN, encode_integer, read_bytes, read_integer, read_string

_REPO = schemas.repository("module T\nI = Integer\nB = Bytes\nS = String\n")


@given(st.integers(min_value=INT64_MIN, max_value=INT64_MAX), st.binary(max_size=3))
def test_read_integer_reads_what_hat_sbs_writes(n: int, tail: bytes) -> None:
    data = _REPO.encode("T.I", n)
    assert encode_integer(n) == data
    assert read_integer(data + tail, 0) == (n, len(data))


@given(st.binary(max_size=40))
def test_read_bytes_reads_what_hat_sbs_writes(value: bytes) -> None:
    data = b"\x00" + _REPO.encode("T.B", value)
    assert read_bytes(data, 1, len(data)) == (value, len(data))
    from_bytearray, _ = read_bytes(bytearray(data), 1, len(data))
    assert from_bytearray == value and type(from_bytearray) is bytes
    with pytest.raises(MalformedMessage, match="runs past"):
        read_bytes(data, 1, len(data) - 1)


@given(st.text(max_size=20))
def test_read_string_reads_what_hat_sbs_writes(value: str) -> None:
    data = _REPO.encode("T.S", value)
    assert read_string(data, 0, len(data)) == (value, len(data))


def test_bad_strings() -> None:
    with pytest.raises(UnicodeDecodeError):
        read_string(b"\x82\xff\xfe", 0, 3)
    with pytest.raises(MalformedMessage, match="runs past"):
        read_string(b"\x83ab", 0, 3)


def test_bad_integers() -> None:
    with pytest.raises(IndexError):  # truncated: the caller names it
        read_integer(b"\x01\x02", 0)
    with pytest.raises(MalformedMessage, match="longer than 10 bytes"):
        read_integer(b"\x00" * 10 + b"\x81", 0)
    beyond = b"\x01" + b"\x00" * 8 + b"\x80"  # 2**63 in 10 bytes
    with pytest.raises(MalformedMessage, match="beyond int64"):
        read_integer(beyond, 0)
    with pytest.raises(MalformedMessage, match="beyond int64"):
        read_integer(b"\x7e" + b"\x7f" * 8 + b"\xff", 0)  # -(2**63) - 1
    assert read_integer(encode_integer(INT64_MIN), 0)[0] == INT64_MIN


def test_both_users_refuse_integers_beyond_int64() -> None:
    msg = encode_msg(Msg(1, 1, True, False, True, "t", b""), Dialect.CURRENT)
    beyond = b"\x01" + b"\x00" * 8 + b"\x80"
    with pytest.raises(MalformedMessage, match="beyond int64"):
        decode_msg(beyond + msg[1:], 0, len(msg) + len(beyond) - 1, Dialect.CURRENT)
    # MsgRegisterReq: one event whose type has one segment of that length
    with pytest.raises(common.InvalidMessage, match="MsgRegisterReq: SBS Integer beyond int64"):
        common.split_register_req(b"\x81\x81" + beyond)


@pytest.mark.parametrize(
    "n", [0, 63, 64, -64, -65, 8191, 8192, -8193, 2**20 - 1, 2**20, 2**27, INT64_MAX]
)
def test_read_integer_at_the_edges_of_its_short_forms(n: int) -> None:
    """One byte, and two or three without the loop (message ids), then the loop."""
    data = _REPO.encode("T.I", n)
    assert read_integer(b"\xff" + data + b"\x81", 1) == (n, 1 + len(data))


@pytest.mark.parametrize("size", [0, 63, 64, 200])
@pytest.mark.parametrize("type_name", ["t", "x" * 63, "y" * 64])
def test_envelope_read_in_place_from_a_bytearray_gives_bytes(size: int, type_name: str) -> None:
    """The envelope reads short types and data in place: from a partly buffered stream's
    ``bytearray`` its data still comes out as ``bytes``, at every length form."""
    msg = Msg(70000, 9000, True, False, True, type_name, bytes(size))
    encoded = bytearray(b"\x00" + encode_msg(msg, Dialect.CURRENT) + b"\x00")
    decoded = decode_msg(encoded, 1, len(encoded) - 1, Dialect.CURRENT)
    assert decoded == msg
    assert decoded.data.__class__ is bytes
    with pytest.raises(MalformedMessage, match="trailing"):
        decode_msg(encoded, 1, len(encoded), Dialect.CURRENT)
    with pytest.raises(MalformedMessage, match=r"runs past|truncated"):
        decode_msg(encoded, 1, len(encoded) - 2, Dialect.CURRENT)
