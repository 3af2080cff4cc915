"""A group node's settings, counters and memory footprint, and how peers are named.

Every limit a node applies is a field of :class:`GroupOptions`, with its default; the
modules that enforce them (links, inbound, de-duplication, members) cite the field.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from rpc.group.multicast import MulticastConfig
from wire import DEFAULT_MAX_SIZE
from wire.gossip import DEFAULT_MAX_NETIDS, NetID

__all__ = ["Footprint", "GroupOptions", "GroupStats", "as_netid"]


@dataclass(slots=True)
class GroupOptions:
    """Limits and timers of one node (all per node; queues per peer)."""

    max_size: int = DEFAULT_MAX_SIZE
    """Largest frame sent or accepted (codec limit), in bytes (default 16 MiB)."""
    max_netids: int = DEFAULT_MAX_NETIDS
    """NetIDs a frame's table may name, sent or accepted (codec limit, default 8192); a
    larger one closes the connection. A frame names its sender, up to 16 seen origins,
    ``max_others`` members and its distribution list (at most half the group): keep it
    above ``max_members / 2 + 32``."""
    max_queue: int = 256
    """Frames waiting for one peer; past it that peer is skipped for the frame."""
    max_queue_bytes: int = 16 << 20
    """Bytes of frames waiting for one peer (default 16 MiB; an empty queue takes one frame
    of any size), counted as each frame's payload plus 64 per node in the rest of its
    chunk; past it, as past ``max_queue``. As much again is kept to resend."""
    max_queued_bytes: int = 128 << 20
    """Bytes of frames all links hold together, queued or kept to resend (default
    128 MiB; with nothing held, one frame of any size fits); past it every peer is
    treated as if its queue were full."""
    send_timeout: float = 5.0
    """How long ``notify`` waits for room in full queues, all together, before handing
    their chunks on (members with room are queued first, never kept waiting)."""
    write_stall_timeout: float = 5.0
    """A link whose writes stay paused this long with frames waiting (its peer reads
    nothing) is aborted: the peer counts as failed and its frames go to the rest of their
    chunks. Keep it at most ``send_timeout``, so a notify waits for a stalled peer only
    until it is given up."""
    connect_timeout: float = 2.0
    idle_timeout: float = 30.0
    """An outgoing connection unused this long is closed."""
    inbound_idle_timeout: float = 120.0
    """An inbound connection silent this long between frames is closed (keep it above
    the peers' ``idle_timeout``)."""
    first_frame_timeout: float = 10.0
    """An inbound connection must deliver its first whole frame within this long."""
    frame_timeout: float = 10.0
    """A frame begun on an inbound connection must be complete within this long (slowloris)."""
    retry_base: float = 0.1
    """Back-off base: after ``n`` failures in a row a peer is skipped for a random time in
    ``[0, min(retry_after, retry_base * 2**(n-1))]`` (exponential back-off, full jitter)."""
    retry_after: float = 5.0
    """Back-off cap: the longest a peer we failed to reach is skipped without trying."""
    resend_window: float = 2.0
    """Frames written this recently are sent again if their connection drops."""
    dedup_window: int = 4096
    """Sequence numbers remembered per origin; older ones are taken for duplicates."""
    max_origins: int = 4096
    """Origins whose windows are kept (least recently heard from forgotten first)."""
    max_connections: int = 1024
    """Inbound connections at once; more are closed on arrival."""
    max_members: int = 4096
    """Members learned at most (``learn``; static peers always count), outgoing links to
    non-members at once, and peers whose failures are remembered."""
    forget_after: int = 3
    """A learned member failing this many times in a row is forgotten."""
    max_others: int = 4
    """Random members named in a gossip, so distant nodes learn of each other."""
    others_interval: float = 1.0
    """Name them on each connection at most this often (they cost bytes on every frame)."""
    max_handler_tasks: int = 1024
    """Coroutine handlers running at once; past it a notification is not dispatched."""
    learn: bool = False
    """Grow the member list from received gossip (peers are then only seeds)."""
    multicast: MulticastConfig | None = None
    """UDP multicast settings; None (the default) keeps the node on TCP only."""


@dataclass(slots=True)
class GroupStats:
    """Counters for tests, benchmarks and monitoring."""

    broadcasts: int = 0
    """Own broadcasts sent (``notify``); joins are not counted."""
    frames_sent: int = 0
    frames_received: int = 0
    multicast_sent: int = 0
    multicast_received: int = 0
    own_multicast_ignored: int = 0
    dispatched: int = 0
    """Broadcasts whose handler ran (or, for a coroutine handler, was started)."""
    not_run: int = 0
    """Broadcasts not dispatched: ``max_handler_tasks`` coroutine handlers were running."""
    duplicates: int = 0
    unhandled: int = 0
    skipped: int = 0
    """Chunk heads passed over (down, unreachable, or their queue full)."""
    rerouted: int = 0
    """... of which the chunk went on to its next node."""
    resent: int = 0
    dropped: int = 0
    """Frames given up: a chunk ran out of reachable nodes, or a frame was too large."""
    overflows: int = 0
    """Chunks whose head's queue was full (after ``send_timeout``, for our own broadcast)."""
    shed: int = 0
    """Frames a link handed to the rest of their chunks to make room for another link's
    frame when ``max_queued_bytes`` was full (it held the most): waiting ones, and copies
    kept to resend while its writes were paused (maybe unread)."""
    stalls: int = 0
    """Links aborted after ``write_stall_timeout`` without their peer reading."""
    protocol_errors: int = 0
    """Inbound connections closed for a framing error (bad start byte, length, key, checksum)."""
    malformed: int = 0
    """Frames dropped for their payload (not our envelope, or not the handler's type)."""
    reconnects: int = 0
    """Outgoing connections opened again after one dropped with frames still to send."""
    refused: int = 0
    """Inbound connections refused at ``max_connections``."""
    timeouts: int = 0
    """Inbound connections closed by a timer (first frame, frame, or idle)."""

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Footprint:
    """What a node holds right now: the structures the limits bound (for tests, monitoring)."""

    inbound: int
    """Inbound connections (at most ``max_connections``)."""
    inbound_buffered: int
    """Bytes of incomplete frames held for them (at most ``11 + max_size`` each)."""
    links: int
    """Outgoing links (members, plus at most ``max_members`` to other nodes)."""
    queued: int
    """Frames waiting on links (at most ``2 * max_queue`` each: queue plus resends)."""
    queued_bytes: int
    """Bytes of frames the links hold, queued or kept to resend (at most
    ``max_queued_bytes``, or one frame; counted as for ``max_queue_bytes``)."""
    write_buffered: int
    """Bytes in outgoing transports' buffers: each at most 64 KiB plus one write (64 frames
    or 1 MiB, or one frame up to ``max_size``), whose frames count in ``queued_bytes``."""
    handler_tasks: int
    """Coroutine handlers running (at most ``max_handler_tasks``)."""
    origins: int
    """Origins tracked by the duplicate filter (at most ``max_origins``)."""
    backed_off: int
    """Peers whose failures are remembered (at most ``max_members``)."""


def as_netid(peer: NetID | str | tuple[str, int]) -> NetID:
    """A NetID from a NetID, ``"host:port"`` or ``(host, port)`` (IPv4 only, as the frame)."""
    if isinstance(peer, NetID):
        return peer
    if isinstance(peer, str):
        host, sep, port = peer.rpartition(":")
        if not sep or not port.isdigit():
            raise ValueError(f"not host:port: {peer!r}")
        return NetID(host, int(port))
    address, number = peer
    return NetID(address, number)
