"""Byte-exact Chatter vectors captured from the real references (both directions)."""

from __future__ import annotations

import pytest

from wire import schemas
from wire.chatter import (
    ChatterConnection,
    Conversation,
    Dialect,
    Msg,
    decode_msg,
    encode_frame,
)


def h(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


CUR, LEG = Dialect.CURRENT, Dialect.LEGACY

# (name, dialect, frame bytes, message)
VECTORS = [
    (
        "A1 current ping",
        CUR,
        "01 16 81 81 01 01 00 8f 48 61 74 43 68 61 74 74 65 72 2e 50 69 6e 67 80",
        Msg(1, 1, True, True, False, "HatChatter.Ping", b""),
    ),
    (
        "A2 current pong",
        CUR,
        "01 16 81 81 00 01 01 8f 48 61 74 43 68 61 74 74 65 72 2e 50 6f 6e 67 80",
        Msg(1, 1, False, True, True, "HatChatter.Pong", b""),
    ),
    (
        "A3 current data",
        CUR,
        "01 0b 81 81 01 01 01 81 58 83 61 62 63",
        Msg(1, 1, True, True, True, "X", b"abc"),
    ),
    (
        "A4 current data id 3",
        CUR,
        "01 0b 83 83 01 01 00 81 58 83 61 62 63",
        Msg(3, 3, True, True, False, "X", b"abc"),
    ),
    (
        "A-wire client pong",
        CUR,
        "01 16 82 81 00 01 01 8f 48 61 74 43 68 61 74 74 65 72 2e 50 6f 6e 67 80",
        Msg(2, 1, False, True, True, "HatChatter.Pong", b""),
    ),
    (
        "B1 legacy ping",
        LEG,
        "01 17 81 81 01 01 00 81 87 48 61 74 50 69 6e 67 87 4d 73 67 50 69 6e 67 80",
        Msg(1, 1, True, True, False, "MsgPing", b"", "HatPing"),
    ),
    (
        "B2 legacy pong",
        LEG,
        "01 17 81 81 00 01 01 81 87 48 61 74 50 69 6e 67 87 4d 73 67 50 6f 6e 67 80",
        Msg(1, 1, False, True, True, "MsgPong", b"", "HatPing"),
    ),
    (
        "B3 legacy data",
        LEG,
        "01 0c 81 81 01 01 01 80 81 58 83 61 62 63",
        Msg(1, 1, True, True, True, "X", b"abc", None),
    ),
    (
        "B-wire client pong",
        LEG,
        "01 17 82 81 00 01 01 81 87 48 61 74 50 69 6e 67 87 4d 73 67 50 6f 6e 67 80",
        Msg(2, 1, False, True, True, "MsgPong", b"", "HatPing"),
    ),
]

EVENTER_C1 = (
    "01 27 81 81 01 01 00 95 48 61 74 45 76 65 6e 74 65 72 2e 4d 73 67 49 6e 69 74 52 65 71"
    " 8b 81 63 80 81 82 81 61 81 2a 80 00"
)
EVENTER_C2 = (
    "01 1e 81 81 00 01 01 95 48 61 74 45 76 65 6e 74 65 72 2e 4d 73 67 49 6e 69 74 52 65 73"
    " 82 80 82"
)
EVENTER_C3 = (
    "01 32 82 82 01 01 01 99 48 61 74 45 76 65 6e 74 65 72 2e 4d 73 67 52 65 67 69 73 74 65"
    " 72 52 65 71 92 81 82 81 61 81 62 80 81 81 88 7b 22 78 22 3a 20 31 7d"
)


@pytest.mark.parametrize(
    ("dialect", "frame", "msg"), [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS]
)
def test_vector_both_directions(dialect: Dialect, frame: str, msg: Msg) -> None:
    raw = h(frame)
    assert encode_frame(msg, dialect) == raw
    assert decode_msg(raw, 2, len(raw), dialect) == msg
    # hat-sbs, loaded from our schemas_sbs, agrees on the envelope bytes
    repo = schemas.repository()
    decoded = repo.decode(f"{dialect.value}.Msg", raw[2:])
    assert decoded["id"] == msg.id and decoded["data"]["type"] == msg.type


@pytest.mark.parametrize(
    ("dialect", "frame", "msg"), [v[1:] for v in VECTORS], ids=[v[0] for v in VECTORS]
)
def test_dialect_detected_from_first_frame(dialect: Dialect, frame: str, msg: Msg) -> None:
    conn = ChatterConnection(strict=False)
    assert conn.dialect is None
    conn.receive_data(h(frame))
    assert conn.dialect is dialect


def test_ping_answered_with_vector_pong_in_both_dialects() -> None:
    for dialect, ping, pong in (
        (CUR, VECTORS[0][2], VECTORS[1][2]),
        (LEG, VECTORS[5][2], VECTORS[6][2]),
    ):
        conn = ChatterConnection()
        assert conn.receive_data(h(ping)) == []
        assert conn.dialect is dialect
        assert conn.pings_received == 1
        assert conn.data_to_send() == h(pong)


def test_our_first_ping_is_the_reference_ping() -> None:
    for dialect, ping in ((CUR, VECTORS[0][2]), (LEG, VECTORS[5][2])):
        conn = ChatterConnection(dialect)
        conn.send_ping()
        assert conn.data_to_send() == h(ping)


def test_client_sequence_matches_capture() -> None:
    """A-wire: the real client pinged (id 1), ponged a peer ping (id 2), then sent X (id 3)."""
    client = ChatterConnection(CUR)
    client.send_ping()
    client.data_to_send()
    assert client.receive_data(h(VECTORS[0][2])) == []  # peer ping id 1
    assert client.data_to_send() == h(VECTORS[4][2])
    client.send("X", b"abc", last=False)
    assert client.data_to_send() == h("01 0b 83 83 01 01 00 81 58 83 61 62 63")


def test_eventer_frames_decode_and_reencode() -> None:
    repo = schemas.repository()
    init_req = h(EVENTER_C1)
    msg = decode_msg(init_req, 2, len(init_req), CUR)
    assert (msg.id, msg.first, msg.owner, msg.token, msg.last) == (1, 1, True, True, False)
    assert msg.type == "HatEventer.MsgInitReq"
    assert repo.decode(msg.type, msg.data) == {
        "clientName": "c",
        "clientToken": ("none", None),
        "subscriptions": [["a", "*"]],
        "serverId": ("none", None),
        "persisted": False,
    }
    assert encode_frame(msg, CUR) == init_req

    init_res = h(EVENTER_C2)
    res = decode_msg(init_res, 2, len(init_res), CUR)
    assert repo.decode(res.type, res.data) == ("success", ("operational", None))
    assert (res.owner, res.last) == (False, True)

    # Our server side produces exactly the reference's answer.
    server = ChatterConnection()
    [req] = server.receive_data(init_req)
    server.send(
        "HatEventer.MsgInitRes",
        repo.encode("HatEventer.MsgInitRes", ("success", ("operational", None))),
        conversation=Conversation.of_received(req),
    )
    assert server.data_to_send() == init_res

    reg = h(EVENTER_C3)
    reg_msg = decode_msg(reg, 2, len(reg), CUR)
    [event] = repo.decode(reg_msg.type, reg_msg.data)
    assert event["type"] == ["a", "b"]
    assert event["payload"] == ("value", ("json", '{"x": 1}'))
    assert encode_frame(reg_msg, CUR) == reg
