"""The run matrix of a preset's study: which runs it trains on the cluster it is planned for, which it drops
and why, the repeats its added rounds decided, and each run's spec as its training will read it."""

from __future__ import annotations

import collections
import itertools
import json
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpt2dist.config.memory import overflow
from gpt2dist.config.presets import Params
from gpt2dist.config.schema import PRECISIONS, ModelConfig, Preset, RunSpec
from gpt2dist.config.sizes import sized
from gpt2dist.config.strategies import check_run, degrees_of
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.layout import RESULTS_DIR, RUNS_DIR, added_round_file
from gpt2dist.pipeline.run import Run

@dataclass
class Study:
    params: Params  # the params.yaml it was planned from
    preset_name: str
    preset: Preset
    device: str
    runs: list[Run]
    dropped: dict[str, str] = field(default_factory=dict)  # config id -> why it does not fit the planned cluster
    gpus: int = 0  # per node, as planned (not necessarily visible where the plan is made)
    nodes: int = 1  # nodes the study may span, as planned
    labels: dict[str, str] = field(default_factory=dict)  # config id -> what the paper calls it

    def seed(self, run: Run) -> int:
        """Repeats differ in seed, so the loss carries its own spread; strategies of one repeat share it."""
        return self.preset.train.seed + run.repeat

    def model(self, size: str | None) -> ModelConfig:
        return model_of(self.preset, size)

    def processes(self, run: Run) -> int:
        """Processes (SLURM tasks) the run starts, by its degrees: dp drives every device from one."""
        return degrees_of(planned_spec(self.preset_name, self.preset, run, self.device)).processes

    @property
    def param_keys(self) -> dict[str, list[str]]:
        """Per section of the preset, the params.yaml keys its values come from."""
        return self.params.section_keys(self.preset_name)

    @property
    def sizes(self) -> list[str | None]:
        """The model sizes the study trains, in its order (None: the preset's model)."""
        return list(dict.fromkeys(run.size for run in self.runs))


def preset_sizes(preset: Preset) -> list[str | None]:
    """The model sizes a preset's runs name, in their order; [None] (its own model) where they name none."""
    return list(dict.fromkeys(size for group in preset.study.runs for size in group.sizes or [])) or [None]


def model_of(preset: Preset, size: str | None) -> ModelConfig:
    """The model a run of this size trains: the preset's, at that size where it has one."""
    return sized(preset.model, size, preset.study.model_sizes) if size else preset.model


def planned_spec(preset_name: str, preset: Preset, run: Run, device: str, *, weak_scaling: bool = False) -> RunSpec:
    """The run's spec as its training would read it (its model size included), for checks and predictions made
    before it exists. `weak_scaling`: each process at the preset's micro-batch, the global batch following the
    processes (a cluster the preset's batch was not sized for), instead of the preset's global batch."""
    train = preset.train
    if weak_scaling:
        train = train.model_copy(update={"global_batch_size": train.micro_batch_size * run.nproc})
    return RunSpec(data_dir="", out_dir="", preset=preset_name, strategy=run.strategy, precision=run.precision,
                   nproc=run.nproc, nodes=run.nodes, device=device, model=model_of(preset, run.size), size=run.size,
                   train=train)


def plan_study(params: Params, preset: str | None, gpus: int, nodes: int = 1, *, gpus_given: bool = True) -> Study:
    """Every run of the preset's study that `nodes` nodes of `gpus` GPUs each (0: CPU) can hold; runs that need
    more are dropped, saying why; impossible runs are errors. `gpus_given`: the user said the GPU count (False:
    it is what the planning host sees, which for a GPU study on a login node is not the nodes' count)."""
    name, chosen = params.preset(preset, cuda=gpus > 0)
    if gpus == 0 and chosen.study.needs_gpus and not gpus_given:
        raise UsageError(f"preset '{name}' is a study for GPU nodes and this host has none: say how many GPUs a node "
                         "has (snakemake --config gpus_per_node=8, the command's --gpus as in gpt2dist estimate --gpus 8, or "
                         "gpus_per_node in params.yaml; 0 plans it for CPUs on purpose)")
    device = "cuda" if gpus else "cpu"
    if len({bool(group.sizes) for group in chosen.study.runs}) > 1:
        raise UsageError(f"presets.{name}.study.runs: some groups name model sizes and some do not; give every group "
                         "its sizes (a study of sizes ranks each size on its own), or none")
    runs, dropped, labels = [], {}, {}
    for group in chosen.study.runs:
        if group.emulate and gpus:
            raise UsageError(f"presets.{name}.study.runs: emulated nodes (emulate: true) train on CPU; plan this "
                             "preset with gpus_per_node=0")
        links = group.link_mbit or [None]
        for size, strategy, precision, nproc, link in itertools.product(group.sizes or [None], group.strategies,
                                                                        group.precisions, group.nproc, links):
            config = Run(strategy, precision, nproc, 0, group.nodes, link, group.emulate, size).config_id
            if group.label:
                labels[config] = group.label
            if not group.emulate and group.nodes > nodes:
                dropped[config] = f"{group.nodes} nodes, the study may span {nodes}"
                continue
            if gpus and nproc // group.nodes > gpus:
                dropped[config] = f"{nproc // group.nodes} processes per node, a node has {gpus} GPUs"
                continue
            try:
                spec = planned_spec(name, chosen, Run(strategy, precision, nproc, 0, group.nodes, size=size), device)
                check_run(spec, gpus)
            except UsageError as exc:
                raise UsageError(f"presets.{name}.study.runs: {config}: {exc}") from None
            if gpus and chosen.study.gpu_memory_gb and (why := overflow(spec, chosen.study.gpu_memory_gb)):
                dropped[config] = why
                continue
            repeats = group.repeats or chosen.study.repeats
            runs.extend(Run(strategy, precision, nproc, r, group.nodes, link, group.emulate, size) for r in range(repeats))
    ids = [run.run_id for run in runs]
    if len(set(ids)) != len(ids):
        raise UsageError(f"presets.{name}.study.runs lists a configuration twice")
    if not runs:
        raise UsageError(f"no run of preset '{name}' fits {nodes} node(s) of {gpus} GPUs; dropped: "
                         f"{', '.join(dropped)}")
    # Round-major: every configuration's repeat 0, then every repeat 1, ... A slow period of the
    # machine then hits all configurations alike instead of all repeats of one.
    runs.sort(key=lambda run: run.repeat)
    return Study(params, name, chosen, device, runs, dropped, gpus, nodes, labels)


def dropped_warning(study: Study) -> str | None:
    """One line naming the configurations the planned cluster cannot hold, and why."""
    if not study.dropped:
        return None
    reasons = collections.defaultdict(list)
    for config, reason in study.dropped.items():
        reasons[reason].append(config)
    planned = len(configurations(study)) + len(study.dropped)
    return f"warning: {len(study.dropped)} of {planned} configurations dropped: " + "; ".join(
        f"{', '.join(configs)} ({reason})" for reason, configs in reasons.items())


def configurations(study: Study) -> list[Run]:
    """One run per configuration (its first repeat): what the selftest checks."""
    return [run for run in study.runs if run.repeat == 0]


def keeps_checkpoint(study: Study, run: Run) -> bool:
    """Whether `run` keeps its final checkpoint (study.keep_checkpoints): fastest, each configuration's first repeat
    (which configuration is fastest is known only once all have run); all, every run; none."""
    keep = study.preset.study.keep_checkpoints
    return keep == "all" or (keep == "fastest" and run.repeat == 0)


def study_precisions(study: Study) -> list[str]:
    """The precisions the study's runs train in, in the registry's order."""
    return sorted({run.precision for run in study.runs}, key=PRECISIONS.index)


def selftested(study: Study) -> list[Run]:
    """The configurations whose selftest job runs before their runs: all, unless the preset turns them off."""
    return configurations(study) if study.preset.study.selftests else []


def resume_cases(study: Study) -> list[Run]:
    """The configuration per strategy whose selftest also kills and resumes: fp32 where the study has
    it, at the fewest processes that still shard a checkpoint (2 or more where the study has them).
    Adding a larger process count to a study then leaves the choice, and every finished run, alone."""
    def preference(run: Run) -> tuple:
        return run.precision == "fp32", run.nproc >= 2, -run.nproc

    chosen: dict[str, Run] = {}
    for run in configurations(study):
        if preference(run) > preference(chosen.setdefault(run.strategy, run)):
            chosen[run.strategy] = run
    return list(chosen.values())


def pipeline_resume_cases(study: Study) -> list[Run]:
    """The resume cases the pipeline's selftests check: none when the study's runs cannot stop between two
    checkpoints (the only one at the last step, which the pipeline does not resume from: `--no-keep-checkpoint`, or
    moved into kept/), as an interrupted run then starts again and resuming is nothing the study does."""
    train = study.preset.train
    if train.checkpoint_interval >= train.max_steps and not train.checkpoint_minutes:
        return []
    return resume_cases(study)


def run_of(study: Study, run_id: str) -> Run:
    """A run of the study by its id: a planned one, or an added repeat of one of its configurations."""
    planned = next((run for run in study.runs if run.run_id == run_id), None)
    if planned is not None:
        return planned
    config, _, repeat = run_id.rpartition("-r")
    base = next((run for run in configurations(study) if run.config_id == config), None)
    if base is None or not repeat.isdigit():
        raise UsageError(f"'{run_id}' is no run of preset '{study.preset_name}' (nor an added repeat of one of its "
                         "configurations)")
    return replace(base, repeat=int(repeat))


def with_added_runs(study: Study, results: Path | str = RESULTS_DIR, upto: int | None = None) -> Study:
    """The study with the runs its added rounds decided so far (rounds 1 to `upto`, at most its own count),
    read from results/rounds/; the study itself when it adds none."""
    rounds = study.preset.study.added_repeats.rounds
    last = rounds if upto is None else min(rounds, upto)
    added: list[Run] = []
    for k in range(1, last + 1):
        path = Path(added_round_file(k, results))
        if not path.exists():
            break
        try:
            chosen = json.loads(path.read_text())["runs"]
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"{path} is damaged ({exc}); delete it and run the study again to decide that round "
                             "anew") from exc
        if not chosen:
            break
        added += [run_of(study, run_id) for run_id in chosen]
    return replace(study, runs=[*study.runs, *added]) if added else study


def unfinished_runs(study: Study, root: Path = Path(".")) -> list[str]:
    """Runs of the study whose record exists and says they did not complete (failed, stopped, or launched and
    never finished)."""
    unfinished = []
    for run in study.runs:
        record = root / RUNS_DIR / run.run_id / "run.json"
        try:
            if json.loads(record.read_text()).get("status") != "completed":
                unfinished.append(run.run_id)
        except (OSError, ValueError):  # none yet, or being written: nothing to retry
            continue
    return unfinished
