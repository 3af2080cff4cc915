"""The optional compiled build of the Gotalk and Chatter codecs (``PEERWIRE_COMPILE=1``).

Everything else about the package is declared in pyproject.toml; without the variable this
file adds nothing and the wheel is pure Python. With ``PEERWIRE_COMPILE=1`` a wheel build
(``pip install``/``pip wheel`` from a source tree or sdist) compiles the modules named by
``wire.COMPILABLE`` with mypyc into extension modules installed next to their sources, which
Python imports in their place (see docs/install.md, "Compiled codecs"). When pip asks what
the build needs, the answer adds :data:`BUILD_REQUIRES` (with build isolation pip fetches
them for the build only; without it they must be installed already, or the build stops and
says so). A C compiler and Python's headers must be on the machine. Editable installs are
refused with the variable set: the extensions would shadow the sources being edited.
"""

from __future__ import annotations

import ast
import os
import sys
import sysconfig
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
BUILD_REQUIRES = ["mypy>=2.4,<3", "msgspec>=0.18"]
"""mypyc (it ships with mypy) and what it needs to type-check the compiled modules."""
GROUP = "peerwire"
"""Names mypyc's library of the code the compiled modules share: ``peerwire__mypyc.*.so``,
the one module a compiled build adds at the top level (mypyc derives each module's
``__file__`` from where that library is, so it cannot live inside ``wire/``)."""


def compilable() -> list[str]:
    """The source files of ``wire.COMPILABLE``, read without importing ``wire`` (its
    dependencies are not in the build environment)."""
    tree = ast.parse((HERE / "wire" / "__init__.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "COMPILABLE":
            return [name.replace(".", "/") + ".py" for name in ast.literal_eval(node.value)]
    raise SystemExit("setup.py: wire/__init__.py defines no COMPILABLE")


class BuildExtensions(build_ext):
    """setuptools' ``build_ext`` that also deletes the extension modules an earlier build
    left in the build directory and this one did not make (a module since dropped from
    ``wire.COMPILABLE``, or a ``build/`` kept across a ``git pull``): the wheel packs that
    whole directory, and such a module, whose code is not in the new ``peerwire__mypyc``,
    would fail at import."""

    def run(self) -> None:
        super().run()
        if self.inplace or self.dry_run:  # nothing was written to the build directory
            return
        made = {Path(output).resolve() for output in self.get_outputs()}
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        for path in Path(self.build_lib).rglob(f"*{suffix}"):
            if path.resolve() not in made:
                print(f"setup.py: removing {path}, left by an earlier build")
                path.unlink()


def compiled_setup() -> None:
    if "editable_wheel" in sys.argv or "develop" in sys.argv:
        raise SystemExit(
            "PEERWIRE_COMPILE=1 builds wheels, not editable installs (the compiled modules "
            "would shadow the sources you edit): unset it, or `pip install .`"
        )
    if not {"bdist_wheel", "build_ext"} & set(sys.argv):
        # pip asking what the build needs, or writing metadata: nothing is compiled yet
        setup(setup_requires=BUILD_REQUIRES)
        return
    try:
        from mypyc.build import mypycify
    except ImportError:
        raise SystemExit(
            "PEERWIRE_COMPILE=1: mypyc is not in the build environment; with "
            f"--no-build-isolation install {' '.join(BUILD_REQUIRES)} first"
        ) from None
    options = [*compilable(), "--config-file", "pyproject.toml"]
    setup(
        ext_modules=mypycify(options, opt_level="3", group_name=GROUP),
        cmdclass={"build_ext": BuildExtensions},
    )


if os.environ.get("PEERWIRE_COMPILE", "") not in ("", "0"):
    compiled_setup()
else:
    setup()
