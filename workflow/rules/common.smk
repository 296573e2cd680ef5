# Helpers shared by the rules: the study this machine runs, from gpt2dist.pipeline.study (the same
# module dvc.yaml is generated from).
import re
import subprocess
import sys

from gpt2dist.pipeline import study as gs
from gpt2dist.errors import UsageError
from gpt2dist.system.hardware import visible_gpus

PARAMS = "params.yaml"
# Snakemake scales a job's threads down to --cores, so this asks for every core of the
# machine whatever --cores is (and needs no --cores for --report or --lint).
WHOLE_MACHINE = 1024

# Snakemake plans where it is started, often a login node without GPUs: the GPUs per node come
# from the user (`--config gpus_per_node=8`, or params.yaml), not from the planning host.
GPUS = visible_gpus() if config.get("gpus_per_node") is None else int(config["gpus_per_node"])
try:
    STUDY = gs.plan_study(PARAMS, config.get("preset"), GPUS)
except UsageError as exc:
    sys.exit(f"error: {exc}")
if STUDY.dropped:
    print(f"warning: more processes than the {GPUS} GPUs per node, dropped: {', '.join(STUDY.dropped)}",
          file=sys.stderr)
RUNS = {run.run_id: run for run in STUDY.runs}
CONFIGS = {run.config_id: run for run in gs.configurations(STUDY)}
OUTPUTS = gs.stage_outputs(STUDY)

