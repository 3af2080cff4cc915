"""Chatter connection: conversation rules, limits, dialect handling, dead-after-error."""

from __future__ import annotations

import pytest

from wire import ConversationError, LocalProtocolError, MalformedMessage, MessageTooLarge
from wire.chatter import ChatterConnection, Conversation, Dialect, Msg, encode_frame
from wire.chatter.connection import JOINED_FRAME, MAX_PING_DATA, PING_TYPES
from wire.chatter.conversations import ConversationTracker
from wire.chatter.framing import MAX_HEADER

CUR = Dialect.CURRENT


def pair(dialect: Dialect = CUR) -> tuple[ChatterConnection, ChatterConnection]:
    return ChatterConnection(dialect), ChatterConnection(dialect)


def deliver(src: ChatterConnection, dst: ChatterConnection) -> list[Msg]:
    return dst.receive_data(src.data_to_send())


def test_request_reply_conversation() -> None:
    client, server = pair()
    sent = client.send("Req", b"1", last=False)
    conv = Conversation(True, sent.id)
    assert client.is_open(conv) and not client.holds_token(conv)
    [req] = deliver(client, server)
    assert req.starts_conversation
    server_conv = Conversation.of_received(req)
    assert server_conv == Conversation(False, sent.id)
    assert server.holds_token(server_conv)
    server.send("Res", b"2", conversation=server_conv)
    assert not server.is_open(server_conv)
    [res] = deliver(server, client)
    assert (res.type, res.data, res.last, res.owner, res.first) == ("Res", b"2", True, False, 1)
    assert Conversation.of_received(res) == conv
    assert not client.is_open(conv)
    assert client.open_conversations == server.open_conversations == 0


def test_token_passing_stream() -> None:
    client, server = pair()
    first = client.send("Part", b"a", token=False, last=False)
    conv = Conversation(True, first.id)
    client.send("Part", b"b", conversation=conv, token=True, last=False)
    with pytest.raises(LocalProtocolError, match="holds the token"):
        client.send("Part", b"c", conversation=conv)
    msgs = deliver(client, server)
    assert [m.data for m in msgs] == [b"a", b"b"]
    sconv = Conversation.of_received(msgs[0])
    server.send("Ack", conversation=sconv, token=True, last=False)
    deliver(server, client)
    assert client.holds_token(conv)
    client.send("End", conversation=conv, last=True)
    [end] = deliver(client, server)
    assert end.last and not server.is_open(sconv)
    with pytest.raises(LocalProtocolError, match="not open"):
        client.send("After", conversation=conv)


def test_peer_sending_without_token_is_a_violation() -> None:
    client, server = pair()
    client.send("Req", last=False)  # token passed to server
    deliver(client, server)
    # Forge a second message from the client in that conversation.
    forged = encode_frame(Msg(2, 1, True, True, False, "Again", b""), CUR)
    with pytest.raises(ConversationError, match="without the token"):
        server.receive_data(forged)
    # dead afterwards: the same error again
    with pytest.raises(ConversationError):
        server.receive_data(b"")


@pytest.mark.parametrize(
    ("frames", "match"),
    [
        (
            [Msg(1, 1, True, True, True, "A", b""), Msg(1, 1, True, True, True, "B", b"")],
            "does not follow",
        ),
        ([Msg(5, 3, False, True, True, "Res", b"")], "unknown conversation"),
        ([Msg(5, 0, False, True, True, "Res", b"")], "unknown conversation"),
        (
            [Msg(1, 1, True, True, True, "A", b""), Msg(2, 1, True, True, True, "B", b"")],
            "unknown conversation",
        ),  # message after last
    ],
)
def test_conversation_violations(frames: list[Msg], match: str) -> None:
    conn = ChatterConnection(CUR)
    data = b"".join(encode_frame(m, CUR) for m in frames)
    with pytest.raises(ConversationError, match=match):
        conn.receive_data(data)


def test_a_reply_that_ends_our_conversation_is_checked_as_any_message() -> None:
    """The reply that ends one of our conversations (read without the tracker's call) is
    held to every rule: its id must follow, the peer must hold the token, and it ends the
    conversation; one in a conversation where we hold the token is a violation that leaves
    the conversation as it was."""
    for forged_id, match in ((1, "does not follow"), (2, "without the token")):
        client, server = pair()
        asked = client.send("Req", last=False)
        kept = client.send("Stream", token=False, last=False)
        deliver(client, server)
        server.send("Res", conversation=Conversation(False, asked.id))
        [reply] = deliver(server, client)
        assert (reply.type, client.is_open(Conversation(True, asked.id))) == ("Res", False)
        forged = encode_frame(Msg(forged_id, kept.id, False, True, True, "Res", b""), CUR)
        with pytest.raises(ConversationError, match=match):
            client.receive_data(forged)
        assert client.holds_token(Conversation(True, kept.id))


def test_lenient_mode_accepts_rule_breakers() -> None:
    conn = ChatterConnection(CUR, strict=False)
    data = b"".join(
        encode_frame(m, CUR)
        for m in (Msg(1, 1, True, True, True, "A", b""), Msg(1, 9, False, True, True, "B", b""))
    )
    assert [m.type for m in conn.receive_data(data)] == ["A", "B"]


def test_abandoned_conversation_drops_late_reply() -> None:
    client, server = pair()
    sent = client.send("Slow", last=False)
    [req] = deliver(client, server)
    client.abandon(Conversation(True, sent.id))
    server.send("Late", conversation=Conversation.of_received(req))
    assert deliver(server, client) == []
    # any message in a conversation of ours that is not open can only be late: dropped too
    again = encode_frame(Msg(2, sent.id, False, True, True, "Again", b""), CUR)
    assert client.receive_data(again) == []
    # ...but one in a conversation we never started is a violation
    forged = encode_frame(Msg(3, client.next_id, False, True, True, "Forged", b""), CUR)
    with pytest.raises(ConversationError, match="unknown conversation"):
        client.receive_data(forged)


def test_late_replies_of_any_number_of_abandoned_conversations_are_dropped() -> None:
    client, server = pair()
    calls = 5000  # more than the 4,096 abandoned conversations once remembered
    sent = [client.send("Slow", last=False) for _ in range(calls)]
    requests = deliver(client, server)
    for msg in sent:
        client.abandon(Conversation(True, msg.id))
    assert client.open_conversations == 0 and not client._tracker._abandoned
    for req in requests:
        server.send("Late", conversation=Conversation.of_received(req))
    assert deliver(server, client) == []
    client.send("Next", last=False)
    [req] = deliver(client, server)
    server.send("Answer", conversation=Conversation.of_received(req))
    assert [m.type for m in deliver(server, client)] == ["Answer"]


def test_peers_abandoned_conversations_are_remembered_up_to_the_bound() -> None:
    """A conversation the peer started and we abandoned: its late messages are dropped up
    to its ``last``; of those, the last ``max_abandoned`` are remembered."""
    tracker = ConversationTracker(max_abandoned=2)
    for i in (1, 2, 3):  # the peer starts three, keeping the token
        assert tracker.incoming(Msg(i, i, True, False, False, "Part", b""))
        tracker.abandon(Conversation(False, i))
    assert not tracker.incoming(Msg(4, 3, True, False, False, "Part", b""))  # late
    assert not tracker.incoming(Msg(5, 3, True, True, True, "End", b""))  # late, the last
    with pytest.raises(ConversationError, match="unknown conversation"):
        tracker.incoming(Msg(6, 3, True, True, True, "Again", b""))  # after its last
    assert not tracker.incoming(Msg(7, 2, True, True, True, "End", b""))
    with pytest.raises(ConversationError, match="unknown conversation"):
        tracker.incoming(Msg(8, 1, True, True, True, "End", b""))  # forgotten: the oldest


def test_peers_abandoned_conversations_are_forgotten_once_nothing_of_theirs_can_come() -> None:
    """One whose token we hold (a request waiting for its answer) is not remembered, and a
    remembered one is forgotten once the peer hands the token over (a stream request's
    End): the peer may send nothing more in either, so the bound is left to the streams
    still sending parts (a graceful close turns requests away by abandoning them; each
    took a place, so 4,096 later ones pushed out a stream whose next part then broke the
    connection)."""
    tracker = ConversationTracker(max_abandoned=2)
    assert tracker.incoming(Msg(1, 1, True, False, False, "Stream", b""))  # it keeps the token
    assert tracker.incoming(Msg(2, 2, True, True, False, "Request", b""))  # the token is ours
    tracker.abandon(Conversation(False, 2))
    tracker.abandon(Conversation(False, 1))
    assert list(tracker._abandoned) == [(False, 1)]
    assert not tracker.incoming(Msg(3, 1, True, False, False, "Part", b""))  # late
    assert not tracker.incoming(Msg(4, 1, True, True, False, "End", b""))  # late, token back
    assert not tracker._abandoned
    with pytest.raises(ConversationError, match="unknown conversation"):
        tracker.incoming(Msg(5, 2, True, True, True, "Again", b""))


def test_open_conversation_limit() -> None:
    conn = ChatterConnection(CUR, max_conversations=2)
    data = b"".join(encode_frame(Msg(i, i, True, True, False, "R", b""), CUR) for i in (1, 2, 3))
    with pytest.raises(ConversationError, match="more than 2"):
        conn.receive_data(data)
    local = ChatterConnection(CUR, max_conversations=1)
    local.send("R", last=False)
    with pytest.raises(LocalProtocolError):
        local.send("R", last=False)


def test_ping_pong_hidden_from_application() -> None:
    a, b = pair()
    a.send_ping()
    assert deliver(a, b) == []
    assert deliver(b, a) == []
    assert (b.pings_received, a.pongs_received) == (1, 1)
    assert a.open_conversations == b.open_conversations == 0


@pytest.mark.parametrize("dialect", list(Dialect))
@pytest.mark.parametrize(("token", "last"), [(True, True), (False, True), (False, False)])
def test_ping_that_cannot_be_answered_counts_without_a_pong(
    dialect: Dialect, token: bool, last: bool
) -> None:
    """A Ping closing its conversation (``last``) or keeping the token cannot be answered
    under the rules a strict connection holds: it counts (the peer is alive), no Pong goes
    out, the rest of the read is delivered and the connection stays usable."""
    module, ping, _ = PING_TYPES[dialect]
    conn = ChatterConnection(dialect)
    frames = encode_frame(Msg(1, 1, True, token, last, ping, b"", module), dialect)
    if (dialect, token, last) == (CUR, True, True):  # the review's frame
        assert frames.hex() == "011681810101018f486174436861747465722e50696e6780"
    frames += encode_frame(Msg(2, 2, True, True, True, "After", b"x", module), dialect)
    assert [m.type for m in conn.receive_data(frames)] == ["After"]
    assert conn.pings_received == 1 and conn.data_to_send() == b""
    conn.send("Ours", b"1")  # not dead, not stuck
    assert conn.data_to_send()


def test_ping_and_pong_data_are_kept_cut_to_max_ping_data() -> None:
    """Only MAX_PING_DATA bytes of a Ping's or a Pong's data outlive the message: with a
    frame of nearly max_size half received, the connection holds that frame and little
    more."""
    big = 1 << 16
    conn = ChatterConnection(CUR, max_size=big)
    ping = Msg(1, 1, True, True, False, "HatChatter.Ping", b"p" * (big - 64), None)
    pong = Msg(2, 2, True, True, True, "HatChatter.Pong", b"q" * (big - 64), None)
    assert conn.receive_data(encode_frame(ping, CUR) + encode_frame(pong, CUR)) == []
    assert conn.last_ping_data == b"p" * MAX_PING_DATA
    assert conn.last_pong_data == b"q" * MAX_PING_DATA
    echo = ChatterConnection(CUR, strict=False)
    assert echo.receive_data(conn.data_to_send()) == []
    assert echo.last_pong_data == b"p" * MAX_PING_DATA  # the echo, as before
    rest = encode_frame(Msg(3, 3, True, True, True, "X", b"x" * (big - 64), None), CUR)
    assert conn.receive_data(rest[:-1]) == []
    held = conn.buffered + len(conn.last_ping_data) + len(conn.last_pong_data)
    assert held <= MAX_HEADER + big + 2 * MAX_PING_DATA


def test_legacy_dialect_carries_module() -> None:
    a, b = pair(Dialect.LEGACY)
    a.send("MsgX", b"1", module="MyMod")
    [m] = deliver(a, b)
    assert (m.module, m.type) == ("MyMod", "MsgX")
    cur = ChatterConnection(CUR)
    with pytest.raises(LocalProtocolError, match="no module"):
        cur.send("X", module="Mod")


def test_send_before_dialect_known() -> None:
    with pytest.raises(LocalProtocolError, match="dialect"):
        ChatterConnection().send("X")


def test_size_limit_from_header_before_body() -> None:
    conn = ChatterConnection(CUR, max_size=100)
    with pytest.raises(MessageTooLarge):
        conn.receive_data(b"\x01\x65")  # k = 101, no body yet
    huge = ChatterConnection(CUR, max_size=1 << 20)
    with pytest.raises(MessageTooLarge):
        huge.receive_data(b"\x05\x10\x00\x00\x00\x00")  # announces 2**40 bytes
    assert huge.buffered == 0


def test_a_huge_frame_size_is_told_by_its_length_not_its_digits() -> None:
    """A header may give 255 length bytes: the error (logged per hostile peer) said the
    size in its 600-odd digits; it now says how many bytes the size took."""
    conn = ChatterConnection(CUR, max_size=100)
    with pytest.raises(MessageTooLarge) as told:
        conn.receive_data(b"\xff" + b"\xff" * 255)
    assert str(told.value) == "Chatter frame of a 255-byte size exceeds max_size 100"
    with pytest.raises(MessageTooLarge, match=r"^Chatter frame of 101 bytes exceeds"):
        ChatterConnection(CUR, max_size=100).receive_data(b"\x01\x65")


def test_partial_frame_is_buffered_up_to_limit() -> None:
    conn = ChatterConnection(CUR, max_size=1000)
    frame = encode_frame(Msg(1, 1, True, True, True, "X", b"y" * 900), CUR)
    assert conn.receive_data(frame[:-1]) == []
    assert conn.buffered == len(frame) - 1
    [msg] = conn.receive_data(frame[-1:])
    assert msg.data == b"y" * 900 and conn.buffered == 0


def test_non_minimal_header_accepted() -> None:
    body = encode_frame(Msg(1, 1, True, True, True, "X", b"abc"), CUR)[2:]
    for header in (b"\x02\x00" + bytes((len(body),)), b"\x08" + len(body).to_bytes(8, "big")):
        [msg] = ChatterConnection(CUR).receive_data(header + body)
        assert msg.data == b"abc"
    empty = ChatterConnection(CUR)
    with pytest.raises(MalformedMessage):  # m = 0 means k = 0: an empty body is no Msg
        empty.receive_data(b"\x00")


@pytest.mark.parametrize("dialect", [CUR, Dialect.LEGACY])
def test_encode_gives_the_id_and_the_frame_of_what_send_queues(dialect: Dialect) -> None:
    """encode() builds no Msg: it returns the message's id and its frame, one piece up to
    JOINED_FRAME bytes, pieces above it (the payload not copied), the same bytes as
    encode_frame of the Msg that send() returns."""
    module = "M" if dialect is Dialect.LEGACY else None
    for data in (b"x" * 16, b"y" * (JOINED_FRAME + 1)):
        encoder, sender = ChatterConnection(dialect), ChatterConnection(dialect)
        msg_id, frame = encoder.encode("Req", data, token=False, last=False, module=module)
        sent = sender.send("Req", data, token=False, last=False, module=module)
        assert msg_id == sent.id == 1
        assert b"".join(frame) == sender.data_to_send() == encode_frame(sent, dialect)
        if len(data) < JOINED_FRAME:
            assert len(frame) == 1
        else:
            assert len(frame) > 1 and frame[-1] is data
        assert encoder.next_id == sender.next_id == 2


@pytest.mark.parametrize("size", [16, 300])
def test_encode_last_is_encode_of_a_reply_that_ends_the_conversation(size: int) -> None:
    """encode_last() gives the bytes encode() gives for the reply that ends a conversation
    the peer started, and ends it (ids past 64 and 8,192: two and three bytes each)."""
    for skipped in (0, 100, 9000):
        client, fast, slow = ChatterConnection(CUR), ChatterConnection(CUR), ChatterConnection(CUR)
        for _ in range(skipped):  # the client's ids, and the servers' own, move on
            client.send("N", b"")
            fast.send("N", b"")
            slow.send("N", b"")
        client.data_to_send()
        request = client.send("Req", b"q", last=False)
        data = client.data_to_send()
        [received] = fast.receive_data(data)
        slow.receive_data(data)
        conv = Conversation.of_received(received)
        frame = fast.encode_last(conv, "Res", b"r" * size)
        msg_id, pieces = slow.encode("Res", b"r" * size, conversation=conv)
        assert frame == b"".join(pieces)
        assert not fast.is_open(conv) and fast.next_id == slow.next_id == msg_id + 1
        [reply] = client.receive_data(frame)
        assert (reply.first, reply.last, reply.data) == (request.id, True, b"r" * size)


def test_encode_last_leaves_what_it_cannot_send_to_encode() -> None:
    """None, and nothing changed, for every reply encode_last does not make: encode()
    then sends it or says why not."""
    client, server = pair()
    client.send("Req", b"", token=False, last=False)  # the client keeps the token
    [req] = deliver(client, server)
    conv = Conversation.of_received(req)
    assert server.encode_last(conv, "Res", b"") is None
    assert server.is_open(conv) and not server.holds_token(conv) and server.next_id == 1
    assert server.encode_last(Conversation(False, 99), "Res", b"") is None  # not open
    assert server.encode_last(Conversation(True, 1), "Res", b"") is None  # not open either
    client.send("Req", b"", last=False)
    [req] = deliver(client, server)
    conv = Conversation.of_received(req)
    assert server.encode_last(conv, "Res", b"x" * (JOINED_FRAME + 1)) is None  # pieces
    assert server.holds_token(conv) and server.next_id == 1
    cases = ((Dialect.LEGACY, True, 1024), (CUR, False, 1024), (CUR, True, 32))
    for dialect, strict, max_size in cases:
        client = ChatterConnection(dialect)
        server = ChatterConnection(dialect, strict=strict, max_size=max_size)
        client.send("Req", b"", last=False)
        [req] = deliver(client, server)
        conv = Conversation.of_received(req)
        assert server.encode_last(conv, "Res", b"x" * 30) is None
        assert server.next_id == 1 and server.open_conversations == int(strict)
        if max_size == 32:
            with pytest.raises(MessageTooLarge):
                server.encode("Res", b"x" * 30, conversation=conv)
        else:
            assert server.encode("Res", b"x" * 30, conversation=conv)[0] == 1


@pytest.mark.parametrize("size", [16, 300])
@pytest.mark.parametrize("token", [True, False])
def test_encode_open_is_encode_of_a_message_that_opens_a_conversation(
    size: int, token: bool
) -> None:
    """encode_open() gives the bytes and the conversation encode() gives for the first
    message of a conversation (a request, a stream request keeping the token), and opens
    it as encode() does (ids past 64 and 8,192: two and three bytes each)."""
    for skipped in (0, 100, 9000):
        fast, slow = ChatterConnection(CUR), ChatterConnection(CUR)
        for _ in range(skipped):
            fast.send("N", b"")
            slow.send("N", b"")
        slow.data_to_send()
        opened = fast.encode_open("Req", b"q" * size, token)
        msg_id, pieces = slow.encode("Req", b"q" * size, token=token, last=False)
        assert opened is not None
        conv, frame = opened
        assert frame == b"".join(pieces)
        assert conv == Conversation(True, msg_id) and type(conv) is Conversation
        assert fast.next_id == slow.next_id == msg_id + 1
        assert fast.is_open(conv) and fast.holds_token(conv) is slow.holds_token(conv) is not token
        [received] = ChatterConnection(CUR, strict=False).receive_data(frame)
        assert (received.id, received.first, received.owner) == (msg_id, msg_id, True)
        assert (received.token, received.last, received.data) == (token, False, b"q" * size)


def test_encode_open_leaves_what_it_cannot_send_to_encode() -> None:
    """None, and nothing changed, for every opening message encode_open does not make:
    encode() then sends it or says why not."""
    conn = ChatterConnection(CUR)
    assert conn.encode_open("Req", b"x" * JOINED_FRAME) is None  # pieces
    assert conn.next_id == 1 and conn.open_conversations == 0
    assert conn.encode("Req", b"x" * JOINED_FRAME, last=False)[0] == 1
    cases = ((Dialect.LEGACY, True, 1024, 9), (CUR, False, 1024, 9), (CUR, True, 32, 9))
    for dialect, strict, max_size, max_open in (
        *cases,
        (CUR, True, 1024, 1),
        (None, True, 1024, 9),
    ):
        conn = ChatterConnection(
            dialect, strict=strict, max_size=max_size, max_conversations=max_open
        )
        if max_open == 1:
            assert conn.encode_open("Req", b"") is not None
        before = conn.next_id, conn.open_conversations
        assert conn.encode_open("Req", b"x" * 30) is None
        assert (conn.next_id, conn.open_conversations) == before
        if max_size == 32:
            with pytest.raises(MessageTooLarge):
                conn.encode("Req", b"x" * 30, last=False)
        elif max_open == 1 or dialect is None:
            with pytest.raises(LocalProtocolError):
                conn.encode("Req", b"x" * 30, last=False)
        else:
            assert conn.encode("Req", b"x" * 30, last=False)[0] == 1


def test_send_size_limit() -> None:
    conn = ChatterConnection(CUR, max_size=64)
    with pytest.raises(MessageTooLarge):
        conn.send("X", b"z" * 64)


@pytest.mark.parametrize(
    "body",
    [
        "81 81 01 01",  # truncated flags
        "81 81 01 01 01 85 58",  # type length runs past the end
        "81 81 01 01 01 81 ff 80",  # type is not UTF-8
        "81 81 01 01 01 81 58 80 00",  # trailing byte
        "01 01 01 01 01 01 01 01 01 01 01 81 81 01 01 01 81 58 80",  # 11-byte integer
        "ff 81 01 01 01 81 58 80",  # negative id
        "81 ff 01 01 01 81 58 80",  # negative first
        "81 81 01 01 01 81 58 ff",  # negative data length (one byte)
        "81 81 01 01 01 81 58 7f 80",  # negative data length (two bytes)
        "81 81 01 01 01 ff 58 80",  # negative type length
        "81 81 01 01 01 81 58 01 80",  # data length of two bytes runs past the end
        "81 81 01 01 01 81 58 82 00",  # data length of one byte runs past the end
        "81 81 01 01 01 81 58",  # no data length
    ],
)
def test_malformed_envelopes(body: str) -> None:
    raw = bytes.fromhex(body.replace(" ", ""))
    conn = ChatterConnection(CUR)
    with pytest.raises(MalformedMessage):
        conn.receive_data(bytes((1, len(raw))) + raw)


def test_undetectable_first_frame() -> None:
    raw = bytes.fromhex("8181010101")
    with pytest.raises(MalformedMessage, match="neither dialect"):
        ChatterConnection().receive_data(bytes((1, len(raw))) + raw)


def test_coalesced_output() -> None:
    conn = ChatterConnection(CUR)
    for i in range(3):
        conn.send("X", bytes([i]))
    out = conn.data_to_send()
    assert conn.data_to_send() == b""
    assert [m.data for m in ChatterConnection(CUR).receive_data(out)] == [b"\0", b"\1", b"\2"]


def test_conversation_keys_built_directly_are_conversations() -> None:
    """``ours`` and ``of_received`` skip the NamedTuple constructor; what they build is the
    same key, type and fields."""
    ours = Conversation.ours(7)
    received = Conversation.of_received(Msg(9, 9, True, True, False, "X", b""))
    assert (ours, received) == (Conversation(True, 7), Conversation(False, 9))
    assert type(ours) is type(received) is Conversation
    assert (ours.owner, ours.first, received.owner, received.first) == (True, 7, False, 9)


def test_the_data_of_every_ping_and_pong_of_a_read_is_kept_until_taken() -> None:
    a, b = ChatterConnection(Dialect.CURRENT), ChatterConnection(Dialect.CURRENT)
    for data in (b"first", b"", *(b"%d" % i for i in range(10))):
        a.send_ping(data)
    a.send("HatChatter.Ping", b"x" * 100, token=True, last=False)  # more than a Ping takes
    b.receive_data(a.data_to_send())  # one read: 13 Pings
    pings, pongs = b.take_ping_data()
    assert b.pings_received == 13  # the last one alone, cut to 64 bytes:
    assert b.last_ping_data == b"x" * MAX_PING_DATA
    kept = [b"first", *(b"%d" % i for i in range(7))]
    assert pings == kept and pongs == []  # none empty; 8 at most
    a.send("HatChatter.Ping", b"y" * 100, token=True, last=False)
    b.receive_data(a.data_to_send())
    assert b.take_ping_data()[0] == [b"y" * MAX_PING_DATA]  # cut to 64 bytes
    assert b.take_ping_data() == ([], [])  # taken
    a.receive_data(b.data_to_send())  # the Pongs echo the data (64 bytes at most)
    assert a.take_ping_data() == ([], kept)
