"""Outgoing links: one persistent connection per peer, fed from a bounded queue of frames.

A :class:`Link` is the ``asyncio.Protocol`` of its connection (handed straight to the loop,
the same object again on every reconnect) and a task that writes its queue. It tells its
owner what happens through :class:`LinkEvents`; it never reaches into the owner.

Limits and timers, per link (fields of :class:`~rpc.group.options.GroupOptions`):

- ``max_queue`` frames (default 256) and ``max_queue_bytes`` (16 MiB; an empty queue takes
  one frame of any size) queued, plus as many being resent after a drop; as many written
  last are kept ``resend_window`` s (2 s) to be resent once if the connection drops, then
  handed to the rest of their chunk. All links together hold at most ``max_queued_bytes``
  (128 MiB, :class:`QueueBytes`), queued or kept. Past any limit :meth:`Link.offer` refuses,
  except that a frame finding ``max_queued_bytes`` full takes room from the link holding
  the most that can give some if that one holds more (:meth:`Link.shed`; a paused link
  holding only its last write cannot, and is passed over): its kept copies go first (to the
  rest of their chunks while writes are paused: maybe unread), then its waiting frames,
  newest first, to the rest of their chunks.
- Writes stop while the transport is above its high-water mark (asyncio's 64 KiB) until it
  drains; a write is at most 64 frames (``max_queue`` if fewer), 1 MiB and
  ``max_queue_bytes``, or one larger frame. Its frames stay counted until writes resumed
  and ``resend_window`` passed: a transport holds at most 64 KiB that no longer count.
- Writes paused for ``write_stall_timeout`` (5 s), frames waiting or not: the peer is not
  reading. The connection is aborted, the peer counts as failed (its back-off grows with
  each stall in a row, however often it accepts a connection, until it reads again or
  speaks to us), and the queued frames and those written since ``resend_window`` before
  the pause go to the rest of their chunks.
- Connects on demand (``connect_timeout``, 2 s); closes after ``idle_timeout`` (30 s) with
  nothing to send. A connection that drops with frames to send is opened again at once,
  then after a full-jitter back-off (``retry_base`` doubling, capped by ``retry_after``),
  at most 3 drops in a row; then, or when a connect fails, the peer counts as failed and every
  queued frame goes to the rest of its chunk.

:class:`~rpc.group.linkset.Links` owns the links and their tasks.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from typing import Protocol, cast

from rpc.backoff import full_jitter
from rpc.group.items import Item, QueueBytes
from rpc.group.options import GroupOptions, GroupStats
from transports.stream import open_stream
from wire.errors import LocalProtocolError
from wire.gossip import NetID

__all__ = ["Item", "Link", "LinkEvents", "QueueBytes"]

log = logging.getLogger("peerwire.group")

BATCH_ITEMS = 64
"""Frames joined into one write at most."""
BATCH_BYTES = 1 << 20
"""Bytes joined into one write at most (a larger single frame is written alone)."""
MAX_DROPS = 3
"""Drops in a row (each within ``resend_window`` of its connect) before a peer has failed."""


class LinkEvents(Protocol):
    """What a link asks of its owner."""

    def frame(self, item: Item, head: NetID, with_others: bool) -> bytes:
        """Encode ``item`` for ``head`` (raises LocalProtocolError if it cannot be sent)."""
        ...

    def reroute(self, failed: NetID, item: Item) -> None:
        """``failed`` could not take ``item``: hand it to the next node of its chunk."""
        ...

    def room(self) -> None:
        """A link's queue made room, or the link ended: senders waiting may go on."""
        ...

    def connected(self, netid: NetID) -> None:
        """A connection to ``netid`` opened (it accepts, which is not yet reading)."""
        ...

    def drained(self, netid: NetID) -> None:
        """``netid`` read what we had buffered: it is alive and reading."""
        ...

    def unreachable(self, netid: NetID, *, stalled: bool = False) -> None:
        """``netid`` could not be reached, or (``stalled``) took no bytes for too long."""
        ...


class Link(asyncio.Protocol):
    """One peer's persistent outgoing connection and the frames waiting for it."""

    def __init__(
        self,
        netid: NetID,
        events: LinkEvents,
        options: GroupOptions,
        stats: GroupStats,
        rng: random.Random,
        held: QueueBytes,
    ) -> None:
        self.netid = netid
        self._events = events
        self._options = options
        self._stats = stats
        self._rng = rng
        self._held = held
        self.counted = 0  # bytes of our frames in the budget (written by it alone)
        self._loop = asyncio.get_running_loop()
        self._pending: deque[Item] = deque()
        self._pending_bytes = 0
        self._recent: deque[Item] = deque()  # written, kept to resend (oldest first)
        self._recent_bytes = 0
        self._last_write = 0  # frames of the last write (the transport may hold them)
        self._wakeup = asyncio.Event()
        self._writable = asyncio.Event()
        self._writable.set()
        self._paused_at = 0.0  # when writes last paused (the write-stall clock)
        self._lost = asyncio.Event()
        self._lost.set()
        self._transport: asyncio.Transport | None = None
        self._dead = False
        self._ours = False  # the close is ours (idle, shutdown): nothing to resend
        self._draining = False
        self._drops = 0
        self._connected_at = 0.0
        self._others_due = 0.0

    def __str__(self) -> str:
        return f"link to {self.netid}"

    # --- asyncio.Protocol ------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A TCP transport (uvloop's do not subclass asyncio.Transport, so no isinstance).
        self._transport = cast(asyncio.Transport, transport)
        self._lost.clear()
        self._writable.set()

    def data_received(self, data: bytes) -> None:
        pass  # members never answer on this direction; anything sent is ignored, not kept

    def connection_lost(self, exc: BaseException | None) -> None:
        self._transport = None
        self._writable.set()
        self._held.can_give(self)  # its last write's copies may go now
        self._lost.set()
        if not (self._ours or self._dead):
            self._dropped(exc)

    def pause_writing(self) -> None:
        self._writable.clear()
        self._paused_at = self._loop.time()

    def resume_writing(self) -> None:
        self._writable.set()
        self._held.can_give(self)  # its last write's copies may go now
        self._wakeup.set()  # an idle link arms the timer that lets its written frames go
        self._events.drained(self.netid)

    # --- what the owner uses ---------------------------------------------------------------

    @property
    def dead(self) -> bool:
        """The link has ended (idle, failed or closed); a new one is needed."""
        return self._dead

    @property
    def queued(self) -> int:
        return len(self._pending)

    @property
    def connected(self) -> bool:
        return self._transport is not None

    @property
    def write_buffered(self) -> int:
        transport = self._transport
        return 0 if transport is None else transport.get_write_buffer_size()

    def offer(self, item: Item) -> bool:
        """Queue without waiting; False if the link has ended, its queue is full
        (``max_queue`` frames or ``max_queue_bytes``) or the node's links hold
        ``max_queued_bytes`` and none holds more than this link would
        (:meth:`QueueBytes.make_room`)."""
        opts = self._options
        if self._dead or len(self._pending) >= opts.max_queue:
            return False
        size = item.size
        if self._pending and self._pending_bytes + size > opts.max_queue_bytes:
            return False
        if not self._held.take(size, self):
            return False
        self._pending.append(item)
        self._pending_bytes += size
        self._wakeup.set()
        return True

    def shed(self, need: int) -> int:
        """Let go of about ``need`` bytes for another link's frame (the node's budget is
        full and we hold the most): copies kept to resend first, oldest first, then waiting
        frames, newest first. While writes are paused the peer may not have read the kept
        copies (the transport or the kernel holds them): those of the last write stay
        (the transport holds their bytes anyway), and the others written since
        ``resend_window`` before the pause go on like the waiting frames, as
        :meth:`_stalled` would send them. Frames going on go to the rest of their chunks on
        the next loop turn (not inside the other link's offer; ``stats.shed``). Returns the
        bytes let go: 0 only while paused with nothing but the last write, until writes
        resume or the connection drops (both tell the budget, :meth:`QueueBytes.can_give`)
        or it queues more."""
        freed = 0
        recent = self._recent
        paused = not self._writable.is_set()
        keep = self._last_write if paused else 0
        since = self._paused_at - self._options.resend_window
        moved: list[Item] = []  # in order, to hand on
        while freed < need and len(recent) > keep:
            item = recent.popleft()
            freed += item.size
            self._forget(item)
            if paused and item.sent_at >= since:
                moved.append(item)  # maybe never read
        waiting: list[Item] = []
        while freed < need and self._pending:
            item = self._pending.pop()
            self._pending_bytes -= item.size
            self._held.release(self, item.size)
            freed += item.size
            waiting.append(item)
        moved += reversed(waiting)
        if moved:
            self._stats.shed += len(moved)
            self._loop.call_soon(self._hand_on, moved)
        return freed

    def drain(self) -> None:
        """Write what is queued, close the connection once flushed, and end."""
        self._draining = True
        self._wakeup.set()

    def abort(self) -> None:
        """Drop the connection now, unflushed (after a drain that took too long)."""
        self._ours = True
        if self._transport is not None:
            self._transport.abort()

    async def run(self) -> None:
        """Connect when there is something to send, write batches, end when idle or failed."""
        try:
            while True:
                transport = self._transport
                if not self._pending:
                    if self._draining:
                        await self._flush_and_close()
                        return
                    self._drops = 0  # nothing waits: the next frame connects at once
                    if not await self._wait_for_work():
                        return
                elif transport is not None and transport.is_closing():
                    await self._lost.wait()  # closed by the peer: connection_lost is coming
                elif transport is None:
                    if self._drops >= MAX_DROPS or not await self._connect():
                        self._give_up()
                        return
                elif not self._writable.is_set():
                    if not await self._wait_writable():
                        self._stalled()
                        return
                else:
                    self._write_batch(transport)
                    await asyncio.sleep(0)  # let other links and the readers run
        finally:
            self._dead = True
            self._let_go()
            self._events.room()
            transport = self._transport
            if transport is not None:
                self._ours = True
                if self._writable.is_set():
                    transport.close()
                else:
                    transport.abort()  # a close would wait for a peer that does not read

    # --- inside ----------------------------------------------------------------------------

    async def _wait_for_work(self) -> bool:
        """Wait for a frame (or a drain) up to ``idle_timeout``; False when idle, or stalled
        (writes paused ``write_stall_timeout``: the last frames written are not read).
        Meanwhile written frames are let go as they pass ``resend_window``."""
        opts = self._options
        idle_at = self._loop.time() + opts.idle_timeout
        while not (self._pending or self._draining):
            self._wakeup.clear()
            self._expire()
            due = idle_at
            if not self._writable.is_set():
                due = min(due, self._paused_at + opts.write_stall_timeout)
            elif self._recent:
                due = min(due, self._recent[0].sent_at + opts.resend_window)
            try:
                async with asyncio.timeout_at(due):
                    await self._wakeup.wait()
            except TimeoutError:
                if self._pending or self._draining:
                    break
                if not self._writable.is_set() and due < idle_at:
                    self._stalled()
                    return False
                if due == idle_at:
                    log.debug("%s idle: closing", self)
                    return False
        return True

    async def _wait_writable(self) -> bool:
        """Wait for writes to resume, until ``write_stall_timeout`` after they paused."""
        try:
            async with asyncio.timeout_at(self._paused_at + self._options.write_stall_timeout):
                await self._writable.wait()
        except TimeoutError:
            return self._writable.is_set()
        return True

    async def _flush_and_close(self) -> None:
        transport = self._transport
        if transport is not None:
            self._ours = True
            transport.close()  # asyncio writes out its buffer first
            await self._lost.wait()

    async def _connect(self) -> bool:
        opts = self._options
        if self._drops:
            # The first reconnect after a drop is at once; later ones back off.
            delay = full_jitter(self._drops - 1, opts.retry_base, opts.retry_after, self._rng)
            delay = delay if self._drops > 1 else 0.0
            log.info("%s dropped; reconnecting in %.3f s", self, delay)
            if delay:
                await asyncio.sleep(delay)  # the back-off timer, not a synchronisation
            self._stats.reconnects += 1
        try:
            await open_stream(
                self.netid.host,
                self.netid.port,
                lambda: self,
                connect_timeout=opts.connect_timeout,
            )
        except (OSError, TimeoutError) as exc:
            log.info("%s: cannot connect: %s", self, exc or type(exc).__name__)
            return False
        self._connected_at = self._loop.time()
        self._events.connected(self.netid)
        return True

    def _write_batch(self, transport: asyncio.Transport) -> None:
        opts = self._options
        frames: list[bytes] = []
        items: list[Item] = []
        size = counted = 0
        now = self._loop.time()
        self._expire()
        most = min(BATCH_ITEMS, max(1, opts.max_queue))
        while self._pending and len(frames) < most and size < BATCH_BYTES:
            if items and counted + self._pending[0].size > opts.max_queue_bytes:
                break  # a write's frames all stay counted while the transport holds them
            item = self._pending.popleft()
            self._pending_bytes -= item.size
            with_others = now >= self._others_due
            if with_others:
                self._others_due = now + self._options.others_interval
            try:
                frame = self._events.frame(item, self.netid, with_others)
            except LocalProtocolError as exc:
                log.warning("%s: frame not sent: %s", self, exc)
                self._stats.dropped += 1
                self._held.release(self, item.size)
                continue
            frames.append(frame)
            items.append(item)
            size += len(frame)
            counted += item.size
        self._events.room()
        if not frames:
            return
        transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
        self._last_write = len(items)
        for item in items:
            item.sent_at = now
        self._recent.extend(items)
        self._recent_bytes += counted
        # Keep the frames written last: at most max_queue, and max_queue_bytes unless one
        # frame is larger (never this write's frames, which the transport may still hold).
        recent = self._recent
        while len(recent) > opts.max_queue or (
            self._recent_bytes > opts.max_queue_bytes and len(recent) > len(items)
        ):
            self._forget(recent.popleft())
        self._stats.frames_sent += len(frames)

    def _forget(self, item: Item) -> None:
        """A written frame will not be resent: it no longer counts."""
        self._recent_bytes -= item.size
        self._held.release(self, item.size)

    def _expire(self) -> None:
        """Let go of written frames past ``resend_window`` (never resent), unless writes are
        paused: the transport may still hold them."""
        if not self._writable.is_set():
            return
        cutoff = self._loop.time() - self._options.resend_window
        recent = self._recent
        if recent and recent[0].sent_at <= cutoff:
            while recent and recent[0].sent_at <= cutoff:
                self._forget(recent.popleft())
            self._events.room()

    def _let_go(self) -> None:
        """Forget every frame queued or kept (the link ends, or hands them on)."""
        self._held.release(self, self._pending_bytes + self._recent_bytes)
        self._pending_bytes = self._recent_bytes = 0
        self._pending.clear()
        self._recent.clear()

    def _hand_on(self, items: list[Item]) -> None:
        """Frames this link let go (:meth:`shed`) go to the rest of their chunks."""
        for item in items:
            self._events.reroute(self.netid, item)

    def _dropped(self, exc: BaseException | None) -> None:
        """The peer closed on us: resend what it may have missed (once), then reconnect."""
        now = self._loop.time()
        window = self._options.resend_window
        if now - self._connected_at > window:
            self._drops = 0
        self._drops += 1
        again: list[Item] = []
        twice: list[Item] = []
        for item in self._recent:
            if now - item.sent_at <= window:
                (twice if item.resent else again).append(item)
        resent = sum(item.size for item in again)
        self._held.release(self, self._recent_bytes - resent)  # the others are let go
        self._recent.clear()
        self._recent_bytes = 0
        for item in reversed(again):
            item.resent = True
            self._pending.appendleft(item)
        self._pending_bytes += resent
        self._stats.resent += len(again)
        if again:
            log.info("%s: connection dropped (%s); sending %d frames again", self, exc, len(again))
        # Lost twice: this peer may be what fails, so the rest of the chunk gets them instead.
        for item in twice:
            self._events.reroute(self.netid, item)
        self._wakeup.set()

    def _give_up(self, *, stalled: bool = False, unread: tuple[Item, ...] = ()) -> None:
        """The peer is unreachable: report it, and hand every frame to its chunk's next node."""
        self._dead = True
        self._events.unreachable(self.netid, stalled=stalled)
        items = [*unread, *self._pending]
        self._let_go()
        self._events.room()
        for item in items:
            self._events.reroute(self.netid, item)

    def _stalled(self) -> None:
        """Writes stayed paused ``write_stall_timeout`` s: abort, and give the peer up."""
        log.warning(
            "%s: peer read nothing for %.1f s with %d frames waiting; giving it up",
            self,
            self._options.write_stall_timeout,
            len(self._pending),
        )
        self._stats.stalls += 1
        self.abort()
        # What it may not have read: written since resend_window before writes paused.
        since = self._paused_at - self._options.resend_window
        self._give_up(stalled=True, unread=tuple(i for i in self._recent if i.sent_at >= since))
