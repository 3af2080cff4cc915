"""Property tests: our envelope equals hat-sbs byte for byte; bad input only ProtocolError,
and a connection holds at most a frame and the kept Ping/Pong data."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.codec_helpers import fed_by_missing
from wire import ConversationError, ProtocolError, schemas
from wire.chatter import (
    ChatterConnection,
    Conversation,
    Dialect,
    Msg,
    decode_msg,
    encode_frame,
    encode_msg,
)
from wire.chatter.connection import MAX_PING_DATA, PING_TYPES
from wire.chatter.framing import MAX_HEADER

ids = st.integers(min_value=0, max_value=2**63 - 1)
texts = st.text(max_size=40)
dialects = st.sampled_from(list(Dialect))


@st.composite
def messages(draw: st.DrawFn, dialect: Dialect) -> Msg:
    module = draw(st.none() | texts) if dialect is Dialect.LEGACY else None
    return Msg(
        draw(ids),
        draw(ids),
        draw(st.booleans()),
        draw(st.booleans()),
        draw(st.booleans()),
        draw(texts),
        draw(st.binary(max_size=300)),
        module,
    )


def as_sbs_value(msg: Msg, dialect: Dialect) -> dict:
    data: dict = {"type": msg.type, "data": msg.data}
    if dialect is Dialect.LEGACY:
        data = {"module": ("none", None) if msg.module is None else ("value", msg.module), **data}
    return {
        "id": msg.id,
        "first": msg.first,
        "owner": msg.owner,
        "token": msg.token,
        "last": msg.last,
        "data": data,
    }


@given(st.data(), dialects)
def test_envelope_matches_hat_sbs(data: st.DataObject, dialect: Dialect) -> None:
    msg = data.draw(messages(dialect))
    repo = schemas.repository()
    ours = encode_msg(msg, dialect)
    assert ours == repo.encode(f"{dialect.value}.Msg", as_sbs_value(msg, dialect))
    assert decode_msg(ours, 0, len(ours), dialect) == msg


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_integer_matches_hat_sbs(n: int) -> None:
    from wire.chatter import encode_integer

    repo = schemas.repository("module T\nI = Integer\n")
    assert encode_integer(n) == repo.encode("T.I", n)


@given(st.data(), dialects, st.lists(st.integers(min_value=1, max_value=64), max_size=30))
def test_rechunking(data: st.DataObject, dialect: Dialect, cuts: list[int]) -> None:
    msgs = [
        Msg(i + 1, i + 1, True, True, True, m.type, m.data, m.module)
        for i, m in enumerate(data.draw(st.lists(messages(dialect), min_size=1, max_size=8)))
    ]
    stream = b"".join(encode_frame(m, dialect) for m in msgs)
    conn = ChatterConnection(dialect)
    got: list[Msg] = []
    pos = 0
    for cut in cuts:
        got += conn.receive_data(stream[pos : pos + cut])
        pos += cut
    got += conn.receive_data(stream[pos:])
    assert got == msgs


def held(conn: ChatterConnection) -> int:
    """Bytes of the peer's a connection holds: a frame's and the last Ping's and Pong's data."""
    return conn.buffered + len(conn.last_ping_data) + len(conn.last_pong_data)


def feed_checked(conn: ChatterConnection, data: bytes, chunk: int) -> None:
    """Feed data; only ProtocolError may escape, and what is held stays bounded."""
    try:
        for pos in range(0, len(data), chunk):
            conn.receive_data(data[pos : pos + chunk])
            assert conn.buffered <= MAX_HEADER + conn.max_size
            assert held(conn) <= MAX_HEADER + conn.max_size + 2 * MAX_PING_DATA
    except ProtocolError:
        pass


@settings(max_examples=400)
@given(
    st.binary(max_size=600),
    st.sampled_from([None, *Dialect]),
    st.integers(min_value=1, max_value=50),
    st.booleans(),
)
def test_random_bytes(data: bytes, dialect: Dialect | None, chunk: int, strict: bool) -> None:
    feed_checked(ChatterConnection(dialect, max_size=128, strict=strict), data, chunk)


@settings(max_examples=400)
@given(st.data(), dialects, st.integers(min_value=1, max_value=50))
def test_mutated_streams(data: st.DataObject, dialect: Dialect, chunk: int) -> None:
    msgs = data.draw(st.lists(messages(dialect), min_size=1, max_size=5))
    stream = bytearray(b"".join(encode_frame(m, dialect) for m in msgs))
    for _ in range(data.draw(st.integers(min_value=1, max_value=4))):
        if not stream:
            break
        pos = data.draw(st.integers(min_value=0, max_value=len(stream) - 1))
        op = data.draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
        if op == "flip":
            stream[pos] ^= data.draw(st.integers(min_value=1, max_value=255))
        elif op == "insert":
            stream[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del stream[pos]
        else:
            del stream[pos:]
    feed_checked(ChatterConnection(dialect, max_size=512), bytes(stream), chunk)


# Ping and Pong of both dialects, as each dialect carries them (the legacy pair in the
# current dialect is a type string like any other; the current one in the legacy dialect
# has no module)
PINGS_PONGS = {
    dialect: [
        (module if dialect is Dialect.LEGACY else None, name)
        for module, *names in PING_TYPES.values()
        for name in names
    ]
    for dialect in Dialect
}


@st.composite
def conversations(draw: st.DrawFn, dialect: Dialect) -> list[Msg]:
    """Messages a peer could send: ids that grow, conversations that exist (mostly), any
    flags, and Pings and Pongs among them, with data up to most of a 1,024-byte frame."""
    msgs: list[Msg] = []
    msg_id = draw(st.integers(min_value=1, max_value=2**40))
    for _ in range(draw(st.integers(min_value=1, max_value=8))):
        if draw(st.booleans()) and msgs:  # in a conversation seen before
            first, owner = draw(st.sampled_from([m.first for m in msgs])), draw(st.booleans())
        else:
            first, owner = msg_id, True
        names = st.sampled_from(PINGS_PONGS[dialect])
        module, name = draw(names | st.tuples(st.none(), texts))
        size = draw(st.sampled_from([0, MAX_PING_DATA, 960]) | st.integers(0, 960))
        token, last = draw(st.booleans()), draw(st.booleans())
        msgs.append(Msg(msg_id, first, owner, token, last, name, bytes(size), module))
        msg_id += draw(st.integers(min_value=1, max_value=3))
    return msgs


@settings(max_examples=300)
@given(st.data(), dialects, st.integers(min_value=1, max_value=200))
def test_pings_and_pongs_with_any_flags(data: st.DataObject, dialect: Dialect, chunk: int) -> None:
    """A strict connection answers the Pings it may answer; any other (sent with ``last``
    or keeping the token) counts without a Pong, never a LocalProtocolError. A Ping's and a
    Pong's data are kept up to MAX_PING_DATA bytes, never whole."""
    stream = b"".join(encode_frame(m, dialect) for m in data.draw(conversations(dialect)))
    feed_checked(ChatterConnection(dialect, max_size=1024, strict=True), stream, chunk)


@settings(max_examples=300)
@given(st.data(), dialects)
def test_replies_in_our_conversations(data: st.DataObject, dialect: Dialect) -> None:
    """The peer's messages in conversations we started (some open, some abandoned, some
    ended, some never started), against a model: one in an open conversation is taken when
    the peer holds its token (a violation otherwise); one in a conversation of ours that is
    not open is late and dropped, however it ended; one whose ``first`` we never sent (0,
    or ``next_id`` and above) is a violation."""
    module = "M" if dialect is Dialect.LEGACY else None
    conn = ChatterConnection(dialect)
    peer_holds: dict[int, bool] = {}  # our open conversations: True while the peer may send
    for _ in range(data.draw(st.integers(min_value=1, max_value=12))):
        msg = conn.send("Req", token=True, last=data.draw(st.booleans()), module=module)
        if not msg.last:
            peer_holds[msg.id] = True
    for first in list(peer_holds):
        if data.draw(st.booleans()):  # timed out
            del peer_holds[first]
            conn.abandon(Conversation(True, first))
    sent = conn.next_id
    for msg_id in range(1, data.draw(st.integers(min_value=1, max_value=12)) + 1):
        first = data.draw(st.integers(min_value=0, max_value=sent + 2))
        token, last = data.draw(st.booleans()), data.draw(st.booleans())
        frame = encode_frame(Msg(msg_id, first, False, token, last, "Res", b"", module), dialect)
        holds = peer_holds.get(first)
        if holds is None and 0 < first < sent:
            assert conn.receive_data(frame) == []  # late
            continue
        if not holds:  # never started, or the peer sends without the token
            with pytest.raises(ConversationError):
                conn.receive_data(frame)
            return
        assert [m.id for m in conn.receive_data(frame)] == [msg_id]
        if last:
            del peer_holds[first]
        elif token:
            peer_holds[first] = False


@given(st.data(), dialects, st.integers(min_value=0, max_value=400))
def test_missing_is_what_completes_the_frame_held(
    data: st.DataObject, dialect: Dialect, cut: int
) -> None:
    """``missing`` (what a reader slices a large read by, rpc.peer.Peer._read): the bytes
    that complete the frame held in part, a lower bound while its header is incomplete,
    and 0 only when nothing is held."""
    msgs = [
        Msg(i + 1, i + 1, True, True, True, m.type, m.data, m.module)
        for i, m in enumerate(data.draw(st.lists(messages(dialect), min_size=1, max_size=6)))
    ]
    stream = b"".join(encode_frame(m, dialect) for m in msgs)
    assert fed_by_missing(ChatterConnection(dialect), stream, cut) == msgs
