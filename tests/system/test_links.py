"""A cluster's links as the bus bandwidth a ring all-reduce can reach: the link inside a node alone on one node;
across nodes the node's NICs together, never more than the link inside."""

from __future__ import annotations

import re

import pytest

from gpt2dist.errors import UsageError
from gpt2dist.system.links import ACROSS_NODES, INSIDE_NODE, Links, links_of


def test_one_node_uses_the_link_inside_and_more_use_the_nics_capped_by_it():
    dgx = links_of("NVIDIA H100 80GB HBM3")
    assert dgx == Links("nvlink4", "ndr", 8)
    assert dgx.bus_bytes_per_s(1) == INSIDE_NODE["nvlink4"] == 450e9
    assert dgx.bus_bytes_per_s(2) == 8 * ACROSS_NODES["ndr"] == 400e9  # 8 NDR NICs: just under NVLink 4
    one_edr = Links("nvlink2", "edr", 1)
    assert one_edr.bus_bytes_per_s(4) == 12.5e9
    # the control: NICs beyond the link inside a node add nothing
    assert Links("pcie3", "ndr", 8).bus_bytes_per_s(2) == INSIDE_NODE["pcie3"]


def test_the_usual_node_is_the_most_specific_name_and_each_part_can_be_replaced():
    assert links_of("NVIDIA H100 PCIe") == Links("pcie5", "ndr", 1)  # not the SXM's NVLink
    assert links_of("Tesla V100-PCIE-32GB").inside == "pcie3"
    assert links_of("Tesla V100-SXM2-16GB").inside == "nvlink2"
    assert links_of("H100", across="roce200", nics=2) == Links("nvlink4", "roce200", 2)
    assert links_of("a toaster", "pcie4", "eth25", 1) == Links("pcie4", "eth25", 1)  # all given: any GPU


@pytest.mark.parametrize("args, message", [
    (("a toaster",), "no usual links known for GPU 'a toaster'"),
    (("H100", "nvlink9"), "--link-inside 'nvlink9': choose one of nvlink4"),
    (("H100", None, "ib"), "--link-across 'ib': choose one of ndr"),
])
def test_unknown_links_are_refused_naming_the_choices(args, message):
    with pytest.raises(UsageError, match=re.escape(message)):
        links_of(*args)


def test_peer_to_peer_off_is_slower_than_the_pcie_it_crosses_twice():
    for generation in ("pcie3", "pcie4"):
        host = INSIDE_NODE[f"{generation}-host"]
        assert host <= INSIDE_NODE[generation] / 2  # up to host memory and down again, with a copy between
    assert links_of("TITAN RTX", inside="pcie3-host").bus_bytes_per_s(1) == 3.9e9


def test_collectives_pay_ncclls_latency_and_their_bytes_at_the_bus_bandwidth():
    """NCCL's cost model: a large all-reduce is its bytes at the bus bandwidth and a latency that grows with the
    ring's steps; many small calls are latency, which a tree of many nodes cuts (log2 of the nodes across, not a
    step per rank); a send crosses one hop. The control: one large call across as many nodes goes by the ring, whose
    latency is then the smaller cost (a tree moves its bytes at half a bus bandwidth NCCL caps)."""
    from gpt2dist.system.links import RING_BASE_S, RING_PLATEAU, RING_STEP_S, collective_seconds

    big = 2 * 7 / 8 * 1e9  # a ring all-reduce of 1 GB over 8 ranks: what each rank sends
    one_call = collective_seconds("all-reduce", big, 1, 8, 1, "nvlink4", 450e9)
    assert one_call == pytest.approx(big / 450e9 + RING_BASE_S + 14 * RING_STEP_S["nvlink"])
    # a thousand small calls across 64 nodes: a tree's 2 log2(64) network steps instead of the ring's 126
    small = 2 * 511 / 512 * 1e3 * 1000
    many = collective_seconds("all-reduce", small, 1000, 512, 64, "nvlink4", 400e9)
    ring_latency = 1000 * (RING_BASE_S + (2 * 511 - 126) * RING_STEP_S["nvlink"] + 126 * RING_STEP_S["net"])
    assert many < ring_latency / 2
    big_across = collective_seconds("all-reduce", 2 * 511 / 512 * 1e9, 1, 512, 64, "nvlink4", 400e9)
    assert big_across == pytest.approx(2 * 511 / 512 * 1e9 / 400e9 + RING_PLATEAU * ring_latency / 1000)
    assert collective_seconds("send", 1e6, 1, 2, 2, "nvlink4", 50e9) == pytest.approx(
        RING_BASE_S + RING_STEP_S["net"] + 1e6 / 50e9)
    assert collective_seconds("all-gather", 0.0, 10, 8, 1, "pcie4", 32e9) == 0
    with pytest.raises(ValueError, match="collective kind 'broadcast'"):
        collective_seconds("broadcast", 1.0, 1, 2, 1, "pcie4", 32e9)


def test_nccl_reaches_the_share_of_each_link_it_was_measured_to_reach():
    """The step model moves bytes at what NCCL was measured to reach over each link, not at its datasheet rate:
    NVLink 3's and 4's measured shares inside a node, the NICs' across nodes (capped by the link inside), a rate
    measured through host memory as it is, and an unmeasured link at the median of the measured shares. The control:
    the datasheet's bus bandwidth is above each."""
    import statistics

    from gpt2dist.system.links import NCCL_SHARE

    a100, h100 = links_of("A100"), links_of("H100")
    assert a100.nccl_bytes_per_s(1) == pytest.approx(230e9) and 230e9 < a100.bus_bytes_per_s(1)
    assert h100.nccl_bytes_per_s(1) == pytest.approx(370e9) and 370e9 < h100.bus_bytes_per_s(1)
    four_nics = links_of("H100", nics=4)
    assert four_nics.nccl_bytes_per_s(2) == pytest.approx(4 * 50e9 * 0.95) and 190e9 < four_nics.bus_bytes_per_s(2)
    assert h100.nccl_bytes_per_s(2) == h100.nccl_bytes_per_s(1)  # 8 NICs' 380 GB/s: NVLink's 370 is the cap
    host = links_of("TITAN RTX", inside="pcie3-host")
    assert host.nccl_bytes_per_s(1) == host.bus_bytes_per_s(1) == 3.9e9
    pcie = links_of("A100-PCIE-40GB")
    assert pcie.nccl_bytes_per_s(1) == pytest.approx(32e9 * statistics.median(NCCL_SHARE.values()))
