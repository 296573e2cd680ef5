"""Bytes each strategy moves between devices per optimizer step: an analytic model from the
model's shapes, the process count and the dtypes, recorded in run.json beside the measured
times so a slower strategy can be read as "more bytes" or "worse overlap".

Counted as the bytes the busiest rank sends, with ring algorithms for collectives over n
ranks: an all-reduce of S bytes sends 2(n-1)/n x S, an all-gather or a reduce-scatter of a
full tensor of S bytes (n-1)/n x S. Not counted: the loss and grad-norm scalars, and
checkpoint gathers."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2dist.config import ModelConfig, RunSpec
from gpt2dist.training.model import non_embedding_params

FP32, HALF = 4, 2


@dataclass(frozen=True)
class Traffic:
    bytes_per_step: int
    pattern: str


def parameter_count(m: ModelConfig) -> int:
    """GPT-2's parameters, the head tied to the token embedding."""
    return non_embedding_params(m) + m.n_positions * m.n_embd


def split_parameter_count(m: ModelConfig) -> int:
    """What tensor parallelism splits: q/k/v and the first MLP matrix with their biases, and both projections'
    matrices (their biases stay whole)."""
    d = m.n_embd
    return m.n_layer * (3 * d * d + 3 * d + 4 * d * d + 4 * d + d * d + 4 * d * d)


def _ring_all_reduce(size: float, n: int) -> float:
    return 2 * (n - 1) / n * size


def _ring_gather(size: float, n: int) -> float:
    return (n - 1) / n * size


def traffic(spec: RunSpec) -> Traffic:
    m, t, n, accum = spec.model, spec.train, spec.nproc, spec.grad_accum_steps
    params = parameter_count(m)
    activation = spec.rows_per_pass * m.n_positions * m.n_embd * (HALF if spec.precision in ("bf16", "fp16") else FP32)
    gradient = HALF if spec.precision == "apex-O2" else FP32  # O2's model, and so its gradients, are fp16
    if spec.strategy == "single" or n == 1:
        return Traffic(0, "none: one device")
    if spec.strategy == "dp":
        if spec.device != "cuda":
            return Traffic(0, "none: DataParallel without CUDA runs on one device")
        sent = 2 * (n - 1) * params * FP32 * accum
        return Traffic(round(sent), "parameters broadcast from and gradients reduced to GPU 0, every micro-step")
    if spec.strategy in ("ddp", "horovod", "apex-ddp"):
        return Traffic(round(_ring_all_reduce(params * gradient, n)), "gradient all-reduce, once per step")
    if spec.strategy == "fsdp":
        gathered = HALF if t.fsdp_mixed_precision else FP32
        sent = 2 * accum * _ring_gather(params * gathered, n) + _ring_gather(params * FP32, n)
        return Traffic(round(sent), "parameter all-gather in forward and backward per micro-step, gradient "
                                    "reduce-scatter once per step")
    if spec.strategy in ("tp", "fsdp-tp"):
        tp = spec.tensor_parallel_size
        sent = 4 * m.n_layer * accum * _ring_all_reduce(activation, tp)
        if spec.strategy == "tp":
            return Traffic(round(sent), "activation all-reduce after each block's two row-parallel projections, "
                                        "and of their input gradients in backward")
        replicas = spec.replicas
        local = params - split_parameter_count(m) + split_parameter_count(m) / tp
        sent += 2 * accum * _ring_gather(local * FP32, replicas) + _ring_gather(local * FP32, replicas)
        return Traffic(round(sent), "tensor-parallel activation all-reduces, and FSDP's all-gathers and "
                                    "reduce-scatter of each rank's slice over the replicas")
    if spec.strategy == "pp":
        micro_batches = spec.pipeline_micro_batches
        per_micro = activation // micro_batches  # one micro-batch's activations at a stage boundary
        tied = _ring_all_reduce(m.vocab_size * m.n_embd * FP32, 2)  # embedding and head copies' gradients
        ends = micro_batches * per_micro + tied
        middle = 2 * micro_batches * per_micro if n > 2 else 0
        return Traffic(round(max(ends, middle)), "activations forward and their gradients backward at each stage "
                                                 "boundary per micro-batch, tied embedding gradients summed "
                                                 "between the first and last stage")
    raise ValueError(f"no traffic model for strategy {spec.strategy}")
