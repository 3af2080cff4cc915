"""peerwire's SBS schemas, read as package resources, loaded into one hat-sbs repository.

The ``.sbs`` files ship inside the ``wire`` package as ``wire.schemas_sbs`` (built from the
source tree's ``schemas_sbs/`` folder). They are read with :mod:`importlib.resources`, so they
load wherever ``wire`` itself imports from: a venv, ``pip install --user`` or ``--target``, an
editable install, or a zip on ``sys.path`` (Spark ``--py-files``, Spark Connect artifacts).
"""

from __future__ import annotations

import functools
import importlib.resources
import struct
from pathlib import Path

import hat.sbs

PACKAGE = "wire.schemas_sbs"
"""The package whose resources are the ``.sbs`` files."""

MODULES = ("Hat", "HatChatter", "HatEventer", "HatPing", "PeerwireRpc")
"""The SBS modules peerwire needs: every one must be installed."""

SBS_ERRORS: tuple[type[Exception], ...] = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    OverflowError,
    SystemError,
    struct.error,
)
"""What hat-sbs raises on bytes or values that do not fit the type it is asked to decode or
encode (its C decoder raises SystemError on some truncated input, its Python one
struct.error): catch these, not ``Exception``, around ``Repository.decode``/``encode``."""


class SchemaNotFound(LookupError):
    """One of peerwire's ``.sbs`` schemas is not installed (a broken or partial install)."""


def schema_texts() -> dict[str, str]:
    """Module name -> schema text, for every module in :data:`MODULES`.

    Raises :class:`SchemaNotFound` naming the missing module and where it was looked for.
    """
    try:
        folder = importlib.resources.files(PACKAGE)
    except ModuleNotFoundError as exc:
        raise SchemaNotFound(
            f"peerwire's SBS schemas are not installed: no package {PACKAGE} "
            f"({exc}); reinstall peerwire (`pip install --force-reinstall peerwire`)"
        ) from None
    texts: dict[str, str] = {}
    for module in MODULES:
        resource = folder / f"{module}.sbs"
        try:
            texts[module] = resource.read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            raise SchemaNotFound(
                f"peerwire's SBS schema {module}.sbs is missing from {PACKAGE} ({folder}); "
                "reinstall peerwire (`pip install --force-reinstall peerwire`)"
            ) from None
    return texts


@functools.cache
def repository(*extra: Path | str) -> hat.sbs.Repository:
    """One :class:`hat.sbs.Repository` of every peerwire schema, plus ``extra`` ones.

    ``extra`` items are schema texts, ``.sbs`` files or folders, as hat-sbs accepts them;
    the result is cached per argument tuple because parsing schemas takes milliseconds.
    Raises :class:`SchemaNotFound` when a schema is not installed.
    """
    return hat.sbs.Repository(*schema_texts().values(), *extra)
