"""Loading the project's SBS schemas (``schemas_sbs/*.sbs``) into one hat-sbs repository.

The folder sits at the top of the source tree; a wheel installs it as data files under
``<prefix>/share/peerwire/schemas_sbs``. :func:`repository` looks in both places.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import hat.sbs

_SOURCE_DIR = Path(__file__).resolve().parent.parent / "schemas_sbs"
_INSTALLED_DIR = Path(sys.prefix) / "share" / "peerwire" / "schemas_sbs"


def schema_dir() -> Path:
    """The folder that holds peerwire's ``.sbs`` files."""
    for candidate in (_SOURCE_DIR, _INSTALLED_DIR):
        if candidate.is_dir() and any(candidate.glob("*.sbs")):
            return candidate
    raise FileNotFoundError(f"no schemas_sbs folder at {_SOURCE_DIR} or {_INSTALLED_DIR}")


@functools.cache
def repository(*extra: Path | str) -> hat.sbs.Repository:
    """One :class:`hat.sbs.Repository` of every schema in the folder, plus ``extra`` ones.

    ``extra`` items are schema texts, ``.sbs`` files or folders, as hat-sbs accepts them;
    the result is cached per argument tuple because parsing schemas takes milliseconds.
    """
    return hat.sbs.Repository(schema_dir(), *extra)
