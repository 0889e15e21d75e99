"""A griffe extension for the API reference (mkdocs.yml, docs/api.md).

pegmask's subpackages live in top-level folders (`pegmask.grammars` is `grammars/`, ...),
mapped by `[tool.setuptools.package-dir]` in pyproject.toml, where griffe's static loader does
not look: it finds `pegmask/` alone. Once `pegmask` is loaded, each mapped folder is loaded as
a package of its own and attached under its `pegmask.` name, so that `::: pegmask.grammars.X`
and the facade's aliases (`pegmask.Grammar`) resolve.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import griffe

ROOT = Path(__file__).resolve().parents[2]  # docs/_ext/ -> the repository
# `"pegmask.grammars" = "grammars"` lines of the package-dir table (TOML kept simple there;
# tomllib is not in Python 3.10's standard library)
_TABLE = re.compile(r"^\[tool\.setuptools\.package-dir\]\s*$(?P<body>.*?)(?=^\[|\Z)", re.M | re.S)
_ENTRY = re.compile(r'^\s*"pegmask\.(?P<name>\w+)"\s*=\s*"(?P<folder>[^"]+)"', re.M)


def package_dirs() -> dict[str, str]:
    """{"grammars": "grammars", ...}: pegmask's direct subpackages and their folders."""
    table = _TABLE.search((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    if table is None:
        raise ValueError("pyproject.toml has no [tool.setuptools.package-dir] table")
    return {m["name"]: m["folder"] for m in _ENTRY.finditer(table["body"])}


class PackageDirs(griffe.Extension):
    """Attach pegmask's subpackages (see the module docstring)."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader,
                   **kwargs: Any) -> None:
        if pkg.name != "pegmask":
            return
        for name, folder in package_dirs().items():
            if folder != name:  # loaded below as the top-level package named like its folder
                raise ValueError(f"pegmask.{name} lives in {folder}/: not supported here")
            subpackage = loader.load(name, try_relative_path=False)
            loader.modules_collection.del_member(name)
            pkg.set_member(name, subpackage)
