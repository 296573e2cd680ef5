"""The strategy registry (config.strategies) is the one home of what a strategy is: nothing else in the
package names a strategy, the CLI lists what it lists, and the papers' names map to the strategies the
presets label with them."""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import (
    ALL_FORWARDS_FIRST,
    INTERLEAVED_SCHEDULES,
    PIPELINE_SCHEDULES,
    STRATEGY_NAMES,
    TrainConfig,
)
from gpt2dist.config.methods import BAI
from gpt2dist.config.strategies import called, STRATEGIES
from gpt2dist.pipeline.imports import PACKAGE

from conftest import REPO, gpt2dist

# Where a strategy may be named: the methods' records, the grammar of splits and its named points, and the modules
# whose mesh dimensions share tp's and pp's names (degrees, the parameters a rank holds, the traffic by group, the
# runtime's meshes)
HOMES = ("config/methods.py", "config/split.py", "config/degrees.py", "config/geometry.py", "config/traffic.py",
         "config/strategies.py", "training/strategies/")
# The Horovod package (its version, its build), which shares the strategy's name
PACKAGE_NAMES = {("system/environment.py", "horovod"), ("system/doctor.py", "horovod")}


def named_in_code(path: Path, names) -> list[tuple[int, str]]:
    """String constants in a module's code (not its docstrings or messages' prose) that are one of `names`."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
            and id(node) not in docstrings]


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_outside_the_registry_names_a_strategy(path):
    relative = path.relative_to(PACKAGE).as_posix()
    if relative.startswith(HOMES):
        return
    named = [(line, name) for line, name in named_in_code(path, STRATEGIES) if (relative, name) not in PACKAGE_NAMES]
    assert not named, f"{relative} names strategies {named}: ask config.strategies"


def test_the_check_finds_a_named_strategy(tmp_path):
    """Negative control: a comparison with a strategy's name, as the code had before the registry."""
    probe = tmp_path / "probe.py"
    probe.write_text('"""Mentions ddp in prose."""\nif spec.strategy == "ddp":\n    pass\n')
    assert named_in_code(probe, STRATEGIES) == [(2, "ddp")]


# Where a pipeline schedule may be named: the list of them and the strategy that runs each
SCHEDULE_HOMES = ("config/schema.py", "training/strategies/pipeline_parallel.py")


@pytest.mark.parametrize("path", sorted(PACKAGE.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_but_the_schema_and_pp_names_a_pipeline_schedule(path):
    """Which schedules interleave and which runs every forward first are said once, in config.schema (memory and
    degrees once tested for "gpipe" each)."""
    relative = path.relative_to(PACKAGE).as_posix()
    if relative.startswith(SCHEDULE_HOMES):
        return
    named = named_in_code(path, PIPELINE_SCHEDULES)
    assert not named, f"{relative} names pipeline schedules {named}: use config.schema's tables of them"


def test_the_check_finds_a_named_schedule(tmp_path):
    """Negative control: the test memory.py's prediction made before the schema said it."""
    probe = tmp_path / "probe.py"
    probe.write_text('if spec.train.pipeline_schedule != "gpipe":\n    pass\n')
    assert named_in_code(probe, PIPELINE_SCHEDULES) == [(1, "gpipe")]


def test_pp_runs_every_schedule_of_the_schema_and_no_other():
    from gpt2dist.training.strategies.pipeline_parallel import SCHEDULES

    assert tuple(SCHEDULES) == PIPELINE_SCHEDULES
    assert set(INTERLEAVED_SCHEDULES) < set(PIPELINE_SCHEDULES) and ALL_FORWARDS_FIRST in PIPELINE_SCHEDULES


def test_the_cli_lists_every_strategy_from_the_registry():
    wide = {**os.environ, "COLUMNS": "400"}
    assert " | ".join(STRATEGIES) in " ".join(gpt2dist("train", "--help", env=wide).stdout.split())  # lines wrap
    table = gpt2dist("strategies", env=wide).stdout
    for name, description in STRATEGIES.items():
        row = next(line for line in table.splitlines() if line.strip("│ ").startswith(f"{name} "))
        assert description.launcher in row and description.summary in row, row


def test_the_paper_presets_label_runs_with_the_registrys_names_for_them():
    """bai2022's labels are the paper's names; where one names a strategy alone, the registry agrees."""
    _, preset = load_params(REPO / "params.yaml").preset("bai2022")
    labelled = {group.label: group.strategies for group in preset.study.runs if group.label}
    papers_names = {d.papers[BAI] for d in STRATEGIES.values() if BAI in d.papers}
    checked = [label for label in labelled if label in papers_names]
    assert len(checked) == 5, labelled  # single, dp, ddp, horovod, apex-ddp; "Horovod + Apex" is a precision
    for label in checked:
        assert labelled[label] == [called(BAI, label)], label


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_a_strategys_degrees_multiply_up_to_its_devices_and_cut_the_batch_exactly(name):
    """dp_replicate x dp_shard x tp x pp is the process count; the batch's shares, rows per pass and micro-steps
    make up the global batch; the launcher starts one process for the strategies that drive every device from
    one; a data-parallel strategy has no model-splitting degree."""
    from conftest import TINY_PRESET

    train = TrainConfig(**{**TINY_PRESET["train"], "global_batch_size": 16, "tensor_parallel_size": 2})
    d = STRATEGIES[name]
    for nproc in (1,) if name == "single" else (2, 4):
        degrees = d.degrees(nproc, train)
        split = degrees.tp * degrees.pp
        assert degrees.dp * split == nproc, degrees
        assert degrees.processes == (1 if d.one_process else nproc), degrees
        assert degrees.batch_shares * degrees.rows_per_pass * degrees.grad_accum_steps == train.global_batch_size
        assert d.data_parallel == (split == 1 and name != "single"), degrees


def test_the_strategies_are_named_once_and_every_registry_follows_that_list():
    """config.schema's names (what params.yaml may say), in their order, are the descriptions' and the runtime
    classes'."""
    from gpt2dist.training.strategies import REGISTRY

    assert tuple(STRATEGIES) == STRATEGY_NAMES and tuple(sorted(REGISTRY)) == tuple(sorted(STRATEGY_NAMES))
