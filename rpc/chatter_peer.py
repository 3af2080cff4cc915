"""The RPC core over Hat Chatter: how requests, results and streams map onto conversations.

=====================  =====================================================================
request                a new conversation: ``type = op``, token passed, ``last = False``
result                 the reply that ends it (``last = True``); ``PeerwireRpc.Result`` for
                       JSON/raw results, or any type the handler names with :class:`Reply`
error / retry result   ``PeerwireRpc.Error`` (String) / ``PeerwireRpc.Retry`` (waitMs,
                       message), ``last = True``
notification           a one-message conversation (``last = True``)
stream request         first message ``type = op`` keeping the token, then
                       ``PeerwireRpc.Part`` messages, then ``PeerwireRpc.End`` passing it
stream result          ``PeerwireRpc.Part`` messages keeping the token, then
                       ``PeerwireRpc.End`` with ``last = True``
=====================  =====================================================================

A handler is keyed by the message type (legacy dialect: ``module.type``), so a plain Hat
peer that sends a message in a new conversation and waits for the reply calls our handlers,
and our ``request`` calls a plain Hat service (any reply that ends the conversation is its
result). Payloads are SBS when the type is in the schema repository, bytes otherwise (JSON
for non-bytes values). Ping: after ``ping_interval`` s of inbound silence we send a Ping;
if nothing arrives within ``ping_timeout`` s more, the connection is closed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import hat.sbs

from rpc.payload import PayloadError, convert, decode_any, encode_value
from rpc.peer import Options, Peer
from rpc.registry import Handler, Registry
from wire import schemas
from wire.chatter import ChatterConnection, Conversation, Dialect, Msg

log = logging.getLogger("peerwire.rpc.chatter")

RPC_MODULE = "PeerwireRpc"
_PART, _END_TYPE, _ERROR, _RETRY, _RESULT = (
    f"{RPC_MODULE}.{t}" for t in ("Part", "End", "Error", "Retry", "Result")
)


@dataclass(slots=True, frozen=True)
class Reply:
    """A result with a message type of its own (e.g. ``HatEventer.MsgQueryRes``).

    ``value`` is SBS-encoded when ``type`` is in the schema repository, else as usual.
    """

    type: str
    value: Any


class ChatterPeer(Peer):
    protocol_name = "chatter"
    default_timeout = 5.0  # the seeds' conversation timeout

    def __init__(
        self,
        registry: Registry | None = None,
        options: Options | None = None,
        *,
        dialect: Dialect | None = None,
        ping_interval: float | None = 30.0,
        ping_timeout: float = 5.0,
        strict: bool = True,
        sbs_repo: hat.sbs.Repository | None = None,
    ) -> None:
        super().__init__(registry, options)
        self.codec = ChatterConnection(dialect, max_size=self.options.max_size, strict=strict)
        self.ping_interval = ping_interval
        self.ping_timeout = ping_timeout
        self.sbs_repo = sbs_repo or schemas.repository()
        self._sbs_names = _sbs_type_names(self.sbs_repo)
        self._last_read = self._loop.time()
        self._ping_sent_at: float | None = None
        self._timer: Any = None
        self._result_type = _RESULT

    # --- names -----------------------------------------------------------------------------

    def _split(self, op: str) -> tuple[str | None, str]:
        """op -> (module, type) for the wire: legacy splits ``module.type``."""
        if self.codec.dialect is Dialect.LEGACY and "." in op:
            module, _, type_name = op.rpartition(".")
            return module, type_name
        return None, op

    @staticmethod
    def _op(msg: Msg) -> str:
        return f"{msg.module}.{msg.type}" if msg.module else msg.type

    def _send(self, op: str, data: bytes, **kwargs: Any) -> Msg:
        module, type_name = self._split(op)
        msg = self.codec.send(type_name, data, module=module, **kwargs)
        self._schedule_flush()  # the codec queues the bytes; _collect_output takes them
        return msg

    def _collect_output(self) -> None:
        data = self.codec.data_to_send()
        if data:
            self._out.append(data)

    # --- lifecycle -------------------------------------------------------------------------

    def _start(self) -> None:
        self._last_read = self._loop.time()
        if self.ping_interval:
            self._timer = self._loop.call_later(self.ping_interval, self._tick)

    def _tick(self) -> None:
        if not self.is_open or not self.ping_interval:
            return
        now = self._loop.time()
        if self._ping_sent_at is not None and self._last_read < self._ping_sent_at:
            if now - self._ping_sent_at >= self.ping_timeout:
                log.warning("chatter ping timeout from %s", self.remote_address)
                self.abort()
                return
            self._timer = self._loop.call_at(self._ping_sent_at + self.ping_timeout, self._tick)
            return
        silent_until = self._last_read + self.ping_interval
        if now >= silent_until and self.codec.dialect is not None:
            self.codec.send_ping()
            self._schedule_flush()
            self._ping_sent_at = now
            self._timer = self._loop.call_at(now + self.ping_timeout, self._tick)
        else:
            self._ping_sent_at = None
            self._timer = self._loop.call_at(max(silent_until, now + 0.01), self._tick)

    def _stop_timers(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _abandon(self, key: Conversation) -> None:
        self.codec.abandon(key)

    # --- receiving -------------------------------------------------------------------------

    def _receive(self, data: bytes) -> None:
        self._last_read = self._loop.time()
        messages = self.codec.receive_data(data)
        for msg in messages:
            op = self._op(msg)
            if msg.owner and msg.first == msg.id:  # a peer starts a conversation
                conv = Conversation(False, msg.id)
                if msg.last:
                    self._on_notification(op, self._incoming_payload(op, msg.data))
                elif msg.token:
                    self._on_request(conv, op, self._incoming_payload(op, msg.data), False)
                else:
                    self._on_request(conv, op, msg.data, True)
                continue
            conv = Conversation.of_received(msg)
            if conv.owner:  # a reply in a conversation we started
                self._on_reply(conv, op, msg)
            elif op == _PART:
                self._on_request_part(conv, msg.data)
            elif op == _END_TYPE:
                self._on_request_end(conv)

    def _on_reply(self, conv: Conversation, op: str, msg: Msg) -> None:
        if op == _RESULT:
            self._on_result(conv, msg.data)
        elif op == _ERROR:
            self._on_error(conv, self._sbs_decode(op, msg.data, str(msg.data)))
        elif op == _RETRY:
            retry = self._sbs_decode(op, msg.data, {"waitMs": 500, "message": "retry"})
            self._on_retry(conv, retry["waitMs"] / 1000, retry["message"])
        elif op == _PART:
            self._on_result_part(conv, msg.data)
        elif op == _END_TYPE:
            self._on_result_end(conv)
        elif msg.last:
            self._on_result(conv, self._incoming_payload(op, msg.data))
        else:
            self._on_result_part(conv, self._incoming_payload(op, msg.data))

    def _sbs_decode(self, op: str, data: bytes, fallback: Any) -> Any:
        try:
            return self.sbs_repo.decode(op, data)
        except Exception:
            log.warning("undecodable %s from %s", op, self.remote_address)
            return fallback

    def _incoming_payload(self, op: str, data: bytes) -> Any:
        """SBS-typed payloads are decoded here; the rest stay bytes for the handler."""
        if op in self._sbs_names:
            return _Sbs(self._sbs_decode(op, data, None))
        return data

    # --- payload hooks ---------------------------------------------------------------------

    def _encode_request(self, op: str, value: Any) -> bytes:
        if op in self._sbs_names:
            try:
                return self.sbs_repo.encode(op, value)
            except Exception as exc:
                raise PayloadError(f"cannot encode {op} as SBS: {exc}") from None
        return encode_value(value)

    def _encode_result(self, value: Any) -> Any:
        if isinstance(value, Reply):
            return value
        return encode_value(value)

    def _decode_params(self, handler: Handler, payload: Any) -> Any:
        if isinstance(payload, _Sbs):
            return convert(payload.value, handler.annotation)
        return handler.decode(payload)

    def _decode_result(self, payload: Any) -> Any:
        if isinstance(payload, _Sbs):
            return payload.value
        return decode_any(payload)

    # --- sending ---------------------------------------------------------------------------

    def _send_request(self, op: str, payload: bytes, stream: bool) -> Conversation:
        msg = self._send(op, payload, token=not stream, last=False)
        return Conversation(True, msg.id)

    def _send_request_part(self, key: Conversation, payload: bytes) -> None:
        self._send(_PART, payload, conversation=key, token=False, last=False)

    def _send_request_end(self, key: Conversation) -> None:
        self._send(_END_TYPE, b"", conversation=key, token=True, last=False)

    def _send_result(self, key: Conversation, payload: Any) -> None:
        if not self.codec.holds_token(key):
            return  # the requester went away or already ended the conversation
        if isinstance(payload, Reply):
            data = (
                self.sbs_repo.encode(payload.type, payload.value)
                if payload.type in self._sbs_names
                else encode_value(payload.value)
            )
            self._send(payload.type, data, conversation=key, last=True)
        else:
            self._send(self._result_type, payload, conversation=key, last=True)

    def _send_result_part(self, key: Conversation, payload: bytes) -> None:
        if self.codec.holds_token(key):
            self._send(_PART, payload, conversation=key, token=False, last=False)

    def _send_result_end(self, key: Conversation) -> None:
        if self.codec.holds_token(key):
            self._send(_END_TYPE, b"", conversation=key, last=True)

    def _send_error(self, key: Conversation, message: str) -> None:
        if self.codec.holds_token(key):
            data = self.sbs_repo.encode(_ERROR, message)
            self._send(_ERROR, data, conversation=key, last=True)

    def _send_retry(self, key: Conversation, wait: float, message: str) -> None:
        if self.codec.holds_token(key):
            data = self.sbs_repo.encode(_RETRY, {"waitMs": int(wait * 1000), "message": message})
            self._send(_RETRY, data, conversation=key, last=True)

    def _send_notification(self, name: str, payload: bytes) -> None:
        self._send(name, payload, last=True)


@dataclass(slots=True, frozen=True)
class _Sbs:
    """A payload already decoded from SBS (as opposed to raw bytes)."""

    value: Any


def _sbs_type_names(repo: hat.sbs.Repository) -> frozenset[str]:
    """Every ``Module.Type`` name the repository defines."""
    return frozenset(
        f"{module['name']}.{type_name}"
        for module in repo.to_json()
        for type_name in module["type_defs"]
    )
