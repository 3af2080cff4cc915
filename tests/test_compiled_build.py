"""The optional compiled build (``PEERWIRE_COMPILE=1``, setup.py) behaves as the sources do.

A copy of this tree is built into a wheel as users build it (pip with build isolation, which
fetches mypy for the build; gcc compiles). The wheel is installed into a fresh venv, which
serves and calls over Gotalk and Chatter with every codec module compiled; and its extension
modules are laid over the copy, where the codec and core tests run in a pytest of their own:
each of them must pass compiled as it does on the sources.
"""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import wire
from tests.test_install_layouts import env_with, fresh_venv, run

ROOT = Path(__file__).resolve().parent.parent
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")
PACKAGES = ("rpc", "wire", "transports", "schemas_sbs", "tests")
COMPILED_TESTS = ("test_gotalk_", "test_chatter_", "test_wire_", "test_rpc_")
"""The test files (by name prefix) run against the compiled copy: every codec test, the
hat-drivers interop ones included, and the core's tests over both protocols."""

PROBE = """\
import asyncio, json
import rpc, wire

registry = rpc.Registry()


@registry.handle("echo")
def echo(value):
    return value


async def main():
    results = []
    for url in ("tcp+gotalk://127.0.0.1:0", "tcp+sbs://127.0.0.1:0"):
        async with rpc.serve(url, registry=registry) as server:
            target = str(server.url) + ("" if "gotalk" in url else "?dialect=HatChatter")
            async with rpc.connect(target) as peer:
                results.append(await peer.request("echo", [1, "two"]))
    print(json.dumps({"compiled": wire.compiled(), "results": results}))


asyncio.run(main())
"""


def _module(path: str) -> str:
    return path.removesuffix(".py").replace("/", ".")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tree's sources (no build leftovers, no caches)."""
    where = tmp_path_factory.mktemp("compiled") / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.so", ".hypothesis")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, where / name, ignore=ignore)
    for name in SOURCES:
        shutil.copy2(ROOT / name, where / name)
    return where


@pytest.fixture(scope="module")
def wheel(tree: Path) -> Path:
    out = tree.parent / "wheel"
    env = env_with(PEERWIRE_COMPILE="1")
    done = run([*PIP, "wheel", "--no-deps", "-w", out, tree], timeout=600, env=env)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("peerwire-*.whl")
    return built


def test_setup_compiles_the_modules_wire_names() -> None:
    """setup.py's list and ``wire.COMPILABLE`` (what ``wire.compiled()`` looks at) agree."""
    module = ast.parse((ROOT / "setup.py").read_text())
    (paths,) = [
        ast.literal_eval(node.value)
        for node in module.body
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "COMPILED"
    ]
    assert sorted(_module(path) for path in paths) == sorted(wire.COMPILABLE)


def test_the_sources_report_nothing_compiled() -> None:
    assert wire.compiled() == ()


def test_wheel_holds_an_extension_per_compiled_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        extensions = sorted(name for name in whl.namelist() if name.endswith(".so"))
        names = set(whl.namelist())
    assert [name.split(".", 1)[0].replace("/", ".") for name in extensions] == sorted(
        ["peerwire__mypyc", *wire.COMPILABLE]
    )
    # the sources ship too: where an extension cannot load, they run
    assert all(f"{name.replace('.', '/')}.py" in names for name in wire.COMPILABLE)
    assert wheel.name.endswith("-linux_x86_64.whl") or "cp3" in wheel.name


def test_installed_compiled_wheel_serves_and_calls(wheel: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    done = run([*PIP, "--python", python, "install", "--no-deps", "--no-index", wheel])
    assert done.returncode == 0, done.stderr
    probe = run([python, "-c", PROBE], env=env_with(), cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    report = json.loads(probe.stdout.strip().splitlines()[-1])
    assert report == {"compiled": list(wire.COMPILABLE), "results": [[1, "two"]] * 2}


@pytest.mark.timeout(900)
def test_codec_and_core_tests_pass_compiled(wheel: Path, tree: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        for name in whl.namelist():
            if name.endswith(".so"):
                whl.extract(name, tree)
    env = env_with(PYTHONPATH=str(tree))
    env.setdefault("PEERWIRE_LEGACY_PYTHON", str(ROOT / ".venv-legacy" / "bin" / "python"))
    check = [sys.executable, "-c", "import wire; print(' '.join(wire.compiled()))"]
    reported = run(check, env=env, cwd=tree)
    assert reported.stdout.split() == list(wire.COMPILABLE), reported.stderr
    files = sorted(
        str(path.relative_to(tree))
        for path in (tree / "tests").glob("test_*.py")
        if path.name.startswith(COMPILED_TESTS)
    )
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files]
    done = subprocess.run(
        command, cwd=tree, env=env, capture_output=True, text=True, timeout=850, check=False
    )
    tail = "\n".join(done.stdout.splitlines()[-30:])
    assert done.returncode == 0, f"compiled tests failed:\n{tail}\n{done.stderr[-2000:]}"
    assert " passed" in tail and " failed" not in tail, tail
