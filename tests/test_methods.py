"""The data-parallel methods are one record each (config.methods): no table elsewhere names them (a new one is its
record alone: tests/training/test_adding_a_method.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from gpt2dist.config.methods import METHODS, NONE
from gpt2dist.pipeline.imports import PACKAGE

# Words that share a method's name: the Horovod package (its version, its build) and the data-parallel process
# group ("dp", as run records name it), which torch.nn.DataParallel's method shares
PACKAGE_NAMES = {("system/environment.py", "horovod"), ("config/traffic.py", "dp")}


def tables_naming(path: Path, names) -> list[tuple[int, list[str]]]:
    """Each literal list, tuple, set or dict in a module whose items (or keys, or values) include one of `names`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        items = node.elts if isinstance(node, (ast.List, ast.Tuple, ast.Set)) else \
            [*filter(None, node.keys), *node.values] if isinstance(node, ast.Dict) else []
        named = [item.value for item in items if isinstance(item, ast.Constant) and item.value in names]
        if named:
            found.append((node.lineno, named))
    return found


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_table_outside_the_records_names_a_method(path):
    """A method's capabilities, words, traffic and runtime live in its record; a list of methods anywhere else
    (the seven name tables there were) is one more place a new method must be added."""
    relative = path.relative_to(PACKAGE).as_posix()
    if relative == "config/methods.py":
        return
    names = set(METHODS) - {NONE}  # "none" is also a setting's word (activation_checkpointing)
    tables = [(line, [n for n in named if (relative, n) not in PACKAGE_NAMES]) for line, named in tables_naming(path, names)]
    assert not [table for table in tables if table[1]], f"{relative} lists methods {tables}: ask config.methods"


def test_the_check_finds_a_table_of_methods(tmp_path):
    """Negative control: a table of methods, as config.split's COMPOSING and the runtime's _WHERE were."""
    probe = tmp_path / "probe.py"
    probe.write_text('"""Mentions ddp in prose."""\nCOMPOSING = ("ddp", "fsdp")\nWHERE = {"hsdp": ("fsdp", "HSDP")}\n')
    assert tables_naming(probe, set(METHODS)) == [(2, ["ddp", "fsdp"]), (3, ["hsdp"]), (3, ["fsdp"])]
