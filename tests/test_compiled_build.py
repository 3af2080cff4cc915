"""The optional compiled build (``PEERWIRE_COMPILE=1``, setup.py) behaves as the sources do.

A copy of this tree is built into a wheel as a user builds it: pip with build isolation, run
by a venv with no packages at all, so the build gets only what setup.py asks for (mypy,
msgspec) and gcc compiles. The wheel is installed into a venv and with ``--target`` (zipped
too), each of which serves and calls over Chatter and Gotalk; its extension modules are laid
over the copy, where the codec, core, hostile-peer, WebSocket and Eventer tests run in a
pytest of their own: each of them must pass compiled as it does on the sources.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import wire
from tests.packaging import (
    ECHOED,
    PIP,
    build_wheel,
    copy_tree,
    env_for,
    env_with,
    fresh_venv,
    keep_compiled,
    overlay,
    probe,
    run,
    zip_packages,
)

# the module's fixtures build one compiled wheel (about 35 s): its tests run on one
# pytest-xdist worker (`make test` runs on every core), so it is built once
pytestmark = pytest.mark.xdist_group("compiled")

COMPILED_TESTS = (
    "test_gotalk_",
    "test_chatter_",
    "test_wire_",
    "test_rpc_core",
    "test_rpc_gotalk_",
    "test_rpc_chatter_",
    "test_eventer_interop",
    "test_eventer_fidelity",
    "test_hostile_core",
    "test_websocket",
)
"""The test files (by name prefix) run against the compiled copy: every codec test (fuzzing
and the hat-drivers interop ones included); the core's calls over both protocols (its main
tests, Gotalk's and Chatter's own) and under hostile peers; WebSocket framing; and the
Eventer against the Hat reference (the other user of ``wire.sbs``). The rest of the core's
and the Eventer's tests exercise no more of the compiled modules (about 90 s more in CI)."""
COMPILED = list(wire.COMPILABLE)


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("compiled") / "tree")


STALE = "wire/gotalk/retired"
"""An extension module an earlier build of the tree made and this one does not (a module
since dropped from ``wire.COMPILABLE``): the build must delete it, not ship it."""


def stale_extension(tree: Path) -> Path:
    """Where setuptools keeps this interpreter's build of ``tree``, and the stale module in
    it."""
    build = f"lib.{sysconfig.get_platform()}-{sys.implementation.cache_tag}"
    return tree / "build" / build / f"{STALE}{sysconfig.get_config_var('EXT_SUFFIX')}"


@pytest.fixture(scope="module")
def wheel(tree: Path) -> Path:
    stale = stale_extension(tree)
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"left by an earlier build")
    empty = fresh_venv(tree.parent / "empty-venv", deps=False)
    built = build_wheel(tree, tree.parent / "wheel", compiled=True, python=empty)
    keep_compiled(built)  # for CI's benchmark smoke pass, which then need not build it
    return built


def test_the_sources_report_nothing_compiled() -> None:
    assert wire.compiled() == ()


@pytest.mark.timeout(600)  # builds the wheel (about 20 s; pip may fetch mypy)
def test_wheel_holds_an_extension_per_compiled_module(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    extensions = sorted(name.split(".", 1)[0] for name in names if name.endswith(".so"))
    assert extensions == sorted(n.replace(".", "/") for n in ["peerwire__mypyc", *COMPILED])
    # the sources ship too: where the extensions are not found (a zip), they run
    assert all(f"{name.replace('.', '/')}.py" in names for name in COMPILED)
    assert "-none-any" not in wheel.name  # a wheel for this interpreter and platform


@pytest.mark.timeout(600)
def test_build_deletes_extensions_an_earlier_build_left(wheel: Path, tree: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        assert not [name for name in whl.namelist() if name.startswith(STALE)]
    assert not stale_extension(tree).exists()  # deleted where it was: the seed was found


@pytest.mark.timeout(600)
def test_compiled_wheel_in_a_venv_serves_and_calls(wheel: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    done = run([*PIP, "--python", python, "install", "--no-deps", "--no-index", wheel])
    assert done.returncode == 0, done.stderr
    report = probe(python, env_with(), cwd=tmp_path)
    assert report["results"] == ECHOED and report["compiled"] == COMPILED, report


@pytest.mark.timeout(600)
def test_compiled_target_install_and_its_zip(wheel: Path, tmp_path: Path) -> None:
    """``--target`` runs the compiled modules; zipped (Spark's ``--py-files``), the same
    packages run their sources, as zipimport loads no extension modules."""
    target = tmp_path / "target"
    done = run([*PIP, "install", "--no-deps", "--no-index", "--target", target, wheel])
    assert done.returncode == 0, done.stderr
    report = probe(sys.executable, env_with(PYTHONPATH=str(target)), cwd=tmp_path)
    assert report["results"] == ECHOED and report["compiled"] == COMPILED, report
    archive = zip_packages(target, tmp_path / "peerwire.zip")
    report = probe(sys.executable, env_with(PYTHONPATH=str(archive)), cwd=tmp_path)
    assert report["results"] == ECHOED and report["compiled"] == [], report
    assert "/peerwire.zip/wire/" in report["wire"]


@pytest.mark.timeout(300)
def test_editable_install_refuses_to_compile(tmp_path: Path) -> None:
    tree = copy_tree(tmp_path / "tree")
    python = fresh_venv(tmp_path / "venv")
    command = [*PIP, "--python", python, "install", "--no-deps", "-e", tree]
    done = run(command, timeout=280, env=env_with(PEERWIRE_COMPILE="1"))
    assert done.returncode != 0
    assert "PEERWIRE_COMPILE=1 builds wheels, not editable installs" in done.stderr + done.stdout
    assert not list(tree.rglob("*.so"))


@pytest.mark.timeout(900)
def test_codec_and_core_tests_pass_compiled(wheel: Path, tree: Path) -> None:
    overlay(wheel, tree)
    env = env_for(tree)
    check = [sys.executable, "-c", "import wire; print(' '.join(wire.compiled()))"]
    reported = run(check, env=env, cwd=tree)
    assert reported.stdout.split() == COMPILED, reported.stderr
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
    assert " passed" in tail and " failed" not in tail and " skipped" not in tail, tail
