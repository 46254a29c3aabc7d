"""The version of alcli (pyproject.toml reads it from here): `alcli --version`, alcli.__version__,
and the `alcli_version` of every OUTPUT.meta.json."""
__version__ = "0.2.0"
