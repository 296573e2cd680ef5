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
# Fewer timed iterations where one takes long: on an emulated node's 50 Mbit/s link one 4 MiB all-reduce
# takes 0.7 s, and five of them were a fifth of a two-node-cpu run.
PROBE_BUDGET_S = 1.0


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

    started = time.perf_counter()
    all_reduce_sum(buffer)  # warm-up: connections, buffers, NCCL's channels
    synchronised()
    # every rank must run as many iterations: the ranks' mean warm-up, the same number on each, decides
    warm_up_s = all_reduce_sum(torch.tensor([time.perf_counter() - started], device=device)).item() / world_size
    iterations = iterations_within(warm_up_s)
    started = time.perf_counter()
    for _ in range(iterations):
        all_reduce_sum(buffer)
    synchronised()
    seconds = (time.perf_counter() - started) / iterations
    algbw = size / seconds
    return {"bytes": size, "seconds": seconds, "algbw_gb_s": algbw / 1e9,
            "busbw_gb_s": algbw * 2 * (world_size - 1) / world_size / 1e9, "iterations": iterations}


def iterations_within(warm_up_s: float) -> int:
    """PROBE_ITERATIONS, or as many as fit PROBE_BUDGET_S at the warm-up's pace (which includes connecting, so
    errs low), at least one."""
    return max(1, min(PROBE_ITERATIONS, int(PROBE_BUDGET_S / max(warm_up_s, 1e-9))))
