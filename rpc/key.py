"""The type of a connection's request key, which :class:`~rpc.peer.Peer` is generic in."""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from typing_extensions import TypeVar

K = TypeVar("K", bound=Hashable, default=Any)
"""A request key: Gotalk's 4-byte request id (``bytes``), Chatter's
:class:`~wire.chatter.Conversation`. A bare ``Peer`` is ``Peer[Any]``."""
