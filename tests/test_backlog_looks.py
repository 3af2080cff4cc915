"""The backlog's look for messages that may run now (:meth:`rpc.backlog.Backlog.run_replies`)
alone, without sockets: a flood kept read by read while our output waits is looked over
once per message, not once over the whole backlog per read (which made 100 flooding
connections cost the server 76% of its time and an honest client 0.2-0.55 s a call while
their backlogs filled); what changes the verdict for messages looked over before (our
output draining, a graceful close's start, messages put back first) makes the next look
go over all of them; replies found run in order and the rest keep theirs. The socket-level scenes
are in tests/test_backlog_looks_close.py, tests/test_backlog_bounds.py and
tests/test_rpc_turns.py."""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Iterator
from typing import Any

import pytest

from rpc.backlog import MESSAGES_PER_TURN, Backlog
from rpc.request_bytes import RequestBytes

REPLY = "reply"


class Kinds:
    """Messages are ``(kind, n)`` tuples; none opens or follows a request."""

    def message_size(self, message: Any) -> int:
        return 1

    def opens_request(self, message: Any) -> Hashable | None:
        return None

    def follows_request(self, message: Any) -> Hashable | None:
        return None

    def is_part(self, message: Any) -> bool:
        return False


class Looks:
    """``runs_now`` for the backlog: replies run now; counts the messages it is asked of."""

    def __init__(self) -> None:
        self.asked = 0
        self.ran: list[Any] = []

    def runs_now(self, message: Any) -> bool:
        self.asked += 1
        return message[0] == REPLY

    def dispatch(self, message: Any) -> None:
        self.ran.append(message)


@pytest.fixture
def backlog() -> Iterator[Backlog]:
    loop = asyncio.new_event_loop()
    try:
        yield Backlog(RequestBytes(1 << 40), loop, lambda: None, Kinds())
    finally:
        loop.close()


def requests(start: int, count: int) -> list[Any]:
    return [("request", n) for n in range(start, start + count)]


def test_a_flood_kept_read_by_read_is_looked_over_once_per_message(backlog: Backlog) -> None:
    looks = Looks()
    reads, per_read = 100, 1_000
    for read in range(reads):
        backlog.extend(requests(read * per_read, per_read))
        assert not backlog.sorted
        assert backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN) == 0
        assert backlog.sorted
    assert looks.asked == reads * per_read  # before: a look over all, 50.5 million
    assert list(backlog.messages) == requests(0, reads * per_read)
    assert backlog.bytes == reads * per_read * (1 + 256)


def test_replies_among_the_newest_run_in_order_and_the_rest_keep_theirs(
    backlog: Backlog,
) -> None:
    looks = Looks()
    backlog.extend(requests(0, 3))
    backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN)
    newest = [("request", 3), (REPLY, 0), ("request", 4), (REPLY, 1)]
    backlog.extend(newest)
    looks.asked = 0
    assert backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN) == 2
    assert looks.asked == len(newest)
    assert looks.ran == [(REPLY, 0), (REPLY, 1)]
    assert list(backlog.messages) == requests(0, 5)
    assert backlog.sorted and backlog.unlooked == 0


def test_replies_past_the_budget_go_back_first_and_the_next_look_is_whole(
    backlog: Backlog,
) -> None:
    looks = Looks()
    backlog.extend([*requests(0, 2), (REPLY, 0), (REPLY, 1), (REPLY, 2)])
    assert backlog.run_replies(looks.runs_now, looks.dispatch, 1) == 1
    assert list(backlog.messages) == [(REPLY, 1), (REPLY, 2), *requests(0, 2)]
    assert not backlog.sorted
    looks.asked = 0
    assert backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN) == 2
    assert looks.asked == 4
    assert looks.ran == [(REPLY, 0), (REPLY, 1), (REPLY, 2)]


def test_taking_the_first_ones_leaves_the_look_to_the_rest(backlog: Backlog) -> None:
    looks = Looks()
    backlog.extend(requests(0, 5))
    assert backlog.popleft() == ("request", 0)
    assert backlog.popleft() == ("request", 1)
    backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN)
    assert looks.asked == 3
    backlog.extend(requests(5, 2))
    for n in range(2, 6):  # the ones looked over, then one of the two new ones
        assert backlog.popleft() == ("request", n)
    looks.asked = 0
    backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN)
    assert looks.asked == 1
    assert list(backlog.messages) == [("request", 6)]


@pytest.mark.parametrize("change", ["recheck", "put back"])
def test_what_changes_the_verdict_of_those_looked_over_makes_the_next_look_whole(
    backlog: Backlog, change: str
) -> None:
    looks = Looks()
    backlog.extend(requests(0, 10))
    backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN)
    if change == "recheck":  # our output drained: parts of running streams may run now
        backlog.recheck()
    else:  # a message taken could not run after all
        backlog.appendleft(backlog.popleft())
    backlog.extend(requests(10, 2))
    looks.asked = 0
    backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN)
    assert looks.asked == 12
    assert list(backlog.messages) == requests(0, 12)


def test_a_cleared_backlog_starts_afresh(backlog: Backlog) -> None:
    looks = Looks()
    backlog.extend(requests(0, 4))
    backlog.clear()
    assert backlog.sorted and backlog.unlooked == 0 and not backlog.messages
    backlog.extend(requests(4, 3))
    backlog.run_replies(looks.runs_now, looks.dispatch, MESSAGES_PER_TURN)
    assert looks.asked == 3
