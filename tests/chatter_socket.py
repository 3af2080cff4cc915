"""A minimal asyncio driver for the sans-I/O ChatterConnection, for interop tests.

The RPC core has its own transport; this keeps the codec tests independent of it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from wire.chatter import ChatterConnection, Dialect, Msg


class ChatterSocket:
    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, conn: ChatterConnection
    ) -> None:
        self.reader, self.writer, self.conn = reader, writer, conn
        self._pending: list[Msg] = []

    @classmethod
    async def connect(cls, host: str, port: int, dialect: Dialect) -> ChatterSocket:
        reader, writer = await asyncio.open_connection(host, port)
        return cls(reader, writer, ChatterConnection(dialect))

    def flush(self) -> None:
        out = self.conn.data_to_send()
        if out:
            self.writer.write(out)

    async def receive(self, timeout: float = 5) -> Msg:
        """Next application message; answers pings on the way."""
        while not self._pending:
            data = await asyncio.wait_for(self.reader.read(65536), timeout)
            if not data:
                raise ConnectionError("peer closed")
            self._pending += self.conn.receive_data(data)
            self.flush()
        return self._pending.pop(0)

    async def pump_until(self, predicate: Callable[[], object], timeout: float = 5) -> None:
        """Keep reading (and answering pings) until ``predicate()`` holds after a read;
        TimeoutError after ``timeout`` s, ConnectionError if the peer closes."""
        async with asyncio.timeout(timeout):
            while not predicate():
                data = await self.reader.read(65536)
                if not data:
                    raise ConnectionError("peer closed")
                self._pending += self.conn.receive_data(data)
                self.flush()

    async def close(self) -> None:
        self.writer.close()
        await self.writer.wait_closed()
