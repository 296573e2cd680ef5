"""A run's parallel degrees, derived once per run from its strategy's split (config.split) and checked in one
place (torchtitan's ParallelDims is the model): how its devices divide into pipeline stages (`pp`, each rank
holding `pp_virtual` of them), data-parallel groups that each hold a whole copy of the state (`dp_replicate`) and
ranks that shard one copy (`dp_shard`), and ranks that split each layer (`tp`); how the global batch is cut for
them; and where each rank sits in the device mesh. The launcher, the planner, the memory and traffic models and
the runtime's meshes read it; nothing recomputes a degree from the process count.

The mesh runs pp outermost, then dp (replicate, shard), tp innermost, as torchtitan's and Megatron-core's default
order: a tensor-parallel group is consecutive ranks, inside one node; a pipeline's stages are the farthest apart,
its point-to-point activations being the traffic a slow link bears best."""

from __future__ import annotations

import math
from dataclasses import dataclass

from gpt2dist.config.schema import ALL_FORWARDS_FIRST, ModelConfig, TrainConfig
from gpt2dist.config.split import composed_name
from gpt2dist.errors import UsageError

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "tp")  # outermost first


@dataclass(frozen=True)
class Degrees:
    strategy: str  # whose degrees, for the messages
    nproc: int  # devices the run asked for
    global_batch_size: int
    micro_batch_size: int
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    pp: int = 1
    pp_virtual: int = 1
    devices_per_process: int = 1  # nn.DataParallel: one process drives every device
    fixed_by: tuple[str, int] | None = None  # the setting that fixes one degree, nproc dividing by it for the other
    composed: bool = False  # the degrees are in the strategy's name (ddp-tp2-pp2), not a named strategy's
    method: str = ""  # the data-parallel method, for the messages ("none": one replica)

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each computes the gradient of its own share of the global batch."""
        return self.dp_replicate * self.dp_shard

    @property
    def processes(self) -> int:
        """Processes the launcher starts (SLURM tasks)."""
        return self.nproc // self.devices_per_process

    @property
    def batch_shares(self) -> int:
        """Processes that read their own share of the global batch (one process reads for all its devices)."""
        return self.dp // self.devices_per_process

    @property
    def rows_per_pass(self) -> int:
        """Sequences one share's process feeds to one forward pass: a pipeline's step takes its whole share."""
        if self.pp > 1:
            return self.global_batch_size // self.batch_shares
        return self.micro_batch_size * self.devices_per_process

    @property
    def grad_accum_steps(self) -> int:
        """Forward and backward passes per optimizer step."""
        return self.global_batch_size // (self.batch_shares * self.rows_per_pass)

    @property
    def pipeline_micro_batches(self) -> int:
        """Micro-batches a pipeline step splits its share of the global batch into."""
        return self.global_batch_size // (self.dp * self.micro_batch_size)

    @property
    def passes(self) -> int:
        """Forward and backward passes of micro_batch_size rows each process runs per optimizer step (a pipeline's
        micro-batches, else its accumulation steps)."""
        return self.pipeline_micro_batches if self.pp > 1 else self.grad_accum_steps

    # -- the device mesh ------------------------------------------------------------------
    def sizes(self) -> dict[str, int]:
        """Each mesh dimension's size, outermost first."""
        return {"pp": self.pp, "dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp}

    def coordinates(self, rank: int) -> dict[str, int]:
        """Where a rank sits in the mesh: the row-major order init_device_mesh lays ranks out in."""
        coordinates, rest = {}, rank
        for dim, size in reversed(self.sizes().items()):
            rest, coordinates[dim] = divmod(rest, size)
        return {dim: coordinates[dim] for dim in MESH_ORDER}

    def rank_at(self, coordinates: dict[str, int]) -> int:
        rank = 0
        for dim, size in self.sizes().items():
            rank = rank * size + coordinates[dim]
        return rank

    def data_rank(self, rank: int) -> int:
        """The data-parallel share a rank reads: ranks that split one replica (tp, pp) read the same rows."""
        at = self.coordinates(rank)
        return at["dp_replicate"] * self.dp_shard + at["dp_shard"]

    def stride(self, dim: str) -> int:
        """How far apart in rank two neighbours along `dim` are (row-major: the product of the inner sizes)."""
        sizes = list(self.sizes().items())
        inner = [size for name, size in sizes[[name for name, _ in sizes].index(dim) + 1:]]
        return math.prod(inner)

    def farthest(self, dims: tuple[str, ...]) -> int:
        """The highest rank of rank 0's group of `dims`: counted, not enumerated (a planner's groups may hold
        billions of ranks)."""
        sizes = self.sizes()
        return sum((sizes[dim] - 1) * self.stride(dim) for dim in dims)

    def members_below(self, dims: tuple[str, ...], span: int) -> int:
        """How many ranks of rank 0's group of `dims` (adjacent mesh dimensions: one of size their product, strided
        as the innermost) are below rank `span`: on rank 0's node, for a node of `span` ranks."""
        sizes = self.sizes()
        return min(math.prod(sizes[dim] for dim in dims), -(-span // self.stride(dims[-1])))

    def group(self, rank: int, dims: tuple[str, ...]) -> list[int]:
        """The ranks that differ from `rank` only along `dims`: its group of those dimensions, in rank order."""
        at, sizes = self.coordinates(rank), self.sizes()
        ranks = []
        for index in range(math.prod(sizes[dim] for dim in dims)):
            moved = dict(at)
            for dim in reversed(dims):
                index, moved[dim] = divmod(index, sizes[dim])
            ranks.append(self.rank_at(moved))
        return sorted(ranks)

    def groups(self, dims: tuple[str, ...]) -> list[list[int]]:
        """Every group of `dims`, by its first rank."""
        return [list(group) for group in sorted({tuple(self.group(rank, dims)) for rank in range(self.processes)})]

    def layout(self) -> dict:
        """For run.json: the degrees, the mesh's order and each dimension's groups."""
        sizes = self.sizes()
        return {"degrees": sizes, "mesh_order": list(MESH_ORDER),
                "groups": {dim: self.groups((dim,)) for dim in MESH_ORDER if sizes[dim] > 1}}

    # -- validation -----------------------------------------------------------------------
    def validate(self, model: ModelConfig, train: TrainConfig) -> None:
        """Refuse degrees that do not divide the devices, the model or the batch, naming the setting to change."""
        self._validate_split()
        if model.n_head % self.tp:
            fix = ("a process count" if self.fixed_by is None and not self.composed else
                   "a tensor-parallel degree" if self.composed else f"a {self.fixed_by[0]}")
            raise UsageError(f"{self.strategy} splits attention heads over {self.tp} ranks, but model.n_head "
                             f"({model.n_head}) is not divisible by {self.tp}; use {fix} that divides {model.n_head}")
        self._validate_pipeline(model, train)
        divisor = self.dp * self.micro_batch_size
        if self.global_batch_size % divisor:
            share = "nproc" if self.dp == self.nproc else "1 (one replica)" if self.dp == 1 else \
                f"nproc / {self.tp * self.pp} (tp x pp)" if self.composed else f"nproc / {self.fixed_by[0]}"
            raise UsageError(f"train.global_batch_size ({self.global_batch_size}) must be divisible by {share} x "
                             f"train.micro_batch_size ({self.dp} x {self.micro_batch_size} = {divisor})")

    def _validate_split(self) -> None:
        replica = self.tp * self.pp
        if self.composed and self.nproc % replica:
            multiples = sorted({replica * max(1, self.nproc // replica), replica * (self.nproc // replica + 1)})
            raise UsageError(f"strategy '{self.strategy}' splits each replica over tp {self.tp} x pp {self.pp} = "
                             f"{replica} processes, and --nproc {self.nproc} is not a multiple of {replica}; use "
                             f"--nproc {' or '.join(map(str, multiples))}")
        if self.composed and self.method == "none" and self.nproc != replica:
            raise UsageError(f"strategy '{self.strategy}' at --nproc {self.nproc} would leave {self.nproc // replica} "
                             f"replicas and names no data-parallel method to hold them; use "
                             f"{composed_name('ddp', self.tp, self.pp)} or {composed_name('fsdp', self.tp, self.pp)}, "
                             f"or --nproc {replica}")
        if self.dp_replicate * self.dp_shard * self.tp * self.pp != self.nproc and self.fixed_by:
            key, size = self.fixed_by
            if self.composed:
                dp = self.nproc // replica
                raise UsageError(f"strategy '{self.strategy}' shards each replica's state over {key} ({size}) of its "
                                 f"{dp} data-parallel ranks (nproc / (tp x pp)), which {size} does not divide; use a "
                                 f"{key} that divides {dp}, or --nproc {replica * size * max(1, dp // size + 1)}")
            raise UsageError(f"strategy '{self.strategy}' needs --nproc ({self.nproc}) divisible by {key} ({size}); "
                             f"use --nproc {2 * size} or a {key} that divides {self.nproc}")

    def _validate_pipeline(self, model: ModelConfig, train: TrainConfig) -> None:
        stages, schedule = self.pp * self.pp_virtual, train.pipeline_schedule
        if stages > model.n_layer:
            fewer = "fewer pipeline stages (ppN)" if self.composed else \
                f"--nproc {max(1, model.n_layer // self.pp_virtual)} or fewer"
            if self.pp_virtual == 1:
                raise UsageError(f"strategy '{self.strategy}' puts at least one block on each of its {self.pp} "
                                 f"stages, but the model has {model.n_layer} (model.n_layer); use "
                                 f"{f'--nproc {model.n_layer} or fewer' if not self.composed else fewer}")
            raise UsageError(f"strategy '{self.strategy}' with '{schedule}' puts at least one block on each of its "
                             f"{self.pp} x {self.pp_virtual} stages (train.pipeline_virtual_stages), but the model has "
                             f"{model.n_layer} (model.n_layer); use {fewer}, or fewer virtual stages")

    def validate_schedule(self, train: TrainConfig) -> None:
        """Refuse what torch's pipeline schedules cannot run, though other engines run it (Megatron-LM runs fewer
        micro-batches than stages, a larger bubble, and the planner prices it): 1F1B needs a micro-batch per stage
        before its first backward, and the interleaved schedules their micro-batches in equal rounds."""
        micro_batches, schedule = self.pipeline_micro_batches, train.pipeline_schedule
        if self.pp > 1 and schedule != ALL_FORWARDS_FIRST and micro_batches < self.pp:
            # torch's 1F1B schedules fill the pipeline with one micro-batch per rank before their first backward
            raise UsageError(f"train.pipeline_schedule '{schedule}' needs at least one micro-batch per stage, but "
                             f"global_batch_size / {'(data-parallel ranks x micro_batch_size)' if self.dp > 1 else 'micro_batch_size'} "
                             f"is {micro_batches} for {self.pp} stages; use a smaller train.micro_batch_size, or "
                             f"train.pipeline_schedule={ALL_FORWARDS_FIRST}")
        rounds = max(1, micro_batches // self.pp)
        if self.pp_virtual > 1 and micro_batches % rounds:
            # torch's interleaved schedules run the micro-batches in rounds of about one per rank
            raise UsageError(f"train.pipeline_schedule '{schedule}' runs the {micro_batches} micro-batches in "
                             f"{rounds} equal rounds, which they do not divide into; use a global batch of "
                             f"{rounds * (micro_batches // rounds)} or {rounds * (micro_batches // rounds + 1)} "
                             "micro-batches")
