"""attention-conformance, the one import name the suite claims.

Its packages are `attention_conformance.conformance` (tests, oracle, tolerances, strategies, report) and
`attention_conformance.implementations` (the registry and built-in backends). An installed wheel holds them
here, with spec/ and fixtures/ as package data. In a source checkout they are the repository's top-level
directories: __path__ reaches the directory above, so both layouts import the same modules under the same
names and a user's own package called `conformance` or `implementations` is never shadowed.
"""
from pathlib import Path as _Path

_HERE = _Path(__file__).resolve().parent
if not (_HERE / "conformance").is_dir() and (_HERE.parent / "conformance" / "plugin.py").is_file():
    __path__.append(str(_HERE.parent))  # noqa: F821 (a package's __path__ is defined at import)
