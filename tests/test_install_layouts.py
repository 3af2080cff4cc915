"""The built wheel works in every install layout the docs name, Chatter schemas included.

One wheel is built from this tree (pip, with build isolation, as users build it). It is then
installed into a fresh venv, with ``--user``, with ``--target``, and zipped (what Spark's
``--py-files`` put on ``sys.path``); the zip also goes to Spark Connect executors with
``spark.addArtifacts(..., pyfile=True)``.
Each layout runs a Chatter request (which needs the ``.sbs`` schemas) and a Gotalk one over
TCP, and reports where ``wire`` and the schemas came from and that no codec module runs
compiled (this wheel is pure; tests/test_compiled_build.py builds the other kind).
peerwire's dependencies come from this venv's site-packages through a ``.pth`` line, which
does not run this venv's editable-install hook.
"""

from __future__ import annotations

import json
import shutil
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from tests.packaging import (
    ECHOED,
    PIP,
    PROBE,
    ROOT,
    build_wheel,
    copy_tree,
    env_with,
    fresh_venv,
    probe,
    run,
    zip_packages,
)
from tests.spark_session import ONE_SPARK_AT_A_TIME

# the tests share one wheel (the module's fixtures) and one starts Spark Connect: all of
# them on the one pytest-xdist worker that runs Spark, the wheel built once
pytestmark = ONE_SPARK_AT_A_TIME


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # built from a copy, as tests/test_compiled_build.py builds: a build writes build/ and
    # *.egg-info into its source, and a module left in an older build/lib goes into the wheel
    where = tmp_path_factory.mktemp("wheel")
    return build_wheel(copy_tree(where / "tree"), where)


@pytest.fixture(scope="module")
def target(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("target")
    done = run([*PIP, "install", "--no-deps", "--no-index", "--target", where, wheel])
    assert done.returncode == 0, done.stderr
    return where


def assert_inside(report: dict, root: Path, schemas_in: str) -> None:
    assert report["results"] == ECHOED and report["compiled"] == [], report
    assert Path(report["wire"]).is_relative_to(root), report
    assert report["schemas"].startswith(str(root)) and report["schemas"].endswith(schemas_in)


@pytest.mark.timeout(180)
def test_wheel_holds_three_packages_and_every_schema(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as whl:
        names = whl.namelist()
        top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith(".dist-info")}
        assert top == {"rpc", "wire", "transports"}
        for sbs in sorted((ROOT / "schemas_sbs").glob("*.sbs")):
            assert whl.read(f"wire/schemas_sbs/{sbs.name}") == sbs.read_bytes()
        web = ROOT / "transports" / "web"  # the browser library: its parts, list, Node loader
        parts = json.loads((web / "gotalk.parts.json").read_text())
        for name in [*parts, "gotalk.parts.json", "gotalk.js"]:
            assert whl.read(f"transports/web/{name}") == (web / name).read_bytes(), name
        assert not [n for n in names if n.endswith(".sbs") and not n.startswith("wire/")]
        metadata = whl.read("peerwire-0.1.0.dist-info/METADATA").decode()
        assert "License-Expression: MIT" in metadata
        assert "peerwire-0.1.0.dist-info/licenses/LICENSE" in names


def test_package_list_names_every_source_folder() -> None:
    """pyproject lists packages by hand (schemas_sbs/ maps into wire): none may be missed."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    on_disk = {
        ".".join(d.relative_to(ROOT).parts)
        for top in ("rpc", "wire", "transports")
        for d in [ROOT / top, *(ROOT / top).rglob("*")]
        if d.is_dir() and d.name != "__pycache__"
    }
    assert listed == on_disk | {"wire.schemas_sbs"}
    assert config["package-dir"] == {"wire.schemas_sbs": "schemas_sbs"}


@pytest.mark.timeout(180)
def test_venv_install(wheel: Path, tmp_path: Path) -> None:
    python = fresh_venv(tmp_path / "venv")
    done = run([*PIP, "--python", python, "install", "--no-deps", "--no-index", wheel])
    assert done.returncode == 0, done.stderr
    assert_inside(probe(python, env_with(), cwd=tmp_path), tmp_path / "venv", "schemas_sbs")
    assert not list((tmp_path / "venv").rglob("share/peerwire"))  # no data-files any more


@pytest.mark.timeout(180)
def test_user_install(wheel: Path, tmp_path: Path) -> None:
    # a venv that sees user site-packages (one with system site-packages does)
    python = fresh_venv(tmp_path / "venv", system_site_packages=True)
    env = env_with(PYTHONUSERBASE=str(tmp_path / "userbase"))
    done = run([*PIP, "--python", python, "install", "--user", "--no-deps", wheel], env=env)
    assert done.returncode == 0, done.stderr
    assert_inside(probe(python, env, cwd=tmp_path), tmp_path / "userbase", "schemas_sbs")
    cli = run([tmp_path / "userbase" / "bin" / "peerwire", "--help"], env=env)
    assert cli.returncode == 0 and "serve" in cli.stdout, cli.stderr


@pytest.mark.timeout(180)
def test_target_install(target: Path, tmp_path: Path) -> None:
    report = probe(sys.executable, env_with(PYTHONPATH=str(target)), cwd=tmp_path)
    assert_inside(report, target, "schemas_sbs")


@pytest.mark.timeout(180)
def test_zip_on_sys_path(target: Path, tmp_path: Path) -> None:
    """A zip of the installed packages, as shipped with --py-files or as an artifact."""
    archive = zip_packages(target, tmp_path / "peerwire.zip")
    report = probe(sys.executable, env_with(PYTHONPATH=str(archive)), cwd=tmp_path)
    assert_inside(report, archive, "wire/schemas_sbs/")


@pytest.mark.timeout(300)
def test_zip_as_spark_connect_artifact(target: Path, tmp_path: Path) -> None:
    """The same zip shipped with spark.addArtifacts(pyfile=True): the executors import
    wire from it and encode a Chatter message with its schemas."""
    from tests.spark_session import require_spark, spark_env

    require_spark()
    archive = zip_packages(target, tmp_path / "peerwire.zip")
    env = env_with(**{k: v for k, v in spark_env().items() if k != "PYTHONPATH"})
    env["SPARK_TESTING"] = "1"  # the local Connect server takes a free port
    job = ROOT / "tests" / "peers" / "spark_zip_job.py"
    args = [sys.executable, job, "--remote", "local[2]", "--zip", archive]
    done = run(args, env=env, cwd=tmp_path, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(reports) == 2
    for report in reports:
        assert "/peerwire.zip/wire/__init__.py" in report["wire"], report
        assert report["schemas"].endswith("/peerwire.zip/wire/schemas_sbs/"), report
        assert report["bytes"] > 0


def test_editable_install_reads_the_source_folder(tmp_path: Path) -> None:
    """This venv's editable install maps wire.schemas_sbs onto the one schemas_sbs/ folder."""
    report = probe(sys.executable, env_with(), cwd=tmp_path)  # not run from the tree
    assert report["results"] == ECHOED
    assert Path(report["schemas"]) == ROOT / "schemas_sbs"


@pytest.mark.timeout(180)
def test_missing_schema_is_a_typed_error(target: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(target, broken)
    (broken / "wire" / "schemas_sbs" / "HatEventer.sbs").unlink()
    done = run([sys.executable, "-c", PROBE], env=env_with(PYTHONPATH=str(broken)), cwd=tmp_path)
    assert done.returncode == 1
    # `import rpc` fails at once, before any connection could fail in a less clear way
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("wire.schemas.SchemaNotFound: peerwire's SBS schema HatEventer.sbs")
    assert "AssertionError" not in done.stderr


@pytest.mark.timeout(300)
def test_another_distributions_transports_is_named(wheel: Path, tmp_path: Path) -> None:
    """PyPI's `transports` 0.10.0 installed after peerwire: pip merges the two `transports/`
    folders and its `__init__.py` wins. `import rpc` and the CLI must say so, naming it."""
    python = fresh_venv(tmp_path / "venv")
    for what in ([wheel], ["transports==0.10.0"]):
        done = run([*PIP, "--python", python, "install", "--no-deps", *what])
        assert done.returncode == 0, done.stderr
    done = run([python, "-c", "import rpc"], env=env_with(), cwd=tmp_path)
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("rpc._packages.PackageClash: the package 'transports' at "), last
    assert "it belongs to transports 0.10.0" in last
    assert "use separate virtual environments" in last
    cli = run([tmp_path / "venv" / "bin" / "peerwire", "--help"], env=env_with())
    assert cli.returncode == 1
    assert "it belongs to transports 0.10.0" in cli.stderr
