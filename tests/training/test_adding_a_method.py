"""docs/development.md's walkthrough: a data-parallel method the torch path runs is its record alone."""

from __future__ import annotations

import os
import re
import shutil

import pytest
from test_equivalence import assert_follows_reference

from gpt2dist.pipeline.imports import PACKAGE

from conftest import REPO, gpt2dist, read_metrics, run_record, train_args


def walkthrough_record() -> tuple[str, str]:
    """The record docs/development.md adds, and its name."""
    section = (REPO / "docs" / "development.md").read_text().split("## Adding a data-parallel method", 1)[1]
    record = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    return record, re.search(r'Method\("([a-z0-9-]+)"', record).group(1)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_new_method_is_its_record_alone(reference, shards, params_file, tmp_path):
    """The walkthrough's record, put in config/methods.py of a copy of the package and nowhere else: `gpt2dist
    strategies` lists it with its engine, a split of it parses, and 2 ranks of it follow single's loss curve (fp32)
    holding half of single's state, as its sharded settings say. The control: the package as it is refuses the name
    in one line."""
    record, name = walkthrough_record()
    copy = tmp_path / "src"
    shutil.copytree(PACKAGE, copy / "gpt2dist", ignore=shutil.ignore_patterns("__pycache__"))
    methods = copy / "gpt2dist" / "config" / "methods.py"
    anchor = "    Method(NONE,"
    methods.write_text(methods.read_text().replace(anchor, record + anchor, 1))
    env = {**os.environ, "PYTHONPATH": str(copy)}

    refused = gpt2dist(*train_args(shards, params_file, tmp_path / "refused", name, nproc=2), check=False)
    assert refused.returncode == 2 and f"unknown --strategy '{name}'" in refused.stderr
    listed = gpt2dist("strategies", "--format", "markdown", env=env).stdout
    assert f"| `{name}` " in listed and f"`{name}-tp2`" in listed
    assert "reshard_after_forward=False" in next(line for line in listed.splitlines() if f"| `{name}` " in line)
    run = tmp_path / "run"
    gpt2dist(*train_args(shards, params_file, run, name, nproc=2), env=env)
    assert_follows_reference(reference, run)
    assert read_metrics(run)[-1]["loss"] < 0.9 * read_metrics(run)[0]["loss"]
    held, whole = run_record(run)["model_state_bytes"]["total"], run_record(reference)["model_state_bytes"]["total"]
    assert held / whole == pytest.approx(0.5, rel=0.02)
