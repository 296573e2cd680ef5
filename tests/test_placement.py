"""A configuration's placement, decided and worded in one place (config/placement.py): its kind from nodes and
`emulated`, summaries older than a cluster's nodes read as emulated, and the three wordings the answer, the
figures and the summary table use."""

from __future__ import annotations

import math

import pytest

from gpt2dist.config.placement import Kind, Placement


@pytest.mark.parametrize("row, kind", [
    ({"nproc": 4}, Kind.ONE_MACHINE),
    ({"nproc": 4, "nodes": math.nan}, Kind.ONE_MACHINE),  # a summary whose other rows spread
    ({"nproc": 4, "nodes": 2, "emulated": True, "link_mbit": 100.0}, Kind.EMULATED),
    ({"nproc": 4, "nodes": 2}, Kind.EMULATED),  # older summaries: every spread run was emulated
    ({"nproc": 4, "nodes": 2, "emulated": False}, Kind.CLUSTER),
    ({"nproc": 4, "nodes": 2, "emulated": 0.0}, Kind.CLUSTER),
])
def test_the_kind_comes_from_nodes_and_emulated(row, kind):
    assert Placement.of(row).kind is kind


def test_each_kind_is_worded_for_the_answer_the_figures_and_the_table():
    machine = Placement.of({"nproc": 1, "nodes": 1, "size": "medium"})
    assert (machine.words(), machine.short_words(), machine.where()) == (
        "GPT-2 medium, 1 process on one machine", "GPT-2 medium, 1 process", "one machine")
    shaped = Placement.of({"nproc": 8, "nodes": 2, "emulated": True, "link_mbit": 100.0})
    assert (shaped.words(), shaped.short_words(), shaped.where()) == (
        "8 processes on 2 emulated nodes, 100 Mbit/s", "8 processes on 2 nodes, 100 Mbit/s",
        "2 emulated nodes, 100 Mbit/s")
    unshaped = Placement.of({"nproc": 2, "nodes": 2.0, "emulated": True, "link_mbit": math.nan})
    assert (unshaped.words(), unshaped.short_words(), unshaped.where()) == (
        "2 processes on 2 emulated nodes, unshaped links", "2 processes on 2 nodes, unshaped link",
        "2 emulated nodes, unshaped")
    # the control: a cluster's nodes are never called emulated, and say the bandwidth they measured
    cluster = Placement.of({"nproc": 16, "nodes": 2, "emulated": False, "busbw_gb_s": 42.0, "size": math.nan})
    assert (cluster.words(), cluster.short_words(), cluster.where()) == (
        "16 processes on 2 nodes", "16 processes on 2 nodes", "2 nodes, 42.0 GB/s busbw")
