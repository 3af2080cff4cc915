"""Shared test settings: hypothesis profile (CI runs the same examples every time), PKI, and
the event loop the async tests run on (``pytest --loop asyncio|uvloop|both``), and fresh
rate-limited logs per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from rpc import loops
from rpc.escapes import escapes
from rpc.eventer import confirm, handlers, service
from rpc.logs import cuts, refusals, violations
from rpc.notifications import failures
from tests.certs import Pki, make_pki
from transports import websocket

settings.register_profile(
    "default", deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
settings.load_profile("default")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--loop",
        choices=["asyncio", "uvloop", "both"],
        default="asyncio",
        help="event loop of the async tests, of rpc.blocking/Spark loop threads and of CLI "
        "children (via $PEERWIRE_LOOP); 'both' runs every async test once on each "
        "(in-process loops only). Default: asyncio",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "both_loops: on an asyncio run, also run on uvloop")
    choice = config.getoption("--loop")
    if choice != "asyncio" and not loops.uvloop_installed():
        raise pytest.UsageError(f"--loop {choice} needs uvloop: pip install -e '.[speed]'")
    if choice != "both":  # threads and child processes follow the same choice
        os.environ[loops.ENV_VAR] = choice


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> dict[str, loops.LoopFactory]:
    """pytest-asyncio (>= 1.4) runs each async test on each loop returned here; with one
    loop the test ids stay as they are. Tests marked ``both_loops`` get both on an asyncio
    run, and uvloop alone on a uvloop run."""
    choice = config.getoption("--loop")
    # CI's uvloop pass follows an asyncio pass that ran both already
    marked = choice == "asyncio" and item.get_closest_marker("both_loops") is not None
    both = choice == "both" or marked
    names = ["asyncio", "uvloop"] if both else [choice]
    return {name: loops.loop_factory(name) for name in names}


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA with server and client certificates, generated for this test session."""
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def fresh_rate_limited_logs() -> None:
    """Each test starts a new window of the process-wide rate-limited logs (protocol
    violations, notification handlers' failures, handlers' BaseExceptions, refused HTTP
    requests, a close's cut work, the Eventer's refusals, dropped notifications and
    unconfirmed registrations): one test's burst must not hide the next test's records."""
    violations.reset()
    refusals.reset()
    failures.reset()
    escapes.reset()
    websocket.violations.reset()
    cuts.reset()
    confirm.drops.reset()
    service.refusals.reset()
    handlers.dropped.reset()


@pytest.fixture
def spans() -> Iterator[Any]:
    """An OpenTelemetry SDK tracer provider whose finished spans are kept in memory:
    (provider, exporter), shut down after the test."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()
