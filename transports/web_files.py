"""What the WebSocket server serves over HTTP besides the handshake: the browser script
(``<mount>gotalk.js`` and ``<mount>peerwire.js``: the parts ``web/gotalk.parts.json`` lists,
joined in that order, read once per process) and the files under ``static_dir`` (each read,
gzipped and hashed once, in a thread, and kept in a cache bounded in bytes, checked against
the file's size and modification time on every request; never a dotfile). No sockets here:
:mod:`transports.web_http` answers requests with these.
"""

from __future__ import annotations

import asyncio
import functools
import gzip
import hashlib
import json
import logging
import mimetypes
import urllib.parse
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("peerwire.transports.websocket")

WEB = Path(__file__).parent / "web"
SCRIPT_PARTS = WEB / "gotalk.parts.json"
"""The browser library's parts, in the order that makes one script of them (a JSON list of
file names in ``WEB``); ``web/gotalk.js`` joins the same parts for Node."""
SCRIPT_NAMES = ("gotalk.js", "peerwire.js")
_COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml")
_COMPRESSED_TYPES = {
    "gzip": "application/gzip",
    "bzip2": "application/x-bzip2",
    "xz": "application/x-xz",
    "compress": "application/x-compress",
}
"""Types of files whose name says they are compressed (``mimetypes``' encodings; others,
e.g. ``.br``: ``application/octet-stream``)."""


@dataclass(frozen=True, slots=True)
class Asset:
    """One file ready to serve: body, gzipped body (None when gzip does not pay), ETag."""

    body: bytes
    gzipped: bytes | None
    etag: str
    content_type: str

    @classmethod
    def load(cls, path: Path) -> Asset:
        return cls.of(path.read_bytes(), path.name)

    @classmethod
    def of(cls, body: bytes, name: str) -> Asset:
        """``body`` served as a file called ``name`` (its type is guessed from the name)."""
        ctype, coding = mimetypes.guess_type(name)
        if coding is not None:  # ``x.json.gz``: a gzip file, served as it is (not gzipped)
            ctype = _COMPRESSED_TYPES.get(coding)
        ctype = ctype or "application/octet-stream"
        gzipped = None
        if ctype.startswith(_COMPRESSIBLE):
            zipped = gzip.compress(body, mtime=0)
            gzipped = zipped if len(zipped) < len(body) else None
        if ctype.startswith("text/") or ctype.endswith("javascript"):
            ctype += "; charset=utf-8"
        return cls(body, gzipped, '"' + hashlib.sha1(body).hexdigest() + '"', ctype)

    @property
    def size(self) -> int:
        return len(self.body) + len(self.gzipped or b"")


def script_source() -> bytes:
    """The browser library as one script: its parts (see :data:`SCRIPT_PARTS`) joined.
    A part that is missing raises ``FileNotFoundError``."""
    names: list[str] = json.loads(SCRIPT_PARTS.read_text(encoding="utf-8"))
    return b"".join((WEB / name).read_bytes() for name in names)


@functools.cache
def script_asset() -> Asset:
    """The browser library, read, joined, gzipped and hashed once per process."""
    return Asset.of(script_source(), SCRIPT_NAMES[0])


MAX_DEPTH = 32
"""Segments a static path may have. Resolving a path costs the event loop in proportion to
its segments times its length (an 8 KB request line for ``/a/a/a/...``, 4,080 segments,
took 20-40 ms of it, and a peer could send dozens a second); a deeper path, or one with a
segment that begins with a dot (``.``, ``..``: browsers remove them before they send a
URL), is 404 before the file system is asked."""


def _hidden(relative: Path) -> bool:
    """A dotfile, or a file in a dot folder (``.env``, ``.git/config``): never served."""
    return any(part.startswith(".") for part in relative.parts)


class StaticFiles:
    """Files under one folder, each loaded once; an LRU cache of at most ``budget`` bytes.

    A file whose size or mtime changed is loaded again. Loading (read, gzip, SHA-1) runs in
    a thread of the cache's own, one file at a time, and concurrent requests for a file
    share its load: a client that makes the cache evict and reload files (requesting more
    than fit, in turn) keeps that thread busy, never the event loop. A file larger than a
    quarter of the budget is not served (404, and one warning per file): one load reads
    and gzips at most that much, and at least two files fit. ``loads`` counts the loads.
    """

    def __init__(self, root: Path, budget: int) -> None:
        self._root = root.resolve()
        self._budget = budget
        self._used = 0
        self._cache: OrderedDict[Path, tuple[int, int, Asset]] = OrderedDict()
        self._loading: dict[Path, asyncio.Future[Asset | None]] = {}
        """Loads queued or running, one per file; each is dropped once its file is read
        (or at close)."""
        self._loader: ThreadPoolExecutor | None = None
        self._closed = False
        self._refused: set[Path] = set()
        """Files refused as too large and warned about (at most 1024 entries)."""
        self.loads = 0
        """Files loaded so far (read, gzipped, hashed): a file evicted and asked for again
        counts again."""

    def get(self, path: str) -> Asset | asyncio.Future[Asset | None] | None:
        """The file's asset when cached; a future of it (None: gone) while it loads; None
        when there is no such file to serve."""
        relative = urllib.parse.unquote(path).lstrip("/") or "index.html"
        segments = relative.split("/")
        if len(segments) > MAX_DEPTH or any(s.startswith(".") for s in segments):
            return None
        try:  # ValueError: a NUL byte (%00) in the path
            target = (self._root / relative).resolve()
            if self._root not in target.parents or _hidden(target.relative_to(self._root)):
                return None
            stat = target.stat()
        except (OSError, ValueError):
            return None
        if not target.is_file():
            return None
        if stat.st_size > self._budget // 4:
            if target not in self._refused and len(self._refused) < 1024:
                self._refused.add(target)
                log.warning(
                    "static file %s (%d bytes) is larger than a quarter of static_cache_bytes "
                    "(%d): not served",
                    target,
                    stat.st_size,
                    self._budget,
                )
            return None
        cached = self._cache.get(target)
        if cached is not None and cached[:2] == (stat.st_size, stat.st_mtime_ns):
            self._cache.move_to_end(target)
            return cached[2]
        if cached is not None:
            self._drop(target)
        loading = self._loading.get(target)
        if loading is None and not self._closed:
            loading = self._load(target, stat.st_size, stat.st_mtime_ns)
        return loading

    def _load(self, target: Path, size: int, mtime: int) -> asyncio.Future[Asset | None]:
        loop = asyncio.get_running_loop()
        if self._loader is None:
            self._loader = ThreadPoolExecutor(1, thread_name_prefix="peerwire-static")
        self.loads += 1
        loading: asyncio.Future[Asset | None] = loop.create_future()
        self._loading[target] = loading

        def loaded(read: asyncio.Future[Asset]) -> None:
            if self._loading.get(target) is loading:
                del self._loading[target]
            if loading.done():  # closed meanwhile
                return
            error = read.exception() if not read.cancelled() else None
            if error is not None and not isinstance(error, OSError):
                log.warning("static file %s could not be loaded: %r", target, error)
            asset = None if read.cancelled() or error is not None else read.result()
            if asset is not None and asset.size <= self._budget:  # (else it grew: not kept)
                self._keep(target, size, mtime, asset)
            loading.set_result(asset)

        loop.run_in_executor(self._loader, Asset.load, target).add_done_callback(loaded)
        return loading

    def _keep(self, target: Path, size: int, mtime: int, asset: Asset) -> None:
        if target in self._cache:
            self._drop(target)
        while self._used + asset.size > self._budget:  # it fits: at most twice its size
            self._drop(next(iter(self._cache)))
        self._cache[target] = (size, mtime, asset)
        self._used += asset.size

    def _drop(self, target: Path) -> None:
        self._used -= self._cache.pop(target)[2].size

    @property
    def cached_bytes(self) -> int:
        return self._used

    def close(self) -> None:
        """Cancel the loads not started (their requests are answered 404) and stop the
        thread once the running one ends; files cached are still served."""
        self._closed = True
        if self._loader is not None:
            self._loader.shutdown(wait=False, cancel_futures=True)
        for loading in self._loading.values():
            loading.set_result(None)
        self._loading.clear()
