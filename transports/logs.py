"""Logging that a hostile peer cannot turn into a flood.

A peer that breaks the protocol is worth one WARNING line (its address and what it did),
never a traceback. Thousands of such peers must not fill the disk: :class:`RateLimitedLog`
lets ``burst`` lines through per ``window`` seconds and then counts, reporting the count
when the window ends. Here, not in :mod:`rpc`, so that the transports' own
refusals (HTTP requests a WebSocket server cannot take) go through it too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any


class RateLimitedLog:
    """At most ``burst`` records per ``window`` seconds (default 20 per 10 s). How many were
    left out is said in one WARNING when the window ends: by a timer armed on the loop
    running in the logging thread at the first record left out (one per window, only while
    records are left out), or, logged where no loop runs (or the loop stopped first), by
    the next record. Loggers are shared by every thread and loop: a timer is never
    cancelled (that would touch another thread's loop); one that finds its window told
    already does nothing."""

    __slots__ = ("_burst", "_count", "_logger", "_started", "_suppressed", "_window")

    def __init__(self, logger: logging.Logger, *, burst: int = 20, window: float = 10.0) -> None:
        self._logger = logger
        self._burst = burst
        self._window = window
        self._started = 0.0
        self._count = 0
        self._suppressed = 0

    def reset(self) -> None:
        """Start a new window (tests; a process that wants a fresh count)."""
        self._started, self._count, self._suppressed = 0.0, 0, 0

    def warning(self, message: str, *args: Any) -> None:
        self._log(logging.WARNING, message, args, False)

    def exception(self, message: str, *args: Any) -> None:
        """An ERROR record with the exception being handled (its traceback)."""
        self._log(logging.ERROR, message, args, True)

    def error(self, message: str, *args: Any, exc: BaseException, stacklevel: int = 1) -> None:
        """An ERROR record with ``exc``'s traceback (one not being handled here), naming the
        caller ``stacklevel`` frames up (1: the caller of this method), as logging does."""
        self._log(logging.ERROR, message, args, exc, stacklevel)

    def _log(
        self,
        level: int,
        message: str,
        args: tuple[Any, ...],
        exc_info: bool | BaseException,
        stacklevel: int = 1,
    ) -> None:
        logger = self._logger
        if not logger.isEnabledFor(level):
            return
        now = time.monotonic()
        if now - self._started >= self._window:
            self._tell(now)
        if self._count >= self._burst:
            if not self._suppressed:  # the first left out: its count is told at the end
                self._arm(self._started + self._window - now)
            self._suppressed += 1
            return
        self._count += 1
        # stacklevel: the record names the caller of warning()/exception(), not this module
        # (None, not False: a record's exc_info False reads as "has one" to handlers' checks)
        logger.log(level, message, *args, exc_info=exc_info or None, stacklevel=2 + stacklevel)

    def _tell(self, now: float) -> None:
        """The window ended: say how many records it left out, and start a new one."""
        if self._suppressed:
            self._logger.warning(
                "%d similar records suppressed (at most %d per %g s)",
                self._suppressed,
                self._burst,
                self._window,
            )
        self._started, self._count, self._suppressed = now, 0, 0

    def _arm(self, delay: float) -> None:
        """Tell the count ``delay`` seconds from now, on the loop running here, if any."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # a thread without a loop: the next record tells it
        loop.call_later(delay, self._due)

    def _due(self) -> None:
        now = time.monotonic()
        if now - self._started >= self._window:
            self._tell(now)
        elif self._suppressed:  # the loop's clock ran ahead (or a later window's): again then
            self._arm(max(self._started + self._window - now, 0.001))


websocket_violations = RateLimitedLog(logging.getLogger("peerwire.transports.websocket"))
"""Where WebSocket peers that break the rules are reported (requests the HTTP side refused,
input too slow)."""
