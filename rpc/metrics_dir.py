"""Multiprocess metrics: a fresh ``PROMETHEUS_MULTIPROC_DIR`` before prometheus_client loads.

prometheus_client chooses between in-process and file-backed values once, when it is first
imported; so a parent that forks workers calls :func:`prepare` before anything imports it
(:mod:`rpc.metrics` does), then forks. This module imports nothing of prometheus_client.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

ENV = "PROMETHEUS_MULTIPROC_DIR"


def prepare(directory: str | os.PathLike[str] | None = None) -> Path:
    """Point prometheus_client at ``directory`` (default: a new temporary one), emptied of
    the ``.db`` files of earlier runs, and return it. RuntimeError if prometheus_client was
    imported already without it (its values would stay per process)."""
    if "prometheus_client" in sys.modules and ENV not in os.environ:
        raise RuntimeError("prometheus_client was imported before prepare(): call it first")
    path = Path(directory) if directory is not None else Path(tempfile.mkdtemp("-peerwire-metrics"))
    path.mkdir(parents=True, exist_ok=True)
    for stale in path.glob("*.db"):
        stale.unlink()
    os.environ[ENV] = str(path)
    return path


@contextlib.contextmanager
def owned() -> Iterator[Path]:
    """A multiprocess directory for the life of the block: a new temporary one, set in the
    environment (so forked children inherit it) and removed with the variable at the end.
    When ``PROMETHEUS_MULTIPROC_DIR`` is set already, that directory is used and left as
    it is (whoever set it owns it), made first if it does not exist (OSError when it
    cannot be). RuntimeError as :func:`prepare`."""
    if os.environ.get(ENV):
        given = Path(os.environ[ENV])
        given.mkdir(parents=True, exist_ok=True)
        yield given
        return
    path = prepare()
    try:
        yield path
    finally:
        os.environ.pop(ENV, None)
        shutil.rmtree(path, ignore_errors=True)
