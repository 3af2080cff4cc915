"""The ``peerwire`` CLI as a user runs it: real processes, real sockets, no mocks.

One ``peerwire serve examples/greet.py`` process on both protocols serves most tests; the
timeout and retry tests serve a registry of their own in this process, so the slow or busy
handler needs no place in the example.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

import rpc

ROOT = Path(__file__).resolve().parent.parent
PEERWIRE = [sys.executable, "-m", "rpc.cli"]
GREET = "examples/greet.py"

pytestmark = pytest.mark.timeout(60)


def peerwire_all(*commands: Sequence[str]) -> list[subprocess.CompletedProcess[str]]:
    """Run CLI processes side by side: each spends ~0.5 s importing, most of a test's time."""
    processes = [
        subprocess.Popen(
            [*PEERWIRE, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for args in commands
    ]
    try:
        done = []
        for process in processes:
            out, err = process.communicate(timeout=30)
            done.append(subprocess.CompletedProcess(process.args, process.returncode, out, err))
        return done
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def peerwire(*args: str) -> subprocess.CompletedProcess[str]:
    return peerwire_all(args)[0]


def json_lines(stdout: str) -> list[object]:
    return [json.loads(line) for line in stdout.splitlines()]


class Serving:
    """A ``peerwire serve`` process whose stdout a thread reads, so no read can hang."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [*PEERWIRE, "serve", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._pump, daemon=True)
        self._reader.start()

    def __enter__(self) -> Serving:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Kill the server if it still runs; release its pipes and their reader thread."""
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self._reader.join(timeout=10)
        for pipe in (self.process.stdout, self.process.stderr):
            if pipe is not None:
                pipe.close()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def next_line(self, containing: str, timeout: float = 10) -> str:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line with {containing!r} within {timeout} s") from None
            if line is None:
                raise AssertionError(f"server exited: {self.stop()} {self.stderr()}")
            if containing in line:
                return line

    def urls(self, count: int) -> list[str]:
        return [self.next_line("listening on ").split()[-1] for _ in range(count)]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def stderr(self) -> str:
        assert self.process.stderr is not None
        return self.process.stderr.read() if self.process.poll() is not None else ""


@pytest.fixture(scope="module")
def greet_server() -> Iterator[tuple[Serving, dict[str, str]]]:
    listen = ["tcp+sbs", "tcp+gotalk", "ws+sbs", "ws+gotalk"]
    with Serving(GREET, *(f"--listen={scheme}://127.0.0.1:0" for scheme in listen)) as server:
        sbs, gotalk, ws_sbs, ws_gotalk = server.urls(len(listen))
        urls = {
            "gotalk": gotalk,
            "hat": sbs,
            "hatchatter": f"{sbs}?dialect=HatChatter",
            "ws+sbs": ws_sbs,
            "ws+gotalk": ws_gotalk,
        }
        yield server, urls
        assert server.stop() == 0, server.stderr()


@pytest.fixture(params=["gotalk", "hat", "hatchatter"])
def url(request: pytest.FixtureRequest, greet_server: tuple[Serving, dict[str, str]]) -> str:
    return greet_server[1][request.param]


def closed_port() -> int:
    """A port nothing listens on: bound a moment ago, then released."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# --- against examples/greet.py -------------------------------------------------------------


def test_serve_prints_bound_urls(greet_server: tuple[Serving, dict[str, str]]) -> None:
    urls = greet_server[1]
    assert rpc.parse_url(urls["gotalk"]).port > 0
    assert rpc.parse_url(urls["hat"]).codec == "sbs"


def test_call(url: str) -> None:
    value = {"list": [1, 2.5, None, True], "text": "héllo"}
    greet, echo, no_payload = peerwire_all(
        ["call", url, "greet", '{"name": "Ada"}'],
        ["call", url, "echo", json.dumps(value)],
        ["call", url, "echo"],
    )
    assert (greet.returncode, json.loads(greet.stdout)) == (0, {"greeting": "Hello Ada"})
    assert (echo.returncode, json.loads(echo.stdout)) == (0, value)
    assert (no_payload.returncode, no_payload.stdout) == (0, "null\n")


def test_stream_result_and_stream_request(url: str) -> None:
    count, total = peerwire_all(
        ["stream", url, "count", '{"to": 3}'],
        ["stream", url, "sum", "--part", "1", "--part", "2", "--part", "3.5"],
    )
    assert (count.returncode, json_lines(count.stdout)) == (0, [1, 2, 3])
    assert (total.returncode, json_lines(total.stdout)) == (0, [6.5])


@pytest.mark.parametrize("kind", ["ws+sbs", "ws+gotalk"])
def test_websocket_urls(kind: str, greet_server: tuple[Serving, dict[str, str]]) -> None:
    url = greet_server[1][kind]
    assert rpc.parse_url(url).path  # printed with the endpoint's path, ready to use
    greet, total = peerwire_all(
        ["call", url, "greet", '{"name": "Wu"}'],
        ["stream", url, "sum", "--part", "2", "--part", "3"],
    )
    assert (greet.returncode, json.loads(greet.stdout)) == (0, {"greeting": "Hello Wu"})
    assert (total.returncode, json_lines(total.stdout)) == (0, [5])


@pytest.mark.parametrize("kind", ["gotalk", "hat"])
def test_notify_reaches_the_handler(
    kind: str, greet_server: tuple[Serving, dict[str, str]]
) -> None:
    server, urls = greet_server
    done = peerwire("notify", urls[kind], "log", json.dumps(f"hello {kind}"))
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
    assert server.next_line(f"hello {kind}") == f"log: hello {kind}"


@pytest.mark.parametrize("kind", ["gotalk", "hatchatter"])
def test_error_result_exits_5_with_the_peers_message(
    kind: str, greet_server: tuple[Serving, dict[str, str]]
) -> None:
    done = peerwire("call", greet_server[1][kind], "greet", '{"nom": "Ada"}')
    assert done.returncode == 5
    assert done.stdout == ""
    assert "missing required field `name`" in done.stderr


def test_error_in_a_stream_exits_5(greet_server: tuple[Serving, dict[str, str]]) -> None:
    done = peerwire("stream", greet_server[1]["gotalk"], "sum", "--part", "1", "--part", '"x"')
    assert done.returncode == 5
    assert "unsupported operand" in done.stderr


def test_unknown_operation_exits_5(greet_server: tuple[Serving, dict[str, str]]) -> None:
    done = peerwire("-v", "call", greet_server[1]["hat"], "nope")
    assert done.returncode == 5
    assert 'unknown operation "nope"' in done.stderr
    assert "DEBUG peerwire.cli: connecting to" in done.stderr  # -v before the subcommand


# --- failures before or without a peer ----------------------------------------------------


def test_connection_refused_exits_3() -> None:
    done = peerwire("call", f"tcp+gotalk://127.0.0.1:{closed_port()}", "echo", "-v")
    assert done.returncode == 3
    assert "cannot connect" in done.stderr
    assert done.stderr.count("cannot connect") == 1  # one error text, not the cause twice
    assert "connecting to" in done.stderr  # -v after the subcommand works too


USAGE_ERRORS = [
    (["call", "http://127.0.0.1:1", "echo"], "unsupported scheme 'http'"),
    (["call", "tcp+gotalk://127.0.0.1", "echo"], "needs host and port"),
    (["call", "tcp+sbs://127.0.0.1:1?dialect=X", "echo"], "dialect must be"),
    (["call", "tcp+gotalk://127.0.0.1:1", "echo", "{bad"], "PAYLOAD is not JSON"),
    (["stream", "tcp+gotalk://127.0.0.1:1", "sum", "--part", "x"], "--part is not JSON"),
    (["stream", "tcp+gotalk://127.0.0.1:1", "sum", "1", "--part", "2"], "not both"),
    (["call", "tcp+gotalk://127.0.0.1:1"], "usage:"),
    (["serve", "examples/missing.py", "--listen", "tcp+sbs://127.0.0.1:0"], "cannot import"),
    (["serve", GREET, "--listen", "ssl+sbs://127.0.0.1:0"], "need --cert"),
]


def test_usage_errors_exit_2() -> None:
    results = peerwire_all(*(args for args, _ in USAGE_ERRORS))
    for (args, message), done in zip(USAGE_ERRORS, results, strict=True):
        assert (done.returncode, message in done.stderr) == (2, True), (args, done.stderr)


# --- a server of our own: slow and busy handlers ------------------------------------------


async def run_cli(*args: str) -> tuple[int, str, str]:
    """The CLI as a child while this loop keeps serving (subprocess.run would block it)."""
    process = await asyncio.create_subprocess_exec(
        *PEERWIRE, *args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        # generous: the child's imports alone took 6-10 s on a loaded 2-core machine (a test
        # that waits on a 30 s handler must still see the CLI give up first)
        async with asyncio.timeout(40):
            out, err = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


@pytest.mark.parametrize("scheme", ["tcp+gotalk", "tcp+sbs"])
async def test_timeout_exits_4(scheme: str) -> None:
    registry = rpc.Registry()
    arrived: list[float] = []

    @registry.handle("slow")
    async def slow(value: object) -> object:
        arrived.append(time.monotonic())
        await asyncio.sleep(30)  # work that outlasts the call's 0.2-s timeout (not a wait)
        return value

    server = await rpc.serve(f"{scheme}://127.0.0.1:0", registry=registry)
    try:
        code, out, err = await run_cli("call", str(server.url), "slow", "--timeout", "0.2")
        assert (code, out) == (4, "")
        assert "no result within 0.2 s" in err
        # timed from the request's arrival, not the child's start: its imports alone took
        # 6-10 s on a loaded 2-core machine; a CLI that waited for the result takes 30 s
        assert len(arrived) == 1 and time.monotonic() - arrived[0] < 10
    finally:
        await server.close(drain_timeout=0.1)


async def test_connection_closed_by_the_peer_exits_3() -> None:
    registry = rpc.Registry()

    @registry.handle("hang_up")
    def hang_up(value: object) -> None:
        rpc.current_peer.get().abort()

    server = await rpc.serve("tcp+sbs://127.0.0.1:0", registry=registry)
    try:
        code, out, err = await run_cli("call", str(server.url), "hang_up")
        assert (code, out) == (3, "")
        assert "connection closed" in err
    finally:
        await server.close(drain_timeout=0.1)


async def test_retry_results_exhausted_exit_6() -> None:
    registry = rpc.Registry()
    registry.handle("echo")(lambda value: value)
    busy = rpc.Options(max_concurrent=0, retry_wait=0.01)  # every request: "retry later"
    server = await rpc.serve("tcp+gotalk://127.0.0.1:0", registry=registry, options=busy)
    try:
        code, out, err = await run_cli("call", str(server.url), "echo", "1")
        assert (code, out) == (6, "")
        assert "request rate limit" in err
    finally:
        await server.close(drain_timeout=0.1)


# --- serve: shutdown and TLS --------------------------------------------------------------


async def test_serve_closes_connections_gracefully_on_sigint() -> None:
    with Serving(GREET, "--listen", "tcp+gotalk://127.0.0.1:0") as server:
        [url] = await asyncio.to_thread(server.urls, 1)
        peer = await rpc.connect(url, reconnect=False)
        assert await peer.request("greet", {"name": "Bo"}) == {"greeting": "Hello Bo"}
        assert await asyncio.to_thread(server.stop, signal.SIGINT) == 0
        async with asyncio.timeout(5):
            await peer.closed  # the server closed our connection before exiting


async def test_serve_freezes_its_start_up_objects(tmp_path: Path) -> None:
    """Modules, schemas and listeners live as long as the process: frozen once serving, so
    full collections do not walk them again (`rpc.workers.freeze_startup_objects`)."""
    module = tmp_path / "gc_service.py"
    module.write_text(
        "import gc\nimport rpc\n\nregistry = rpc.Registry()\n\n\n"
        "@registry.handle('frozen')\ndef frozen(_: object) -> int:\n"
        "    return gc.get_freeze_count()\n"
    )
    with Serving(str(module), "--listen", "tcp+gotalk://127.0.0.1:0") as server:
        [url] = await asyncio.to_thread(server.urls, 1)
        async with rpc.connect(url, reconnect=False) as peer:
            assert await peer.request("frozen", None) > 10_000
        assert await asyncio.to_thread(server.stop) == 0


def self_signed_cert(directory: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 that is its own CA, so it also serves as --cafile."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "peerwire test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = directory / "cert.pem", directory / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_file, key_file


def test_mutual_tls(tmp_path: Path) -> None:
    cert, key = self_signed_cert(tmp_path)
    pem = ("--cert", str(cert), "--key", str(key))  # one certificate for everything
    with Serving(
        GREET, "--listen", "ssl+sbs://127.0.0.1:0", *pem, "--client-ca", str(cert)
    ) as server:
        [url] = server.urls(1)
        trusted, insecure, unknown_ca, no_client_cert = peerwire_all(
            ["call", url, "greet", '{"name": "Cy"}', "--cafile", str(cert), *pem],
            ["call", url, "echo", "7", "--insecure", *pem],
            ["call", url, "echo", "7", *pem],
            ["call", url, "echo", "7", "--cafile", str(cert)],
        )
        assert (trusted.returncode, trusted.stdout) == (0, '{"greeting":"Hello Cy"}\n')
        assert (insecure.returncode, insecure.stdout) == (0, "7\n")
        assert unknown_ca.returncode == 3
        assert "CERTIFICATE_VERIFY_FAILED" in unknown_ca.stderr
        assert no_client_cert.returncode == 3
        assert server.stop() == 0


def test_console_script_is_declared() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"peerwire": "rpc.cli:main"}
    from rpc.cli import main

    assert main(["call", "bad://x:1", "echo"]) == 2
