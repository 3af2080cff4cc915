"""Where an Eventer client connects: its URLs, and a server's address as text."""

from __future__ import annotations

import dataclasses
from typing import Any

import rpc
from wire.chatter import Dialect


def eventer_url(url: str) -> str:
    """``url`` in the current Chatter dialect (the only one that carries the Eventer)."""
    parsed = rpc.parse_url(url)
    if parsed.codec != "sbs":
        raise ValueError(f"the Eventer runs over Chatter (tcp+sbs, ssl+sbs), not {url!r}")
    if parsed.dialect is Dialect.LEGACY:
        raise ValueError(
            f"the Eventer exists only in the current Chatter dialect: {url!r} asks for the "
            "legacy one (drop ?dialect=Hat)"
        )
    return str(dataclasses.replace(parsed, dialect=Dialect.CURRENT))


def address_text(address: Any) -> str:
    """``host:port`` of a socket address (anything else as it is)."""
    if isinstance(address, tuple) and len(address) >= 2:
        host = f"[{address[0]}]" if ":" in str(address[0]) else address[0]
        return f"{host}:{address[1]}"
    return str(address)
