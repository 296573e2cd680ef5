"""What a run's processes ran on, node by node, and how fast its process group moves data: recorded in
run.json at the start of every run, so runs from a 200 GB/s cluster and a 400 GB/s one are never mistaken
for each other, and collect can refuse to compare runs made on different hardware.

The bandwidth is an all-reduce of one buffer, timed as nccl-tests times it: after a warm-up, the mean of
a few iterations, reported as bus bandwidth (algorithm bandwidth x 2(n-1)/n, what each rank's link
carries in a ring), which is comparable across process counts."""

from __future__ import annotations

import platform
import time
from collections import Counter

import torch

from gpt2dist.system.environment import cpu_model

# Big enough to leave the latency-bound regime on a GPU interconnect, small enough to take milliseconds;
# on CPU (gloo over TCP) a smaller buffer keeps the probe well under a second.
PROBE_BYTES = {"cuda": 64 << 20, "cpu": 4 << 20}
PROBE_ITERATIONS = 5


def this_node(device: torch.device) -> dict:
    """One rank's host and the device it computes on."""
    cuda = device.type == "cuda"
    return {"host": platform.node(), "cpu": cpu_model(),
            "gpu": torch.cuda.get_device_name(device) if cuda else None,
            "gpus_on_node": torch.cuda.device_count() if cuda else 0}


def nodes_of(ranks: list[dict]) -> list[dict]:
    """Every rank's facts (in rank order) folded into one entry per host, in the order of their first rank."""
    nodes: dict[str, dict] = {}
    for facts in ranks:
        node = nodes.setdefault(facts["host"], {**facts, "ranks": 0, "devices": Counter()})
        node["ranks"] += 1
        node["devices"][facts["gpu"] or facts["cpu"]] += 1
    return [{**node, "devices": dict(node["devices"])} for node in nodes.values()]


def probe_bandwidth(all_reduce_sum, barrier, device: torch.device, world_size: int) -> dict:
    """Time an all-reduce of PROBE_BYTES over the run's ranks; every rank must call it."""
    size = PROBE_BYTES[device.type]
    buffer = torch.ones(size // 4, dtype=torch.float32, device=device)

    def synchronised():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        barrier()

    all_reduce_sum(buffer)  # warm-up: connections, buffers, NCCL's channels
    synchronised()
    started = time.perf_counter()
    for _ in range(PROBE_ITERATIONS):
        all_reduce_sum(buffer)
    synchronised()
    seconds = (time.perf_counter() - started) / PROBE_ITERATIONS
    algbw = size / seconds
    return {"bytes": size, "seconds": seconds, "algbw_gb_s": algbw / 1e9,
            "busbw_gb_s": algbw * 2 * (world_size - 1) / world_size / 1e9, "iterations": PROBE_ITERATIONS}
