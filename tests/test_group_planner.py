"""The distribution tree, replayed with seeded random generators for groups of 1..200 nodes."""

from __future__ import annotations

import math
import random
from collections import Counter

import pytest

from rpc.group.planner import Chunk, Planner, fanout_bound, skip_head, split


def simulate(n: int, origin: int, rng: random.Random) -> tuple[Counter[int], Counter[int], int]:
    """Run the tree for nodes 0..n-1 from ``origin``: (receipts, direct sends, depth)."""
    planner: Planner[int] = Planner(rng)
    received: Counter[int] = Counter()
    sent: Counter[int] = Counter()
    depth = 0
    # (node, its distribution list, hop count): the origin's list is every other member
    work = [(origin, list(range(n)), 0)]
    while work:
        node, targets, hops = work.pop()
        depth = max(depth, hops)
        for chunk in planner.plan(targets, exclude=node):
            sent[node] += 1
            received[chunk.head] += 1
            work.append((chunk.head, list(chunk.rest), hops + 1))
    return received, sent, depth


@pytest.mark.parametrize("seed", [1, 2])
def test_everyone_receives_once_with_bounded_fanout(seed: int) -> None:
    rng = random.Random(seed)
    for n in range(1, 201):
        origin = rng.randrange(n)
        received, sent, depth = simulate(n, origin, rng)
        bound = math.ceil(math.log2(n)) if n > 1 else 0
        assert bound == fanout_bound(n)
        assert received == Counter({i: 1 for i in range(n) if i != origin}), n
        assert max(sent.values(), default=0) <= bound, (n, sent.most_common(1))
        assert sent[origin] == bound  # the origin uses its whole budget (m = n-1 others)
        assert depth <= bound, (n, depth)


def test_chunks_halve() -> None:
    assert split([]) == []
    assert split(["a"]) == [Chunk("a", ())]
    sizes = [1 + len(c.rest) for c in split(list(range(15)))]
    assert sizes == [8, 4, 2, 1]
    sizes = [1 + len(c.rest) for c in split(list(range(200)))]
    assert sizes == [100, 50, 25, 13, 6, 3, 2, 1]
    assert sum(sizes) == 200
    # order is kept: the planner shuffles before splitting, split itself does not
    assert [c.head for c in split(list(range(7)))] == [0, 4, 6]


def test_seeded_plans_repeat_and_differ_between_seeds() -> None:
    targets = list(range(50))
    first = Planner(random.Random(7)).plan(targets)
    assert first == Planner(random.Random(7)).plan(targets)
    assert first != Planner(random.Random(8)).plan(targets)


def test_plan_drops_self_and_duplicates() -> None:
    chunks = Planner(random.Random(3)).plan([1, 2, 2, 3, 4, 4, 5], exclude=3)
    covered = [node for c in chunks for node in (c.head, *c.rest)]
    assert sorted(covered) == [1, 2, 4, 5]


def test_skip_head_hands_chunk_to_next_node() -> None:
    assert skip_head(Chunk(1, (2, 3, 4))) == Chunk(2, (3, 4))
    assert skip_head(Chunk(1, ())) is None


def test_skipping_failed_nodes_still_reaches_the_rest() -> None:
    """Any set of dead nodes: every live node still receives once when heads are skipped."""
    rng = random.Random(11)
    for n in (2, 3, 16, 64, 200):
        dead = set(rng.sample(range(1, n), k=n // 4))
        planner: Planner[int] = Planner(rng)
        received: Counter[int] = Counter()
        work = [(0, list(range(n)))]
        while work:
            node, targets = work.pop()
            for chunk in planner.plan(targets, exclude=node):
                current: Chunk[int] | None = chunk
                while current is not None and current.head in dead:
                    current = skip_head(current)
                if current is not None:
                    received[current.head] += 1
                    work.append((current.head, list(current.rest)))
        assert received == Counter({i: 1 for i in range(1, n) if i not in dead}), n


def test_fanout_bound_rejects_empty_group() -> None:
    with pytest.raises(ValueError):
        fanout_bound(0)
