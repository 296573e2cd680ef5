"""The interconnect probe times as many all-reduces as fit its budget: five on a fast link, fewer where one
takes long (a shaped emulated link), and every rank the same number (the two-node tests run it for real)."""

from __future__ import annotations

import time

import torch

from gpt2dist.training.interconnect import PROBE_BUDGET_S, PROBE_ITERATIONS, iterations_within, probe_bandwidth


def test_iterations_fit_the_budget_at_the_warm_ups_pace():
    assert iterations_within(0.01) == PROBE_ITERATIONS == 5
    assert iterations_within(PROBE_BUDGET_S / 3) == 3
    assert iterations_within(0.7) == iterations_within(60.0) == 1  # a 50 Mbit/s link; one at the least
    assert iterations_within(0.0) == PROBE_ITERATIONS


def test_a_slow_collective_is_timed_fewer_times():
    calls = []

    def slow_sum(value: torch.Tensor) -> torch.Tensor:
        calls.append(value.numel())
        if value.numel() > 1:  # the buffer, not the warm-up's duration
            time.sleep(0.4)
        return value

    probe = probe_bandwidth(slow_sum, lambda: None, torch.device("cpu"), world_size=1)
    # warm-up, the agreement on its duration, then two timed iterations at 0.4 s each
    assert probe["iterations"] == 2 and len(calls) == 4 and probe["seconds"] >= 0.4, (probe, calls)
    fast = probe_bandwidth(lambda value: value, lambda: None, torch.device("cpu"), world_size=1)
    assert fast["iterations"] == PROBE_ITERATIONS and fast["bytes"] == 4 << 20  # control: a fast link, all five
