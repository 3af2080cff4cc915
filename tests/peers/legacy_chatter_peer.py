"""A legacy hat-chatter 0.5.11 peer, run in its own venv (it pins hat-sbs 0.6).

usage: legacy_chatter_peer.py server          -> prints "PORT <n>", echoes MsgReq as MsgRes
       legacy_chatter_peer.py client URL N    -> sends N MsgReq, prints one JSON line per reply,
                                                 then idles (pinging) until a line on stdin and
                                                 prints {"open": ...}
Messages use the module PwTest: MsgReq = Bytes, MsgRes = Bytes.
"""

import asyncio
import json
import sys

from hat import chatter, sbs

SCHEMA = """module PwTest
MsgReq = Bytes
MsgRes = Bytes
"""
repo = sbs.Repository(chatter.sbs_repo, sbs.Repository(SCHEMA))


async def serve() -> None:
    async def on_conn(conn: chatter.Connection) -> None:
        try:
            while True:
                msg = await conn.receive()
                conn.send(chatter.Data("PwTest", "MsgRes", msg.data.data), conv=msg.conv)
        except ConnectionError:
            pass

    srv = await chatter.listen(repo, "tcp+sbs://127.0.0.1:0", on_conn, ping_timeout=0.3)
    print("PORT", srv.addresses[0].rsplit(":", 1)[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await srv.async_close()


async def client(url: str, count: int) -> None:
    conn = await chatter.connect(repo, url, ping_timeout=0.3)
    for i in range(count):
        conv = conn.send(chatter.Data("PwTest", "MsgReq", b"req%d" % i), last=False)
        reply = await asyncio.wait_for(conn.receive(), 5)
        print(
            json.dumps(
                {
                    "module": reply.data.module,
                    "type": reply.data.type,
                    "data": reply.data.data.decode(),
                    "same_conv": reply.conv.first_id == conv.first_id,
                    "last": reply.last,
                }
            ),
            flush=True,
        )
    # idle, pinging and answering pings, until the test has seen enough pings go by
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(json.dumps({"open": not conn.is_closing}), flush=True)
    await conn.async_close()


if __name__ == "__main__":
    if sys.argv[1] == "server":
        asyncio.run(serve())
    else:
        asyncio.run(client(sys.argv[2], int(sys.argv[3])))
