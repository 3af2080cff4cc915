"""Chatter: the reply that ends a conversation of ours (the tracker's fast path in
``ConversationTracker.incoming``) is held to the id rule like any message."""

from __future__ import annotations

import pytest

from wire import ConversationError
from wire.chatter import ChatterConnection, Conversation, Dialect, Msg, encode_frame

CUR = Dialect.CURRENT


@pytest.mark.parametrize("forged_id", [1, 2])
def test_a_reply_whose_id_does_not_follow_is_a_violation_where_the_peer_holds_the_token(
    forged_id: int,
) -> None:
    """Two requests open, the peer holding both tokens; its reply to the first carries id 2,
    then a reply to the second with id 2 (repeated) or 1 (going back) must be refused and
    leave the second conversation open. The existing test forges such an id only in a
    conversation where WE hold the token, which the general path refuses anyway: a fast
    path without its id check passed every test of tests/test_chatter_connection.py."""
    client = ChatterConnection(CUR)
    first = client.send("Req", last=False)
    second = client.send("Req", last=False)
    client.data_to_send()
    reply = encode_frame(Msg(2, first.id, False, True, True, "Res", b""), CUR)
    [msg] = client.receive_data(reply)
    assert msg.first == first.id and not client.is_open(Conversation(True, first.id))
    forged = encode_frame(Msg(forged_id, second.id, False, True, True, "Res", b""), CUR)
    with pytest.raises(ConversationError, match="does not follow"):
        client.receive_data(forged)
    assert client.is_open(Conversation(True, second.id))
