"""Chatter codec micro-benchmark: encode and decode rates, small and 1 MiB messages.

Run: ``.venv/bin/python tests/benchmarks/bench_chatter.py``. Not part of the test suite:
figures depend on the machine and are reported, never asserted. hat-sbs' C serializer on
the same envelope is printed alongside as the reference point.
"""

from __future__ import annotations

import timeit

from wire import schemas
from wire.chatter import ChatterConnection, Dialect


def rate(label: str, fn, number: int) -> None:
    best = min(timeit.repeat(fn, number=number, repeat=5)) / number
    print(f"chatter  {label:<28} {best * 1e6:9.2f} us/op  {1 / best:12,.0f} ops/s")


def bench(dialect: Dialect, size_label: str, payload: bytes, number: int) -> None:
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
    rate(f"{tag} encode", encode, number)
    rate(f"{tag} encode+decode", decode_renumbered, number)
    lenient = ChatterConnection(dialect, max_size=32 << 20, strict=False)
    rate(f"{tag} decode", lambda: lenient.receive_data(frame), number)
    del decode


def main() -> None:
    small = b"0123456789abcdef"
    big = bytes(range(256)) * 4096
    for dialect in (Dialect.CURRENT, Dialect.LEGACY):
        bench(dialect, "small", small, 50_000)
        bench(dialect, "1MiB", big, 200)
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
    rate("hat-sbs    small encode", lambda: repo.encode("HatChatter.Msg", value), 50_000)
    rate("hat-sbs    small decode", lambda: repo.decode("HatChatter.Msg", raw), 50_000)


if __name__ == "__main__":
    main()
