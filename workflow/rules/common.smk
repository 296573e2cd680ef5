# Helpers shared by the rules: the study this machine runs (gpt2dist.pipeline.study), its jobs' commands
# (pipeline.jobs) and its files (pipeline.layout), the same modules dvc.yaml is generated from.
import re
import shlex
import subprocess
import sys
from pathlib import Path

from snakemake.settings.types import DeploymentMethod

from gpt2dist.pipeline import jobs, layout
from gpt2dist.pipeline import study as gs
from gpt2dist.config.planning import planned_nodes
from gpt2dist.config.presets import load_params
from gpt2dist.errors import UsageError
from gpt2dist.system.hardware import visible_gpus

PARAMS = "params.yaml"
TRAIN_RETRIES = 1  # a train job whose run failed is tried once more in the same call (train.smk)
# Snakemake scales a job's threads down to --cores, so this asks for every core of the
# machine whatever --cores is (and needs no --cores for --report or --lint).
WHOLE_MACHINE = 1024

# Snakemake plans where it is started, often a login node without GPUs: the GPUs per node and the
# nodes a study may span come from the user (`--config gpus_per_node=8 nodes=2`, or params.yaml), not
# from the planning host.
GPUS = visible_gpus() if config.get("gpus_per_node") is None else int(config["gpus_per_node"])
try:
    params = load_params(PARAMS)
    STUDY = gs.plan_study(params, config.get("preset"), GPUS, planned_nodes(params, config.get("nodes")),
                          gpus_given=config.get("gpus_per_node") is not None)
except UsageError as exc:
    sys.exit(f"error: {exc}")
if STUDY.dropped:
    print(gs.dropped_warning(STUDY), file=sys.stderr)
RUNS = {run.run_id: run for run in STUDY.runs}
# Runs whose last attempt failed (or was stopped) left a record saying so: mark them to be trained again.
for run_id in gs.unfinished_runs(STUDY):
    Path(layout.retry_marker(run_id)).touch()
CONFIGS = {run.config_id: run for run in gs.configurations(STUDY)}
OUTPUTS = jobs.stage_outputs(STUDY)
RUN_OUTPUTS = layout.run_outputs("{run}")  # a train job's declared files, its run id the wildcard


# Runs across a cluster's nodes (rule train_across_nodes in train.smk)
ACROSS_NODES = [run_id for run_id, run in RUNS.items() if run.nodes > 1 and not run.emulated]


def run_pattern(across_nodes):
    """The run ids one of the two train rules takes (its planned ones, and the added repeats of their
    configurations; ADDED is added.smk's)."""
    planned = [re.escape(run_id) for run_id in RUNS if (run_id in ACROSS_NODES) == across_nodes]
    added = [re.escape(config) + r"-r\d+" for config, run in CONFIGS.items()
             if (run.nodes > 1 and not run.emulated) == across_nodes] if ADDED.rounds else []
    return "|".join(planned + added) or "(?!)"  # (?!): matches nothing when there are none


def slurm_resources(run_of):
    """A job's SLURM resources (jobs.slurm_request), one callable per key; `run_of(wildcards)` is its run."""
    return {key: (lambda wildcards, key=key: jobs.slurm_request(STUDY, run_of(wildcards))[key])
            for key in ("nodes", "tasks", "tasks_per_node", "mpi", "gres")}
