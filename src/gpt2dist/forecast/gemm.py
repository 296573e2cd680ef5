"""A GEMM's share of the tensor cores' peak from its shape, before the GPU step model's one fitted GEMM efficiency.

cuBLAS and CUTLASS cut the m x n output into thread-block tiles and run one per SM at a time, in waves over the SMs
(NVIDIA's "Matrix Multiplication Background" user guide, sections 3.1 and 3.2: tile and wave quantization): the
output's last partial tile computes padding, and a last partial wave leaves SMs idle, so a GEMM whose tiles fill
1.1 waves takes as long as 2. A tile runs its reduction depth k in steps, its main loop filling a pipeline of
shared-memory stages before it computes at full rate: a short k pays that fill on every tile. The library picks the
kernel that finishes first: smaller tiles fill the SMs better but reuse each operand less, and run below the large
tiles' rate; and where the output has too few tiles for the SMs, a split-K kernel cuts the depth k into slices that
run on SMs of their own and sums their partial tiles (CUTLASS's serial split-K, one kernel whose partial sums meet in
L2: NVIDIA/cutlass issues 867 and 1406, the maintainers' answers; cuBLAS chooses among such kernels by heuristics,
Osama et al., "Stream-K", PPoPP 2023, arXiv 2301.03598). A tensor-parallel slice narrows n (or k) k-fold, a
micro-batch of one makes m a single sequence: both are where these effects decide.

Every number here is a fact of the hardware or the library, not fitted: the SM counts are the datasheets'
(system.hardware), the tiles are those cuBLAS's Ampere and Hopper kernels use for half-precision GEMMs, a tile's
rate follows its operand reuse (its arithmetic intensity, m_t n_t / (m_t + n_t) FLOPs per byte of half-precision
operands) relative to a 128 x 128 tile's, the largest reuse below which an SM's shared-memory bandwidth no longer
keeps its tensor cores fed, and the main loop's fill is CUTLASS's multistage pipeline: 3 stages of 32. How deep a
split-K slice must be is the one number here set by measurement: the depth that brings these shares closest to a
published cuBLASLt sweep on an A100 (tests/forecast/test_gemm.py); the partial sums' traffic, which stays in L2, is
not priced."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

# (rows, columns) of an output tile cuBLAS runs half-precision tensor-core GEMMs in on Ampere and Hopper
TILES = ((256, 128), (128, 256), (128, 128), (128, 64), (64, 128), (64, 64))
FULL_RATE_REUSE = 128 * 128 / (128 + 128)  # a 128 x 128 tile's FLOPs per operand byte: tiles at or above run at full rate
K_STEP, STAGES = 32, 1  # CUTLASS's multistage main loop: each stage a k-slice of 32, filled before the first MMA
# split-K's least depth of a slice: of 128 to 1024, the one that brings these shares closest to Azure's cuBLASLt
# sweep on an A100 (ND A100 v4, 8 shapes: 1024-cubed 0.47 of the best, 2048-cubed 0.86); 256 would make 1024-cubed 0.58
SPLIT_K_DEPTH = 512


@dataclass(frozen=True)
class Shape:
    """A GEMM C[m, n] = A[m, k] B[k, n], `batch` of them in one launch (attention's heads)."""

    m: int
    n: int
    k: int
    batch: int = 1


def tile_rate(rows: int, columns: int) -> float:
    """A tile's rate as a share of the full-rate tiles': its operand reuse against a 128 x 128 tile's, at most 1."""
    return min(1.0, rows * columns / (rows + columns) / FULL_RATE_REUSE)


def resident(rows: int, columns: int) -> int:
    """Tiles an SM runs at once: two of 128 x 128 or smaller (their shared-memory stages and registers fit twice in
    an Ampere or Hopper SM), one of the larger."""
    return 2 if rows * columns <= 128 * 128 else 1


@functools.lru_cache(maxsize=65536)  # a planner prices the same few shapes for thousands of candidates
def efficiency(shape: Shape, sms: int) -> float:
    """The share of the tensor cores' peak the best kernel reaches on this shape: its tile and wave quantization with
    k whole or split, its tile's rate, and the main loop's fill over k."""
    depth = shape.k / (shape.k + (STAGES - 1) * K_STEP)
    slicings = range(1, max(1, shape.k // SPLIT_K_DEPTH) + 1)
    best = 0.0
    for rows, columns in TILES:
        tiles_m, tiles_n = math.ceil(shape.m / rows), math.ceil(shape.n / columns)
        slots = sms * resident(rows, columns)
        useful = shape.m * shape.n / (tiles_m * rows * tiles_n * columns)  # the output's share of the tiles' area
        for slices in slicings:  # each slice of k a tile's work of its own
            units = tiles_m * tiles_n * shape.batch * slices
            waves = math.ceil(units / slots)
            best = max(best, tile_rate(rows, columns) * useful * units / (waves * slots))
    return best * depth
