"""The RPC core over Gotalk v1: requests are ``r``/``s``+``p``, results ``R``/``S``/``E``/``e``.

Request ids are 4 opaque bytes; ours are a little-endian counter (as the Go client's).
Liveness: we send a heartbeat every ``heartbeat_interval`` seconds (well inside the 30 s
read timeout of Go peers) and, when nothing at all arrives for ``read_timeout`` seconds,
send ``f00000003`` and close, as Go peers do.
"""

from __future__ import annotations

import time
from typing import Any

from rpc.peer import Options, Peer
from rpc.registry import Registry
from wire import gotalk
from wire.errors import ProtocolError


class GotalkPeer(Peer):
    protocol_name = "gotalk"

    def __init__(
        self,
        registry: Registry | None = None,
        options: Options | None = None,
        *,
        heartbeat_interval: float | None = 20.0,
        read_timeout: float | None = 30.0,
    ) -> None:
        super().__init__(registry, options)
        self.codec = gotalk.GotalkConnection(max_size=self.options.max_size)
        self.heartbeat_interval = heartbeat_interval
        self.read_timeout = read_timeout
        self._next_id = 0
        self._last_read = self._loop.time()
        self._timer: Any = None
        self.heartbeats_received = 0

    # --- lifecycle -------------------------------------------------------------------------

    def _start(self) -> None:
        if self._framed:
            # Over WebSocket, websockets' own ping detects dead peers, and browsers delay
            # timers (so heartbeats) in background tabs: no Gotalk read timeout there.
            self.read_timeout = None
        self._write(self.codec.handshake())
        self._last_read = self._loop.time()
        self._schedule_tick()

    def _schedule_tick(self) -> None:
        intervals = [t for t in (self.heartbeat_interval, self.read_timeout) if t]
        if intervals:
            self._timer = self._loop.call_later(min(intervals) / 2, self._tick)

    def _tick(self) -> None:
        if not self.is_open:
            return
        now = self._loop.time()
        if self.read_timeout and now - self._last_read > self.read_timeout:
            self._write(self.codec.fault(gotalk.ErrorCode.TIMEOUT))
            self.abort()
            return
        if self.heartbeat_interval:
            self._emit(gotalk.Heartbeat(0, int(time.time()) & 0xFFFFFFFF))
        self._schedule_tick()

    def _stop_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _protocol_failed(self, exc: ProtocolError) -> None:
        code = exc.code if exc.code is not None else gotalk.ErrorCode.INVALID_MESSAGE
        self._write(self.codec.fault(code))

    def _emit(self, message: gotalk.Message) -> None:
        """Queue one message; over WebSocket its header and payload go in separate frames."""
        if self._framed:
            header, payload = gotalk.encode_parts(message)
            self._write(header)
            if payload:
                self._write(payload)
        else:
            self._write(gotalk.encode(message))

    # --- receiving -------------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        for msg in self.codec.receive_data(data):
            cls = msg.__class__
            if cls is gotalk.Request:
                self._on_request(msg.id, msg.op, msg.payload, False)
            elif cls is gotalk.Result:
                self._on_result(msg.id, msg.payload)
            elif cls is gotalk.Notification:
                self._on_notification(msg.name, msg.payload)
            elif cls is gotalk.ErrorResult:
                self._on_error(msg.id, msg.payload.decode(errors="replace"))
            elif cls is gotalk.RetryResult:
                self._on_retry(msg.id, msg.wait / 1000, msg.payload.decode(errors="replace"))
            elif cls is gotalk.StreamResult:
                if msg.payload:
                    self._on_result_part(msg.id, msg.payload)
                else:
                    self._on_result_end(msg.id)
            elif cls is gotalk.StreamRequest:
                if msg.id in self._incoming_streams:
                    raise ProtocolError(
                        "duplicate in-flight stream id", code=gotalk.ErrorCode.INVALID_MESSAGE
                    )
                self._on_request(msg.id, msg.op, msg.payload, True)
            elif cls is gotalk.StreamRequestPart:
                known = (
                    self._on_request_part(msg.id, msg.payload)
                    if msg.payload
                    else self._on_request_end(msg.id)
                )
                if not known:
                    raise ProtocolError(
                        "stream part for an unknown stream", code=gotalk.ErrorCode.INVALID_MESSAGE
                    )
            elif cls is gotalk.Heartbeat:
                self.heartbeats_received += 1
            elif cls is gotalk.Fault:
                self.abort()
                return

    # --- sending ---------------------------------------------------------------------------

    def _new_id(self) -> bytes:
        while True:
            self._next_id = (self._next_id + 1) & 0xFFFFFFFF
            rid = self._next_id.to_bytes(4, "little")
            if rid not in self._calls:
                return rid

    def _send_request(self, op: str, payload: bytes, stream: bool) -> bytes:
        rid = self._new_id()
        cls = gotalk.StreamRequest if stream else gotalk.Request
        self._emit(cls(rid, op, payload))
        return rid

    def _send_request_part(self, key: bytes, payload: bytes) -> None:
        if payload:
            self._emit(gotalk.StreamRequestPart(key, payload))

    def _send_request_end(self, key: bytes) -> None:
        self._emit(gotalk.StreamRequestPart(key, b""))

    def _send_result(self, key: bytes, payload: bytes) -> None:
        self._emit(gotalk.Result(key, payload))

    def _send_result_part(self, key: bytes, payload: bytes) -> None:
        if payload:
            self._emit(gotalk.StreamResult(key, payload))

    def _send_result_end(self, key: bytes) -> None:
        self._emit(gotalk.StreamResult(key, b""))

    _send_result_end_after_error = _send_result_end

    def _send_error(self, key: bytes, message: str) -> None:
        self._emit(gotalk.ErrorResult(key, message.encode()))

    def _send_retry(self, key: bytes, wait: float, message: str) -> None:
        self._emit(gotalk.RetryResult(key, int(wait * 1000), message.encode()))

    def _send_notification(self, name: str, payload: bytes) -> None:
        self._emit(gotalk.Notification(name, payload))
