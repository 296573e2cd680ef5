"""A run's parallel degrees, derived once per run and checked in one place (torchtitan's ParallelDims is the
model): how its devices divide into data-parallel groups that each hold a whole copy of the state
(`dp_replicate`) and ranks that shard one copy (`dp_shard`), ranks that split each layer (`tp`) and ranks
that run consecutive blocks (`pp`, each holding `pp_virtual` stages), and how the global batch is cut for
them. The launcher, the planner, the memory and traffic models and the device meshes read it; nothing
recomputes a degree from the process count."""

from __future__ import annotations

from dataclasses import dataclass

from gpt2dist.config.schema import ALL_FORWARDS_FIRST, ModelConfig, TrainConfig
from gpt2dist.errors import UsageError


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
    whole_batch_per_pass: bool = False  # a pipeline step takes the global batch as its micro-batches
    fixed_by: tuple[str, int] | None = None  # the setting that fixes one degree, nproc dividing by it for the other

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
        """Sequences one share's process feeds to one forward pass."""
        if self.whole_batch_per_pass:
            return self.global_batch_size
        return self.micro_batch_size * self.devices_per_process

    @property
    def grad_accum_steps(self) -> int:
        """Forward and backward passes per optimizer step."""
        return self.global_batch_size // (self.batch_shares * self.rows_per_pass)

    @property
    def pipeline_micro_batches(self) -> int:
        """Micro-batches a pipeline step splits the global batch into."""
        return self.global_batch_size // self.micro_batch_size

    def validate(self, model: ModelConfig, train: TrainConfig) -> None:
        """Refuse degrees that do not divide the devices, the model or the batch, naming the setting to change."""
        split = self.dp_replicate * self.dp_shard * self.tp * self.pp
        if split != self.nproc and self.fixed_by:
            key, size = self.fixed_by
            raise UsageError(f"strategy '{self.strategy}' needs --nproc ({self.nproc}) divisible by {key} ({size}); "
                             f"use --nproc {2 * size} or a {key} that divides {self.nproc}")
        if model.n_head % self.tp:
            fix = "a process count" if self.fixed_by is None else f"a {self.fixed_by[0]}"
            raise UsageError(f"{self.strategy} splits attention heads over {self.tp} ranks, but model.n_head "
                             f"({model.n_head}) is not divisible by {self.tp}; use {fix} that divides {model.n_head}")
        self._validate_pipeline(model, train)
        divisor = self.dp * self.micro_batch_size
        if self.global_batch_size % divisor:
            share = "nproc" if self.dp == self.nproc else "1 (one replica)" if self.dp == 1 else \
                f"nproc / {self.fixed_by[0]}"  # a fixed degree splits the rest (fsdp-tp)
            raise UsageError(f"train.global_batch_size ({self.global_batch_size}) must be divisible by {share} x "
                             f"train.micro_batch_size ({self.dp} x {self.micro_batch_size} = {divisor})")

    def _validate_pipeline(self, model: ModelConfig, train: TrainConfig) -> None:
        stages, schedule = self.pp * self.pp_virtual, train.pipeline_schedule
        if stages > model.n_layer:
            if self.pp_virtual == 1:
                raise UsageError(f"strategy '{self.strategy}' puts at least one block on each of its {self.pp} "
                                 f"stages, but the model has {model.n_layer} (model.n_layer); use --nproc "
                                 f"{model.n_layer} or fewer")
            raise UsageError(f"strategy '{self.strategy}' with '{schedule}' puts at least one block on each of its "
                             f"{self.pp} x {self.pp_virtual} stages (train.pipeline_virtual_stages), but the model has "
                             f"{model.n_layer} (model.n_layer); use --nproc {max(1, model.n_layer // self.pp_virtual)} "
                             "or fewer, or fewer virtual stages")
        micro_batches = self.pipeline_micro_batches
        if self.pp > 1 and schedule != ALL_FORWARDS_FIRST and micro_batches < self.pp:
            # torch's 1F1B schedules fill the pipeline with one micro-batch per rank before their first backward
            raise UsageError(f"train.pipeline_schedule '{schedule}' needs at least one micro-batch per stage, but "
                             f"global_batch_size / micro_batch_size is {micro_batches} for {self.pp} stages; use a "
                             f"smaller train.micro_batch_size, or train.pipeline_schedule={ALL_FORWARDS_FIRST}")
        rounds = max(1, micro_batches // self.pp)
        if self.pp_virtual > 1 and micro_batches % rounds:
            # torch's interleaved schedules run the micro-batches in rounds of about one per rank
            raise UsageError(f"train.pipeline_schedule '{schedule}' runs the {micro_batches} micro-batches in "
                             f"{rounds} equal rounds, which they do not divide into; use a global batch of "
                             f"{rounds * (micro_batches // rounds)} or {rounds * (micro_batches // rounds + 1)} "
                             "micro-batches")
