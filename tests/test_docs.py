"""Every code block in README.md and docs/ runs as printed.

- ``python`` blocks are complete programs, run in an empty folder; a ``text`` block marked
  ``<!-- output -->`` right after one is what it must print. ``<!-- fragment: spark -->``
  blocks use the names their page describes (``spark``, ``df``, ``url``) and run with those
  given, on the test session's Spark. ``<!-- server: browser -->`` marks the web server that
  serves the page's ``html`` block, loaded in headless Chromium.
- ``toml`` blocks are loaded by the Eventer's config loader.
- ``sh`` blocks: ``peerwire`` lines run against the ``peerwire serve`` line before them (its
  fixed ports replaced by free ones); ``make`` targets, extras and paths must exist.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rpc.eventer.config import ConfigError, load_config
from tests.certs import make_pki
from tests.spark_session import (
    ONE_SPARK_AT_A_TIME,
    Served,
    loop_thread_fixture,
    serve_peer_fixture,
    spark_fixture,
)

__all__ = ["loop_thread_fixture", "serve_peer_fixture", "spark_fixture"]  # fixtures used here

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LANGUAGES = {"python", "html", "toml", "sh", "text"}
PEERWIRE = [sys.executable, "-m", "rpc.cli"]


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    marker: str  # the HTML comment right before the fence, e.g. "output", or ""

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def parse(page: Path) -> list[Block]:
    lines = page.read_text().split("\n")
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^```(\S*)", lines[i])
        if fence is None:
            i += 1
            continue
        start = i
        i += 1
        while not lines[i].startswith("```"):
            i += 1
        before = [x for x in lines[:start] if x.strip()][-1:] or [""]
        marker = re.fullmatch(r"<!-- (.+) -->", before[0].strip())
        blocks.append(
            Block(
                page,
                start + 1,
                fence.group(1),
                "\n".join(lines[start + 1 : i]) + "\n",
                marker.group(1) if marker else "",
            )
        )
        i += 1
    return blocks


BLOCKS = [b for page in PAGES for b in parse(page)]


def by(lang: str, marker: str | None = None) -> list[Block]:
    return [b for b in BLOCKS if b.lang == lang and (marker is None or b.marker == marker)]


def expected_output(block: Block) -> str | None:
    """The ``<!-- output -->`` text block that follows ``block`` on its page, if any."""
    later = [b for b in BLOCKS if b.page == block.page and b.line > block.line]
    if later and later[0].marker == "output":
        return later[0].text
    return None


def ids(blocks: list[Block]) -> list[str]:
    return [b.name for b in blocks]


# --- every block is one of the kinds this file runs ----------------------------------------


def test_every_block_is_of_a_kind_that_is_run() -> None:
    assert BLOCKS, "no code blocks found"
    unknown = [b.name for b in BLOCKS if b.lang not in LANGUAGES]
    assert not unknown, f"code blocks without a known language: {unknown}"
    outputs = by("text", "output")
    assert all(any(expected_output(p) == o.text for p in by("python")) for o in outputs), (
        "an <!-- output --> block that follows no python block"
    )
    for page in PAGES:  # no indented code blocks: they would escape these tests
        outside = "".join(page.read_text().split("```")[0::2])  # the text between fences
        indented = re.findall(r"\n\n((?: {4}\S.*\n)+)", outside)
        assert not indented, f"{page.name}: indented code block {indented[0]!r}"


PROGRAMS = [b for b in by("python") if not b.marker]


@pytest.mark.parametrize("block", PROGRAMS, ids=ids(PROGRAMS))
def test_python_program_runs(block: Block, tmp_path: Path) -> None:
    script = tmp_path / "example.py"
    script.write_text(block.text)
    done = subprocess.run(
        [sys.executable, script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, f"{block.name}:\n{done.stderr}"
    output = expected_output(block)
    if output is not None:
        assert done.stdout == output


# --- the browser example ----------------------------------------------------------------------


@pytest.mark.timeout(90)
async def test_browser_page_runs_against_its_server(tmp_path: Path) -> None:
    from tests.browser import chromium, page_errors

    (server_block,) = by("python", "server: browser")
    (page_block,) = by("html")
    assert page_block.page == server_block.page
    (tmp_path / "static").mkdir()
    (tmp_path / "static" / "index.html").write_text(page_block.text)
    (tmp_path / "server.py").write_text(server_block.text)
    server = await asyncio.create_subprocess_exec(
        sys.executable, "server.py", cwd=tmp_path, stdout=asyncio.subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        first = (await asyncio.wait_for(server.stdout.readline(), 30)).decode().strip()
        assert first.startswith("open http://127.0.0.1:"), first
        async with chromium() as browser:
            page = await browser.new_page()
            errors = page_errors(page)
            await page.goto(first.removeprefix("open "))
            log = page.locator("#log")
            await log.filter(has_text="echo:").wait_for(timeout=10_000)
            await log.filter(has_text="welcome:").wait_for(timeout=10_000)
            shown = (await log.inner_text()).splitlines()
            assert errors == []
            assert set(shown) == {"online", "welcome: hello ada", 'echo: {"any":"json"}'}
    finally:
        server.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(server.wait(), 10)
        except TimeoutError:
            server.kill()
            await server.wait()


# --- Eventer configuration samples ------------------------------------------------------------


TOMLS = by("toml")


@pytest.mark.parametrize("block", TOMLS, ids=ids(TOMLS))
def test_toml_sample_loads(block: Block, tmp_path: Path) -> None:
    config_file = tmp_path / "eventer.toml"
    config_file.write_text(block.text)
    tls = tomllib.loads(block.text).get("tls")
    if tls:
        with pytest.raises(ConfigError, match=r"tls\.cert: no such file .*server\.pem"):
            load_config(config_file)
        (tmp_path / "pki").mkdir()
        pki = make_pki(tmp_path / "pki")
        for key, made in (
            ("cert", pki.server_cert),
            ("key", pki.server_key),
            ("client_ca", pki.ca),
        ):
            if key in tls:
                shutil.copy(made, tmp_path / tls[key])
    config = load_config(config_file)
    assert config.listen
    assert Path(config.database).parent == tmp_path


# --- Spark fragments --------------------------------------------------------------------------


def _greet_registry() -> Any:
    spec = importlib.util.spec_from_file_location("greet_example", ROOT / "examples" / "greet.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.registry


SPARK = by("python", "fragment: spark")


def _errors(value: Any) -> list[Any]:
    """Every non-null ``error`` field in a row (results are ``struct<result, error>``)."""
    if not isinstance(value, dict):
        return []
    found = [v for k, v in value.items() if k == "error" and v is not None]
    return found + [e for v in value.values() for e in _errors(v)]


@ONE_SPARK_AT_A_TIME
@pytest.mark.timeout(240)
@pytest.mark.parametrize("block", SPARK, ids=ids(SPARK))
def test_spark_fragment_runs(block: Block, spark: Any, serve_peer: Any) -> None:
    served: Served = serve_peer("gotalk", _greet_registry())
    df = spark.createDataFrame([("Ada", 36), ("Bob", 41)], "name string, age int")
    namespace: dict[str, Any] = {"__name__": "__main__", "spark": spark, "df": df}
    namespace["url"] = served.url
    code = compile(block.text, block.name, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    result = eval(code, namespace)  # a coroutine when the fragment awaits at top level
    if asyncio.iscoroutine(result):
        asyncio.run(result)
    from pyspark.sql import DataFrame

    for value in list(namespace.values()):  # run every DataFrame the fragment made
        if isinstance(value, DataFrame):
            rows = [row.asDict(recursive=True) for row in value.collect()]
            assert rows and not [e for row in rows for e in _errors(row)], (block.name, rows)


# --- shell blocks -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


CLI = [b for b in by("sh") if b.text.startswith("peerwire serve ")]


def with_ports(line: str, ports: dict[str, str]) -> str:
    return re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports[m[1]]}", line)


@contextlib.contextmanager
def cli_server(serve_line: str) -> Iterator[dict[str, str]]:
    """Run a ``peerwire serve`` line with free ports; yields {printed port: free port}."""
    ports = {p: str(free_port()) for p in re.findall(r"127\.0\.0\.1:(\d+)", serve_line)}
    args = shlex.split(
        re.sub(r"127\.0\.0\.1:(\d+)", lambda m: f"127.0.0.1:{ports[m[1]]}", serve_line)
    )
    server = subprocess.Popen([*PEERWIRE, *args[1:]], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        for _ in ports:
            line = server.stdout.readline()
            assert line.startswith("listening on "), line
        yield ports
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        if server.stdout is not None:
            server.stdout.close()  # not left to the GC


@pytest.mark.timeout(120)
@pytest.mark.parametrize("block", CLI, ids=ids(CLI))
def test_cli_lines_run(block: Block) -> None:
    serve_line, *lines = [line for line in block.text.splitlines() if line.strip()]
    # the Spark example's lines are run by tests/test_spark_connect.py (a Spark job each)
    calls = [line for line in lines if line.startswith("peerwire ")]
    assert calls or "examples/spark_enrich.py" in block.text
    with cli_server(serve_line) as ports:
        for line in calls:
            args = shlex.split(with_ports(line, ports))
            done = subprocess.run(
                [*PEERWIRE, *args[1:]], cwd=ROOT, capture_output=True, text=True, timeout=30
            )
            assert done.returncode == 0, f"{block.name}: {line}\n{done.stderr}"


def test_shell_lines_name_real_targets_extras_and_files() -> None:
    makefile = (ROOT / "Makefile").read_text()
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    commands = 0
    helped: set[str] = set()  # `peerwire <sub> --help` once per subcommand named
    for block in by("sh"):
        for line in block.text.splitlines():
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            commands += 1
            words = shlex.split(line.lstrip("("))
            if words[0] == "make":
                assert re.search(rf"^{re.escape(words[1])}:", makefile, re.M), line
            for extra in re.findall(r"peerwire\[(\w+)\]", line):
                assert extra in extras, line
            for word in words:
                if word.startswith("examples/"):
                    assert (ROOT / word).exists(), line
            if words[0] == "peerwire" and words[1] not in helped:
                helped.add(words[1])
                sub = subprocess.run(
                    [*PEERWIRE, *words[1:2], "--help"], capture_output=True, timeout=30
                )
                assert sub.returncode == 0, line
    assert commands


# --- what the pages say -----------------------------------------------------------------------


def test_readme_is_a_front_door() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) < 300


def test_no_internal_jargon_or_dangling_references() -> None:
    """User docs describe protocols by name; nothing cites files outside the repository."""
    internal = re.compile(r"\bseeds?\b|\bnotes" + "/", re.I)
    for page in PAGES:
        found = internal.findall(page.read_text())
        assert not found, f"{page.relative_to(ROOT)}: {found}"
    # the API reference renders docstrings: the sources of its packages cite no protocol
    # document by its internal number ("seed 003"); "seeds" of a gossip group are fine
    numbered = re.compile(r"\bseeds? 0\d\d", re.I)
    for package in ("rpc", "wire", "transports"):
        for source in sorted((ROOT / package).rglob("*.py")):
            found = numbered.findall(source.read_text())
            assert not found, f"{source.relative_to(ROOT)}: {found}"
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    dangling = re.compile(r"\bnotes" + r"/[\w.-]+")
    for name in tracked:
        path = ROOT / name
        if path.suffix in {".py", ".md", ".js", ".html", ".toml"} and path.is_file():
            assert not dangling.findall(path.read_text()), name
    for link in re.findall(r"\]\(((?!https?:)[^)#]+)", (ROOT / "README.md").read_text()):
        assert (ROOT / link).exists(), link
