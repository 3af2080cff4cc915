"""Which event loop peerwire runs on: ``auto``, ``asyncio`` or ``uvloop``.

``auto`` (the default) is uvloop when it is installed (``pip install 'peerwire[speed]'``),
else asyncio's own loop. The environment variable ``PEERWIRE_LOOP`` sets the choice for
everything that does not name one: ``peerwire`` commands without ``--loop``, the blocking
facade's loop thread (:mod:`rpc.blocking`) and Spark's worker loop (:mod:`rpc.spark`).
Code that runs its own loop with ``asyncio.run`` is not affected: pass
``loop_factory=rpc.loops.loop_factory()`` to ``asyncio.Runner`` instead.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
from collections.abc import Callable, Coroutine
from typing import Any, Literal, TypeVar

T = TypeVar("T")

ENV_VAR = "PEERWIRE_LOOP"
CHOICES = ("auto", "asyncio", "uvloop")

LoopName = Literal["asyncio", "uvloop"]
LoopFactory = Callable[[], asyncio.AbstractEventLoop]


class LoopUnavailable(ValueError):
    """The loop asked for cannot be had: an unknown name, or uvloop is not installed."""


def uvloop_installed() -> bool:
    """Whether ``import uvloop`` would find a module (it is not imported here)."""
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: str | None = None) -> LoopName:
    """The loop ``choice`` means here; ``None`` reads ``PEERWIRE_LOOP`` (default ``auto``).

    Raises :class:`LoopUnavailable` for an unknown name, or for ``uvloop`` when it is not
    installed.
    """
    name = choice if choice is not None else (os.environ.get(ENV_VAR) or "auto")
    if name not in CHOICES:
        source = "" if choice is not None else f" (from ${ENV_VAR})"
        choices = ", ".join(CHOICES)
        raise LoopUnavailable(f"unknown event loop {name!r}{source}: use one of {choices}")
    if name == "auto":
        return "uvloop" if uvloop_installed() else "asyncio"
    if name == "uvloop":
        if not uvloop_installed():
            raise LoopUnavailable(
                "the uvloop event loop was asked for but uvloop is not installed: "
                "pip install 'peerwire[speed]' (or use --loop asyncio)"
            )
        return "uvloop"
    return "asyncio"


def loop_factory(choice: str | None = None) -> LoopFactory:
    """A function that makes a new loop of the resolved kind (see :func:`resolve`)."""
    if resolve(choice) == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def new_event_loop(choice: str | None = None) -> asyncio.AbstractEventLoop:
    """A new, not running, loop of the resolved kind; the caller runs and closes it."""
    return loop_factory(choice)()


def run(main: Coroutine[Any, Any, T], choice: str | None = None) -> T:
    """``asyncio.run(main)`` on the resolved loop kind (Python 3.11's ``asyncio.run`` takes no
    loop factory; ``asyncio.Runner`` does)."""
    try:
        factory = loop_factory(choice)
    except BaseException:
        main.close()  # never started: no "coroutine was never awaited" warning
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


__all__ = [
    "CHOICES",
    "ENV_VAR",
    "LoopFactory",
    "LoopName",
    "LoopUnavailable",
    "loop_factory",
    "new_event_loop",
    "resolve",
    "run",
    "uvloop_installed",
]
