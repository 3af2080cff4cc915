"""rpc.middleware.run without sockets: the order of a chain of any length, and what a
middleware may do with its ``call_next`` (call it twice, pass a new Call on, answer
itself, return its awaitable from a plain function)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from rpc.middleware import Call, run

Events = list[str]


def new_call(op: str = "op") -> Call:
    return Call(op, "request", "server", None, b"payload")  # type: ignore[arg-type]


def recording(name: str, events: Events) -> Callable[[Call, Any], Awaitable[Any]]:
    async def middleware(call: Call, call_next: Any) -> Any:
        events.append(f"{name} in {call.op}")
        result = await call_next(call)
        events.append(f"{name} out")
        return f"{name}({result})"

    return middleware


def innermost(events: Events) -> Callable[[Call], Awaitable[Any]]:
    async def handler(call: Call) -> Any:
        events.append(f"handler {call.op}")
        return call.op

    return handler


@pytest.mark.parametrize("length", [0, 1, 3])
async def test_a_chain_runs_outermost_first(length: int) -> None:
    events: Events = []
    names = [f"m{i}" for i in range(length)]
    chain = tuple(recording(name, events) for name in names)
    result = await run(chain, new_call(), innermost(events))
    expected = "op"
    for name in reversed(names):
        expected = f"{name}({expected})"
    assert result == expected
    assert events == (
        [f"{name} in op" for name in names]
        + ["handler op"]
        + [f"{name} out" for name in reversed(names)]
    )


async def test_call_next_twice_and_with_a_new_call() -> None:
    events: Events = []

    async def twice(call: Call, call_next: Any) -> Any:
        first = await call_next(call)
        second = await call_next(new_call("again"))
        return [first, second]

    chain = (twice, recording("inner", events))
    assert await run(chain, new_call(), innermost(events)) == ["inner(op)", "inner(again)"]
    assert events == [
        "inner in op",
        "handler op",
        "inner out",
        "inner in again",
        "handler again",
        "inner out",
    ]


async def test_an_inner_middleware_may_answer_itself() -> None:
    events: Events = []

    async def answers(call: Call, call_next: Any) -> Any:
        events.append("answers")
        return "cached"

    chain = (recording("outer", events), answers, recording("never", events))
    assert await run(chain, new_call(), innermost(events)) == "outer(cached)"
    assert events == ["outer in op", "answers", "outer out"]


async def test_a_plain_function_may_return_call_next_s_awaitable() -> None:
    events: Events = []

    def plain(call: Call, call_next: Any) -> Any:
        events.append("plain")
        return call_next(call)

    chain = (recording("outer", events), plain)
    assert await run(chain, new_call(), innermost(events)) == "outer(op)"
    assert events == ["outer in op", "plain", "handler op", "outer out"]
