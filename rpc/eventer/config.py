"""Eventer server configuration: a JSON or TOML file, validated into :class:`ServerConfig`.

Relative paths in the file (``database``, ``tls.*``) are relative to the file's folder, so
a config can travel with its database. Unknown keys are errors (a typo must not silently
fall back to a default), and so are values the server cannot use: integers beyond int64,
an ``ack_timeout`` that is not a finite positive number, paths holding a NUL.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Literal

import msgspec

from rpc.eventer.wal import MAX_WAL_BYTES
from rpc.url import UrlError, parse_url

INT64_MAX = 2**63 - 1
"""Largest integer the server can use: ids are SBS Integers and SQLite INTEGERs (int64)."""
_MINIMUMS = {
    "max_query_results": 1,
    "max_client_backlog": 1,
    "max_pending_bytes": 1,
    "max_message_size": 4096,
    "max_wal_bytes": 1024 * 1024,
}


class ConfigError(ValueError):
    """The configuration cannot be used; the message says which key and why."""


class TlsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    cert: str
    """PEM certificate chain (may hold the key too)."""
    key: str | None = None
    client_ca: str | None = None
    """Require client certificates signed by these CAs (mutual TLS)."""


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    listen: list[str]
    """peerwire URLs, e.g. ``tcp+sbs://127.0.0.1:23012?dialect=HatChatter``."""
    server_id: int = 1
    token: str | None = None
    """Clients that send a token must send this one; clients without a token are accepted."""
    database: str = "eventer.db"
    """SQLite file (``:memory:`` for a throw-away store)."""
    tls: TlsConfig | None = None
    """Needed by ``ssl+sbs://`` URLs."""
    sync: Literal["full", "normal"] = "full"
    """SQLite ``synchronous``: ``full`` survives power loss, ``normal`` survives crashes of
    the process only (and commits about ten times faster)."""
    events_ack: bool = False
    """Send events notifications with last = False and wait for each client's ack before
    sending it the next one (per-client flow control)."""
    ack_timeout: float = 30.0
    """Seconds a client may take to ack; past it the connection is closed."""
    max_query_results: int = 4096
    """Server-side cap on events in one query result (the reference's default)."""
    max_client_backlog: int = 64 * 1024 * 1024
    """Bytes of notifications a client without acks may leave unread, or (``events_ack``)
    may have queued for it and not yet acked (one larger notification alone passes); past
    it the server closes that client (a slow reader must not make the server's memory
    grow)."""
    max_pending_bytes: int = 256 * 1024 * 1024
    """Bytes of registered events waiting for their commit (all clients together); while
    this many wait, registrations fail (a request's answer is ``failure``, one sent as a
    notification is dropped), so that clients registering faster than the disk commits
    cannot fill the server's memory: at most this plus one registration waits."""
    max_message_size: int = 16 * 1024 * 1024
    """Largest Chatter message in bytes, both ways (the reference has no limit). A larger
    incoming message closes its connection; a registration whose events would not fit in
    one response is refused alone; timeseries and server results are cut to fit
    (``more_follows``); a latest result that cannot fit gets an error reply. Clients must
    accept messages this large (``rpc.eventer.connect(..., max_size=)``)."""
    max_wal_bytes: int = MAX_WAL_BYTES
    """Size the database's ``-wal`` file is kept under, in bytes (at least 1 MiB):
    checkpoints start at a quarter of it, the file is truncated past half of it and before
    a registration that could take it to this (see :mod:`rpc.eventer.writer`). One
    registration whose log alone is larger passes it: a large registration writes 1.1 to 6.6
    times its bytes of log (more for small events of many types), so the default
    ``max_message_size`` (16 MiB) allows ones that do."""
    system_events: bool = True
    """Register the reference's own events: ``event/<id>/engine`` STARTED/STOPPED and
    ``event/<id>/eventer/<client>`` CONNECTED/DISCONNECTED."""

    def __post_init__(self) -> None:
        if not self.listen:
            raise ConfigError("listen: give at least one URL")
        for url in self.listen:
            try:
                parsed = parse_url(url)
            except UrlError as exc:
                raise ConfigError(f"listen: {exc}") from None
            if parsed.codec != "sbs":
                raise ConfigError(f"listen: {url!r} is not a Chatter (tcp+sbs/ssl+sbs) URL")
            if parsed.tls and self.tls is None:
                raise ConfigError(f"listen: {url!r} needs a [tls] section (cert, key)")
        if not -INT64_MAX - 1 <= self.server_id <= INT64_MAX:
            raise ConfigError("server_id must be an int64 (-2**63 to 2**63 - 1)")
        if not (math.isfinite(self.ack_timeout) and self.ack_timeout > 0):
            raise ConfigError("ack_timeout must be a positive number of seconds (not nan/inf)")
        for key, minimum in _MINIMUMS.items():
            if not minimum <= getattr(self, key) <= INT64_MAX:
                raise ConfigError(f"{key} must be from {minimum} to {INT64_MAX} (int64)")
        if not self.database:
            raise ConfigError("database: give a file path (or ':memory:')")
        paths = [("database", self.database)]
        if self.tls is not None:
            paths += [
                (f"tls.{key}", getattr(self.tls, key)) for key in ("cert", "key", "client_ca")
            ]
        for key, path in paths:
            if path is not None and "\0" in path:
                raise ConfigError(f"{key}: a path cannot hold a NUL character")


def config_from_dict(data: dict[str, object], base: Path | None = None) -> ServerConfig:
    """Validate a decoded config; ``listen`` may be one URL or a list.

    With ``base`` (the file's folder), relative paths are resolved against it and the TLS
    files must exist (:class:`ConfigError` names a missing one).
    """
    data = dict(data)
    if isinstance(data.get("listen"), str):
        data["listen"] = [data["listen"]]
    try:
        config = msgspec.convert(data, ServerConfig)
    except msgspec.ValidationError as exc:
        raise ConfigError(str(exc)) from None
    if base is None:
        return config

    def rel(path: str | None) -> str | None:
        if path is None or path == ":memory:":
            return path
        return str(base / path)

    tls = config.tls
    if tls is not None:
        tls = TlsConfig(rel(tls.cert) or tls.cert, rel(tls.key), rel(tls.client_ca))
        _check_tls_files(tls)
    return msgspec.structs.replace(config, database=rel(config.database) or "", tls=tls)


def _check_tls_files(tls: TlsConfig) -> None:
    """A missing certificate or key is named here, not left to a bare ``[Errno 2]``."""
    for key in ("cert", "key", "client_ca"):
        path = getattr(tls, key)
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"tls.{key}: no such file {path}")


def load_config(path: str | Path) -> ServerConfig:
    """Read ``path``: ``.toml`` as TOML, anything else as JSON."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from None
    try:
        if path.suffix.lower() == ".toml":
            data = tomllib.loads(raw.decode())
        else:
            data = msgspec.json.decode(raw)
    except (tomllib.TOMLDecodeError, msgspec.DecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a table/object")
    return config_from_dict(data, path.resolve().parent)


__all__ = ["ConfigError", "ServerConfig", "TlsConfig", "config_from_dict", "load_config"]
