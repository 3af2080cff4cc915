"""Micro-benchmark of the gossip frame codec: ``python tests/benchmarks/bench_gossip.py``.

Not collected by pytest. Measures a small gossip (3 NetIDs, 5-byte payload, as test vector V1)
and one with a 1 MiB payload, half random bytes and half repetitive text, so snappy has real
work on both kinds of data. Encoding is :meth:`GossipCodec.send` with fresh random padding,
as a sender does; decoding is :meth:`GossipCodec.receive_data` fed one whole frame per call.
Also times the one-shot ``encode_frame`` / ``decode_frame`` of the small gossip, which build
the cipher per call (the datagram path). Each figure is the best of several repeats, after a
warm-up. ``--smoke`` (CI) runs every row on a hundredth of the calls, once: it shows the code
runs; its figures are rough.

The 1 MiB figures depend on glibc's malloc more than on the codec: with its default dynamic
mmap/trim thresholds, a run may map and fault in fresh pages for every big buffer (about 600
page faults per message), which can add a millisecond. For figures of the codec alone, pin
the allocator::

    MALLOC_MMAP_THRESHOLD_=8388608 MALLOC_TRIM_THRESHOLD_=268435456 \\
        python tests/benchmarks/bench_gossip.py
"""

from __future__ import annotations

import argparse
import random
import sys
import timeit
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from wire.gossip import (
    BroadcastID,
    Gossip,
    GossipCodec,
    NetID,
    decode_frame,
    encode_frame,
    payload_tag,
)

REPEAT = 7
KEY = b"benchmark key"


def best_per_op(stmt: Callable[[], object], number: int, smoke: bool = False) -> float:
    """Seconds per call of ``stmt``: the best of REPEAT runs of ``number`` calls (smoke: one
    run of a hundredth)."""
    number, repeat = (max(1, number // 100), 1) if smoke else (number, REPEAT)
    return min(timeit.Timer(stmt).repeat(repeat=repeat, number=number)) / number


def report(name: str, what: str, seconds: float) -> None:
    rate = 1 / seconds
    if rate >= 1e6:
        rate_text = f"{rate / 1e6:.2f}M"
    elif rate >= 1e3:
        rate_text = f"{rate / 1e3:.1f}k"
    else:
        rate_text = f"{rate:.0f}"
    print(f"gossip  {name:<5}  {what:<12}  {seconds * 1e6:10.2f} us/op  {rate_text:>6} ops/s")


def bench(name: str, g: Gossip, number: int, smoke: bool) -> None:
    codec = GossipCodec(KEY)
    frame = codec.send(g)
    assert codec.receive_data(frame) == [g]
    send = codec.send
    receive = codec.receive_data
    for _ in range(10):  # warm-up: first-touch and allocator growth are not per-message costs
        send(g)
    for _ in range(10):
        receive(frame)
    report(name, "encode", best_per_op(lambda: send(g), number, smoke))
    report(name, "decode", best_per_op(lambda: receive(frame), number, smoke))
    assert codec.buffered == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every row briefly (CI)")
    smoke = parser.parse_args().smoke
    a, b, c = (NetID("127.0.0.1", p) for p in (29999, 30001, 30002))
    small = Gossip(BroadcastID(a, 1), (), (), (b, c), payload_tag("hello"), b"world")
    bench("small", small, 20_000, smoke)

    frame = encode_frame(small, KEY)
    assert decode_frame(frame, KEY) == small
    report("small", "encode_frame", best_per_op(lambda: encode_frame(small, KEY), 20_000, smoke))
    report("small", "decode_frame", best_per_op(lambda: decode_frame(frame, KEY), 20_000, smoke))

    half = 1 << 19
    noise = random.Random(4).randbytes(half)
    text = (b"peerwire gossip benchmark, compressible half. " * (half // 40 + 1))[:half]
    big = Gossip(BroadcastID(a, 2), (), (), (b, c), payload_tag("blob"), noise + text)
    bench("1MiB", big, 50, smoke)


if __name__ == "__main__":
    main()
