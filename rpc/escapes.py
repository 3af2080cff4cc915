"""A handler's BaseException that is not an Exception (a ``class Stop(BaseException)``,
KeyboardInterrupt, SystemExit): how it is logged, and how the last two go on to the loop's
run. Shared by requests (:meth:`rpc.handler_results.HandlerResults.escaped`,
:mod:`rpc.handler_runner`) and notifications (:mod:`rpc.notifications`).

- Logged as errors with their tracebacks on ``peerwire.rpc``, at most 20 per 10 s (then a
  count of those left out), as handlers' failures are: a peer can send what makes a
  handler raise one.
- :data:`PASSED_ON` leave the loop's run once their caller is answered, as asyncio lets
  them leave from a callback or a task. A plain function's (run in the peer's read) is
  raised from a callback of its own (:func:`pass_on`), never in the read, which it would
  leave half done (its output held). At most one waits per loop: a second one, from the
  same read, would fire during ``asyncio.run``'s clean-up once the first left the run
  (while it cancels what is left), cutting that short; it is logged only.
"""

from __future__ import annotations

import asyncio
import logging
import weakref

from transports.logs import RateLimitedLog

PASSED_ON = (KeyboardInterrupt, SystemExit)
"""What a handler raises that goes on to the loop's run once its caller is answered."""

escapes = RateLimitedLog(logging.getLogger("peerwire.rpc"))
"""Where handlers' BaseExceptions are logged (see the module doc)."""

_waiting: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
"""Loops with a pass-on scheduled that has not fired yet."""


def report(
    exc: BaseException,
    message: str,
    *args: object,
    loop: asyncio.AbstractEventLoop | None = None,
) -> None:
    """Log ``exc`` (an error with its traceback; rate-limited). With ``loop`` (a handler
    run in the peer's read), one of :data:`PASSED_ON` is then raised from a callback of
    its own there (:func:`pass_on`); without (the default), a task or job raises it
    itself."""
    if loop is not None and isinstance(exc, PASSED_ON):
        pass_on(loop, exc)
    escapes.error(message, *args, exc=exc, stacklevel=2)  # the record names our caller


def pass_on(loop: asyncio.AbstractEventLoop, exc: BaseException) -> None:
    """Raise ``exc`` from a callback of its own on ``loop``, unless one is waiting there
    already (see the module doc)."""
    if loop in _waiting:
        return
    _waiting.add(loop)
    loop.call_soon(_raise, loop, exc)


def _raise(loop: asyncio.AbstractEventLoop, exc: BaseException) -> None:
    _waiting.discard(loop)
    raise exc
