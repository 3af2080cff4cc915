"""Chatter codec micro-benchmark: encode and decode rates, small and 1 MiB messages.

Run: ``.venv/bin/python tests/benchmarks/bench_chatter.py [--smoke]``. Not part of the test
suite: figures depend on the machine and are reported, never asserted. hat-sbs' C serializer
on the same envelope is printed alongside as the reference point. ``--smoke`` (CI) runs
every row on a hundredth of the calls, once: it shows the code runs; its figures are rough.
"""

from __future__ import annotations

import argparse
import timeit

from wire import schemas
from wire.chatter import ChatterConnection, Dialect


def rate(label: str, fn, number: int, smoke: bool) -> None:
    number, repeat = (max(1, number // 100), 1) if smoke else (number, 5)
    best = min(timeit.repeat(fn, number=number, repeat=repeat)) / number
    print(f"chatter  {label:<28} {best * 1e6:9.2f} us/op  {1 / best:12,.0f} ops/s")


def bench(dialect: Dialect, size_label: str, payload: bytes, number: int, smoke: bool) -> None:
    sender = ChatterConnection(dialect)
    receiver = ChatterConnection(dialect, max_size=32 << 20)

    def encode() -> bytes:
        sender.send("echo", payload)
        return sender.data_to_send()

    frame = encode()

    def decode() -> None:
        receiver.receive_data(frame)

    def decode_renumbered() -> None:
        # strict receivers need increasing ids: decode a freshly encoded frame each time
        receiver.receive_data(encode())

    tag = f"{dialect.value:<10} {size_label}"
    rate(f"{tag} encode", encode, number, smoke)
    rate(f"{tag} encode+decode", decode_renumbered, number, smoke)
    lenient = ChatterConnection(dialect, max_size=32 << 20, strict=False)
    rate(f"{tag} decode", lambda: lenient.receive_data(frame), number, smoke)
    del decode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="every row briefly (CI)")
    smoke = parser.parse_args().smoke
    small = b"0123456789abcdef"
    big = bytes(range(256)) * 4096
    for dialect in (Dialect.CURRENT, Dialect.LEGACY):
        bench(dialect, "small", small, 50_000, smoke)
        bench(dialect, "1MiB", big, 200, smoke)
    repo = schemas.repository()
    value = {
        "id": 1000,
        "first": 1000,
        "owner": True,
        "token": True,
        "last": True,
        "data": {"type": "echo", "data": small},
    }
    raw = repo.encode("HatChatter.Msg", value)
    rate("hat-sbs    small encode", lambda: repo.encode("HatChatter.Msg", value), 50_000, smoke)
    rate("hat-sbs    small decode", lambda: repo.decode("HatChatter.Msg", raw), 50_000, smoke)


if __name__ == "__main__":
    main()
