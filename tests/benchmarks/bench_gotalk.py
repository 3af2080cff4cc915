"""Micro-benchmark of the Gotalk codec: ``python tests/benchmarks/bench_gotalk.py [--smoke]``.

Not collected by pytest. Measures encode and decode of a small request (``r`` with op
"echo" and a 7-byte payload, the reference benchmark's message) and of a 1 MiB payload.
Decoding goes through a :class:`GotalkConnection` fed one whole message per call, after the
handshake, which is how a transport delivers a message that arrived in one read.
Each figure is the best of several timeit-style repeats, to keep noise from other processes
out of it. ``--smoke`` (CI) runs every row on a hundredth of the calls, once: it shows the
code runs; its figures are rough.
"""

from __future__ import annotations

import argparse
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from wire.gotalk import GotalkConnection, Request, encode

REPEAT = 15


def best_per_op(stmt: object, number: int, smoke: bool = False) -> float:
    """Seconds per call of ``stmt``: the best of REPEAT runs of ``number`` calls (smoke: one
    run of a hundredth)."""
    number, repeat = (max(1, number // 100), 1) if smoke else (number, REPEAT)
    timer = timeit.Timer(stmt)  # type: ignore[arg-type]
    return min(timer.repeat(repeat=repeat, number=number)) / number


def report(name: str, what: str, seconds: float) -> float:
    us = seconds * 1e6
    rate = 1 / seconds
    if rate >= 1e6:
        rate_text = f"{rate / 1e6:.2f}M"
    elif rate >= 1e3:
        rate_text = f"{rate / 1e3:.1f}k"
    else:
        rate_text = f"{rate:.0f}"
    print(f"gotalk  {name:<5}  {what:<6}  {us:9.2f} us/op  {rate_text:>6} ops/s")
    return us


def bench(name: str, message: Request, number: int, smoke: bool) -> tuple[float, float]:
    wire = encode(message)
    conn = GotalkConnection(max_size=len(message.payload) + 1)
    conn.receive_data(conn.handshake())
    assert conn.receive_data(wire) == [message]
    receive = conn.receive_data

    enc = report(name, "encode", best_per_op(lambda: encode(message), number, smoke))
    dec = report(name, "decode", best_per_op(lambda: receive(wire), number, smoke))
    assert conn.buffered == 0
    return enc, dec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every row briefly (CI)")
    smoke = parser.parse_args().smoke
    small = Request(b"\x00\x00\x00\x01", "echo", b'"hello"')
    enc, dec = bench("small", small, 50_000, smoke)
    print(f"gotalk  small  total   {enc + dec:9.2f} us/op  (encode + decode)")
    big = Request(b"\x00\x00\x00\x02", "echo", b"x" * (1 << 20))
    bench("1MiB", big, 100, smoke)


if __name__ == "__main__":
    main()
