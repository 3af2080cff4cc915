"""Shared test settings: hypothesis profile (CI runs the same examples every time), PKI,
and the event loops: tests marked ``both_loops`` run on asyncio's loop and on uvloop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest
import uvloop
from hypothesis import HealthCheck, settings

from tests.certs import Pki, make_pki

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("default")


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with server and client certificates, generated for this test session."""
    return make_pki(tmp_path_factory.mktemp("pki"))


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
}


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_loops: run on asyncio's loop and on uvloop")


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    """Both loops for tests marked ``both_loops``, asyncio's for the others."""
    if item.get_closest_marker("both_loops") is not None:
        return LOOPS
    return {"asyncio": LOOPS["asyncio"]}
