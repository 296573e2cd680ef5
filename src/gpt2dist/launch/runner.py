"""Plan and start one training run from the command line's choices: resolve the RunSpec,
check it, then train in this process or hand it to the strategy's launcher."""

from __future__ import annotations

import json
import logging
import os
import shlex
import shutil
import signal
import sys
from pathlib import Path

import torch

from gpt2dist.config import (
    LAUNCHERS,
    PRECISIONS,
    STRATEGIES,
    Preset,
    RunSpec,
    check_combination,
    choose_preset,
    write_spec,
)
from gpt2dist.errors import Interrupted, UsageError
from gpt2dist.io import atomic_write_json
from gpt2dist.launch import commands, emulated, lifetime, locks, slurm
from gpt2dist.logs import setup_logging
from gpt2dist.system.allocation import Allocation, job_allocation
from gpt2dist.system.conditions import LoadMonitor, wait_for_quiet
from gpt2dist.training import preflight
from gpt2dist.training.metrics import now_iso

log = logging.getLogger(__name__)


def chosen_preset(params: Path, preset: str | None, overrides: list[str]) -> tuple[str, Preset]:
    return choose_preset(params, preset, torch.cuda.is_available(), overrides)


def _choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise UsageError(f"unknown {option} '{value}' (allowed: {', '.join(allowed)})")
    return value


def build_spec(*, data: Path, out: Path, strategy: str, precision: str, nproc: int, params: Path,
               preset: str | None, overrides: list[str], check_devices: bool = True,
               device: str | None = None, keep_checkpoint: bool = True, stale_checkpoint: str = "fail") -> RunSpec:
    """The validated RunSpec; `device` defaults to what this machine has (cuda when visible)."""
    _choice(strategy, STRATEGIES, "--strategy")
    _choice(precision, PRECISIONS, "--precision")
    _choice(stale_checkpoint, ("fail", "restart"), "--stale-checkpoint")
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    name, chosen = choose_preset(params, preset, device == "cuda", overrides)
    spec = RunSpec(data_dir=str(Path(data).resolve()), out_dir=str(Path(out).resolve()), preset=name,
                   strategy=strategy, precision=precision, nproc=nproc, device=device, model=chosen.model,
                   train=chosen.train, keep_checkpoint=keep_checkpoint, stale_checkpoint=stale_checkpoint)
    preflight.check_dependencies(spec)  # "not installed" is the first thing to fix
    if check_devices:
        check_combination(spec, torch.cuda.device_count())
    return spec


def print_multinode(spec: RunSpec, hosts: list[commands.Host]) -> list[str]:
    """Write the spec and return the commands that start it on several machines."""
    out = Path(spec.out_dir)
    write_spec(spec, out / "spec.json")
    lines = commands.multinode_commands(LAUNCHERS[spec.strategy], hosts, out / "spec.json", run_id=out.name,
                                          cuda=spec.device == "cuda")
    return [f"# on {where}\n{command}" for where, command in lines.items()]


def start(spec: RunSpec, *, print_only: bool = False, emulation: emulated.Emulation | None = None) -> str | None:
    """Verify the data, then run (a failure raises). Returns the launcher command line, if one is used."""
    preflight.check_data(spec)
    out = Path(spec.out_dir)
    launcher = LAUNCHERS[spec.strategy]
    if emulation is not None:
        emulation.check(spec)
        command, allocation = None, None
        shown = f"{launcher} on {emulation.nodes} emulated nodes"
    else:
        # without srun (an image run by `snakemake --sdm apptainer` has no SLURM commands) the
        # ranks start on this node with its own launcher
        allocation = job_allocation() if shutil.which("srun") else None
        command = _command(spec, launcher, out, allocation)
        shown = " ".join(command) if command else f"(in this process) {spec.strategy}"
    if print_only:
        write_spec(spec, out / "spec.json")
        return shown
    setup_logging()
    # a selftest's checks measure nothing: they need not wait for the machine to calm down
    measured = not locks.held_by_parent()
    with locks.own_run_directory(out), locks.hold_the_machine():
        write_spec(spec, out / "spec.json")
        quiet_after_s = wait_for_quiet() if measured else 0.0
        started = now_iso()
        monitor = LoadMonitor(out / "spec.json")
        nodes_record = None
        try:
            with monitor:
                if emulation is not None:
                    log.info("starting the ranks: %s", shown)
                    code, stopped_by, nodes_record = emulated.run(spec, emulation)
                elif command is None:
                    _train_here(spec, started)
                    return None
                else:
                    log.info("starting the ranks: %s", shown)
                    several_nodes = allocation is not None and len(allocation.nodes) > 1
                    ranks_here = allocation.ranks_per_node if several_nodes else spec.nproc
                    code, stopped_by = lifetime.run_launchers([command], commands.launch_env(ranks_here))
        finally:  # whatever the outcome, the record says how busy the machine was meanwhile
            extra = {"emulated_nodes": nodes_record} if nodes_record else {}
            _add_to_record(out, started, conditions={**monitor.summary(), "waited_for_quiet_s": round(quiet_after_s, 1)},
                           launched_at=started,
                           command_line=shlex.join(sys.argv), launch_command=shown, **extra)
        if stopped_by is not None:
            _stop(out, stopped_by, started)
            return shown  # the signal came after the last step
        if code:
            _mark_failed(out, code, started)
            raise UsageError(f"training failed ({launcher} exited with {code}); the ranks' messages are above")
    return shown


def _add_to_record(out: Path, started: str, **fields) -> None:
    """Merge `fields` into this run's run.json (not a record left by an earlier run)."""
    record_path = out / "run.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    if record is not None and record["started_at"] >= started:
        atomic_write_json(record_path, record | fields)


def _train_here(spec: RunSpec, started: str) -> None:
    from gpt2dist.training import loop  # here: a launcher of other processes never loads the strategies

    lifetime.stop_on_signals()
    try:
        loop.run(spec)
    except Interrupted as stop:
        _stop(Path(spec.out_dir), stop.signum, started)
    except Exception:
        _mark_failed(Path(spec.out_dir), 1, started)
        raise


def _command(spec: RunSpec, launcher: str, out: Path, allocation: Allocation | None) -> list[str] | None:
    """srun inside a SLURM job that holds the ranks as tasks or nodes; else the local launcher."""
    if allocation is not None:
        # GPT2DIST_IMAGE: run every task inside this image (when the job itself runs on the host)
        command = slurm.launch_command(launcher, spec.nproc, allocation, out / "spec.json",
                                       image=os.environ.get("GPT2DIST_IMAGE"), run_id=out.name)
        if command is not None:
            return command
    return commands.local_command(launcher, spec.nproc, out / "spec.json", cuda=spec.device == "cuda")


def _stop(out: Path, signum: int, started: str) -> None:
    """End an interrupted run: run.json says so, with the signal this process got (ranks may have seen
    the SIGTERM their launcher turned it into, or been too blocked to write at all)."""
    name = signal.Signals(signum).name
    record_path = out / "run.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else None
    if record is None or record["started_at"] < started:  # no rank got as far as writing this run's record
        raise Interrupted(signum, f"interrupted by {name} before training started; re-run the same command")
    if record["status"] == "completed":
        return  # the signal came after the last step
    record.update(status="interrupted", signal=name, finished_at=record.get("finished_at") or now_iso())
    atomic_write_json(record_path, record)
    where = f" at step {record['interrupted_at_step']}" if "interrupted_at_step" in record else ""
    raise Interrupted(signum, f"interrupted by {name}{where}; re-run the same command to resume from step "
                              f"{record['checkpoint_step']}")


def _mark_failed(out: Path, code: int, started: str) -> None:
    _add_to_record(out, started, status="failed", exit_code=code)
