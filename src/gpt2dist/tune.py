"""`gpt2dist tune`: from prediction to measurement on the user's own machines. The planner predicts every split of the
cluster (forecast.shortlist), keeps those it cannot tell apart from its pick and the best of each method and shape,
and the tune measures them as a study of its own (pipeline.tune: the same rules, run records, containers and SLURM
profile as a study's), in rounds: the first runs every candidate's repeats interleaved, each later one repeats only
what the study's paired test has not yet placed beside the top (the study's added rounds), until one tier is left or
the budget is spent. Then the answer (results.tune): the measured tiers, each candidate's prediction beside its
measurement, and a calibration that `recommend --calibration` reads.

A budget bounds it all, from this command's start: the tune times what it needs here (single's step, on CPUs),
keeps as many candidates as one round of them fits, and gives its study's runs what is left after the fixed part
(Snakemake, the data, the decisions between rounds, collect, figures and report), which its added rounds then fit
into run by run (study.added_repeats.max_study_minutes)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gpt2dist.config.presets import load_params
from gpt2dist.config.strategies import REFERENCE
from gpt2dist.errors import UsageError
from gpt2dist.forecast.plan import GPU_LAUNCH_S
from gpt2dist.forecast.published import setup_columns
from gpt2dist.forecast.recommend import read_stored
from gpt2dist.forecast.shortlist import (Cluster, CpuBasis, Shortlist, cpu_bus_bandwidth, cpu_ratio_error,
                                         gpu_ratio_error, predicted, shortlist)
from gpt2dist.forecast.splits import splits_of
from gpt2dist.io import atomic_write_json
from gpt2dist.pipeline.duration import Calibration, minutes, write_estimate
from gpt2dist.pipeline.layout import (ESTIMATE_FILE, PARAMS_FILE, RESULTS_DIR, STORED_STUDIES, TUNE_CALIBRATION,
                                      TUNE_MEASURED, TUNE_PLAN, TUNE_SUMMARY)
from gpt2dist.pipeline.study import model_of, plan_study
from gpt2dist.pipeline.tune import TUNE_PRESET, Rounds, Window, tune_params, tune_preset, write_params

# The default budget: twice what the first round of the short list needs, with the fixed part, at most this
CPU_BUDGET_S = 600.0
GPU_BUDGET_S = 1800.0
# What a tune's Snakemake takes besides its runs, after the planning the tune times itself: its start and the data
# before the first run, collect, the figures, the report and the answer after the last, 15 to 30 s in two tunes on
# a 2-core AMD EPYC (the cpu preset on 2 processes, two-node-splits-cpu on 2 emulated nodes): rounded up
FIXED_S = 40.0
DECISION_S = 4.0  # an added round's decision (the runs so far collected and ranked), two of them reserved
BETWEEN_JOBS_S = 1.0  # Snakemake's own work between two jobs: 0.3 to 0.7 s in those two tunes


@dataclass(frozen=True)
class Request:
    """What the user asked: the preset's model (at `size`) in `precision` on `cluster`, within `budget_s` (None: sized
    for the machine), measured in `window`s, `repeats` of each candidate in the first round and at most `rounds`
    more, `halving` or not; `among`: the splits to weigh (None: every split)."""

    params: Path
    preset: str | None
    cluster: Cluster
    precision: str
    out: Path
    size: str | None = None
    budget_s: float | None = None
    among: list[str] | None = None
    window: Window = Window(2, 5)
    repeats: int = 3
    rounds: int = 10
    halving: bool = True
    resolve: float | None = None
    studies: list[Path] | None = None  # stored studies the CPU step model's error is measured on
    profile: Path | None = None  # a Snakemake profile (the SLURM one)
    replace: bool = False
    dry_run: bool = False


@dataclass
class Plan:
    """The tune as planned before its first run: what tune.json holds."""

    base: str
    shortlist: Shortlist
    candidates: list[str]
    run_s: dict[str, float]
    budget_s: float
    fixed_s: float
    study_minutes: float
    started_at: float
    trained: dict  # the model and batch every split trains, in the published table's columns (setup_columns)
    basis: CpuBasis | None = None
    launch_s: float = GPU_LAUNCH_S
    left_for_budget: list[str] = field(default_factory=list)


def tune(request: Request, say: Callable[[str], None]) -> dict:
    """Plan the tune, say what it measures and what not, run its study, and write its answer; the plan alone with
    `dry_run`. Returns what tune.json holds at the end."""
    started = time.time()
    plan = planned(request, say, started)
    record = plan_record(request, plan)
    atomic_write_json(request.out / RESULTS_DIR / TUNE_PLAN, record)
    for line in plan_words(request, plan):
        say(line)
    if request.dry_run:
        say(f"dry run: nothing measured; the tune's study is planned in {request.out} (its params.yaml)")
        return record
    run_study(request)
    record |= {"finished_at_unix_s": time.time(), "wall_s": time.time() - started}
    atomic_write_json(request.out / RESULTS_DIR / TUNE_PLAN, record)
    from gpt2dist.results.tune import write_answer  # pandas and scipy once the runs are done

    answer = write_answer(request.out / RESULTS_DIR, request.out / TUNE_SUMMARY, request.out / TUNE_CALIBRATION,
                          request.out / TUNE_MEASURED)
    for line in answer:
        say(line)
    return record


def planned(request: Request, say: Callable[[str], None], started: float) -> Plan:
    """The short list, the budget and the tune's study written into request.out (its params.yaml)."""
    params = load_params(request.params)
    cluster = request.cluster
    base, chosen = params.preset(request.preset, cuda=cluster.device == "cuda")
    fresh_directory(request.out, request.replace)
    group = {"precisions": [request.precision], "sizes": [request.size] if request.size else []}
    placement = {"nproc": [cluster.nproc], "nodes": cluster.nodes, "emulate": cluster.emulated,
                 "link_mbit": [cluster.link_mbit] if cluster.link_mbit else []}
    # On GPUs every GPU at the preset's micro-batch, the global batch following them, as recommend predicts them
    train = {"global_batch_size": chosen.train.micro_batch_size * cluster.nproc} if cluster.device == "cuda" else {}
    workdir = Path.cwd()

    def write(candidates: list[str], where: dict, study_minutes: float) -> Path:
        rounds = Rounds(request.repeats, request.rounds, study_minutes, request.halving, request.resolve)
        preset = tune_preset(base, candidates, group | where, request.window, rounds, train)
        return write_params(tune_params(params, base, preset, cluster.gpus_per_node, cluster.nodes, workdir),
                            request.out / PARAMS_FILE)

    # first single alone: to time it here (on CPUs), and to price every split as the tune will run it
    single = load_params(write([REFERENCE], {"nproc": [1]}, 1.0))
    _, tuned = single.preset(TUNE_PRESET)
    basis, launch_s, ratio_error, timed = None, GPU_LAUNCH_S, gpu_ratio_error(), None
    if cluster.device == "cpu":
        from gpt2dist.selftest import calibrate  # torch, in its own process

        say(f"tune: timing single's step of preset {base}'s model here ({request.precision}, one process)...")
        window = request.window  # single timed as the runs will be: its median after their warm-up
        timed = calibrate(plan_study(single, TUNE_PRESET, 0), steps=window.warmup + window.measured,
                          warmup=window.warmup)
        stored = stored_studies(request)
        busbw, said = cpu_bus_bandwidth(stored, cluster.nproc)
        basis, launch_s = CpuBasis(timed.step_s[request.precision], busbw, said), timed.launch_s
        ratio_error = cpu_ratio_error(stored)[0]
    table = predicted(TUNE_PRESET, tuned, cluster, request.precision, request.size, basis,
                      named=request.among or [], unavailable=lacking(request, tuned))
    listed = shortlist(table, ratio_error, request.among)
    # on CPUs each rank starts on the shared cores, as pipeline.duration.launch_seconds counts it
    launch = launch_s * cluster.nproc if cluster.device == "cpu" else launch_s
    run_s = {name: launch + request.window.steps * listed.predicted_step_s(name) for name in listed.candidates}
    fixed = FIXED_S + 2 * DECISION_S

    budget = request.budget_s or min(CPU_BUDGET_S if cluster.device == "cpu" else GPU_BUDGET_S,
                                     fixed + 2 * first_round(listed.candidates, run_s, request.repeats))
    spent = time.time() - started
    candidates = within_budget(listed.candidates, run_s, request.repeats, budget - spent - fixed)
    if not candidates:
        need = spent + fixed + first_round(listed.candidates[:2], run_s, request.repeats)
        raise UsageError(f"--budget {budget:g}s: the first round of {' and '.join(listed.candidates[:2])} alone takes "
                         f"about {need:,.0f} s here ({request.repeats} runs each, {minutes(fixed)} besides the runs, "
                         f"{minutes(spent)} spent planning); give --budget {need * 1.5:,.0f}s or more")
    study_minutes = (budget - spent - fixed) / 60
    study = plan_study(load_params(write(candidates, placement, study_minutes)), TUNE_PRESET, cluster.gpus_per_node,
                       cluster.nodes)
    # the study's estimate, candidate by candidate, which each run's progress line scales (its start times nothing)
    calibration = timed if basis else Calibration({request.precision: listed.predicted_step_s(listed.pick)}, launch_s)
    write_estimate(study, calibration, 0, request.out / ESTIMATE_FILE,
                   seconds={cluster.run(name, request.precision, request.size).config_id: run_s[name]
                            for name in candidates})
    return Plan(base, listed, candidates, {name: run_s[name] for name in candidates}, budget, fixed, study_minutes,
                started, setup_columns(model_of(tuned, request.size), tuned.train), basis, launch_s,
                [name for name in listed.candidates if name not in candidates])


def first_round(candidates: list[str], run_s: dict[str, float], repeats: int) -> float:
    """Seconds the first round of `candidates` takes: each run `repeats` times, Snakemake's work between them."""
    return sum(repeats * (run_s[name] + BETWEEN_JOBS_S) for name in candidates)


def within_budget(candidates: list[str], run_s: dict[str, float], repeats: int, room_s: float) -> list[str]:
    """The most wanted candidates (the first of `candidates`) whose first round fits `room_s`, at least two (one
    where only one is wanted); none where even those do not fit."""
    kept = list(candidates)
    while len(kept) > 2 and first_round(kept, run_s, repeats) > room_s:
        kept.pop()
    return kept if first_round(kept, run_s, repeats) <= room_s else []


def stored_studies(request: Request) -> list:
    """The stored studies whose runs measure the CPU step model's error: --study, else docs/reference's."""
    directories = request.studies or sorted(path.parent / path.name.removesuffix(".tar.gz") for path in
                                            (request.params.parent / STORED_STUDIES).glob("*.tar.gz"))
    if not directories:
        raise UsageError(f"no stored study beside {request.params} ({STORED_STUDIES}) to measure the CPU step model's "
                         "error on: pass --study <a collected CPU study's results directory>")
    return read_stored(directories)


def lacking(request: Request, preset) -> dict[str, str]:
    """What this host lacks of what each split needs (Horovod, Apex), as the reason it cannot run; not its torch
    build, which a GPU tune planned on a cluster's login node need not share with the nodes (`gpt2dist doctor` on a
    node says)."""
    from gpt2dist.system.doctor import Found  # imports Horovod where it is installed

    cluster, found = request.cluster, Found()
    names = [*(request.among or []), *splits_of(cluster.nproc, cluster.per_node, preset.model, preset.train)]
    gaps = {name: found.missing(name, request.precision, cluster.device, torch_build=False)
            for name in dict.fromkeys(names)}
    return {name: "needs " + "; ".join(f"{what} ({fix})" for what, fix in lacks) + ", which this host lacks"
            for name, lacks in gaps.items() if lacks}


def fresh_directory(out: Path, replace: bool) -> None:
    """The tune's directory, empty: a previous tune's is replaced only when asked."""
    if out.exists() and any(out.iterdir()):
        if not replace:
            raise UsageError(f"{out} holds a previous tune (or other files); give --replace to delete it and tune "
                             "again, or --out another directory")
        if not (out / PARAMS_FILE).exists() and not (out / RESULTS_DIR / TUNE_PLAN).exists():
            raise UsageError(f"{out} holds files that gpt2dist tune did not write; choose another --out")
        shutil.rmtree(out)
    (out / RESULTS_DIR).mkdir(parents=True, exist_ok=True)


def plan_record(request: Request, plan: Plan) -> dict:
    """tune.json: what was asked, the cluster, every split's prediction, the short list and why, the budget."""
    listed = plan.shortlist
    table = listed.table.astype(object).where(listed.table.notna(), None)
    return {
        "made_by": "gpt2dist tune", "preset": plan.base, "size": request.size, "precision": request.precision,
        "cluster": request.cluster.as_dict(),
        "window": {"warmup": request.window.warmup, "measured": request.window.measured,
                   "traced": request.window.traced},
        "repeats": request.repeats, "rounds": request.rounds, "halving": request.halving,
        "basis": None if plan.basis is None else vars(plan.basis), "launch_s": plan.launch_s,
        "ratio_error": listed.ratio_error, "model": "the CPU step model" if plan.basis else "the GPU step model",
        "trained": plan.trained, "pick": listed.pick, "candidates": plan.candidates,
        "kept_because": {name: listed.kept_because[name] for name in plan.candidates},
        "left_for_budget": plan.left_for_budget, "ruled_out": listed.ruled_out,
        "splits": table.to_dict("records"), "run_s": plan.run_s,
        "budget_s": plan.budget_s, "fixed_s": plan.fixed_s, "study_minutes": plan.study_minutes,
        "started_at_unix_s": plan.started_at,
        "started_at": datetime.fromtimestamp(plan.started_at, timezone.utc).isoformat(timespec="seconds"),
    }


def plan_words(request: Request, plan: Plan) -> list[str]:
    """What the tune says before its first run: where and what, the model's error, the candidates and why, what it
    rules out and why, and the estimate within the budget."""
    listed, cluster = plan.shortlist, request.cluster
    model = (f"the CPU step model (single's step timed here, {plan.basis.single_step_s * 1e3:,.1f} ms, shared by the "
             f"processes on the cores; their collectives at {plan.basis.busbw_gb_s:.2g} GB/s, {plan.basis.busbw_from}"
             + ("; across the emulated link, the bytes that cross it at its rate" if cluster.emulated else "") + ")"
             if plan.basis else f"the GPU step model on the {cluster.gpu}")
    lines = [f"tune: {cluster.words()}, preset {plan.base}'s model" + (f" at {request.size}" if request.size else "")
             + f" in {request.precision}; predicted by {model}, which cannot tell two splits apart within "
             f"{listed.ratio_error:.0%} (its error on the ratio of two runs)."]
    lines.append(f"Measuring {len(plan.candidates)} of the {len(listed.table)} splits:")
    lines += [f"  {name}: predicted {listed.predicted_step_s(name) * 1e3:,.1f} ms a step; {listed.kept_because[name]}"
              for name in plan.candidates]
    ruled = {**{name: f"left out for the budget ({listed.kept_because[name]}); a larger --budget measures it"
                for name in plan.left_for_budget}, **listed.ruled_out}
    if ruled:
        lines.append("Ruled out without running:")
        lines += [f"  {name}: {why}" for name, why in ruled.items()]
    first = first_round(plan.candidates, plan.run_s, request.repeats)
    lines.append(f"Estimate: round 1 is {request.repeats * len(plan.candidates)} runs ({len(plan.candidates)} "
                 f"candidates x {request.repeats} repeats, interleaved), about {minutes(first)} here; with "
                 f"{minutes(plan.fixed_s)} besides the runs, the budget of {minutes(plan.budget_s)} leaves about "
                 f"{minutes(max(0.0, plan.study_minutes * 60 - first))} for rounds that repeat the undecided "
                 + ("(each beside the top)." if request.halving else "(every candidate each round: no halving)."))
    return lines


def run_study(request: Request) -> None:
    """The tune's study under Snakemake in its own directory, with the repository's Snakefile and rules (and a
    profile where given); its jobs' output is this command's."""
    snakefile = request.params.resolve().parent / "Snakefile"
    if not snakefile.is_file():
        raise UsageError(f"no Snakefile beside {request.params}: run gpt2dist tune in the gpt2dist repository (where "
                         "params.yaml and the Snakefile are)")
    bin_dir = Path(sys.executable).parent
    snakemake = shutil.which("snakemake", path=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}") or "snakemake"
    command = [snakemake, "--snakefile", str(snakefile), "--directory", str(request.out), "--quiet", "rules",
               "progress", "host"]  # its errors still said
    command += ["--profile", str(request.profile.resolve())] if request.profile else ["--cores", "all"]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    sys.stdout.flush()  # what the tune said comes before what its jobs say
    done = subprocess.run(command, env=env)
    if done.returncode:
        raise UsageError(f"the tune's Snakemake run ended with status {done.returncode} (its output above; its logs "
                         f"in {request.out / 'logs'}); gpt2dist tune --replace starts it again")

