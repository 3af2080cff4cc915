"""JSON nested past the recursion limit is bad input like any other (a PayloadError), and
notifications with bad payloads cost at most a rate-limited warning each."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import logging
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import rpc
from rpc.logs import violations
from rpc.middleware import Call, CallNext
from rpc.notifications import failures
from rpc.payload import convert, decode_any, decoder_for
from tests.rpc_helpers import FLAVOURS, served, wait_until


@dataclasses.dataclass
class Point:
    x: int


class Node(msgspec.Struct):
    """A type as deep as its value: converting a deep value recurses as deep."""

    a: Node | None = None


ANNOTATIONS = [inspect.Parameter.empty, list, dict, Point, Node]


def nested(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    return b'{"a":' * depth + b"null" + b"}" * depth


@settings(max_examples=60)
@given(
    st.integers(min_value=500, max_value=5000),
    st.sampled_from(["list", "dict"]),
    st.sampled_from(ANNOTATIONS),
)
def test_deep_json_decodes_or_is_a_payload_error(depth: int, kind: str, annotation: Any) -> None:
    """Every decoder a handler can get returns a value or raises PayloadError, whatever the
    depth (msgspec raises RecursionError past about 1,000 levels)."""
    decode = decoder_for(annotation)
    with contextlib.suppress(rpc.PayloadError):
        decode(nested(depth, kind))


def test_too_deep_is_said_so() -> None:
    deep = nested(5000, "list")
    for decode in (decode_any, decoder_for(list)):
        with pytest.raises(rpc.PayloadError, match="nested too deeply"):
            decode(deep)
    value: Any = None
    for _ in range(5000):  # an already-decoded value (e.g. from SBS), converted to a type
        value = {"a": value}
    with pytest.raises(rpc.PayloadError, match="nested too deeply"):
        convert(value, Node)


DEEP = nested(3000, "list")


def deep_registry(seen: list[Any]) -> rpc.Registry:
    reg = rpc.Registry()

    @reg.handle_notification("note")
    def note(value: Any) -> None:
        seen.append(value)

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    @reg.handle("deep")
    def deep(_value: Any) -> bytes:
        return DEEP  # bytes go out as they are: JSON our client cannot decode

    return reg


async def passing(call: Call, call_next: CallNext) -> Any:
    return await call_next(call)


@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
@pytest.mark.parametrize("flavour", list(FLAVOURS))
async def test_deep_json_from_a_peer_leaves_its_connection_serving(
    flavour: str, middleware: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A deep notification is dropped with one warning, a deep request gets an error
    result, a deep result is a PayloadError for our caller, and the connection goes on."""
    violations.reset()  # earlier tests' violations must not use up this window
    seen: list[Any] = []
    options = rpc.Options(middleware=(passing,)) if middleware else None
    async with served(flavour, deep_registry(seen), options=options) as (_, peer):
        peer.notify("note", DEEP)  # bytes go out as they are
        with pytest.raises(rpc.RemoteError, match="nested too deeply"):
            await peer.request("echo", DEEP)
        with pytest.raises(rpc.PayloadError, match="nested too deeply"):
            await peer.request("deep", None)
        assert await peer.request("echo", [1]) == [1]
        assert seen == []
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert len(dropped) == 1 and dropped[0].name == "peerwire.rpc.violations"
    assert "nested too deeply" in dropped[0].getMessage() and dropped[0].exc_info is None


@pytest.mark.parametrize("middleware", [False, True], ids=["plain", "middleware"])
async def test_notifications_with_bad_payloads_are_rate_limited_warnings(
    middleware: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """1,000 notifications a handler cannot take, written at once: at most 20 warnings
    (rpc.logs.violations' burst), not one each."""
    violations.reset()
    done = 0

    async def counting(call: Call, call_next: CallNext) -> Any:
        nonlocal done
        try:
            return await call_next(call)
        finally:  # the failure is logged in the same step, before any other task runs
            if call.kind == "notification":
                done += 1

    reg = rpc.Registry()

    @reg.handle_notification("note")
    def note(value: int) -> None:
        raise AssertionError("not an int: never called")

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    options = rpc.Options(middleware=(counting,)) if middleware else None
    with caplog.at_level(logging.WARNING):
        async with served("gotalk", reg, options=options) as (_, peer):
            for _ in range(1000):
                peer.notify("note", b"x")  # not JSON
            assert await peer.request("echo", 1) == 1  # after the notifications, in order
            if middleware:  # the notifications run as tasks: wait for the last of them
                await wait_until(lambda: done == 1000, timeout=10)
    dropped = [r for r in caplog.records if "dropped" in r.getMessage()]
    assert 1 <= len(dropped) <= 21
    assert all(r.name == "peerwire.rpc.violations" for r in dropped)


@pytest.mark.parametrize("coroutine", [False, True])
async def test_a_failing_notification_handler_logs_rate_limited_tracebacks(
    coroutine: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A peer that sends what a notification handler raises on gets at most 20 tracebacks
    logged per 10 s (rpc.notifications.failures), not one per notification."""
    failures.reset()
    failed = 0
    reg = rpc.Registry()

    def fail(value: int) -> None:
        nonlocal failed
        failed += 1
        raise ValueError(f"no {value}")

    if coroutine:

        @reg.handle_notification("note")
        async def async_note(value: int) -> None:
            fail(value)

    else:
        reg.handle_notification("note")(fail)

    @reg.handle("echo")
    def echo(value: Any) -> Any:
        return value

    with caplog.at_level(logging.ERROR):
        async with served("gotalk", reg) as (_, peer):
            for i in range(1000):
                peer.notify("note", i)
            assert await peer.request("echo", 1) == 1
            await wait_until(lambda: failed == 1000, timeout=10)
    logged = [r for r in caplog.records if "notification handler" in r.getMessage()]
    assert 1 <= len(logged) <= 21, len(logged)  # was 1,000
    assert logged[0].exc_info is not None  # with its traceback
