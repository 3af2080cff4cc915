"""A clear ImportError when ``rpc``, ``wire`` or ``transports`` is another distribution's.

peerwire installs three top-level packages whose names other PyPI distributions use too
(e.g. ``transports`` 0.10.0). Installed into one environment, pip merges the folders and the
last install's ``__init__.py`` wins, so an import would fail far from the cause. Each of
peerwire's ``__init__.py`` files sets ``__peerwire__`` to its package name; a package
without it, or one that fails to import, is traced to the distribution whose files it holds.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

PACKAGES = ("rpc", "wire", "transports")
"""peerwire's top-level packages (the distribution installs exactly these)."""

MARKER = "__peerwire__"


class PackageClash(ImportError):
    """One of peerwire's package names resolves to another distribution's files."""


def foreign_distributions(name: str) -> list[str]:
    """``"name version"`` of every installed distribution but peerwire with files in ``name/``."""
    import importlib.metadata  # only on this error path: it costs every import ~60 ms

    found = []
    for dist in importlib.metadata.distributions():
        dist_name = dist.metadata["Name"] or ""
        if dist_name.lower() == "peerwire":
            continue
        if any(file.parts[:1] == (name,) for file in dist.files or ()):
            found.append(f"{dist_name} {dist.version}")
    return sorted(set(found))


def clash_message(name: str, where: str, owners: list[str]) -> str:
    """The error text: which distribution, where, and what to do."""
    others = ", ".join(owners) if owners else "a distribution that is not peerwire"
    return (
        f"the package {name!r} at {where} is not peerwire's: it belongs to {others}. "
        f"peerwire installs the top-level packages {', '.join(PACKAGES)}, so it cannot share "
        "an environment with another distribution that installs one of them: use separate "
        f"virtual environments, or uninstall the other one and reinstall peerwire "
        f"(`pip install --force-reinstall peerwire`)."
    )


def _where(module: ModuleType | None, name: str) -> str:
    path = getattr(module, "__file__", None)
    if path is None:
        spec = importlib.util.find_spec(name)
        path = spec.origin if spec is not None else None
    return str(path or "an unknown location")


def check(module: ModuleType) -> None:
    """Raise :class:`PackageClash` unless ``module`` (a top-level package) is peerwire's."""
    if getattr(module, MARKER, None) != module.__name__:
        owners = foreign_distributions(module.__name__)
        raise PackageClash(clash_message(module.__name__, _where(module, module.__name__), owners))


def require(name: str) -> ModuleType:
    """Import peerwire's top-level package ``name``, or raise :class:`PackageClash`.

    A failed import is re-raised as it is unless another distribution owns files there.
    """
    try:
        module = importlib.import_module(name)
    except Exception as exc:
        owners = foreign_distributions(name)
        if not owners:
            raise
        raise PackageClash(clash_message(name, _where(None, name), owners)) from exc
    check(module)
    return module
