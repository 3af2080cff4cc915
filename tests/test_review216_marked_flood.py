"""Review 216 (of 989470a): during a graceful close (a peer without retry results, our
output waiting), a peer that sends a part with each stream request the close turns away
gets every such stream marked in ``_ended`` (``InputFlow._runs_now`` finds its part kept),
so past ``ENDED_STREAMS`` each read forgets marked streams and asks a look over the whole
backlog (``ServedStreams._end_stream``): one whole look per read, the cost review 213
found for bare stream requests (fixed for those by 60a419c), back with one part each.
Real sockets on 127.0.0.1; the waits are bounded, none is a fixed sleep."""

from __future__ import annotations

from typing import Any

import pytest

from rpc.backlog import Backlog
from rpc.served_streams import ENDED_STREAMS
from tests.rpc_helpers import wait_until
from tests.test_backlog_looks_close import KEPT, PER_READ, READS, _output_waits, _rid
from wire.gotalk.messages import Request, StreamRequest, StreamRequestPart

pytestmark = pytest.mark.both_loops


async def test_turned_away_streams_with_a_part_each_ask_no_whole_look_per_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As review 213's scene (2,000 requests kept from before the close, turned-away
    stream requests 100 per read), each stream request followed by one part: a look per
    message read is fine, one over the whole backlog per read is not."""
    looked = [0]
    real = Backlog.run_replies

    def counted(self: Backlog, *args: Any) -> int:  # the real look, counted
        looked[0] += len(self.messages) if self.unlooked < 0 else self.unlooked
        return real(self, *args)

    monkeypatch.setattr(Backlog, "run_replies", counted)
    async with _output_waits() as scene:
        scene.send(*(Request(_rid(i), "work", b"0") for i in range(2, 2 + KEPT)))
        await wait_until(lambda: len(scene.kept.messages) == KEPT and scene.served.reading, 5)
        await scene.close(drain_timeout=10.0)
        looked[0] = 0
        first = 100_000
        for n in range(READS):
            ids = range(first + n * PER_READ, first + (n + 1) * PER_READ)
            pairs = [
                message
                for i in ids
                for message in (
                    StreamRequest(_rid(i), "total", b"0"),
                    StreamRequestPart(_rid(i), b"1"),
                )
            ]
            scene.send(*pairs)
            last = _rid(ids[-1])
            await wait_until(
                lambda: (
                    last in scene.served._ended  # noqa: B023
                    and scene.kept.sorted
                    and scene.served.reading
                ),
                5,
            )
        assert READS * PER_READ > 2 * ENDED_STREAMS
        assert len(scene.kept.messages) <= KEPT + ENDED_STREAMS + PER_READ
        assert looked[0] <= 2 * KEPT + 2 * READS * PER_READ, looked[0]
