"""Frames a WebSocket connection holds while its sink has paused reading reach the sink, in
order, however often the sink pauses and resumes before they are handed over (asyncio and
uvloop)."""

from __future__ import annotations

import asyncio

import pytest

from tests.browser import eventually
from tests.test_web_hostile import RawClient, Recorder, recorder_server

pytestmark = pytest.mark.both_loops


async def test_frames_held_survive_a_pause_right_after_a_resume() -> None:
    """A handler ends (resume) and in the same turn output crosses high water (pause): the
    frames held stay held until the next resume, none is dropped."""
    server, sinks, port = await recorder_server()
    try:
        client = await RawClient.open(port)
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        sink = sinks[0]

        def on_data(recorder: Recorder) -> None:
            if len(recorder.data) == 1:
                recorder.transport.pause_reading()

        sink.on_data = on_data
        for i in range(5):
            client.ws.send_binary(b"m%d" % i)
        client.writer.write(b"".join(client.ws.data_to_send()))  # one read: parsed at once
        await eventually(lambda: sink.data == [b"m0"], "the first message")
        assert not sink.transport.is_reading()
        sink.transport.resume_reading()  # schedules the hand-over of m1..m4
        sink.transport.pause_reading()  # ... which then finds reading paused
        # the final resume comes after the hand-over the first one scheduled (FIFO)
        asyncio.get_running_loop().call_soon(sink.transport.resume_reading)
        await eventually(lambda: len(sink.data) == 5, "every message after the final resume")
        assert sink.data == [b"m%d" % i for i in range(5)]
        client.writer.close()
    finally:
        server.close()
        await server.wait_closed()


async def test_a_sink_that_pauses_on_every_frame_gets_them_all() -> None:
    """Paused again while held frames are handed over: the rest stay held, in order."""
    server, sinks, port = await recorder_server()
    try:
        client = await RawClient.open(port)
        await eventually(lambda: sinks and sinks[0].transport is not None, "connected")
        sink = sinks[0]
        loop = asyncio.get_running_loop()

        def on_data(recorder: Recorder) -> None:
            recorder.transport.pause_reading()
            loop.call_soon(recorder.transport.resume_reading)

        sink.on_data = on_data
        for i in range(20):
            client.ws.send_binary(b"n%02d" % i)
        client.writer.write(b"".join(client.ws.data_to_send()))
        await eventually(lambda: len(sink.data) == 20, "every message")
        assert sink.data == [b"n%02d" % i for i in range(20)]
        client.writer.close()
    finally:
        server.close()
        await server.wait_closed()
