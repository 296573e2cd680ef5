"""A configuration's id and name, made in one place (config/configuration.py): every id it makes reads back as the
run id parser reads it, and the answer, the figures and the summary name a configuration the same way."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpt2dist.config.configuration import Configuration, config_id
from gpt2dist.config.placement import Placement
from gpt2dist.config.schema import PRECISIONS, STRATEGY_NAMES
from gpt2dist.config.sizes import GPT2_SIZES
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.run import parse_run_id, Run

PLACEMENTS = st.builds(
    lambda nproc, nodes, link, size: Placement(nproc * nodes, nodes, nodes > 1 and link is not None, link, size),
    st.integers(1, 64), st.integers(1, 16), st.none() | st.sampled_from([0.5, 50.0, 100.0, 1000.0]),
    st.none() | st.sampled_from([*GPT2_SIZES, "narrow", "wide2"]))


@given(st.sampled_from(STRATEGY_NAMES), st.sampled_from(PRECISIONS), PLACEMENTS, st.integers(0, 9))
def test_every_id_reads_back_as_the_configuration_it_names(strategy, precision, placement, repeat):
    configuration = Configuration(strategy, precision, placement)
    run = parse_run_id(f"{configuration.id}-r{repeat}")
    link = placement.link_mbit if placement.nodes > 1 else None  # one machine's runs have no link to name
    assert (run.strategy, run.precision, run.nproc, run.nodes, run.link_mbit, run.size, run.repeat) == (
        strategy, precision, placement.nproc, placement.nodes, link, placement.size, repeat)
    assert run.config_id == config_id(strategy, precision, placement.nproc, placement.nodes, link, placement.size)


def test_ids_and_names_of_each_kind_of_placement():
    assert Configuration.of({"strategy": "ddp", "precision": "bf16", "nproc": 8}).id == "ddp-bf16-n8"
    sized = Configuration.of({"strategy": "fsdp", "precision": "bf16", "nproc": 8, "size": "medium"})
    assert (sized.id, sized.name(), sized.name_with_processes()) == ("fsdp-bf16-n8-medium", "fsdp bf16", "fsdp bf16 x8")
    emulated = Run("horovod", "fp32", 4, 0, nodes=2, link_mbit=100.0, emulated=True)
    assert (emulated.config_id, emulated.run_id) == ("horovod-fp32-n4-2nodes-100mbit", "horovod-fp32-n4-2nodes-100mbit-r0")
    cluster = Configuration.of({"strategy": "ddp", "precision": "bf16", "nproc": 16, "nodes": 2, "emulated": False})
    assert cluster.id == "ddp-bf16-n16-2nodes"
    # the control: the parser refuses an id whose parts are out of order, so the round trip above can fail
    with pytest.raises(UsageError):
        parse_run_id("bf16-ddp-n8-r0")
