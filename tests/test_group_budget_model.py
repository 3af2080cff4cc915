"""The shared byte budget of a node's links (:class:`rpc.group.items.QueueBytes`) alone,
without sockets: the link asked for room is one holding the most (checked against a walk,
over a random walk of holdings), none is asked when none holds more than the taker would,
one that cannot give back is passed over for the next, and the budget keeps no link that
holds nothing alive. The node-level scenes are in tests/test_group_budget_share.py."""

from __future__ import annotations

import gc
import random
import weakref

from rpc.group.items import QueueBytes


class Sink:
    """A holder that gives back what it is asked for (as a link would), unless ``stuck``
    (as a paused link holding only its last write), checking that no other that can give
    holds more than it does when asked."""

    def __init__(self, budget: QueueBytes, others: list[Sink]) -> None:
        self.budget = budget
        self.others = others
        self.counted = 0
        self.asked = 0
        self.stuck = False

    def shed(self, need: int) -> int:
        assert self.counted >= max((s.counted for s in self.others if not s.stuck), default=0)
        self.asked += 1
        if self.stuck:
            return 0
        freed = min(need, self.counted)
        self.budget.release(self, freed)
        return freed


def test_the_link_asked_for_room_is_one_holding_the_most() -> None:
    """Holdings change at random (frames queued and let go, links ending and new ones in
    their place, which may get an ended one's ``id``; now and then most links empty, so
    the budget stops watching; some cannot give back, for a while); each time the budget
    is full, every link asked to shed holds the most of those that can give (by a walk of
    them all), none is asked when none holds more than the taker would, and room is
    refused only when no link that can give holds more than the taker would. The heap
    stays within twice the links holding now (plus 64)."""
    rng = random.Random(184)
    budget = QueueBytes(10_000)
    sinks: list[Sink] = []
    sinks += [Sink(budget, sinks) for _ in range(50)]
    taker = Sink(budget, sinks)
    full = asked = ended = unwatched = passed = 0
    for _ in range(20_000):
        i = rng.randrange(len(sinks))
        sink = sinks[i]
        size = rng.randrange(1, 300)
        if rng.random() < 0.01:  # writes pause with only the last write held, or resume
            sink.stuck = not sink.stuck
            if not sink.stuck:
                budget.can_give(sink)
        elif rng.random() < 0.02:
            asked += sink.asked
            budget.release(sink, sink.counted)  # the link ended; a new one takes its place
            sinks[i] = Sink(budget, sinks)
            del sink
            ended += 1
        elif rng.random() < 0.002:  # links empty till at most half is held
            for s in sinks:
                if budget.held <= budget.limit // 2:
                    break
                budget.release(s, s.counted)
            assert not budget._heap  # not watched (as after a drain)
            unwatched += 1
        elif rng.random() < 0.2:
            budget.release(sink, min(sink.counted, size))
        elif budget.held + size <= budget.limit:
            assert budget.take(size, sink)
        else:
            full += 1
            most = max(s.counted for s in sinks)
            givers = max((s.counted for s in sinks if not s.stuck), default=0)
            before = sum(s.asked for s in sinks)
            if budget.make_room(size, taker):
                assert budget.held + size <= budget.limit
                passed += most > givers
            else:  # what the givers hold now, after any they gave
                left = max((s.counted for s in sinks if not s.stuck), default=0)
                assert left <= size and budget.held + size > budget.limit
            if most <= size:
                assert sum(s.asked for s in sinks) == before
            assert len(budget._heap) <= 2 * sum(s.counted > 0 for s in sinks) + 64 + 2
    assert full > 1000 and ended > 300 and unwatched > 10 and passed > 100
    assert asked + sum(s.asked for s in sinks) > 500
    assert budget.held == sum(s.counted for s in sinks)
    # a taker holding the most gets no room from the others
    for s in sinks:
        budget.release(s, s.counted)
    assert budget.take(budget.limit - 100, taker)
    assert budget.take(100, sinks[0])
    assert not budget.make_room(1, taker)
    assert not budget.take(1, taker)
    assert budget.held == budget.limit


def test_no_link_is_asked_when_none_holds_more_than_the_taker_would() -> None:
    """The random walk above never meets this case (its largest holder always holds more
    than a frame, so its check of it never runs): links that each hold no more than the
    taker would with the new bytes are not asked and the room is refused; a link holding
    one byte more is asked, alone."""
    budget = QueueBytes(10_000)
    sinks: list[Sink] = []
    sinks += [Sink(budget, sinks) for _ in range(50)]
    taker = Sink(budget, sinks)
    for s in sinks:
        assert budget.take(200, s)
    assert budget.held == budget.limit
    assert not budget.make_room(200, taker)
    assert [s.asked for s in sinks] == [0] * 50
    budget.release(sinks[0], 1)
    assert budget.take(1, sinks[7])  # 201: more than the taker would hold
    assert budget.make_room(200, taker)
    assert [i for i, s in enumerate(sinks) if s.asked] == [7] and sinks[7].asked == 1


class Giver:
    """A holder that gives back what it is asked for, or (``gives`` False) nothing."""

    def __init__(self, budget: QueueBytes, gives: bool = True) -> None:
        self.budget = budget
        self.gives = gives
        self.counted = 0
        self.asked = 0

    def shed(self, need: int) -> int:
        self.asked += 1
        freed = min(need, self.counted) if self.gives else 0
        self.budget.release(self, freed)
        return freed


def test_a_holder_that_cannot_give_back_does_not_stop_the_budget_asking_the_next() -> None:
    """Review 194: a holds the most and can give nothing back (a paused link holding only
    its last write), b could: before, the budget asked a, got nothing and refused the
    frame, with b still holding 400. Now it asks b; and a only once, not for every frame,
    until a can give again."""
    budget = QueueBytes(1000)
    a, b, t = Giver(budget, gives=False), Giver(budget), Giver(budget)
    assert budget.take(600, a) and budget.take(400, b)
    assert budget.take(10, t)
    assert (a.counted, b.counted, t.counted, budget.held) == (600, 390, 10, 1000)
    taken = 0
    while taken < 1000 and budget.take(1, t):
        taken += 1
    # b gave until it held no more than t would (fair); a was asked once, and once more
    # at each rebuild of the heap (after 64 pushes or more), not for each frame
    assert b.counted <= t.counted + 1 < b.counted + 2 and taken == 190
    assert a.asked <= 1 + taken // 64
    assert (a.counted, budget.held) == (600, a.counted + b.counted + t.counted)
    asked = a.asked
    assert not budget.take(1, t) and a.asked == asked
    a.gives = True  # its writes resumed
    budget.can_give(a)
    assert budget.take(1, t) and a.counted == 599 and a.asked == asked + 1
    assert budget.held == 1000 == a.counted + b.counted + t.counted


class Gone:
    """A holder that has nothing to give back."""

    counted = 0

    def shed(self, need: int) -> int:
        return 0


def test_a_link_that_holds_nothing_is_not_kept_alive_by_the_budget() -> None:
    """Review 191: links that let go of everything (they ended) stayed in the heap (built
    when the budget was full) until a later question reached them or a rebuild: while
    the budget had room, nothing asked, and every link that had been in it stayed alive."""
    budget = QueueBytes(1000)
    holders = [Gone() for _ in range(10)]
    for h in holders:
        h.counted = 0
        assert budget.take(100, h)
    assert not budget.make_room(10, Gone())  # full: the heap is built and asked
    refs = [weakref.ref(h) for h in holders]
    for h in holders[1:]:
        budget.release(h, 100)  # they end; the first one still holds
    del holders, h
    gc.collect()
    assert budget.held == 100
    alive = sum(r() is not None for r in refs)
    assert alive == 1, f"{alive - 1} ended holders still referenced by the budget"
