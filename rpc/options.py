"""What a connection is set up with: its :class:`Options` and its wire format's
:class:`Adapter` (:mod:`rpc.gotalk_peer`, :mod:`rpc.chatter_peer`)."""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from rpc.key import K
from rpc.message_stall import MessageStall
from rpc.middleware import Middleware
from rpc.registry import Handler
from wire.errors import ProtocolError


@dataclass(slots=True)
class Options:
    """Per-connection settings; every limit is per connection."""

    timeout: float | None = None
    """Seconds a request waits for its result; None = the protocol's default (Chatter 5 s,
    the Chatter conversation timeout; Gotalk 30 s)."""
    max_concurrent: int = 1024
    """Handlers running at once. Past it, peers that understand retry results get one
    (waiting ``retry_wait``); the requests of others (browsers' gotalk.js) wait, read up to
    the backlog's bound and then not read from until a handler finishes
    (:mod:`rpc.backlog`)."""
    retry_wait: float = 0.5
    """Wait we ask for in our retry results, in seconds."""
    retries: int = 5
    """At most this many retry results are honoured per request, all within its timeout."""
    max_size: int = 16 * 1024 * 1024
    """Largest message accepted or sent, in bytes. A result above it becomes an error result;
    a request above it raises PayloadError before anything is sent."""
    max_stream_queue: int = 256
    """Items waiting unread per stream, either way (parts of a stream request to us, results
    of a stream of ours). Past it, or past ``max_size`` bytes of them, the connection stops
    reading until the reader has taken half; a reader that takes none for its stall limit
    (our stream: its ``item_timeout``; a stream request: the request timeout) fails that
    stream alone, our own with StreamOverflow (see :mod:`rpc.stream_hold`). At least 1:
    with 0 a stream's first item would wait for a reader with nothing to take
    (ValueError)."""
    high_water: int = 256 * 1024
    """Unsent output (bytes) above which we handle no input from the peer but replies to our
    calls: the rest is read and kept, in order, up to the backlog's bound
    (:mod:`rpc.backlog`), past which reading pauses."""
    low_water: int = 64 * 1024
    """Unsent output (bytes) below which reading resumes."""
    handshake_timeout: float | None = 10.0
    """Seconds a new connection may take to send its version (Gotalk) or first frame
    (Chatter) before it is closed. A Chatter peer that has sent nothing at all is left to the
    ping limits instead (Hat peers say nothing until their first Ping, after 20 s)."""
    middleware: tuple[Middleware, ...] = ()
    """Wrapped around every call of the connection, both ways, first outermost (see
    :mod:`rpc.middleware`); the registry's own middleware run inside these."""
    max_request_bytes: int = 64 * 1024 * 1024
    """Bytes the peer's requests may hold on the connection: payloads of requests whose
    coroutine handlers have not finished and stream parts not yet read (see
    :mod:`rpc.request_bytes`). Past it new requests are treated as past
    ``max_concurrent`` and stream parts wait, kept (reading goes on), until handlers take or
    finish enough; the first payload always goes in, so the connection holds at most this
    plus ``max_size``. Messages kept unrun while our output waits share it (see
    :mod:`rpc.backlog`: past it come at most the rest of one read and one message). At
    least 1 (ValueError)."""

    min_receive_rate: float | None = 1024.0
    """Bytes a second the peer must send, on average, while its input ends in an unfinished
    message, once ``receive_grace`` has passed; else the connection is closed (see
    :mod:`rpc.message_stall`). None: no such check."""
    receive_grace: float = 10.0
    """Seconds an unfinished message may take before ``min_receive_rate`` counts."""

    def __post_init__(self) -> None:
        if self.max_stream_queue < 1:
            raise ValueError(f"max_stream_queue must be at least 1, not {self.max_stream_queue}")
        if self.max_request_bytes < 1:
            raise ValueError(f"max_request_bytes must be at least 1, not {self.max_request_bytes}")
        if self.min_receive_rate is not None and not self.min_receive_rate > 0:
            raise ValueError(f"min_receive_rate must be positive, not {self.min_receive_rate}")
        if not self.receive_grace > 0:
            raise ValueError(f"receive_grace must be positive, not {self.receive_grace}")


class Adapter(Protocol[K]):
    """What the peer needs from a wire format (see :mod:`rpc.gotalk_peer`)."""

    name: str
    default_timeout: float
    retry_results: bool
    cancels: bool
    """True once both sides announced the cancellation extension."""
    metadata: bool
    """True once both sides take request metadata (extension level 2)."""
    timeout_defaults: bool
    """True once both sides take a default timeout per connection (extension level 3)."""

    stall: MessageStall
    """The least rate of the peer's unfinished messages (:mod:`rpc.message_stall`)."""

    def start(self) -> None: ...
    def stop(self) -> None: ...
    def input_held(self) -> None:
        """We stopped reading the peer for reasons of our own (``Peer.holding_input``):
        keep it hearing from us meanwhile, as its liveness checks expect."""
        ...

    def handshake_pending(self) -> bool:
        """True while the peer's handshake (Gotalk version, first Chatter frame) is begun or
        due and unfinished: at ``handshake_timeout`` such a connection is closed."""
        ...

    def decode(self, data: bytes | memoryview, read_at: float) -> list[Any]:
        """The messages ``data`` completes; ``read_at``: the loop time of its read (for the
        liveness checks: the peer reads the clock once per read)."""
        ...

    @property
    def missing(self) -> int:
        """Bytes the input must still bring to complete the message the codec holds in part
        (0: none; a lower bound while its header is incomplete)."""
        ...

    def dispatch(self, message: Any) -> None: ...
    def is_reply(self, message: Any) -> bool:
        """True when ``message`` answers a call of ours (a result, a stream's result or
        end, an error, a retry): the peer handles such input while its output waits."""
        ...

    def serves_running(self, message: Any) -> bool:
        """True when ``message`` is for a request of the peer's whose handler runs: a part
        or the end of its stream (:meth:`~rpc.responder.Responder.takes_parts`; or of a
        stream that ended lately: dropped at once), or its cancellation
        (:meth:`~rpc.responder.Responder.cancellable`). It runs while every slot is taken:
        that handler holds one, and waits for the part or frees the slot once cancelled.
        Asked only of input that waits."""
        ...

    def feeds_stream(self, message: Any) -> bool:
        """True when ``message`` is a part or the end of a stream request whose handler
        runs now (not one that ended lately): a graceful close drops the others at once."""
        ...

    def opens_request(self, message: Any) -> Hashable | None:
        """The key of the request or stream request ``message`` is (one that
        :meth:`follows_request` gives for what follows it), else None. Asked only of input
        kept in the backlog (:mod:`rpc.backlog`)."""
        ...

    def is_part(self, message: Any) -> bool:
        """True for a part or the end of a stream request (what waits with its stream for
        room in ``max_request_bytes``; its cancellation does not). Asked only of input that
        waits."""
        ...

    def follows_request(self, message: Any) -> Hashable | None:
        """The request (as :meth:`opens_request` names it) that ``message`` follows: a part
        or the end of its stream, its cancellation; whether it runs or not. Else None.
        Asked only of input that waits."""
        ...

    def message_size(self, message: Any) -> int:
        """Bytes a decoded message counts in the peer's backlog (:mod:`rpc.backlog`), besides
        its fixed overhead: its payload and the names it carries
        (:func:`rpc.request_bytes.text_size`)."""
        ...

    def last_word(self, exc: ProtocolError) -> None: ...
    def send_request(self, op: str, payload: Any, stream: bool) -> K: ...
    def send_request_meta(
        self, op: str, payload: Any, stream: bool, entries: Mapping[str, str], timeout: float | None
    ) -> K: ...
    def send_request_part(self, key: K, payload: bytes) -> None: ...
    def send_request_end(self, key: K) -> None: ...
    def send_result(self, key: K, payload: Any, stream: bool) -> None: ...
    def send_result_part(self, key: K, payload: Any) -> None: ...
    def send_result_end(self, key: K, failed: bool) -> None: ...
    def send_error(self, key: K, message: str) -> None: ...
    def send_retry(self, key: K, wait: float, message: str) -> None: ...
    def drop_request(self, key: K) -> None:
        """Request ``key`` of the peer's is dropped unanswered (a graceful close turned it
        away): forget what is kept for it, as its answer would have."""
        ...

    def send_notification(self, name: str, payload: Any) -> None: ...
    def abandon(self, key: K) -> None: ...
    def encode_request(self, op: str, value: Any) -> bytes:
        """A request's value as the payload :meth:`send_request` takes (bytes: the caller
        checks its size against ``max_size`` before sending)."""
        ...

    def encode_result(self, value: Any) -> Any:
        """A handler's result as the payload :meth:`send_result` takes. A ``bytes`` result
        to a single request within ``max_size`` never comes here: it goes out as it is."""
        ...

    def decode_params(self, handler: Handler, payload: Any) -> Any: ...
    def decode_result(self, payload: Any) -> Any: ...
