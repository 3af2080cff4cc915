"""Shared test settings: hypothesis profile (CI runs the same examples every time), PKI."""

from __future__ import annotations

import pytest
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
