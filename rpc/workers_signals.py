"""The signals of :func:`rpc.workers.serve_workers`'s parent: :class:`ParentSignals`."""

from __future__ import annotations

import os
import signal
from typing import Any

from rpc.workers_child import PARENT_SIGNALS


class ParentSignals:
    """SIGTERM, SIGINT and SIGHUP in the parent for the whole of
    :func:`~rpc.workers.serve_workers` (its start, the serving, its clean-up): counted,
    never raised, so nothing is cut short; each also wakes the supervisor's wait through
    the wakeup fd (``wake_r``).

    ``count`` counts SIGTERM and SIGINT: the first asks for a graceful stop, a second one
    for the workers left to be killed at once. ``hangups`` counts SIGHUPs before the first
    of those (a rolling restart each; once stopping, SIGHUP is ignored). The previous
    handlers and wakeup fd are back at exit. Main thread only (``signal.signal``)."""

    def __init__(self) -> None:
        self.count = 0
        self.hangups = 0
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        self._previous_wakeup = -1
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> ParentSignals:
        for sig in PARENT_SIGNALS:
            self._previous[sig] = signal.signal(sig, self._on_signal)
        self._previous_wakeup = signal.set_wakeup_fd(self.wake_w)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            signal.set_wakeup_fd(self._previous_wakeup)
            for sig, handler in self._previous.items():
                signal.signal(sig, handler)  # from here a signal may raise again
        finally:
            os.close(self.wake_r)
            os.close(self.wake_w)

    def _on_signal(self, signum: int, frame: object) -> None:
        if signum != signal.SIGHUP:
            self.count += 1
        elif not self.count:
            self.hangups += 1
