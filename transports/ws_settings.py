"""A WebSocket connection's limits and timers (:class:`Settings`), given by its server or
client (:mod:`transports.websocket`) and read by :mod:`transports.ws_connection`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Settings:
    """Per-connection limits. Timers default as websockets' own (a ping after 20 s without
    input, 20 s for its pong, 10 s to close, 10 s for the opening handshake); ``max_size``
    (16 MiB) and ``high_water`` (256 KiB) as peerwire's RPC connections use, not websockets'
    1 MiB and 32 KiB; ``min_rate`` (1,024 bytes a second, None: no check) and ``rate_grace``
    (10 s) as peerwire's ``min_receive_rate`` and ``receive_grace``: the least rate of the
    payloads of input that ends inside a frame, a fragmented message or a message the sink
    holds part of, once it has been so for the grace (:mod:`transports.ws_input_rate`)."""

    max_size: int | None = 16 * 1024 * 1024
    ping_interval: float | None = 20.0
    ping_timeout: float | None = 20.0
    close_timeout: float = 10.0
    handshake_timeout: float = 10.0
    high_water: int = 256 * 1024
    low_water: int | None = None
    min_rate: float | None = 1024.0
    rate_grace: float = 10.0

    def __post_init__(self) -> None:
        if self.min_rate is not None and not self.min_rate > 0:
            raise ValueError(f"min_rate must be positive or None, not {self.min_rate!r}")
        if not self.rate_grace > 0:
            raise ValueError(f"rate_grace must be positive, not {self.rate_grace!r}")
        names = ("ping_interval", "ping_timeout") if self.ping_interval is not None else ()
        for name in names:  # (ping_timeout only matters with pings on)
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None, not {value!r}")
