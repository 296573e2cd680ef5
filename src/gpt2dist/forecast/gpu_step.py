"""The GPU step model: a rank's optimizer step as the operations it runs, each at its roofline, with the launches
and the host's dispatch, and each group's collectives as NCCL runs them (system.links).

A micro-step is counted from the model's shapes, the micro-batch, the context and the degrees (config.degrees):
every GEMM of the blocks, the attention and the head, forward and backward (two GEMMs each), at a share of the
dense peak of its arithmetic (fp32 without tensor cores, tf32, or 16-bit tensor cores), or at the memory bandwidth
where its shape makes it move more than it computes (attention's QK^T, 64 deep); fused attention at its own share
of the peak; every elementwise and reduction operation (layer norms, GELU, softmax, dropout, residual adds, casts,
the loss) at the memory bandwidth from the bytes it moves; activation checkpointing's forward again in backward. Once
per step: the optimizer's update, gradient clipping, the loss scaler. What the elementwise work, the kernels and the
host's syncs come to depends on the program that trains (forecast.implementations: counted from its code, never
fitted).

A handful of constants (Constants) turn that work into seconds. They are few and named; forecast/published.py fits
them to published measurements, each source's own rows left out of the fit that predicts them, and says what error
that leaves.

The step: the host runs ahead of the GPU between syncs, so a step's computation is the larger of the GPU's work and
the host's dispatch, plus what each sync costs (the GPU waits for the host's next launch); a pipeline waits its
bubble; each group's collectives take their latency and bytes over the link they cross, and the data-parallel part a
strategy sends under its computation costs only what that computation cannot cover (forecast.prediction.StepTerms)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from gpt2dist.config.memory import Kept, busiest_rank, held_shapes, optimizer_shapes
from gpt2dist.config.schema import RunSpec
from gpt2dist.config.sizes import flops_per_token
from gpt2dist.config.geometry import local_parameters, rank_blocks
from gpt2dist.config.strategies import degrees_of
from gpt2dist.config.traffic import (DATA_PARALLEL_GROUP, GROUP_DIMS, TENSOR_PARALLEL_GROUP, link_streams, overlap,
                                    spans_nodes, traffic)
from gpt2dist.config.units import compute_bytes, FP32, HALF
from gpt2dist.errors import UsageError
from gpt2dist.forecast.prediction import StepTerms, step_terms
from gpt2dist.forecast.gemm import Shape, efficiency
from gpt2dist.system.hardware import COMPUTE_DTYPE, GPU, GPUS, gpu_of
from gpt2dist.system.links import Links, collective_seconds



@dataclass(frozen=True)
class Implementation:
    """How a training program computes GPT-2's step, as far as its time depends on it, counted from its code at the
    precision it ran in: bytes are per token and block in units of the width (the full width's layer norms, residual
    adds and dropouts apart from the tensor-parallel split widths' biases, head copies and GELU), per element of the
    attention scores where they are materialised, and per token and vocabulary entry for the head's loss."""

    name: str
    read_from: str  # the code these counts were read from
    attention: str  # "materialized": the scores written by a GEMM, worked on op by op; "flash": one fused kernel
    kernels: tuple[int, int]  # a block's elementwise and reduction kernels, forward and backward (GEMMs and a fused
    # attention's kernels apart)
    width_bytes: tuple[float, float]  # on the full width, forward and backward
    inner_bytes: tuple[float, float]  # on the split widths
    score_bytes: tuple[float, float] = (0.0, 0.0)  # per score element, forward and backward
    head_bytes: tuple[float, float] = (0.0, 0.0)  # the loss, per token and vocabulary entry, forward and backward
    head_kernels: tuple[int, int] = (1, 1)
    weight_casts: bool = False  # torch.amp's autocast casts each weight to 16 bits per forward, its gradient back
    accumulate_grads: bool = False  # gradients zeroed, not freed: every backward adds into them
    optimizer: str = "fused"  # "loop": its operations tensor by tensor; "foreach": torch's multi-tensor ops; "fused"
    optimizer_tensors: int | None = None  # tensors the optimizer steps when it flattens them (None: the parameters)
    master_copies: bool = False  # 16-bit gradients copied to fp32 master weights, which are cast back after the step
    clip: str = "none"  # gradient clipping: "none", "per-tensor" or "multi-tensor"
    syncs_per_step: float = 1.0  # host syncs (loss scaler, clipping, logging): each stalls the GPU for a launch
    syncs_per_tensor: tuple[float, float] = (0.0, 0.0)  # syncs per gradient tensor, where the optimizer state is
    # replicated and where it is sharded (DeepSpeed's overflow and norm checks, tensor by tensor)
    syncs_per_layer: float = 0.0  # per block and forward (transformers 4.21's scalar tensors)
    launch: str = "python"  # "python": the host dispatches every kernel; "native": C launches only
    checkpoint_host_ops: int = 0  # per checkpointed block and micro-step, beyond its kernels: the RNG states saved
    # in forward and restored around the recompute, the inputs detached, backward called again
    overlaps_backward: bool = True  # the data-parallel collectives run while backward computes
    wire_bytes: int | None = None  # bytes per element the data-parallel collectives move where they move 16 bits
    vocab_parallel: bool = False  # tensor parallelism splits the head over the vocabulary (Megatron), else each
    # tensor-parallel rank computes the whole head
    kept: Kept | None = None  # what it holds at the step's peak (config.memory; None: as this engine does)


@dataclass(frozen=True)
class Constants:
    """What turns counted work into seconds; forecast/published.py fits them (docs/planning.md: what each changes)."""

    gemm_efficiency: float  # the program's GEMMs' share of the best-shaped matmul's measured rate
    flash_efficiency: float  # share of the dense peak a fused attention kernel reaches on causal attention's FLOPs
    kernel_s: float  # a kernel's fixed cost on the GPU: its launch and its tail
    host_op_s: float  # the host's cost of dispatching one operator from Python

    NAMES = ("gemm_efficiency", "flash_efficiency", "kernel_s", "host_op_s")


# Where no measurement of a GPU's best matmul or of its sustained memory bandwidth was published: the median of those
# that were (system.hardware)
UNMEASURED_MATMUL_SHARE = float(np.median([gpu.best_matmul_share for gpu in GPUS.values() if gpu.best_matmul_share]))
UNMEASURED_MEMORY_SHARE = float(np.median([gpu.memory_share for gpu in GPUS.values() if gpu.memory_share]))


def sustained_bandwidth(gpu: GPU) -> float:
    """The memory bandwidth a memory-bound kernel sustains: the datasheet's at its measured share."""
    return gpu.memory_bytes_per_s * (gpu.memory_share or UNMEASURED_MEMORY_SHARE)


def best_matmul_share(gpu: GPU, precision: str) -> float:
    """The share of the peak the best-shaped matmul reaches in the precision's arithmetic: measured for 16-bit
    tensor cores (system.hardware), none known for fp32 and tf32, whose GEMMs the fitted efficiency alone prices."""
    if COMPUTE_DTYPE[precision] not in ("bf16", "fp16"):
        return 1.0
    return gpu.best_matmul_share or UNMEASURED_MATMUL_SHARE


@dataclass
class Work:
    """Work before any constant: GEMMs as seconds at the dense peak and as seconds at the memory bandwidth (each
    runs at the slower: its roofline); fused attention's seconds at the peak; other bytes as seconds at the memory
    bandwidth; kernels, host dispatches and syncs."""

    gemm_peak_s: list[float] = field(default_factory=list)
    gemm_memory_s: list[float] = field(default_factory=list)
    flash_peak_s: float = 0.0
    memory_s: float = 0.0
    kernels: float = 0.0
    host_ops: float = 0.0
    syncs: float = 0.0

    def gemm(self, shape: Shape, moved: float, gpu: GPU, rate: float, bandwidth: float, count: float = 1.0) -> None:
        """`count` GEMMs of `shape` each, moving `moved` bytes each: at the share of the best matmul's `rate` its
        shape reaches (forecast.gemm), or at the sustained memory `bandwidth` where it moves more than it
        computes."""
        flops = 2 * shape.m * shape.n * shape.k * shape.batch
        self.gemm_peak_s.append(count * flops / (rate * efficiency(shape, gpu.sms)))
        self.gemm_memory_s.append(count * moved / bandwidth)
        self.kernels += count

    def moves(self, kernels: float, nbytes: float, bandwidth: float) -> None:
        """Memory-bound kernels moving `nbytes` in all."""
        self.memory_s += nbytes / bandwidth
        self.kernels += kernels

    def add(self, other: Work, times: float = 1.0) -> None:
        self.gemm_peak_s += [s * times for s in other.gemm_peak_s]
        self.gemm_memory_s += [s * times for s in other.gemm_memory_s]
        self.flash_peak_s += other.flash_peak_s * times
        self.memory_s += other.memory_s * times
        self.kernels += other.kernels * times
        self.host_ops += other.host_ops * times
        self.syncs += other.syncs * times

    def seconds(self, c: Constants) -> tuple[float, float]:
        """The GPU's seconds and the host's."""
        gemms = float(np.maximum(np.array(self.gemm_peak_s) / c.gemm_efficiency, np.array(self.gemm_memory_s)).sum())
        gpu = gemms + self.flash_peak_s / c.flash_efficiency + self.memory_s
        return gpu + self.kernels * c.kernel_s, self.host_ops * c.host_op_s


@dataclass(frozen=True)
class Communication:
    """One group's collectives per step: NCCL's latency, and the bytes as seconds at the bus bandwidth NCCL was
    measured to reach over its link (system.links)."""

    group: str
    latency_s: float
    bytes_s: float

    def seconds(self, c: Constants) -> float:
        return self.latency_s + self.bytes_s


@dataclass(frozen=True)
class StepWork:
    """A rank's optimizer step, counted: what its GPU and host do per micro-step and per step, each group's
    collectives, what of the data-parallel one can hide under computation, and the pipeline's bubble."""

    micro: Work
    step: Work
    passes: int
    bubble_micro_steps: float  # the pipeline's bubble in micro-steps ((stages - 1) / virtual stages), 0 without
    communication: tuple[Communication, ...]
    hideable_bytes_s: float  # the data-parallel bytes sent under computation, as seconds at the link's rate
    hidden_under: float  # the share of the step's computation they can run under
    filling: Work = field(default_factory=Work)  # a micro-step of the pipeline's other stages (empty without)

    def terms(self, c: Constants) -> StepTerms:
        """The step's terms. Tensor parallelism's all-reduces sit between a block's GEMMs on the GPU's one stream:
        they lengthen the GPU's micro-step, and cost the step only what the host's dispatch does not already wait
        for; the other groups' collectives come after the computation they follow."""
        micro_gpu, micro_host = self.micro.seconds(c)
        step_gpu, step_host = self.step.seconds(c)
        stall = c.host_op_s + c.kernel_s  # after a sync the GPU waits for the host's next launch
        syncs = (self.passes * self.micro.syncs + self.step.syncs) * stall

        def computing(in_micro_step: float) -> float:
            return (max(self.passes * (micro_gpu + in_micro_step) + step_gpu, self.passes * micro_host + step_host)
                    + syncs)

        comm = {part.group: part.seconds(c) for part in self.communication}
        compute = computing(0.0)
        if TENSOR_PARALLEL_GROUP in comm:  # what the all-reduces add to the computation, the rest in the host's slack
            comm[TENSOR_PARALLEL_GROUP] = computing(comm[TENSOR_PARALLEL_GROUP] / self.passes) - compute
        hidden = min(self.hideable_bytes_s, self.hidden_under * compute,
                     comm.get(DATA_PARALLEL_GROUP, 0.0))
        fill_gpu, fill_host = self.filling.seconds(c)
        # the tensor-parallel share of a micro-step is this stage's too
        other_stage = max(fill_gpu + comm.get(TENSOR_PARALLEL_GROUP, 0.0) / self.passes, fill_host)
        return StepTerms(compute, self.bubble_micro_steps * other_stage, comm, hidden)


class StepWorks:
    """Many rows' steps as arrays, priced at once with StepWork.terms' arithmetic: a fit prices every row of the
    published table at each of its trials."""

    GROUPS = tuple(GROUP_DIMS)

    def __init__(self, works: list[StepWork]):
        self.rows = len(works)
        self.passes = np.array([w.passes for w in works], dtype=float)
        self.bubble = np.array([w.bubble_micro_steps for w in works])
        self.hideable = np.array([w.hideable_bytes_s for w in works])
        self.under = np.array([w.hidden_under for w in works])
        self.parts = {part: self._work([getattr(w, part) for w in works]) for part in ("micro", "step", "filling")}
        self.comm = {}
        for group in self.GROUPS:
            found = [next((p for p in w.communication if p.group == group), None) for w in works]
            self.comm[group] = (np.array([p.latency_s if p else 0.0 for p in found]),
                                np.array([p.bytes_s if p else 0.0 for p in found]))
        if any(p.group not in self.GROUPS for w in works for p in w.communication):
            raise ValueError(f"a group other than {', '.join(self.GROUPS)}")

    @staticmethod
    def _work(works: list[Work]) -> dict[str, np.ndarray]:
        owner = np.concatenate([np.full(len(w.gemm_peak_s), row) for row, w in enumerate(works)]).astype(int)
        return {"owner": owner, "gemm_peak_s": np.concatenate([w.gemm_peak_s for w in works]),
                "gemm_memory_s": np.concatenate([w.gemm_memory_s for w in works]),
                **{name: np.array([getattr(w, name) for w in works], dtype=float)
                   for name in ("flash_peak_s", "memory_s", "kernels", "host_ops", "syncs")}}

    def _seconds(self, part: str, c: Constants) -> tuple[np.ndarray, np.ndarray]:
        w = self.parts[part]
        gemms = np.bincount(w["owner"], np.maximum(w["gemm_peak_s"] / c.gemm_efficiency, w["gemm_memory_s"]),
                            minlength=self.rows)
        gpu = gemms + w["flash_peak_s"] / c.flash_efficiency + w["memory_s"]
        return gpu + w["kernels"] * c.kernel_s, w["host_ops"] * c.host_op_s

    def totals(self, c: Constants) -> np.ndarray:
        """Every row's predicted step, seconds (StepWork.terms(c).total_s)."""
        (micro_gpu, micro_host), (step_gpu, step_host) = self._seconds("micro", c), self._seconds("step", c)
        syncs = (self.passes * self.parts["micro"]["syncs"] + self.parts["step"]["syncs"]) * (c.host_op_s + c.kernel_s)

        def computing(in_micro_step):
            return np.maximum(self.passes * (micro_gpu + in_micro_step) + step_gpu,
                              self.passes * micro_host + step_host) + syncs

        comm = {group: latency + bytes_s for group, (latency, bytes_s) in self.comm.items()}
        compute = computing(0.0)
        comm[TENSOR_PARALLEL_GROUP] = computing(comm[TENSOR_PARALLEL_GROUP] / self.passes) - compute
        hidden = np.minimum.reduce([self.hideable, self.under * compute, comm[DATA_PARALLEL_GROUP]])
        fill_gpu, fill_host = self._seconds("filling", c)
        bubble = self.bubble * np.maximum(fill_gpu + comm[TENSOR_PARALLEL_GROUP] / self.passes, fill_host)
        return compute + bubble + sum(comm.values()) - hidden


def peak_of(gpu: str, precision: str) -> float:
    """The dense peak of `precision`'s arithmetic on `gpu`, refused in one line where the table has none."""
    known = gpu_of(gpu)
    if known is None:
        raise UsageError(f"no datasheet known for GPU '{gpu}' (known: {', '.join(GPUS)})")
    peak = known.peaks.get(COMPUTE_DTYPE[precision])
    if peak is None:
        raise UsageError(f"GPU '{gpu}' has no {COMPUTE_DTYPE[precision]} arithmetic; choose a precision it computes in "
                         f"({', '.join(known.peaks)})")
    return peak


def step_work(spec: RunSpec, gpu: str, implementation: Implementation, links: Links) -> StepWork:
    """A GPU rank's step of `spec` on `gpu` (the busiest rank: a pipeline's last stage, which holds the head), as
    `implementation` computes it, its collectives over `links`."""
    peak, device = peak_of(gpu, spec.precision), gpu_of(gpu)
    bandwidth, rate = sustained_bandwidth(device), peak * best_matmul_share(device, spec.precision)
    degrees, m, t = degrees_of(spec), spec.model, spec.train
    a = compute_bytes(spec.precision)  # a GEMM's operands and outputs
    tp, rows, context, d = degrees.tp, t.micro_batch_size, m.n_positions, m.n_embd
    tokens, heads, head_dim = rows * context, m.n_head // tp, m.n_embd // m.n_head
    blocks = len(rank_blocks(spec, degrees.pp - 1))
    python = implementation.launch == "python"

    forward, backward = Work(), Work()
    for n_out, n_in in ((3 * d // tp, d), (d, d // tp), (4 * d // tp, d), (d, 4 * d // tp)):
        # y = x W^T forward; the input's gradient, dy W; the weight's, dy^T x, reduced over the tokens
        forward.gemm(Shape(tokens, n_out, n_in), (tokens * n_in + n_out * n_in + tokens * n_out) * a, device, rate, bandwidth)
        backward.gemm(Shape(tokens, n_in, n_out), (tokens * n_out + n_out * n_in + tokens * n_in) * a, device, rate, bandwidth)
        backward.gemm(Shape(n_out, n_in, tokens), (tokens * n_out + tokens * n_in) * a + n_out * n_in * FP32, device,
                      rate, bandwidth)
    scores = rows * heads * context * context  # every head's full square
    square_flops = 2 * scores * head_dim  # one of QK^T and PV over the full square
    if implementation.attention == "flash":  # the causal half; backward's five matmuls to forward's two
        forward.flash_peak_s, backward.flash_peak_s = square_flops / peak, 2.5 * square_flops / peak
        forward.kernels, backward.kernels = 1, 3
    else:
        per_head_row = tokens * d // tp * a  # q, k, v or the output, all heads of this rank
        each = rows * heads  # one GEMM per sequence and head, batched
        square, deep = Shape(context, context, head_dim, each), Shape(context, head_dim, context, each)
        forward.gemm(square, 2 * per_head_row + scores * a, device, rate, bandwidth)  # QK^T
        forward.gemm(deep, scores * a + 2 * per_head_row, device, rate, bandwidth)  # PV
        backward.gemm(square, 2 * per_head_row + scores * a, device, rate, bandwidth)  # the scores' gradient, dO V^T
        backward.gemm(deep, scores * a + 2 * per_head_row, device, rate, bandwidth, 3)  # V's, Q's and K's
        forward.moves(0, scores * implementation.score_bytes[0], bandwidth)
        backward.moves(0, scores * implementation.score_bytes[1], bandwidth)
    for work, direction in ((forward, 0), (backward, 1)):
        work.moves(implementation.kernels[direction], tokens * d * (implementation.width_bytes[direction]
                                                                    + implementation.inner_bytes[direction] / tp),
                   bandwidth)
        work.host_ops = work.kernels if python else 0.0
    forward.syncs = implementation.syncs_per_layer

    checkpointed = t.activation_checkpointing == "block"
    forwards = 2 if checkpointed else 1
    if checkpointed and python:
        backward.host_ops += implementation.checkpoint_host_ops
    micro = Work()
    micro.add(forward, blocks * forwards)
    micro.add(backward, blocks)
    _head(micro, implementation, spec, tokens, a, device, rate, degrees.pp)
    # the pipeline's other stages: their blocks (the first's has the embeddings, not the head), which its bubble waits
    # for while the pipeline fills and drains
    filling = Work()
    if degrees.pp > 1:
        filling.add(forward, len(rank_blocks(spec, 0)) * forwards)
        filling.add(backward, len(rank_blocks(spec, 0)))
        _embeddings(filling, spec, tokens, a, bandwidth)
    local = local_parameters(spec, degrees.pp - 1)
    local_elements = sum(math.prod(shape) for shape in local.values())
    matrices = sum(len(shape) == 2 for shape in local.values())
    if implementation.weight_casts and a == HALF:  # per forward (and recompute), and back
        casts = matrices * (2 + checkpointed)
        micro.moves(casts, local_elements * (FP32 + HALF) * casts / matrices, bandwidth)
        micro.host_ops += casts if python else 0
    if implementation.accumulate_grads:  # every backward adds its gradients into the zeroed ones
        grad = HALF if implementation.master_copies else FP32
        micro.moves(len(local), local_elements * 3 * grad, bandwidth)
        micro.host_ops += len(local) if python else 0
    if (devices := degrees.devices_per_process) > 1:  # one process's threads dispatch every replica's work, and
        micro.host_ops = micro.host_ops * devices + 2 * len(local) * devices  # it replicates the module each pass
    step = _step(implementation, spec, len(local), local_elements, bandwidth)
    return StepWork(micro, step, degrees.passes, (degrees.pp - 1) / degrees.pp_virtual if degrees.pp > 1 else 0.0,
                    *_communication(spec, implementation, links), filling=filling)


def _head(micro: Work, implementation: Implementation, spec: RunSpec, tokens: int, a: int, device: GPU, rate: float,
          stages: int) -> None:
    """The busiest stage's ends: the embeddings (without a pipeline), the final norm, the head and its loss."""
    m, d, bandwidth = spec.model, spec.model.n_embd, sustained_bandwidth(device)
    vocab = m.vocab_size // degrees_of(spec).tp if implementation.vocab_parallel else m.vocab_size
    python = implementation.launch == "python"
    if stages == 1:
        _embeddings(micro, spec, tokens, a, bandwidth)
    micro.moves(3, tokens * d * 5 * a, bandwidth)  # the final norm, and back
    micro.gemm(Shape(tokens, vocab, d), (tokens * d + vocab * d + tokens * vocab) * a, device, rate, bandwidth)
    micro.gemm(Shape(tokens, d, vocab), (tokens * vocab + vocab * d + tokens * d) * a, device, rate, bandwidth)
    micro.gemm(Shape(vocab, d, tokens), (tokens * vocab + tokens * d) * a + vocab * d * FP32, device, rate, bandwidth)
    micro.moves(sum(implementation.head_kernels), tokens * vocab * sum(implementation.head_bytes), bandwidth)
    micro.host_ops += 3 + sum(implementation.head_kernels) + 10 if python else 0  # and backward's start


def _embeddings(micro: Work, spec: RunSpec, tokens: int, a: int, bandwidth: float) -> None:
    """Token and position embeddings summed; backward scatters into the token embedding's gradient."""
    m, d = spec.model, spec.model.n_embd
    micro.moves(3, tokens * d * 5 * a, bandwidth)
    micro.moves(4, tokens * d * 2 * a + m.vocab_size * d * 2 * FP32, bandwidth)


def _step(implementation: Implementation, spec: RunSpec, tensors: int, local_elements: int, bandwidth: float) -> Work:
    """Once per step: zeroing the gradients, the 16-bit gradients' copy to fp32 masters, the loss scaler, gradient
    clipping and AdamW's update over the optimizer's share of the state."""
    step = Work()
    held = sum(math.prod(shape) for shape in held_shapes(spec))
    stepped_shapes = optimizer_shapes(spec, busiest_rank(spec))
    stepped = sum(math.prod(shape) for shape in stepped_shapes)
    stepped_tensors = implementation.optimizer_tensors or len(stepped_shapes)
    launches = max(1, stepped_tensors // 32)  # a multi-tensor kernel takes a few dozen tensors per launch
    if implementation.accumulate_grads:
        step.moves(tensors, held * FP32, bandwidth)
    if implementation.master_copies:  # copied and unscaled into the fp32 masters, which are cast back after
        step.moves(3 * launches, stepped * (HALF + FP32 + 2 * FP32 + FP32 + HALF), bandwidth)
    elif spec.precision in ("fp16", "apex-O1"):  # torch.amp's loss scaler unscales and checks every gradient
        step.moves(launches, held * 2 * FP32, bandwidth)
    if implementation.clip != "none":  # each gradient's norm, their norm, each gradient scaled
        step.moves(2 * tensors + 3 if implementation.clip == "per-tensor" else 4, held * 3 * FP32, bandwidth)
    kernels = {"loop": 7 * stepped_tensors, "foreach": 10 * launches, "fused": launches}[implementation.optimizer]
    moved = {"loop": 18, "foreach": 18, "fused": 7}[implementation.optimizer] * FP32  # per element, read and written
    step.moves(kernels, stepped * moved, bandwidth)
    per_tensor = implementation.syncs_per_tensor[stepped < local_elements]  # sharded: the rank steps a part
    step.moves(2 * per_tensor * tensors, per_tensor * held * (HALF + FP32), bandwidth)  # each check casts, reduces
    step.syncs = implementation.syncs_per_step + per_tensor * tensors
    step.host_ops = step.kernels + 20 if implementation.launch == "python" else 0.0
    return step


def group_bus_bytes_per_s(spec: RunSpec, group: str, links: Links) -> float:
    """The bus bandwidth one group of a kind gets: the link inside a node where its ranks stay on one, else the
    node's NICs shared by the groups that cross them at once (config.traffic.link_streams), never more than the
    link inside."""
    if not spans_nodes(spec, group):
        return links.nccl_bytes_per_s(1)
    return min(links.nccl_bytes_per_s(1), links.nccl_bytes_per_s(spec.nodes) / link_streams(spec, group))


def _communication(spec: RunSpec, implementation: Implementation,
                   links: Links) -> tuple[tuple[Communication, ...], float, float]:
    """Each group's collectives (config.strategies' traffic) over its link, and what of the data-parallel part
    hides under computation. An implementation whose data-parallel collectives move 16 bits moves the elements the
    strategy's model counts at that width."""
    if spec.nproc == 1:
        return (), 0.0, 0.0
    parts, hidden, hideable = [], overlap(spec), 0.0
    wire = {}
    if implementation.wire_bytes:  # the same elements, each at wire_bytes: the traffic counted at fp32, rescaled
        at_fp32 = spec.model_copy(update={"precision": "fp32", "train": spec.train.model_copy(
            update={"fsdp_mixed_precision": False})})
        wire = {part.group: part.bytes_per_step * implementation.wire_bytes / FP32 for part in traffic(at_fp32).parts
                if part.group == DATA_PARALLEL_GROUP}
    for part in traffic(spec).parts:
        sent = wire.get(part.group, part.bytes_per_step)
        if not sent:
            continue
        bus = group_bus_bytes_per_s(spec, part.group, links)
        nodes = spec.nodes if spans_nodes(spec, part.group) else 1
        total = collective_seconds(part.kind, sent, part.calls, part.ranks, nodes, links.inside, bus)
        parts.append(Communication(part.group, total - sent / bus, sent / bus))
        # through host memory (peer-to-peer off) NCCL's proxy threads copy every byte on the CPUs the ranks dispatch
        # from: none of it hides (Hugging Face's three pairs with and without peer-to-peer, docs/planning.md)
        if part.group == DATA_PARALLEL_GROUP and implementation.overlaps_backward and not links.through_host:
            hideable = hidden.bytes_per_step * sent / part.bytes_per_step / bus
    return tuple(parts), hideable, hidden.under


# Recomputing each block's activations in backward runs its forward again: a third more of the 6 FLOPs per
# parameter and token a training step has (2 forward, 4 backward)
CHECKPOINTED_COMPUTE = 4 / 3


def mfu_step_terms(spec: RunSpec, gpu: str, mfu: float, links: Links) -> StepTerms:
    """The step at an assumed MFU, the planner's model before this one and its control (`--mfu`): the whole global
    batch's FLOPs at `mfu` of the peak (a third more with activation checkpointing) divided among the processes, a
    pipeline's bubble, and each group's bytes at its link's bus bandwidth, less what the strategy sends under its
    computation."""
    if not 0 < mfu <= 1:
        raise UsageError(f"--mfu is a fraction of the peak in (0, 1], got {mfu:g}")
    m, t = spec.model, spec.train
    single = t.global_batch_size * m.n_positions * flops_per_token(m) / (peak_of(gpu, spec.precision) * mfu)
    single *= CHECKPOINTED_COMPUTE if t.activation_checkpointing == "block" else 1
    hidden = overlap(spec)
    parts = {part.group: (part.bytes_per_step, group_bus_bytes_per_s(spec, part.group, links) / 1e9)
             for part in traffic(spec).parts}
    facts = {"strategy": spec.strategy, "nproc": spec.nproc, "nodes": spec.nodes, "emulated": False,
             "comm_parts": parts, "hidden_comm_bytes": hidden.bytes_per_step, "hidden_under": hidden.under}
    return step_terms(facts, single, "cuda", spec.train)
