"""Handler registration: ``@registry.handle("op")`` and friends.

A module-level default registry backs :func:`rpc.handle`, :func:`rpc.handle_stream` and
:func:`rpc.handle_notification`; create a :class:`Registry` to keep handlers apart.
"""

from __future__ import annotations

import enum
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rpc.payload import decoder_for

if typing.TYPE_CHECKING:
    from rpc.middleware import Middleware


class HandlerKind(enum.Enum):
    REQUEST = "request"
    STREAM = "stream"  # receives an async iterator of request parts
    NOTIFICATION = "notification"


@dataclass(slots=True, frozen=True)
class Handler:
    name: str
    fn: Callable[..., Any]
    kind: HandlerKind
    annotation: Any
    decode: Callable[[bytes], Any]
    is_async: bool
    """An ``async def`` or an async generator function."""
    coroutine: bool
    """An ``async def`` (its call returns a coroutine): on a connection without
    middleware, a single request for it with its caller's deadline runs on the plain path
    (:meth:`rpc.responder.Responder.serve_bounded`)."""

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any], kind: HandlerKind, annotation: Any) -> Handler:
        """The handler ``fn`` for ``name``: its decoder made for ``annotation`` (the type
        of its parameter, or of each part for a stream handler), and what kind of
        function it is read from ``fn``."""
        coroutine = inspect.iscoroutinefunction(fn)
        is_async = coroutine or inspect.isasyncgenfunction(fn)
        return cls(name, fn, kind, annotation, decoder_for(annotation), is_async, coroutine)


def _first_param_annotation(fn: Callable[..., Any]) -> Any:
    try:
        hints = typing.get_type_hints(fn)
    except (NameError, AttributeError, TypeError, SyntaxError):
        # unresolvable or malformed forward references: fall back to the raw annotations
        hints = getattr(fn, "__annotations__", {})
    params = list(inspect.signature(fn).parameters.values())
    if not params:
        return inspect.Parameter.empty
    return hints.get(params[0].name, inspect.Parameter.empty)


class Registry:
    """Named handlers for requests, stream requests and notifications."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._notifications: dict[str, Handler] = {}
        self._middleware: list[Middleware] = []

    def _register(self, name: str, fn: Callable[..., Any], kind: HandlerKind) -> Handler:
        annotation = _first_param_annotation(fn)
        if kind is HandlerKind.STREAM:
            # parts: AsyncIterator[X] / AsyncIterable[X] -> each part decoded as X
            args = typing.get_args(annotation)
            annotation = args[0] if args else inspect.Parameter.empty
        handler = Handler.of(name, fn, kind, annotation)
        table = self._notifications if kind is HandlerKind.NOTIFICATION else self._handlers
        table[name] = handler
        return handler

    def handle(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a request handler: ``fn(params) -> result`` (sync, async, or an async
        generator for a streamed result)."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._register(name, fn, HandlerKind.REQUEST)
            return fn

        return register

    def handle_stream(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a stream-request handler: ``fn(parts: AsyncIterator) -> result``."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._register(name, fn, HandlerKind.STREAM)
            return fn

        return register

    def handle_notification(self, name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register a notification handler: ``fn(value) -> None``."""

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            self._register(name, fn, HandlerKind.NOTIFICATION)
            return fn

        return register

    def use(self, middleware: Middleware) -> Middleware:
        """Wrap every call served by this registry's handlers in ``middleware`` (see
        :mod:`rpc.middleware`); the first one added runs outermost. Read when a connection
        opens: connections already open keep the middleware they had. Usable as a
        decorator."""
        self._middleware.append(middleware)
        return middleware

    @property
    def middleware(self) -> tuple[Middleware, ...]:
        """The middleware added with :meth:`use`, outermost first."""
        return tuple(self._middleware)

    def get(self, name: str) -> Handler | None:
        return self._handlers.get(name)

    def get_notification(self, name: str) -> Handler | None:
        return self._notifications.get(name)

    def names(self) -> list[str]:
        """Names of the request and stream handlers."""
        return sorted(self._handlers)

    def notification_names(self) -> list[str]:
        """Names of the notification handlers."""
        return sorted(self._notifications)

    @property
    def notification_count(self) -> int:
        """How many notification names are registered (names are only ever added: a
        reader that indexed them knows from this alone whether any came since)."""
        return len(self._notifications)

    def update(self, other: Registry) -> None:
        """Add every handler of ``other`` (later registrations win); its middleware are
        not taken over."""
        self._handlers.update(other._handlers)
        self._notifications.update(other._notifications)


default_registry = Registry()
handle = default_registry.handle
handle_stream = default_registry.handle_stream
handle_notification = default_registry.handle_notification
