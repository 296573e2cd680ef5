"""Property-based: params.yaml with any leaf of a preset (or of a run group) replaced by any value (NaN,
infinities, zero, negatives, huge numbers, text, lists, mappings, null, booleans), or with `extends` pointing
anywhere, is either planned or refused with exactly one 'error:' line and status 2, never a traceback. Planned
through `gpt2dist plan` in this process, seeded and bounded."""

from __future__ import annotations

import math
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, seed, settings
from hypothesis import strategies as st
from test_cli_properties import invoke

from conftest import REPO, assert_answer_or_one_error

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())


def leaves(tree, path=()):
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from leaves(value, (*path, key))
    elif isinstance(tree, list):
        for index, value in enumerate(tree):
            yield from leaves(value, (*path, index))
    else:
        yield path


CPU_LEAVES = sorted(leaves(PARAMS["presets"]["cpu"]), key=str)
VALUES = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf, 0, -1, 0.5, 10**30, "", "nan", "fp32", None, True, [], {}, [0]]),
    st.integers(min_value=-10**6, max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)


def planned(params: dict) -> tuple[int, str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(yaml.safe_dump(params))
        return invoke("plan", "--params", str(path), "--preset", "cpu")


@seed(20261126)
@settings(max_examples=30, deadline=None)
@given(path=st.sampled_from(CPU_LEAVES), value=VALUES)
def test_any_value_at_any_key_is_planned_or_one_error_line(path, value):
    params = yaml.safe_load(yaml.safe_dump(PARAMS))
    node = params["presets"]["cpu"]
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    assert_answer_or_one_error(*planned(params), "Plan of preset cpu")


@seed(20261126)
@settings(max_examples=10, deadline=None)
@given(parent=st.one_of(st.sampled_from(["cpu", "paper", "nowhere", ""]), VALUES),
       key=st.sampled_from(["nodes", "link_mbit", "repeats", "nproc", "emulate", "label", "sizes"]), value=VALUES)
def test_extends_and_run_group_keys_are_planned_or_one_error_line(parent, key, value):
    params = yaml.safe_load(yaml.safe_dump(PARAMS))
    params["presets"]["child"] = {"extends": parent}
    params["presets"]["cpu"]["study"]["runs"][0][key] = value
    assert_answer_or_one_error(*planned(params), "Plan of preset cpu")


@seed(20261127)
@settings(max_examples=20, deadline=None)
@given(key=st.sampled_from(["gpu_memory_gb", "model_sizes"]), value=st.one_of(VALUES, st.builds(
    lambda name, shape: {name: shape}, st.text(max_size=6), st.one_of(VALUES, st.fixed_dictionaries(
        {"n_layer": VALUES, "n_head": VALUES, "n_embd": VALUES})))))
def test_the_studys_size_keys_are_planned_or_one_error_line(key, value):
    """study.gpu_memory_gb and study.model_sizes (a GPU plan, where the memory is applied), and a group naming
    one of the sizes given."""
    params = yaml.safe_load(yaml.safe_dump(PARAMS))
    study = params["presets"]["paper-sizes"]["study"]
    study[key] = value
    if key == "model_sizes" and isinstance(value, dict) and value:
        study["runs"][0]["sizes"] = [str(next(iter(value)))]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "params.yaml"
        path.write_text(yaml.safe_dump(params))
        assert_answer_or_one_error(*invoke("plan", "--params", str(path), "--preset", "paper-sizes", "--gpus", "8"),
                                   "Plan of preset paper-sizes")


def test_what_the_property_found_is_one_error_line_now():
    """The property's finding, pinned: a huge block count or repeat count planned for minutes (each block's
    tensors are counted, each repeat is a run); now the schema bounds them and says so at once."""
    for section, key in (("model", "n_layer"), ("study", "repeats")):
        params = yaml.safe_load(yaml.safe_dump(PARAMS))
        params["presets"]["cpu"][section][key] = 10**30
        code, _, err = planned(params)
        assert code == 2 and f"{section}.{key}: Input should be less than or equal to" in err, err


def test_the_check_would_catch_a_traceback_or_a_second_line():
    """The control of the property's assertion: a traceback, two error lines, or a wrong status all fail it."""
    for outcome in [(1, "", "Traceback (most recent call last):\n  KeyError: 'x'\n"),
                    (2, "", "error: one\nerror: two\n"), (1, "", "error: one\n"), (0, "", "")]:
        with pytest.raises(AssertionError):
            assert_answer_or_one_error(*outcome)
