# Helpers shared by the rules: the study this machine runs, from gpt2dist.pipeline.study (the same
# module dvc.yaml is generated from).
import re
import sys

from gpt2dist.pipeline import study as gs
from gpt2dist.errors import UsageError
from gpt2dist.system.hardware import visible_gpus

PARAMS = "params.yaml"
# Snakemake scales a job's threads down to --cores, so this asks for every core of the
# machine whatever --cores is (and needs no --cores for --report or --lint).
WHOLE_MACHINE = 1024

try:
    STUDY = gs.plan_study(PARAMS, None, visible_gpus())
except UsageError as exc:
    sys.exit(f"error: {exc}")
if STUDY.dropped:
    print(f"warning: more processes than the {visible_gpus()} visible GPUs, dropped: "
          f"{', '.join(STUDY.dropped)}", file=sys.stderr)
RUNS = {run.run_id: run for run in STUDY.runs}
OUTPUTS = gs.stage_outputs(STUDY)

