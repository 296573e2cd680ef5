"""Plan and start one training run from the command line's choices: resolve the RunSpec, check it,
then run its ranks in one of four ways (in this process, a local launcher, emulated nodes, or srun in a
SLURM job), and write the run's record (run.json), whose one writer this process is."""

from __future__ import annotations

import logging
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from gpt2dist.config.presets import Params
from gpt2dist.config.schema import PRECISIONS, RunSpec, write_spec
from gpt2dist.config.split import refuse_unread_settings
from gpt2dist.config.strategies import check_run, describe
from gpt2dist.errors import Interrupted, UsageError, failure_line
from gpt2dist.io import file_kind
from gpt2dist.launch import commands, emulated, lifetime, locks, slurm
from gpt2dist.logs import setup_logging
from gpt2dist.pipeline.layout import SLURM_PROFILE
from gpt2dist.system.allocation import Allocation, job_allocation
from gpt2dist.system.conditions import LoadMonitor, wait_for_quiet
from gpt2dist.system.hardware import cuda_gpus
from gpt2dist.training import preflight
from gpt2dist.training.run_record import (
    CHECKPOINT,
    Outcome,
    final_checkpoint,
    finish_record,
    new_attempt,
    now_iso,
    start_record,
)

log = logging.getLogger(__name__)


def _choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise UsageError(f"unknown {option} '{value}' (allowed: {', '.join(allowed)})")
    return value


def build_spec(*, data: Path, out: Path, strategy: str, precision: str, nproc: int, params: Params,
               preset: str | None, overrides: list[str], node_gpus: int | None = None, nodes: int = 1,
               device: str | None = None, keep_checkpoint: bool = True, final_checkpoint_in_kept: bool = False,
               stale_checkpoint: str = "fail",
               resume_from: Path | None = None, size: str | None = None, init_from: Path | None = None) -> RunSpec:
    """The validated RunSpec; `device` defaults to what this machine has (cuda when visible), and the run is checked
    against this machine's GPUs, or `node_gpus` per node where it is meant for other machines (--hosts). `size`: the
    preset's model at that size (config.sizes). `init_from`: a transformers GPT-2 directory to start from, checked
    against the model here, before any rank starts."""
    split = describe(strategy).split
    _choice(precision, PRECISIONS, "--precision")
    refuse_unread_settings(split, {override.partition("=")[0].strip() for override in overrides})
    if size is not None and not size.strip():
        raise UsageError("--size '': name a model size (GPT-2's small, medium, large or xl, or one of the preset's "
                         "study.model_sizes), or leave --size out for the preset's own model")
    _choice(stale_checkpoint, ("fail", "restart"), "--stale-checkpoint")
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    if nodes < 1:
        raise UsageError(f"--nodes must be at least 1, got {nodes}")
    if resume_from is not None:
        resume_from = Path(resume_from).resolve()
        resume_from = final_checkpoint(resume_from) if resume_from.is_dir() else resume_from
        kind = file_kind(resume_from)
        if kind != "a torch checkpoint":
            what = "no checkpoint" if kind == "missing" else f"{kind}, not a checkpoint"
            raise UsageError(f"--resume-from {resume_from} is {what}: name another run's checkpoint.pt or its "
                             "directory (a run keeps it unless trained with --no-keep-checkpoint)")
    own = Path(out) / CHECKPOINT  # what a re-run resumes from: refused now, before anything is written
    if own.exists() and (kind := file_kind(own)) != "a torch checkpoint":
        raise UsageError(f"{own} is {kind}, not a checkpoint (a damaged save, or a file put there by hand); delete "
                         "it to start afresh, or use another --out")
    here = device is None  # on this machine, with what it has
    gpus = cuda_gpus()
    device = device or ("cuda" if gpus else "cpu")
    name, chosen = params.preset(preset, cuda=device == "cuda", overrides=overrides, size=size)
    if here and device == "cpu" and chosen.study.needs_gpus:
        raise UsageError(f"preset '{name}' is a study for GPU nodes and this machine has no CUDA GPU; train it on a "
                         "GPU node (print its commands for other machines with --hosts and --gpus), or choose a CPU "
                         "preset such as cpu")
    init = None
    if init_from is not None:
        from gpt2dist.training.hf_format import read_source  # loads torch: only a run started from weights pays it

        init = read_source(init_from, chosen.model)
    spec = RunSpec(data_dir=str(Path(data).resolve()), out_dir=str(Path(out).resolve()), preset=name,
                   strategy=strategy, precision=precision, nproc=nproc, nodes=nodes, device=device, model=chosen.model,
                   size=size, train=chosen.train, keep_checkpoint=keep_checkpoint,
                   final_checkpoint_in_kept=final_checkpoint_in_kept, stale_checkpoint=stale_checkpoint,
                   resume_from=str(resume_from) if resume_from else None, init_from=init)
    preflight.check_dependencies(spec)  # "not installed" is the first thing to fix
    check_run(spec, gpus if node_gpus is None else node_gpus)
    return spec


def print_multinode(spec: RunSpec, hosts: list[commands.Host]) -> list[str]:
    """Write the spec and return the commands that start it on several machines."""
    out = Path(spec.out_dir)
    write_spec(spec, out / "spec.json")
    lines = commands.multinode_commands(describe(spec.strategy).launcher, hosts, out / "spec.json", run_id=out.name)
    return [f"# on {where}\n{command}" for where, command in lines.items()]


Launch = Callable[[RunSpec], Outcome]


def start(spec: RunSpec, *, print_only: bool = False, emulation: emulated.Emulation | None = None) -> str | None:
    """Verify the data, then run (a failure raises). Returns the launcher command line, if one is used."""
    # the interpreter's start and the imports so far: part of what a run costs, which the study's estimate counts
    startup_s = time.time() - psutil.Process().create_time()
    preflight.check_data(spec)
    out = Path(spec.out_dir)
    launch, shown = _launch_mode(spec, emulation)
    if print_only:
        write_spec(spec, out / "spec.json")
        return shown
    setup_logging()
    # a selftest's checks measure nothing: they need not wait for the machine to calm down
    measured = not locks.held_by_parent()
    with locks.own_run_directory(out), locks.hold_the_machine():
        spec = spec.model_copy(update={"attempt": new_attempt()})
        write_spec(spec, out / "spec.json")
        quiet_after_s = wait_for_quiet() if measured else 0.0
        launched_at = now_iso()
        start_record(spec, launched_at=launched_at, command_line=shlex.join(sys.argv), launch_command=shown)
        monitor = LoadMonitor(None if launch is _in_process else out / "spec.json")
        outcome = Outcome(exit_code=1)  # what an exception out of the launch leaves in the record
        try:
            with monitor:
                if launch is not _in_process:
                    log.info("starting the ranks: %s", shown)
                outcome = launch(spec)
        except Exception as exc:  # in this process (single, dp): the record keeps what went wrong
            outcome = Outcome(exit_code=1, facts={"error": failure_line(f"{type(exc).__name__}: {exc}")})
            raise
        finally:  # whatever the outcome, the record says how busy the machine was meanwhile
            locks.ranks_gone(out, lifetime.GRACE_S)  # their report first (then the record says what it says)
            shutil.rmtree(out / commands.TORCHRUN_LOGS, ignore_errors=True)  # a killed launch's too, at the next
            record = finish_record(spec, outcome, launched_at=launched_at, command_line=shlex.join(sys.argv),
                                   launch_command=shown, conditions={**monitor.summary(),
                                                                     "waited_for_quiet_s": round(quiet_after_s, 1),
                                                                     "startup_s": round(startup_s, 2)})
    if record["status"] == "interrupted":
        where = (f" at step {record['interrupted_at_step']}" if "interrupted_at_step" in record
                 else "" if "started_at" in record else " before training started")
        resume = (f"re-run the same command to resume from step {record['checkpoint_step']}"
                  if "checkpoint_step" in record else "re-run the same command")
        raise Interrupted(outcome.stopped_by, f"interrupted by {record['signal']}{where}; {resume}")
    if record["status"] == "failed":
        where = f" at step {record['failed_at_step']}" if "failed_at_step" in record else ""
        raise UsageError(f"training failed{where} ({describe(spec.strategy).launcher} exited with "
                         f"{outcome.exit_code}); the ranks' messages are above")
    return None if launch is _in_process else shown


def _launch_mode(spec: RunSpec, emulation: emulated.Emulation | None) -> tuple[Launch, str]:
    """How this run's ranks start, and the line that says so."""
    launcher = describe(spec.strategy).launcher
    out = Path(spec.out_dir)
    if emulation is not None:
        emulation.check(spec)
        return (lambda s: _on_emulated_nodes(s, emulation)), f"{launcher} on {emulation.nodes} emulated nodes"
    # without srun (an image run by `snakemake --sdm apptainer` has no SLURM commands) the
    # ranks start on this node with its own launcher
    allocation = job_allocation() if shutil.which("srun") else None
    if spec.nodes > 1 and (allocation is None or len(allocation.nodes) != spec.nodes):
        held = f"this SLURM job holds {len(allocation.nodes)}" if allocation else "this is not a SLURM job"
        raise UsageError(f"--nodes {spec.nodes}: the run spans {spec.nodes} nodes but {held}; start it inside an "
                         f"allocation of {spec.nodes} nodes (sbatch --nodes={spec.nodes}, or snakemake --profile "
                         f"{SLURM_PROFILE}), or print each node's command with --hosts")
    if allocation is not None:
        horovod = slurm.detect_horovod_launch() if launcher == "horovodrun" and spec.nodes > 1 else None
        # GPT2DIST_IMAGE: run every task inside this image (when the job itself runs on the host)
        command = slurm.launch_command(launcher, spec.nproc, allocation, out / "spec.json",
                                       container=slurm.container_from_env(), run_id=out.name, horovod=horovod)
        if command is not None:
            facts = {"nodes": allocation.nodes, "ranks_per_node": allocation.ranks_per_node,
                     **({"horovod_launch": horovod.via, "horovod_launch_why": horovod.why} if horovod else {})}
            return (lambda s: _with_srun(s, command, allocation, facts)), " ".join(command)
    command = commands.local_command(launcher, spec.nproc, out / "spec.json", spec.device)
    if command is None:
        return _in_process, f"(in this process) {spec.strategy}"
    return (lambda s: _with_local_launcher(s, command)), " ".join(command)


def _in_process(spec: RunSpec) -> Outcome:
    """single and dp: this process is the one rank."""
    with lifetime.importing_without_collection():  # here: a launcher of other processes never loads them
        import torch._dynamo  # noqa: F401  (torch's optimizers import it at their first step)

        from gpt2dist.training import loop

    lifetime.stop_on_signals()
    try:
        loop.run(spec)
    except Interrupted as stop:
        return Outcome(stopped_by=stop.signum)
    return Outcome()


def _with_local_launcher(spec: RunSpec, command: list[str]) -> Outcome:
    """torchrun or horovodrun on this machine."""
    code, stopped_by, error = lifetime.run_launchers([command], commands.launch_env(spec.nproc))
    return Outcome(code, stopped_by, {"error": error} if error else {})


def _with_srun(spec: RunSpec, command: list[str], allocation: Allocation, facts: dict) -> Outcome:
    """srun (or horovodrun over ssh) inside a SLURM job that holds the ranks as tasks or nodes."""
    ranks_here = allocation.ranks_per_node if len(allocation.nodes) > 1 else spec.nproc
    code, stopped_by, error = lifetime.run_launchers([command], commands.launch_env(ranks_here))
    return Outcome(code, stopped_by, {"slurm_launch": facts, **({"error": error} if error else {})})


def _on_emulated_nodes(spec: RunSpec, emulation: emulated.Emulation) -> Outcome:
    """The multi-node commands on nodes emulated on this machine."""
    code, stopped_by, nodes, error = emulated.run(spec, emulation)
    return Outcome(code, stopped_by, {"emulated_nodes": nodes, **({"error": error} if error else {})})
