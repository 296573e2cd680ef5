"""How a cluster's GPUs are linked, as the bus bandwidth a ring all-reduce can reach over each link: inside a node
(NVLink by generation, a two-GPU bridge, PCIe, or through host memory where peer-to-peer is off) and across nodes
(the node's NICs: InfiniBand, RoCE or Ethernet). Datasheet rates per direction; a measured all-reduce reaches most
of a link's rate, never more.

Across nodes NCCL runs one ring per NIC, each carrying its share of the bytes, so the bus bandwidth is the node's
NICs together, capped by the link inside the node: 8 NDR NICs give 400 GB/s, one EDR NIC 12.5 GB/s."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from gpt2dist.errors import UsageError
from gpt2dist.system.hardware import named_in

# Per GPU and direction. NVLink: 25 GB/s per link per direction, times the links a GPU has (V100 SXM2 6, A100 SXM
# 12, H100 SXM 18); bridge: Turing's and Ampere's two-GPU bridges (TITAN RTX 2 links, RTX 3090 4 links of
# 14 GB/s); PCIe: x16 lanes of each generation. Host: peer-to-peer off (NCCL_P2P_DISABLE=1, or a board
# without it), every byte copied through host memory: NCCL's shared-memory all-reduce of 2 GPUs on PCIe 3 x16 ran
# at 3.9 GB/s bus bandwidth (NVIDIA/nccl issue 384); PCIe 4's twice that is assumed, not measured.
INSIDE_NODE = {"nvlink4": 450e9, "nvlink3": 300e9, "nvlink2": 150e9, "nvlink-bridge-3090": 56.25e9,
               "nvlink-bridge": 50e9, "pcie5": 64e9, "pcie4": 32e9, "pcie3": 16e9, "pcie4-host": 7.8e9,
               "pcie3-host": 3.9e9}
# Per NIC and direction
ACROSS_NODES = {"ndr": 50e9, "hdr": 25e9, "edr": 12.5e9, "roce400": 50e9, "roce200": 25e9, "roce100": 12.5e9,
                "eth25": 3.125e9, "eth10": 1.25e9}
# What a GPU's usual node has, by the name its own contains as whole words (system.hardware.named_in, the longest
# wins): its link inside the node, its NICs and how many. DGX H100/H200: NVLink 4, 8 NDR; DGX A100: NVLink 3,
# 8 HDR; DGX-1 (V100): NVLink 2, 4 EDR; PCIe cards: PCIe of their generation, one NIC per node.
# Data-centre PCIe cards for inference (T4, A10, L4, L40S) usually sit in Ethernet nodes; GeForce RTX 4090s have no
# NVLink and their driver turns peer-to-peer off, so their bytes go through host memory.
USUAL_NODE = {"H200": ("nvlink4", "ndr", 8), "H100": ("nvlink4", "ndr", 8), "H100 NVL": ("pcie5", "ndr", 1),
              "H100 PCIe": ("pcie5", "ndr", 1), "H200 NVL": ("pcie5", "ndr", 1), "A100": ("nvlink3", "hdr", 8),
              "A100-PCIE": ("pcie4", "hdr", 1), "A100 80GB PCIe": ("pcie4", "hdr", 1), "V100": ("nvlink2", "edr", 4),
              "V100-PCIE": ("pcie3", "edr", 1), "T4": ("pcie3", "eth10", 1), "A10": ("pcie4", "eth25", 1),
              "L4": ("pcie4", "eth25", 1), "L40S": ("pcie4", "roce100", 1), "TITAN RTX": ("nvlink-bridge", "eth10", 1),
              "RTX 3090": ("nvlink-bridge-3090", "eth10", 1), "RTX 4090": ("pcie4-host", "eth10", 1)}


# The share of a link's rate a ring all-reduce's bus bandwidth was measured to reach at large messages (nccl-tests
# all_reduce_perf): NVLink 3 228-232 of 300 GB/s on 8 A100s at 1 to 8 GB (Azure's ND A100 v4 results, microsoft/
# mscclpp's docs, VIA-Research/vTrain trace/a100/AR_GPU8_1M_1024M_LUT: 229 at 1 GiB); NVLink 4's ring about 370 of
# 450 (NVIDIA/nccl-tests#212, the maintainer's figure, and an H200 run with NVLS off); across nodes about 95% of the
# node's NICs (NVIDIA's DGX A100 figure, 192 of 200 GB/s over 8 HDR; Azure's A100 pair, 188). A rate measured through
# host memory (`*-host`) is NCCL's own already. Links without a published measurement take the median of these.
NCCL_SHARE = {"nvlink3": 230 / 300, "nvlink4": 370 / 450, "across": 0.95}
MEASURED_INSIDE = {"pcie4-host": 1.0, "pcie3-host": 1.0}


@dataclass(frozen=True)
class Links:
    """A node's link between its GPUs, and its NICs to other nodes."""

    inside: str
    across: str
    nics: int

    @property
    def through_host(self) -> bool:
        """Peer-to-peer off: the GPUs of a node exchange bytes through host memory."""
        return self.inside.endswith("-host")

    def bus_bytes_per_s(self, nodes: int) -> float:
        """The bus bandwidth of a ring all-reduce over every GPU of `nodes` nodes, at the links' datasheet rates."""
        inside = INSIDE_NODE[self.inside]
        return inside if nodes == 1 else min(inside, self.nics * ACROSS_NODES[self.across])

    def nccl_bytes_per_s(self, nodes: int) -> float:
        """The bus bandwidth NCCL reaches over every GPU of `nodes` nodes: each link's rate at its measured share
        (NCCL_SHARE)."""
        typical = float(statistics.median(NCCL_SHARE.values()))
        inside = INSIDE_NODE[self.inside] * MEASURED_INSIDE.get(self.inside, NCCL_SHARE.get(self.inside, typical))
        return inside if nodes == 1 else min(inside, self.nics * ACROSS_NODES[self.across] * NCCL_SHARE["across"])

    def words(self, nodes: int) -> str:
        inside = f"{self.inside} ({INSIDE_NODE[self.inside] / 1e9:g} GB/s) inside a node"
        if nodes == 1:
            return inside
        return (f"{inside}, {self.nics} {self.across} NIC(s) per node ({self.nics * ACROSS_NODES[self.across] / 1e9:g} "
                f"GB/s) across nodes")


def links_of(gpu: str, inside: str | None = None, across: str | None = None, nics: int | None = None) -> Links:
    """The links of `gpu`'s usual node, each part replaced where given."""
    name = named_in(gpu, USUAL_NODE)
    if not name and None in (inside, across, nics):
        raise UsageError(f"no usual links known for GPU '{gpu}' (known: {', '.join(USUAL_NODE)}): give "
                         "--link-inside, --link-across and --nics")
    usual = USUAL_NODE[name] if name else (None, None, None)
    chosen = Links(inside or usual[0], across or usual[1], nics or usual[2])
    if chosen.inside not in INSIDE_NODE:
        raise UsageError(f"--link-inside {chosen.inside!r}: choose one of {', '.join(INSIDE_NODE)}")
    if chosen.across not in ACROSS_NODES:
        raise UsageError(f"--link-across {chosen.across!r}: choose one of {', '.join(ACROSS_NODES)}")
    if chosen.nics < 1:
        raise UsageError(f"--nics {chosen.nics}: a node has at least 1 NIC")
    return chosen


# NCCL's cost model of its Simple protocol, the one bulk gradients and activations take (src/graph/tuning.cc, as in the
# NCCL 2.7 to 2.8 of the 2020-21 runs others published), in seconds: a collective pays a base latency and a latency
# per step of its algorithm by the hardware that step crosses (NVLink, PCIe, the network); its bytes go at the bus
# bandwidth. A ring all-reduce takes 2 (n - 1) steps (2 (nodes - 1) of them across the network), an all-gather or
# reduce-scatter n - 1; a tree all-reduce goes up and down a tree inside each node and log2(nodes) levels across,
# its bytes at half a bus bandwidth NCCL caps (80 GB/s on more than two nodes, 110 on two). NCCL picks whichever it
# predicts faster, call by call; so does this.
RING_BASE_S = 8.4e-6
RING_STEP_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "net": 9.6e-6}
TREE_STEP_S = {"nvlink": 28e-6, "pcie": 28e-6, "net": 50e-6}
TREE_CAP = {2: 110e9, 3: 80e9}  # bus bandwidth, by nodes (three meaning more than two)
RING_PLATEAU = 1.9  # a ring all-reduce's latency across nodes, once its calls are large (NCCL's "plateau effect")
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "send")


def _hop(inside: str) -> str:
    return "nvlink" if inside.startswith("nvlink") else "pcie"


def collective_seconds(kind: str, sent_bytes: float, calls: float, ranks: int, nodes: int, inside: str,
                       bus_bytes_per_s: float) -> float:
    """The seconds `calls` collectives of a kind take in all over `ranks` ranks on `nodes` nodes (a node's GPUs
    linked by `inside`), the busiest rank sending `sent_bytes` in all (the ring's bytes: config.strategies'
    traffic), at `bus_bytes_per_s`. A point-to-point send crosses one hop."""
    if kind not in COLLECTIVE_KINDS:
        raise ValueError(f"collective kind {kind!r}: one of {', '.join(COLLECTIVE_KINDS)}")
    if not sent_bytes or not calls:
        return 0.0
    intra, across = _hop(inside), nodes > 1
    if kind == "send":
        return calls * (RING_BASE_S + RING_STEP_S["net" if across else intra]) + sent_bytes / bus_bytes_per_s
    all_reduce = kind == "all-reduce"
    steps, inter = (2 * (ranks - 1), 2 * (nodes - 1)) if all_reduce else (ranks - 1, nodes - 1)
    size = sent_bytes / (steps / ranks)  # the tensors' bytes the ring's sent bytes stand for
    latency = RING_BASE_S + (steps - inter) * RING_STEP_S[intra] + inter * RING_STEP_S["net"]
    if all_reduce and across and size / calls >= ranks / 16 * 65536:
        latency *= RING_PLATEAU
    ring = calls * latency + sent_bytes / bus_bytes_per_s
    if not all_reduce:
        return ring
    tree_latency = 2 * ((ranks // nodes - 1) * TREE_STEP_S[intra] + math.log2(nodes) * TREE_STEP_S["net"])
    tree_bus = min(0.9 * bus_bytes_per_s, TREE_CAP[min(nodes, 3)]) if across else 0.9 * bus_bytes_per_s
    return min(ring, calls * tree_latency + size / (0.5 * tree_bus))
