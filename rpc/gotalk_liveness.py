"""When a Gotalk connection sends a heartbeat, and when it gives up on a silent peer.

We send a heartbeat every ``interval`` seconds (default 20 s, well inside the 30 s read
timeout of Go peers) and, when nothing at all arrives for ``read_timeout`` seconds (default
30 s), send ``f00000003`` and close, as Go peers do. Heartbeats on our own plan go every
100-110% of the interval, at random (``BEAT_SPREAD``). A peer's heartbeat that arrives when
ours is due within half an interval is answered with ours at once, and our next is then
planned after 120% (``ANSWERER_SLACK``), later than the peer's: one side sends and the other
answers, and an idle connection wakes one side's timer once per interval. Both plans live in
the peer's coarse deadlines (:mod:`rpc.deadlines`), slots ``"heartbeat"`` and ``"read"``.
Over WebSocket there is no read timeout (the WebSocket's own pings detect dead peers, and
browsers delay timers in background tabs).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rpc.deadlines import ANSWERER_SLACK, next_beat
from wire import gotalk


class GotalkLiveness:
    """One connection's heartbeat plan and read check."""

    __slots__ = (
        "_emit",
        "_fault",
        "_loop",
        "_peer",
        "heartbeats_received",
        "interval",
        "last_read",
        "read_timeout",
    )

    def __init__(
        self,
        peer: Any,
        interval: float | None,
        read_timeout: float | None,
        emit: Callable[[bytes, bytes], None],
        fault: Callable[[int], bytes],
    ) -> None:
        self._peer = peer
        self._loop = peer.loop
        self._emit = emit
        """Queues a message's header and payload (the adapter owns the output)."""
        self._fault = fault
        self.interval = interval
        self.read_timeout = read_timeout
        self.last_read = 0.0
        """Loop time of the last bytes received (the adapter sets it per read)."""
        self.heartbeats_received = 0

    def start(self, framed: bool) -> None:
        """Plan both from now; ``framed`` (WebSocket) drops the read check."""
        if framed:
            self.read_timeout = None
        now = self.last_read = self._loop.time()
        deadlines = self._peer.deadlines
        if self.interval:
            deadlines.set("heartbeat", next_beat(now, self.interval), self._beat, coarse=True)
        if self.read_timeout:
            deadlines.set("read", now + self.read_timeout, self._read_due, coarse=True)

    def _beat(self) -> None:
        """The heartbeat timer: send one now and write it at once (no other output waits)."""
        if not self._peer.is_open or not self.interval:
            return
        self._send(next_beat(self._loop.time(), self.interval))
        self._peer.outbox.flush()

    def _send(self, next_at: float) -> None:
        beat = gotalk.Heartbeat(0, int(time.time()) & 0xFFFFFFFF)
        self._emit(*gotalk.encode_parts(beat))
        self._peer.deadlines.set("heartbeat", next_at, self._beat, coarse=True)

    def heard(self) -> None:
        """The peer's heartbeat: answer it when ours is due soon; move the read check on.

        Both moves make the timer later, so it is re-armed here (once per heartbeat, not per
        message) instead of waking up to find nothing due.
        """
        self.heartbeats_received += 1
        deadlines = self._peer.deadlines
        now = self.last_read
        interval = self.interval
        if interval:
            due = deadlines.when("heartbeat")
            if due is not None and due - now <= interval / 2:
                # flushed with this read's output; the peer's next one comes first
                self._send(now + interval * (1 + ANSWERER_SLACK))
        if self.read_timeout:
            deadlines.set("read", now + self.read_timeout, self._read_due, coarse=True)
        deadlines.rearm()

    def _read_due(self) -> None:
        timeout = self.read_timeout
        peer = self._peer
        if not timeout or not peer.is_open:
            return
        deadlines = peer.deadlines
        silent_until = max(self.last_read, peer.resumed_at) + timeout
        if deadlines.now() < silent_until:  # something arrived meanwhile
            deadlines.set("read", silent_until, self._read_due, coarse=True)
            return
        if peer.holding_input:  # we do not read it: its heartbeats wait unread
            deadlines.set("read", deadlines.now() + timeout, self._read_due)
            return
        peer.outbox.push(self._fault(gotalk.ErrorCode.TIMEOUT))
        peer.abort(TimeoutError(f"nothing read within {timeout} s (read_timeout)"))
