"""A stage's code is what its commands can import, found by reading the imports: the strategy registry loads
its modules by name at run time, and the train stage depends on every one of them."""

from gpt2dist.pipeline.imports import PACKAGE, code_closure, imported_modules
from gpt2dist.pipeline.jobs import stage_code
from gpt2dist.config.methods import ENGINES

STRATEGIES = PACKAGE / "training" / "strategies"


def test_the_train_stage_depends_on_every_engines_module():
    names = {engine.runtime.split(":")[0] for engine in ENGINES}
    assert {f"src/gpt2dist/training/strategies/{module}.py" for module in names} <= set(stage_code("train"))
    # the control: the registry's own imports name none of them, so reading imports alone would miss them all
    assert not {name for name in imported_modules(STRATEGIES / "__init__.py")
                if name.removeprefix("gpt2dist.training.strategies.") in names}


def test_a_package_without_loading_by_name_brings_only_what_is_imported():
    closure = {path.relative_to(PACKAGE).as_posix() for path in code_closure(["gpt2dist.errors"])}
    assert closure == {"__init__.py", "errors.py"}
