"""Wheels, venvs and tree copies for the tests of how peerwire installs.

Shared by tests/test_install_layouts.py, tests/test_compiled_build.py and
tests/benchmarks/bench_compiled.py. Wheels are built as users build them (pip with build
isolation). :data:`PROBE` is a program that serves and calls over Chatter and Gotalk with
whatever peerwire it imports and prints, as JSON, where ``wire`` and the schemas came from and
which codec modules run compiled.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SITE_PACKAGES = sysconfig.get_paths()["purelib"]
PIP = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE")
PACKAGES = ("rpc", "wire", "transports", "schemas_sbs", "tests")

PROBE = """\
import asyncio, importlib.resources, json
import rpc, wire

registry = rpc.Registry()


@registry.handle("echo")
def echo(value):
    return value


async def main():
    results = []
    for url in ("tcp+sbs://127.0.0.1:0", "tcp+gotalk://127.0.0.1:0"):
        async with rpc.serve(url, registry=registry) as server:
            chatter = url.startswith("tcp+sbs")
            target = f"{server.url}?dialect=HatChatter" if chatter else str(server.url)
            async with rpc.connect(target) as peer:
                results.append(await peer.request("echo", [1, "two"]))
    schemas = importlib.resources.files("wire.schemas_sbs")
    report = {"wire": wire.__file__, "schemas": str(schemas), "results": results}
    print(json.dumps({**report, "compiled": wire.compiled()}))


asyncio.run(main())
"""
ECHOED = [[1, "two"], [1, "two"]]
"""What :data:`PROBE` reports as ``results`` when both calls worked."""


def run(
    args: list[str | Path], timeout: float = 120, **kwargs: object
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, **kwargs
    )  # type: ignore[call-overload]


def env_with(**extra: str) -> dict[str, str]:
    """This process's environment without what would change which peerwire runs or how
    one is built (PYTHONPATH, PYTHONUSERBASE, PEERWIRE_COMPILE), plus ``extra``."""
    dropped = ("PYTHONPATH", "PYTHONUSERBASE", "PEERWIRE_COMPILE")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(extra)
    return env


def probe(python: str | Path, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict:
    done = run([python, "-c", PROBE], env=env, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def fresh_venv(where: Path, *, system_site_packages: bool = False, deps: bool = True) -> Path:
    """A venv without pip; with ``deps``, peerwire's dependencies are this venv's (a .pth
    line, no hooks run). Returns its python."""
    venv.EnvBuilder(with_pip=False, system_site_packages=system_site_packages).create(where)
    python = where / "bin" / "python"
    if deps:
        purelib = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
        Path(purelib.stdout.strip(), "peerwire-test-deps.pth").write_text(SITE_PACKAGES + "\n")
    return python


def build_wheel(
    source: Path, out: Path, *, compiled: bool = False, python: Path | None = None
) -> Path:
    """Build ``source``'s wheel into ``out`` with pip (``compiled``: ``PEERWIRE_COMPILE=1``)
    for ``python`` (default: this one; pip runs the build with that interpreter, so a venv
    without packages builds as a user's fresh environment does). Raises RuntimeError with
    pip's output when the build fails (no C compiler or Python headers, no registry)."""
    env = env_with(PEERWIRE_COMPILE="1") if compiled else env_with()
    target = [] if python is None else ["--python", python]
    command = [*PIP, *target, "wheel", "--no-deps", "--no-cache-dir", "-w", out, source]
    done = run(command, timeout=600, env=env)
    if done.returncode:
        raise RuntimeError(f"pip wheel failed:\n{done.stdout}\n{done.stderr}")
    (wheel,) = out.glob("peerwire-*.whl")
    return wheel


COMPILED_KEEP = ROOT / "build" / "compiled-wheel"
"""Where :func:`keep_compiled` keeps the last compiled wheel a test built (``build/`` is
ignored by git and removed by ``make clean``)."""


def compiled_key() -> str:
    """What a compiled wheel is built from: the codecs' sources (``wire/``), the build's
    files and this interpreter."""
    digest = hashlib.sha256(sys.version.encode())
    for path in sorted(
        [*(ROOT / "wire").rglob("*.py"), ROOT / "setup.py", ROOT / "pyproject.toml"]
    ):
        digest.update(path.relative_to(ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def keep_compiled(wheel: Path) -> None:
    """Keep ``wheel`` (compiled from this tree's sources) for :func:`kept_compiled`: CI's
    benchmark smoke pass then reuses the wheel its tests built (about 30 s on 2 cores)."""
    shutil.rmtree(COMPILED_KEEP, ignore_errors=True)
    (COMPILED_KEEP / compiled_key()).mkdir(parents=True)
    shutil.copy2(wheel, COMPILED_KEEP / compiled_key() / wheel.name)


def kept_compiled() -> Path | None:
    """The compiled wheel :func:`keep_compiled` kept, if it was built from these sources."""
    kept = sorted((COMPILED_KEEP / compiled_key()).glob("peerwire-*.whl"))
    return kept[0] if kept else None


def zip_packages(target: Path, archive: Path) -> Path:
    """The rpc, wire and transports folders of a ``--target`` install as one zip (no
    caches), as Spark's ``--py-files`` ship them."""
    with zipfile.ZipFile(archive, "w") as zf:
        for top in ("rpc", "wire", "transports"):
            for file in sorted((target / top).rglob("*")):
                if file.is_file() and "__pycache__" not in file.parts:
                    zf.write(file, file.relative_to(target).as_posix())
    return archive


def copy_tree(where: Path) -> Path:
    """Copy the packages, the tests (benchmarks included) and the files a build reads to
    ``where``: no build leftovers, no caches, no extension modules."""
    ignore = shutil.ignore_patterns("__pycache__", "*.so", ".hypothesis")
    for name in PACKAGES:
        shutil.copytree(ROOT / name, where / name, ignore=ignore)
    for name in SOURCES:
        shutil.copy2(ROOT / name, where / name)
    return where


def overlay(wheel: Path, tree: Path) -> list[str]:
    """Extract ``wheel``'s extension modules into ``tree`` (a copy): next to the sources,
    they run in their place for anything run with ``tree`` first on ``sys.path``."""
    with zipfile.ZipFile(wheel) as whl:
        names = [name for name in whl.namelist() if name.endswith(".so")]
        for name in names:
            whl.extract(name, tree)
    return names


def env_for(tree: Path) -> dict[str, str]:
    """The environment that runs ``tree``'s code: it first on ``sys.path``; the legacy
    hat-chatter venv (tests/test_chatter_interop.py) is the checkout's."""
    env = env_with(PYTHONPATH=str(tree))
    env.setdefault("PEERWIRE_LEGACY_PYTHON", str(ROOT / ".venv-legacy" / "bin" / "python"))
    return env
