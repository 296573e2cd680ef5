"""The package's layers: every module imports only its own subpackage or the layers below it.

The order (top first): __main__ -> cli -> tune -> selftest -> launch, results -> training -> forecast -> system -> data,
pipeline -> config -> inputs -> io, logs -> errors. forecast (torch-free) never reads the study's results. Modules of one layer do not import each other's subpackages.
"""

from __future__ import annotations

import graphlib
import subprocess
import sys
from pathlib import Path

import pytest

from gpt2dist.pipeline.imports import PACKAGE, imported_modules

LAYERS = [
    {"__main__"},
    {"cli"},
    {"tune"},
    {"selftest"},
    {"launch", "results"},
    {"training"},
    {"forecast"},
    {"system"},
    {"data", "pipeline"},
    {"config"},
    {"inputs"},
    {"io", "logs", "__init__"},
    {"errors"},  # below io: a write that runs out of disk is one error line
]
RANK = {unit: len(LAYERS) - i for i, layer in enumerate(LAYERS) for unit in layer}
MODULES = sorted(PACKAGE.rglob("*.py"))


def unit_of(module: str) -> str:
    """'gpt2dist.training.loop' -> 'training'; 'gpt2dist' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


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
    assert {"gpt2dist.launch.commands", "gpt2dist.training"} <= imported_modules(module)


def import_cycle(modules: dict[str, Path]) -> list[str] | None:
    """A circle in the imports between these modules (every import: type-only and inside functions too), or None."""
    graph = {name: {other for other in imported_modules(path) if other in modules and other != name}
             for name, path in modules.items()}
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as cycle:
        return cycle.args[1]
    return None


def test_no_module_imports_itself_through_others():
    """Inside a layer as between layers: what imports a module is never imported by it, even for type hints
    alone (config.schema, config.strategies and config.sizes did so)."""
    assert import_cycle({module_name(path): path for path in MODULES}) is None


def test_the_check_catches_a_type_only_circle(tmp_path):
    """Negative control: two modules that import each other, one of them only for type checking."""
    (tmp_path / "a.py").write_text("from gpt2dist.b import thing\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from gpt2dist.a import x\n")
    assert sorted(set(import_cycle({"gpt2dist.a": tmp_path / "a.py", "gpt2dist.b": tmp_path / "b.py"}))) == [
        "gpt2dist.a", "gpt2dist.b"]


HEAVY = ("torch", "scipy", "matplotlib")


def heavy_after_each(*modules: str) -> list[set[str]]:
    """Which heavy libraries are loaded after importing each module in turn, in one fresh interpreter."""
    code = ("import importlib, sys\n"
            f"for module in {list(modules)!r}:\n"
            "    importlib.import_module(module)\n"
            f"    print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return [set(line.split()) for line in out.splitlines()]


@pytest.mark.slow  # imports torch, scipy and matplotlib in a fresh interpreter
@pytest.mark.timeout(60)
def test_the_results_layer_and_refusals_do_not_import_torch():
    """collect, plot, report and bundle never need torch (2-3 s of every such command's start before); a bundle is
    verified before scipy and matplotlib load, so a refused one is told in about half a second; plan, recommend and
    project-scaling read the shipped fit, so scipy's optimizer loads only where a fit is made (validate-published),
    half a second of each forecast's start before. The controls: the probe sees scipy where collect's statistics
    load it, and torch where a module of the training layer does."""
    loaded = heavy_after_each("gpt2dist.results.bundle", "gpt2dist.forecast.words", "gpt2dist.results.collect",
                              "gpt2dist.results.plots", "gpt2dist.results.report", "gpt2dist.forecast.recommend",
                              "gpt2dist.training.loop")
    assert loaded[0] == set(), f"importing the bundle module loads {loaded[0]}"
    assert loaded[1] == set(), f"importing the forecasts loads {loaded[1]}"
    assert "scipy" in loaded[2], "the probe does not see scipy where collect's statistics load it"
    assert "torch" not in loaded[5], "the results layer imports torch"
    assert "torch" in loaded[6], "the probe does not see torch where the training layer loads it"
