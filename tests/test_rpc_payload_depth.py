"""Notifications with bad payloads cost at most a rate-limited warning each."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import rpc
from rpc.logs import violations
from rpc.middleware import Call, CallNext
from tests.rpc_helpers import served, wait_until


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
