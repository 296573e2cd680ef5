"""Which of the package's modules a piece of code can run: the imports of its modules, followed
transitively (imports inside functions too, since the commands import lazily). DVC's stages depend on
exactly these files, so a change to any module a stage runs re-runs it, and nobody keeps the list."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # src/gpt2dist


def imported_modules(path: Path) -> set[str]:
    """The gpt2dist modules a file names in its imports (absolute imports; the package uses no others)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # `from gpt2dist.x import y` may name the submodule y (or only a function or constant in x)
            found.update(name for alias in node.names
                         if module_file(name := f"{node.module}.{alias.name}") is not None)
    return {name for name in found if name == "gpt2dist" or name.startswith("gpt2dist.")}


def module_file(module: str) -> Path | None:
    """The file of a gpt2dist module or package, None for a name that is not one (an imported function)."""
    parts = module.split(".")[1:]
    if not parts:
        return PACKAGE / "__init__.py"
    relative = Path(*parts)
    for candidate in (PACKAGE / relative.with_suffix(".py"), PACKAGE / relative / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imports_by_name(path: Path) -> bool:
    """Whether a file calls importlib's import_module: a package that loads its own modules by name at run time
    (the strategy registry) can run any of them."""
    return any(isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) ==
               "import_module" for node in ast.walk(ast.parse(path.read_text())))


def code_closure(entries: list[str]) -> list[Path]:
    """Every module file the entry modules can reach, with the __init__ files of the packages on the way, and
    every module of a package whose __init__ imports its modules by name."""
    seen: set[Path] = set()
    todo = list(entries)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for depth in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__ first
            name = ".".join(parts[:depth])
            path = module_file(name)
            if path is not None and path not in seen:
                seen.add(path)
                todo.extend(imported_modules(path))
                if path.name == "__init__.py" and imports_by_name(path):
                    todo.extend(f"{name}.{sibling.stem}" for sibling in path.parent.glob("*.py")
                                if sibling.name != "__init__.py")
    return sorted(seen)
