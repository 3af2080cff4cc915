"""The Eventer's message handlers: what each message a client sends does.

=========================  ================================================================
MsgInitReq (last=False)    request handler; answers MsgInitRes (``rpc.Reply``); a refused
                           init is answered with the error, then closed after 0.5 s (a
                           wrong token; with ``system_events``, a client name too long
                           for its DISCONNECTED event to fit in ``max_message_size``)
MsgRegisterReq             request (last=False) -> MsgRegisterRes after the commit;
                           notification (last=True) -> registered, nothing answered
MsgQueryReq                request -> MsgQueryRes; a latest result over
                           ``max_message_size`` -> an error reply (``PeerwireRpc.Error``);
                           one query per connection at a time, run once its output
                           is below ``high_water``; one the client sends once a close
                           drains the connections is not run (the core drops what a
                           peer without retry results sends during its close), nor
                           answered
anything else              closes the connection, as the reference does
=========================  ================================================================

A message before a successful init, or a second init, also closes the connection.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

import rpc
from rpc.eventer.codec import (
    decode,
    encode,
    encode_query_result,
    encode_register_res,
    optional_from_sbs,
    query_params_from_sbs,
    status_to_sbs,
)
from rpc.eventer.fanout import AckSender, ClientInfo
from rpc.eventer.sessions import SessionFuture
from rpc.eventer.store import ResultTooLarge
from rpc.eventer.subscription import Subscription
from rpc.eventer.values import (
    MSG_EVENTS_ACK,
    MSG_EVENTS_NOTIFY,
    MSG_INIT_REQ,
    MSG_INIT_RES,
    MSG_QUERY_REQ,
    MSG_QUERY_RES,
    MSG_REGISTER_REQ,
    MSG_REGISTER_RES,
    MSG_STATUS_NOTIFY,
    InvalidMessage,
    QueryError,
)
from rpc.registry import Handler, HandlerKind
from transports.logs import RateLimitedLog

if TYPE_CHECKING:
    from rpc.eventer.service import Service

log = logging.getLogger("peerwire.eventer.server")
dropped = RateLimitedLog(log)
"""Registrations sent as notifications and refused: at most 20 lines per 10 s."""

INIT_REFUSED_CLOSE_TIMEOUT = 0.5
"""After a refused init, seconds the client gets to close before we do (the reference's)."""

LONGEST_CLIENT_STATUS = "DISCONNECTED"
"""The longer of a client's system events' payloads (the other is CONNECTED)."""

_CLIENT = "eventer.client"
_REFUSED = "eventer.refused"


class _ClosingRegistry(rpc.Registry):
    """A registry whose answer for a message type it has no handler for is ``closing``,
    a handler that closes the connection: the reference closes on any message type it does
    not expect, before the init and after it."""

    def __init__(self, closing: Callable[[Any], None]) -> None:
        super().__init__()
        # payload taken as it comes (bytes, or an SBS value): nothing to decode, or to fail
        self._closing_request, self._closing_notification = (
            dataclasses.replace(Handler.of("(unknown)", closing, kind, bytes), annotation=Any)
            for kind in (HandlerKind.REQUEST, HandlerKind.NOTIFICATION)
        )

    def get(self, name: str) -> Handler:
        return super().get(name) or self._closing_request

    def get_notification(self, name: str) -> Handler:
        return super().get_notification(name) or self._closing_notification


class Handlers:
    """:attr:`registry` holds a handler for every HatEventer message type, and closes the
    connection on any other."""

    def __init__(self, service: Service) -> None:
        self._service = service
        self._config = service.config
        self._conn_ids = itertools.count(1)
        registry = _ClosingRegistry(self._on_unexpected)
        registry.handle(MSG_INIT_REQ)(self._on_init)
        registry.handle(MSG_REGISTER_REQ)(self._on_register_request)
        registry.handle_notification(MSG_REGISTER_REQ)(self._on_register_notification)
        registry.handle(MSG_QUERY_REQ)(self._on_query)
        # messages only a server sends, or only inside a conversation: the reference
        # closes a connection that starts a conversation with one of them
        for msg_type in (
            MSG_INIT_RES,
            MSG_STATUS_NOTIFY,
            MSG_EVENTS_NOTIFY,
            MSG_EVENTS_ACK,
            MSG_REGISTER_RES,
            MSG_QUERY_RES,
        ):
            registry.handle(msg_type)(self._on_unexpected)
            registry.handle_notification(msg_type)(self._on_unexpected)
        self.registry = registry

    def _on_unexpected(self, data: bytes) -> None:
        _drop(rpc.current_peer.get(), "unexpected message type")

    def _on_init(self, data: bytes) -> rpc.Reply:
        peer = rpc.current_peer.get()
        if _CLIENT in peer.state or _REFUSED in peer.state:
            _drop(peer, "init sent twice")
            raise InvalidMessage("init sent twice")
        try:
            req = decode(MSG_INIT_REQ, data)
            subscription = Subscription(req["subscriptions"])
        except (InvalidMessage, ValueError) as exc:
            return self._refuse(peer, str(exc))
        token = optional_from_sbs(req["clientToken"])
        if token is not None and token != self._config.token:
            return self._refuse(peer, "invalid client token")
        service = self._service
        if service.closing:
            return self._refuse(peer, "server is stopping")
        name = req["clientName"]
        if self._config.system_events and not service.system_event_fits(
            ("eventer", name), LONGEST_CLIENT_STATUS
        ):
            # its CONNECTED and DISCONNECTED events could not be registered: refused here,
            # in a MsgInitRes its client can read (it used to get a PeerwireRpc.Error)
            return self._refuse(
                peer,
                f"client name of {len(name.encode())} bytes too long for its system events "
                f"(max_message_size {self._config.max_message_size})",
            )
        client = ClientInfo(
            id=next(self._conn_ids),
            name=name,
            token=token,
            subscription=subscription,
            server_id=optional_from_sbs(req["serverId"]),
            persisted=req["persisted"],
            peer=peer,
        )
        if self._config.events_ack:
            client.sender = AckSender(
                client, self._config.ack_timeout, self._config.max_client_backlog, service.tasks
            )
        if self._config.system_events:
            service.register_system_nowait(("eventer", client.name), "CONNECTED")
        # its own CONNECTED is not notified to it
        client.since_session = service.registrar.last_session
        service.fanout.add(client)
        peer.state[_CLIENT] = client
        peer.closed.add_done_callback(lambda _: self._on_closed(peer))
        log.info(
            "eventer client %d %r connected from %s", client.id, client.name, peer.remote_address
        )
        res = ("success", status_to_sbs(service.status))
        return rpc.Reply(MSG_INIT_RES, encode(MSG_INIT_RES, res))

    def _refuse(self, peer: rpc.Peer, message: str) -> rpc.Reply:
        log.warning("eventer init from %s refused: %s", peer.remote_address, message)
        peer.state[_REFUSED] = True
        self._service.tasks.spawn(_close_later(peer, INIT_REFUSED_CLOSE_TIMEOUT))
        return rpc.Reply(MSG_INIT_RES, encode(MSG_INIT_RES, ("error", message)))

    def _on_closed(self, peer: rpc.Peer) -> None:
        service = self._service
        client = service.fanout.remove(peer)
        if client is None:
            return
        log.info("eventer client %d %r disconnected", client.id, client.name)
        if self._config.system_events and not service.closing:
            service.register_system_nowait(("eventer", client.name), "DISCONNECTED")

    def _on_register_request(self, data: bytes) -> rpc.Reply | Coroutine[Any, Any, rpc.Reply]:
        _client()
        try:
            future = self._service.submit_request(data)
        except InvalidMessage as exc:
            log.warning("registration refused: %s", exc)
            future = None
        if future is None:
            return rpc.Reply(MSG_REGISTER_RES, encode_register_res(None))
        return _register_reply(future)  # the core awaits it: answered after the commit

    def _on_register_notification(self, data: bytes) -> None:
        if _client_or_drop() is None:
            return
        service = self._service
        try:
            session = service.submit(data, None)
        except InvalidMessage as exc:
            log.warning("registration dropped: %s", exc)
            return
        if session is None:
            dropped.warning(
                "registration without response dropped (status %s, %d bytes wait for the disk)",
                service.status.value,
                service.writer.pending_bytes,
            )

    async def _on_query(self, data: bytes) -> rpc.Reply:
        """One query of a connection runs at a time, and only once the client has taken
        our output (below the core's ``high_water``, 256 KiB): its result is made when it
        can be sent. A client that sends many queries and reads nothing thus makes the
        server hold at most two results (the one the transport holds, and the one made
        before the client stopped reading), not one per query (1,024 at once, the core's
        ``max_concurrent``: all the queries of one read used to run at once, each result
        waiting in memory for the client to read)."""
        client = _client()
        peer = rpc.current_peer.get()
        async with client.query_turn:
            await peer.drain()  # ConnectionClosed once it is gone: nothing to answer
            try:
                params = query_params_from_sbs(decode(MSG_QUERY_REQ, data))
                blobs, more = await self._service.query(params)
            except ResultTooLarge as exc:
                # MsgQueryRes has no error field: an error reply; hat's client closes on
                # it, which fails its query instead of leaving it waiting forever
                log.warning("query from %s refused: %s", peer.remote_address, exc)
                raise QueryError(f"{exc} (max_message_size)") from None
            except (InvalidMessage, ValueError, KeyError) as exc:
                _drop(peer, f"query failed: {exc}")
                raise
            return rpc.Reply(MSG_QUERY_RES, encode_query_result(blobs, more))


async def _register_reply(future: SessionFuture) -> rpc.Reply:
    return rpc.Reply(MSG_REGISTER_RES, encode_register_res(await future))


def _client() -> ClientInfo:
    """The calling connection's client; raises (after closing it) before an init."""
    client = _client_or_drop()
    if client is None:
        raise InvalidMessage("message before a successful init")
    return client


def _client_or_drop() -> ClientInfo | None:
    peer = rpc.current_peer.get()
    client: ClientInfo | None = peer.state.get(_CLIENT)
    if client is None:
        _drop(peer, "message before a successful init")
    return client


def _drop(peer: rpc.Peer, reason: str) -> None:
    """The reference closes a connection that breaks the protocol; so do we."""
    log.warning("closing eventer connection from %s: %s", peer.remote_address, reason)
    peer.abort()


async def _close_later(peer: rpc.Peer, timeout: float) -> None:
    """Give a refused client ``timeout`` s to close, then close."""
    await asyncio.wait([peer.closed], timeout=timeout)
    peer.abort()
