"""Exponential back-off with full jitter: the one formula every retry loop here uses."""

from __future__ import annotations

import random

__all__ = ["full_jitter"]


def full_jitter(attempt: int, base: float, cap: float, rng: random.Random | None = None) -> float:
    """Wait before try ``attempt + 1`` (``attempt`` >= 1 failures so far): uniform in
    ``[0, min(cap, base * 2**(attempt-1))]`` (AWS "full jitter"); ``rng`` defaults to the
    :mod:`random` module's generator. No overflow however long the outage."""
    ceiling = min(cap, base * 2 ** min(max(attempt - 1, 0), 62))
    return (random.uniform if rng is None else rng.uniform)(0.0, ceiling)
