"""The optional compiled build of the Gotalk and Chatter codecs (``PEERWIRE_COMPILE=1``).

Everything else about the package is declared in pyproject.toml; without the variable this
file adds nothing and the wheel is pure Python. With ``PEERWIRE_COMPILE=1`` (``pip install``
or ``pip wheel`` from a source tree or sdist) the modules in :data:`COMPILED` are compiled
with mypyc into extension modules installed next to their sources, which Python imports in
their place; where an extension cannot load (another interpreter, a zip on ``sys.path``) the
sources run as before. The build front end fetches mypy for the build only (it is asked for
as a build requirement when mypyc is missing); a C compiler and Python's headers must be on
the machine. What it gains is measured in docs/benchmarks.md
("Compiled codecs").
"""

from __future__ import annotations

import os

from setuptools import setup

COMPILED = (
    "wire/gotalk/connection.py",
    "wire/gotalk/decoding.py",
    "wire/gotalk/encoding.py",
    "wire/sbs.py",
    "wire/chatter/connection.py",
    "wire/chatter/conversations.py",
    "wire/chatter/envelope.py",
    "wire/chatter/framing.py",
)
"""The modules the compiled build compiles: the codecs' per-message paths.
``wire/gotalk/messages.py`` stays interpreted (mypyc takes its classes' ``TYPE`` class
variable for a field, and the decoder builds them through slot setters)."""
GROUP = "peerwire"
"""Names mypyc's library of the code the compiled modules share: ``peerwire__mypyc.*.so``,
the one module a compiled build adds at the top level (mypyc derives each module's
``__file__`` from where it is, so it cannot live inside ``wire/``)."""
MYPY = "mypy>=2.4,<3"
"""The mypyc the compiled build asks the front end for (mypyc ships with mypy)."""

if os.environ.get("PEERWIRE_COMPILE", "") not in ("", "0"):
    try:
        from mypyc.build import mypycify
    except ImportError:  # pip asks for the build requirements first; mypy is one
        setup(setup_requires=[MYPY])
    else:
        options = [*COMPILED, "--config-file", "pyproject.toml"]
        setup(ext_modules=mypycify(options, opt_level="3", group_name=GROUP))
else:
    setup()
