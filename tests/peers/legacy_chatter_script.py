"""A legacy hat-chatter 0.5.11 peer that runs a script of sends and receives (own venv).

usage: legacy_chatter_script.py URL STEPS_JSON

STEPS_JSON is a list of steps; every message is in module PwTest (all types Bytes):
  ["req", TYPE, TEXT]    start a conversation (last = False) -> prints {"sent": TYPE, "conv": n}
                         ({"closed": true} if the connection is gone)
  ["note", TYPE, TEXT]   one-message conversation (last = True), printed as "req"
  ["recv"]               wait (5 s at most) for the next message -> prints {"type": "PwTest.X",
                         "data": TEXT, "conv": n, "last": bool}, or {"closed": true} once the
                         connection is gone (hat-chatter closes it on a type it cannot decode)
At the end prints {"open": bool}.
"""

import asyncio
import json
import sys

from hat import chatter, sbs

TYPES = ("MsgReq", "MsgRes", "Missing", "Fail", "Slow", "Release", "Raw")
SCHEMA = "module PwTest\n" + "".join(f"{t} = Bytes\n" for t in TYPES)
repo = sbs.Repository(chatter.sbs_repo, sbs.Repository(SCHEMA))


async def run(url: str, steps: list) -> None:
    conn = await chatter.connect(repo, url, ping_timeout=5)
    convs: list[int] = []
    for step in steps:
        if step[0] in ("req", "note"):
            try:
                conv = conn.send(
                    chatter.Data("PwTest", step[1], step[2].encode()), last=step[0] == "note"
                )
            except ConnectionError:
                print(json.dumps({"closed": True}), flush=True)
                continue
            convs.append(conv.first_id)
            print(json.dumps({"sent": step[1], "conv": len(convs) - 1}), flush=True)
            continue
        try:
            msg = await asyncio.wait_for(conn.receive(), 5)
        except ConnectionError:
            print(json.dumps({"closed": True}), flush=True)
            continue
        first = msg.conv.first_id
        print(
            json.dumps(
                {
                    "type": f"{msg.data.module}.{msg.data.type}",
                    "data": bytes(msg.data.data).decode(errors="replace"),
                    "conv": convs.index(first) if first in convs else None,
                    "last": msg.last,
                }
            ),
            flush=True,
        )
    print(json.dumps({"open": not conn.is_closing}), flush=True)
    await conn.async_close()


if __name__ == "__main__":
    asyncio.run(run(sys.argv[1], json.loads(sys.argv[2])))
