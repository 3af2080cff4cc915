"""Received SBS payloads are checked before hat-sbs decodes them (wire.schemas.check): a
count, a length or a nesting the bytes do not back is an undecodable payload, found at a cost
in proportion to the bytes, never a MemoryError, a stall or a crash of hat-sbs."""

from __future__ import annotations

from typing import Any

import hat.sbs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rpc.chatter_payloads import Sbs, SbsPayloads, Undecodable
from rpc.payload import PayloadError
from wire import sbs, schemas

PAYLOADS = SbsPayloads(schemas.repository())
DEPTH = 64  # wire.schemas.MAX_SBS_DEPTH

RECURSIVE = SbsPayloads(
    hat.sbs.Repository(
        "module R\n"
        "T = Array(T)\n"
        "U = Choice { leaf: None  node: U }\n"
        "O = Optional(O)\n"
        "V = Record { a: V }\n"
        "N = Array(Record { a: None  b: None })\n"
        "P(x) = Record { v: x  w: Array(x) }\n"
        "Q = P(Optional(Integer))\n"
    )
)


def read(payloads: SbsPayloads, op: str, data: bytes) -> Any:
    """What a handler or caller gets: the decoded value, or Undecodable for a payload that
    fails as a PayloadError."""
    held = payloads.incoming(op, data)
    if type(held) is Sbs:
        try:
            return held.value
        except PayloadError as exc:
            return Undecodable(str(exc))
    return held


@pytest.mark.parametrize("op", sorted(PAYLOADS.names))
@settings(max_examples=30, deadline=200)
@given(count=st.integers(0, 2**63 - 1), rest=st.binary(max_size=8))
def test_a_count_the_bytes_do_not_back_is_undecodable(op: str, count: int, rest: bytes) -> None:
    value = read(PAYLOADS, op, sbs.encode_integer(count) + rest)
    if type(value) is not Undecodable:  # it did decode: as hat-sbs decodes it
        assert value == PAYLOADS.repo.decode(op, sbs.encode_integer(count) + rest)


@pytest.mark.parametrize(
    ("op", "data"),
    [
        ("R.T", b"\x81" * 100_000 + b"\x80"),  # hat-sbs' C decoder: segfault
        ("R.U", b"\x81" * 100_000 + b"\x80"),
        ("R.O", b"\x81" * 100_000 + b"\x80"),
        ("R.T", b"\x81" * DEPTH + b"\x80"),
        ("R.V", b""),  # a Record of itself: hat-sbs recurses for good
        ("R.N", sbs.encode_integer(2**20)),  # a million elements of no bytes
    ],
)
def test_nesting_past_the_limit_and_free_elements_are_undecodable(op: str, data: bytes) -> None:
    value = read(RECURSIVE, op, data)
    assert type(value) is Undecodable
    assert "nested more than 64 deep" in value.reason or "take no bytes" in value.reason


def test_within_the_limits_payloads_decode_as_hat_sbs_decodes_them() -> None:
    assert schemas.MAX_SBS_DEPTH == DEPTH
    deepest = b"\x81" * (DEPTH - 1) + b"\x80"
    assert read(RECURSIVE, "R.T", deepest) == RECURSIVE.repo.decode("R.T", deepest)
    assert read(RECURSIVE, "R.N", b"\x82") == [{"a": None, "b": None}] * 2  # budget: 1 + 1
    generic = {"v": ("value", 3), "w": [("none", None), ("value", -7)]}
    assert read(RECURSIVE, "R.Q", RECURSIVE.repo.encode("R.Q", generic)) == generic
    events = [
        {
            "type": ["a", "b" * 100],
            "sourceTimestamp": ("value", {"s": -(2**40), "us": 999_999}),
            "payload": ("value", ("binary", {"type": "t", "data": b"\x00" * 300})),
        },
        {"type": [], "sourceTimestamp": ("none", None), "payload": ("value", ("json", "{}"))},
    ]
    data = PAYLOADS.repo.encode("HatEventer.MsgRegisterReq", events)
    assert read(PAYLOADS, "HatEventer.MsgRegisterReq", data) == events
    assert type(read(PAYLOADS, "HatEventer.MsgRegisterReq", data[:-1])) is Undecodable


def test_a_payload_is_decoded_once_and_only_when_read() -> None:
    held = PAYLOADS.incoming("HatEventer.EventType", sbs.encode_integer(2**40))
    assert type(held) is Sbs and held.data == sbs.encode_integer(2**40)  # nothing decoded
    for _ in range(2):
        with pytest.raises(PayloadError, match="an Array of 1099511627776 elements"):
            held.value  # noqa: B018 (the property decodes)
    good = PAYLOADS.incoming("HatEventer.EventType", b"\x81\x81x")
    assert type(good) is Sbs and good.value == ["x"] and good.value is good.value


def test_a_record_of_one_empty_type_twice_takes_no_bytes() -> None:
    """``Pair = Record { a: Unit  b: Unit }`` takes no bytes: an Array of two of them in one
    byte is valid (the check took the second ``Unit`` for a loop, so "takes bytes", and
    refused the Array's count)."""
    repo = hat.sbs.Repository(
        "module S\n"
        "Unit = None\n"
        "Pair = Record { a: Unit  b: Unit }\n"
        "Pairs = Record { pairs: Array(Pair)  n: Integer }\n"
    )
    data = repo.encode("S.Pairs", {"pairs": [{"a": None, "b": None}] * 2, "n": 5})
    schemas.check(repo, "S.Pairs", data)  # raised SbsRejected before
    assert read(SbsPayloads(repo), "S.Pairs", data) == repo.decode("S.Pairs", data)
