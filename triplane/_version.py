"""The one version number of triplane: the package, its processes (scheduler, executor)
and ``pyproject.toml`` (``[tool.setuptools.dynamic]``) all read it here."""

__version__ = "0.1.0"
