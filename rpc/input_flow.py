"""Input flow: what a connection does with the messages of a read, when it reads on, and
when it stops.

:class:`InputFlow` is the part of :class:`~rpc.peer.Peer` that decides, per message, whether
it runs now or waits in the connection's :class:`~rpc.backlog.Backlog` (whose module doc
states the bound), and when reading pauses and resumes:

- a message runs at once unless our output waits (above ``high_water``), a stream's full
  queue holds the input (:mod:`rpc.stream_hold`), or it finds no slot: a notification
  while ``max_concurrent`` tasks run, a request from a peer without retry results while
  ``max_concurrent`` handlers run or ``max_request_bytes`` is taken (a peer with them gets
  a retry result instead). Replies to our calls run at once but behind a stream's full
  queue, and so do the parts of stream requests whose handlers run and the cancellations
  of running handlers, unless our output waits (:meth:`InputFlow._runs_now`);
- while a message waits, reading goes on (replies run, the rest is kept) up to the
  backlog's bound, unless :meth:`InputFlow._holds_all`, a message that refused to run
  (InputHeld from its handler), or kept messages that may run now (the backlog not
  ``sorted``, or a stream's parts put back ``front``: they run first) pause it at once;
- a part of a running stream that finds ``max_request_bytes`` taken (NoRoom) is set aside,
  with what of its stream follows, until room comes back (:meth:`InputFlow._bytes_freed`),
  and reading goes on: the handlers holding the bytes may wait for replies;
- a read is handled ``MESSAGES_PER_TURN`` messages at a time; the rest waits a turn;
- a graceful close's end (or a protocol violation) reads the peer's input only to drop it
  (:meth:`InputFlow.drop_input`): none of the above resumes reading then. (During the
  close the input is read as ever; what it no longer runs is the responder's choice,
  :meth:`~rpc.responder.Responder.turned_away`.)

It shares the peer's state (slots set up by :class:`~rpc.peer.Peer`).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Generic

from rpc.backlog import MESSAGES_PER_TURN, Backlog
from rpc.closing import NOT_CLOSING
from rpc.key import K
from rpc.responder import NoTaskSlot, current_peer
from rpc.stream_hold import InputHeld, NoRoom, RoomStall, StreamHold
from wire.errors import ProtocolError

if TYPE_CHECKING:
    from rpc.handler_runner import HandlerRunner
    from rpc.options import Adapter, Options
    from rpc.outbox import Outbox
    from rpc.request_bytes import RequestBytes
    from rpc.tasks import TaskSet

log = logging.getLogger("peerwire.rpc")

READ, DROPPED = 0, 1
"""The phases of a connection's input (:attr:`InputFlow._input_end`): read as the flow
decides; read and dropped while the transport closes (:meth:`InputFlow.drop_input`: a
graceful close's end, a protocol violation), until the connection is gone."""


class InputFlow(Generic[K]):
    """The input flow of a connection (mixed into :class:`~rpc.peer.Peer`, which sets up
    the attributes below)."""

    adapter: Adapter[K]
    options: Options
    outbox: Outbox
    resumed_at: float
    _loop: asyncio.AbstractEventLoop
    _transport: Any
    _kept: Backlog
    _backlog: Any
    _reading: bool
    _unread: tuple[bytes, int, float] | None
    _input_end: int
    _close_began: float
    _hold_told: bool
    _output_hold: bool
    _stream_hold: StreamHold
    _room_stall: RoomStall
    _tasks: TaskSet
    _task_slots: int
    _runner: HandlerRunner[K]
    _request_bytes: RequestBytes

    if TYPE_CHECKING:

        @property
        def handlers_running(self) -> int: ...
        @property
        def protocol_name(self) -> str: ...
        def abort(self, exc: BaseException | None = None, *, refused: bool = False) -> None: ...
        def _violation(self, exc: ProtocolError) -> None: ...
        def turned_away(self) -> bool: ...
        def _read(self, data: bytes, pos: int, read_at: float) -> None: ...

    def _held(self, message: Any) -> bool:
        """True when ``message`` may not run now: a stream's full queue holds all input;
        our backed-up output or :meth:`_other_holds` all but what :meth:`_runs_now`."""
        if self._stream_hold.active:
            return True
        return (self.outbox.blocked or self._other_holds()) and not self._runs_now(message)

    def _runs_now(self, message: Any) -> bool:
        """True for input that runs while the rest waits (never behind a stream's full
        queue): replies to our calls; unless our output waits, the parts and end of a
        stream request whose handler runs, or the cancellation of a running handler: that
        handler may hold the slot the rest waits for; and a request or notification a
        graceful close turns away (:meth:`~rpc.responder.Responder.turned_away`): dropped,
        it takes no slot, and kept it would fill the backlog and stop the reading of what
        the close waits for (replies, parts of running streams), and the parts of a stream
        it turned away or that ended, whose handler no longer takes them."""
        adapter = self.adapter
        if adapter.is_reply(message):
            return True
        if not self.outbox.blocked and adapter.serves_running(message):
            return True
        if self._close_began == NOT_CLOSING or adapter.retry_results:
            return False
        if adapter.is_part(message):  # of a stream whose handler does not run (turned away,
            # ended lately, or forgotten) and not behind its kept request: dropped as it
            # runs, at once, else it would fill the backlog behind the slots
            key = adapter.follows_request(message)
            return not adapter.feeds_stream(message) and not self._kept.keeps_request(key)
        return (
            adapter.follows_request(message) is None  # (not a cancellation, kept in
            and self.turned_away()  # order behind the request it cancels)
        )

    def _other_holds(self) -> bool:
        """True while the peer's input other than replies waits for more than our output: a
        stream's full queue, every notification (and ``on_open``) task slot taken
        (``_task_slots``), or every handler slot or ``max_request_bytes`` taken for a peer
        that does not understand retry results (one that does gets them instead)."""
        if self._stream_hold.active or len(self._tasks) >= self._task_slots:
            return True
        full = self.handlers_running >= self.options.max_concurrent or self._request_bytes.full
        return full and not self.adapter.retry_results

    def _holds_all(self) -> bool:
        """True while all the peer's input waits unread, replies to our calls too: a stream's
        full queue (its items come in order), or :meth:`_other_holds` with no handler of
        ours running (``max_concurrent=0`` for a peer that takes no retry results). Else
        reading goes on while input waits, replies run, the rest is kept up to the
        backlog's bound: the handlers that hold the slots may wait for replies from this
        very peer, which would otherwise come only after their calls timed out."""
        if self._stream_hold.active:
            return True
        return not self.handlers_running and self._other_holds()

    def _run(self, messages: list[Any], budget: int = MESSAGES_PER_TURN) -> None:
        """Dispatch one read's messages, with :data:`current_peer` set for them all (the
        handlers they run, and the tasks those start, see it); past ``budget`` of them the
        rest is kept for the next turn (what a turn has left: a read's first slices used
        the rest, :meth:`~rpc.peer.Peer._read`)."""
        # _held() and handlers_running inlined: this check runs once per message (the
        # notification tasks' bound is checked by notifications alone: NoTaskSlot)
        dispatch = self.adapter.dispatch
        outbox = self.outbox
        slots = None if self.adapter.retry_results else self.options.max_concurrent
        tasks = self._tasks
        runner = self._runner
        held = self._request_bytes
        runs_now = self._runs_now
        kept = self._kept
        room = kept.room  # streams whose parts wait for max_request_bytes: theirs wait too
        token = current_peer.set(self)  # type: ignore[arg-type]  # (mixed into Peer)
        try:
            for index, message in enumerate(messages):
                if (
                    outbox.blocked
                    or (
                        slots is not None
                        and (len(tasks) + runner.jobs >= slots or held.used >= held.limit)
                    )
                ) and not runs_now(message):
                    self._hold(messages, index)
                    return
                if room and kept.waits_room(message):
                    held.reserved += kept.wait_room(message, kept.read_at)
                    if kept.full:  # reading pauses until room comes back; a turn for
                        # what the rest holds that may run now (replies, cancellations):
                        # the handlers holding the bytes may wait for it (as in _hold)
                        self._keep(messages, index + 1, turn=index + 1 < len(messages))
                        return
                    continue
                if index == budget:  # a flood: let other connections have a turn
                    self._keep(messages, index, turn=True)
                    return
                try:  # free unless raised (3.11's zero-cost exceptions)
                    dispatch(message)
                except (NoTaskSlot, NoRoom):  # it waits for a task or bytes; replies still run
                    self._hold(messages, index)
                    return
                except InputHeld:  # a handler's refusal, or an item for a full stream
                    self._kept.refused = message  # (reading stays paused until it ran)
                    self._keep(messages, index)
                    return
        finally:
            current_peer.reset(token)

    def _hold(self, messages: list[Any], start: int) -> None:
        """The rest of a read from ``messages[start]``, which may not run now or comes after
        messages that wait: reading goes on (:meth:`~rpc.backlog.Backlog.take`) unless
        :meth:`_holds_all`, a message that refused to run, or kept messages that may run
        now (not ``sorted``, or ``front``: they run first) keep them all, reading paused."""
        kept = self._kept
        if (
            not self._reading
            or kept.refused is not None
            or not kept.sorted
            or kept.front is not None
            or self._holds_all()
        ):
            self._keep(messages, start)
            return
        end = min(len(messages), MESSAGES_PER_TURN)  # (no handler runs: no current_peer)
        stop = kept.take(messages, start, end, self._runs_now, self.adapter.dispatch)
        if stop < len(messages) or kept.full:  # or a stream's queue full, a turn's end
            # a turn for what the rest holds that may run now (replies, parts of running
            # streams): the handler that would give the next turn may wait for it
            self._keep(messages, stop, turn=stop < len(messages))

    def _keep(self, messages: list[Any], start: int, turn: bool = False) -> None:
        """Keep ``messages[start:]`` in order and pause reading (until the next ``turn``);
        with ``max_request_bytes`` taken, stream handlers that do not read fail in time."""
        self._kept.extend(messages[start:])
        self._pause_reading()
        if self._request_bytes.full:
            self._room_stall.arm()
        if turn:
            self._kept.next_turn()

    def _continue(self) -> None:
        """Handle held-back messages once output drained or a handler slot freed; unless
        :meth:`_holds_all`, handle the replies among them and read on."""
        backlog = self._backlog
        kept = self._kept
        if self._transport is None:
            return
        if kept.room_due:
            kept.room_back()
        token = current_peer.set(self)  # type: ignore[arg-type]  # (mixed into Peer)
        try:
            adapter = self.adapter  # _held(): room for a notification too
            handled = kept.run(self._held, adapter.dispatch, MESSAGES_PER_TURN)
            if handled == MESSAGES_PER_TURN and backlog:  # a turn's worth: the rest later
                self.outbox.flush()
                kept.next_turn()
                return
            if backlog and not kept.sorted and not self._holds_all():  # replies, then read on
                budget = MESSAGES_PER_TURN - handled
                handled += kept.run_replies(self._runs_now, adapter.dispatch, budget)
                if not kept.sorted and not self._stream_hold.active and kept.refused is None:
                    kept.next_turn()  # past the turn's (a refusal's end gives the turn)
        except ProtocolError as exc:
            self._violation(exc)
            return
        except Exception as exc:  # as in data_received: no half-dead connection, reading paused
            log.exception("%s: unexpected error handling input; closing", self.protocol_name)
            self.abort(exc)
            return
        finally:
            current_peer.reset(token)
        self.outbox.flush()
        if kept.refused is not None:  # reading went on while the output waited: not past it
            self._pause_reading()
        if not self._reading and self._may_read(kept):
            if handled:  # what this turn handled may have woken readers of our streams:
                self._kept.next_turn()  # they run first, and reading resumes after them (uvloop
                return  # reads before the callbacks queued meanwhile: a stream overflowed)
            if self._unread is not None:  # the rest of a read cut in slices comes first
                data, pos, read_at = self._unread
                self._unread = None
                self._read(data, pos, read_at)  # (which may leave a rest again)
                if kept.refused is None:  # the rest, or reading, at the next turn (a
                    kept.next_turn()  # refusal's end gives it: tried again before, refused)
                return
            self._reading = True
            self._room_stall.disarm()
            self._hold_told = False
            self._output_hold = False
            self.resumed_at = self._loop.time()
            self._transport.resume_reading()
        elif not self._reading:  # a pause that began otherwise (a turn, output) holds now
            self._tell_hold()
            if self._request_bytes.full:  # (and the bytes may have filled meanwhile)
                self._room_stall.arm()

    def _may_read(self, kept: Backlog) -> bool:
        """True when reading may resume: nothing waits, or only our output holds what does
        and the backlog has room, and no Ping answered while the output waits nor a message
        that refused to run (``kept.refused``) stops it. Never once the input is dropped
        (:meth:`drop_input`)."""
        if (
            self._input_end
            or kept.refused is not None
            or (self._output_hold and self.outbox.blocked)
        ):
            return False
        if not kept.messages:  # (parts may wait for room all the same: they count)
            return not kept.full
        return kept.sorted and kept.front is None and not kept.full and not self._holds_all()

    def _keep_unread(self) -> None:
        """A graceful close begins: the rest of a read not decoded yet (``_unread``) is
        decoded and kept whole, as it was read before the close, which waits for what was
        (:meth:`~rpc.closing.Closing.close`; reading is paused already)."""
        unread = self._unread
        if unread is None:
            return
        self._unread = None
        data, pos, read_at = unread
        self._kept.read_at = read_at
        try:
            messages = self.adapter.decode(data[pos:], read_at)
        except ProtocolError as exc:
            self._violation(exc)
            return
        self._keep(messages, 0)

    def answered_while_blocked(self) -> None:
        """The codec answered input itself (Chatter Pongs) while our output waits: reading
        stops until it drains, so a peer that pings and never reads adds one read's worth."""
        self._output_hold = True
        self._pause_reading()

    def _task_done(self) -> None:
        """A handler ended (a task leaving the task set, or a job of the runner, called from
        inside its task): held-back input waits for a turn of its own, so that it neither
        runs in that task nor inherits its context variables."""
        if self._backlog and self._transport is not None:
            self._kept.next_turn()

    def _bytes_freed(self) -> None:
        """``max_request_bytes`` has room again (:mod:`rpc.request_bytes`): the parts that
        waited for it go first (:meth:`~rpc.backlog.Backlog.room_back`) at the backlog's
        next turn, not now: this may come in the middle of a read (a queued job cancelled),
        whose later parts would then overtake them."""
        kept = self._kept
        if kept.room:
            kept.room_due = True
            if self._transport is not None:
                kept.next_turn()
        else:
            self._task_done()

    def drop_input(self) -> None:
        """The end of a graceful close, for a peer that takes no retry results (see
        :meth:`~rpc.closing.Closing.close`), as its transport closes: what the backlog still
        keeps is dropped, and reading resumes, everything read then dropped unrun
        (:meth:`~rpc.peer.Peer.data_received`): a TLS
        close_notify or a WebSocket close frame behind the requests left unread ends the
        closing handshake, within the linger (:data:`~rpc.closing.LINGER`). Lasts until the
        connection is gone. Also after a protocol violation (:meth:`~rpc.peer.Peer._violation`),
        whose WebSocket closing handshake reads on too: nothing the peer sends then runs."""
        if self._input_end == DROPPED or self._transport is None:
            return
        self._input_end = DROPPED
        self._kept.clear()
        self._unread = None
        if not self._reading:
            self._reading = True
            self._transport.resume_reading()

    def _pause_reading(self) -> None:
        if self._reading and self._transport is not None:
            self._reading = False
            self._transport.pause_reading()
            self._tell_hold()

    def _tell_hold(self) -> None:
        """Once per hold (see :attr:`holding_input`): the adapter keeps the peer hearing
        from us meanwhile, as its liveness checks expect."""
        if not self._hold_told and self.holding_input:
            self._hold_told = True
            self.adapter.input_held()

    @property
    def reading(self) -> bool:
        """True while the peer is read: not paused by us (see :meth:`_pause_reading`)."""
        return self._reading

    @property
    def input_unfinished(self) -> bool:
        """True while the peer's input ends in an unfinished message: a WebSocket connection
        then checks the rate of what comes (:mod:`transports.ws_input_rate`). Not while the
        rest of a read waits undecoded (``_unread``, reading paused): that rest is here, and
        the connection asks again when reading resumes."""
        return self.adapter.stall.unfinished and self._unread is None

    @property
    def holding_input(self) -> bool:
        """True while we hold the peer's input for reasons of our own (handler slots or
        notification tasks all taken, a turn given to other connections, a stream's full
        queue, ``max_request_bytes``) and something will end the hold (a handler running, a
        turn due, a stall limit); not while it stopped reading our output. The liveness
        checks (read timeout, Ping, keepalive) then count it alive, since what it sent waits
        unread. A handler that never ends holds it for good."""
        busy = self._kept.turn is not None or self.handlers_running > 0
        return not self._reading and not self.outbox.blocked and (busy or self._stream_hold.active)
