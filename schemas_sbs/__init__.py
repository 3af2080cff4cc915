"""peerwire's SBS schemas (``*.sbs``), installed as the package ``wire.schemas_sbs``.

This folder is the only copy: the build maps it into the ``wire`` package (see
``pyproject.toml``), and :mod:`wire.schemas` reads it with :mod:`importlib.resources`.
"""
