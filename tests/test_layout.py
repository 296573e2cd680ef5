"""The package's layers: every module imports only its own subpackage or the layers below it.

The order (top first): __main__ -> cli -> launch, results -> training -> system -> data, pipeline ->
config -> io, errors, logs. Modules of one layer do not import each other's subpackages.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import REPO

PACKAGE = REPO / "src" / "gpt2dist"
LAYERS = [
    {"__main__"},
    {"cli"},
    {"launch", "results"},
    {"training"},
    {"system"},
    {"data", "pipeline"},
    {"config"},
    {"io", "errors", "logs", "__init__"},
]
RANK = {unit: len(LAYERS) - i for i, layer in enumerate(LAYERS) for unit in layer}
MODULES = sorted(PACKAGE.rglob("*.py"))


def unit_of(module: str) -> str:
    """'gpt2dist.training.loop' -> 'training'; 'gpt2dist' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from gpt2dist import x` names submodule x
            if node.module == "gpt2dist":
                found.update(f"gpt2dist.{alias.name}" for alias in node.names)
    return {name for name in found if name == "gpt2dist" or name.startswith("gpt2dist.")}


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    return ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)


def test_every_unit_has_a_layer():
    units = {unit_of(module_name(path)) for path in MODULES}
    assert units <= set(RANK), f"add {units - set(RANK)} to LAYERS"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path):
    own = unit_of(module_name(path))
    upward = [name for name in imported_modules(path)
              if unit_of(name) != own and RANK[unit_of(name)] >= RANK[own]]
    assert not upward, f"{module_name(path)} ({own}) imports {upward}: move the shared piece down a layer"


def test_the_check_catches_an_upward_import(tmp_path):
    """Negative control: the parser sees both import forms an upward import can take."""
    module = tmp_path / "probe.py"
    module.write_text("from gpt2dist.launch.commands import DEFAULT_PORT\nfrom gpt2dist import training\n")
    assert imported_modules(module) == {"gpt2dist.launch.commands", "gpt2dist", "gpt2dist.training"}
