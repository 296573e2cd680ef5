"""The `gpt2dist` command: one subcommand per pipeline stage. Thin: parse, call, exit code."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer

from gpt2dist import launch, preflight, train as training
from gpt2dist.strategies import REGISTRY
from gpt2dist.config import (
    PRECISIONS,
    STRATEGIES,
    RunSpec,
    check_combination,
    load_preset,
    read_params,
    resolve_preset_name,
    write_spec,
)
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_write_json
from gpt2dist.logs import setup_logging

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


@app.callback()
def main() -> None:
    """Which data-parallel strategy trains GPT-2 fastest on this hardware, measured reproducibly."""


def _choice(value: str, allowed: tuple[str, ...], option: str) -> str:
    if value not in allowed:
        raise UsageError(f"unknown {option} '{value}' (allowed: {', '.join(allowed)})")
    return value


def build_spec(*, data: Path, out: Path, strategy: str, precision: str, nproc: int, params: Path,
               preset: str | None, overrides: list[str], check_devices: bool = True) -> RunSpec:
    _choice(strategy, STRATEGIES, "--strategy")
    _choice(precision, PRECISIONS, "--precision")
    cuda = torch.cuda.is_available()
    name = resolve_preset_name(read_params(params), preset, cuda)
    chosen = load_preset(params, name, overrides)
    if nproc < 1:
        raise UsageError(f"--nproc must be at least 1, got {nproc}")
    spec = RunSpec(data_dir=str(data.resolve()), out_dir=str(out.resolve()), preset=name, strategy=strategy,
                   precision=precision, nproc=nproc, device="cuda" if cuda else "cpu",
                   model=chosen.model, train=chosen.train)
    preflight.check_dependencies(spec)  # "not installed" is the first thing to fix
    if check_devices:
        check_combination(spec, torch.cuda.device_count())
    return spec


def _mark_failed(out: Path, code: int) -> None:
    record_path = out / "run.json"
    if record_path.exists():
        record = json.loads(record_path.read_text())
        record.update(status="failed", exit_code=code)
        atomic_write_json(record_path, record)


@app.command()
def train(
    data: Annotated[Path, typer.Option(help="Token shard directory (train.bin, val.bin, meta.json).")],
    strategy: Annotated[str, typer.Option(help="single | dp | ddp | horovod | fsdp")],
    out: Annotated[Path, typer.Option(help="Run directory: metrics.jsonl, run.json, checkpoint.pt.")],
    precision: Annotated[str, typer.Option(help="fp32 | fp16 | bf16 | apex-O1 | apex-O2")] = "fp32",
    nproc: Annotated[int, typer.Option(help="Processes (devices for dp) on this machine.")] = 1,
    params: Annotated[Path, typer.Option(help="Parameter file.")] = Path("params.yaml"),
    preset: Annotated[Optional[str], typer.Option(help="Preset name; default: params.yaml's 'preset'.")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", help="Override a preset key: model.n_layer=2.")] = None,
    max_steps: Annotated[Optional[int], typer.Option(help="Shorthand for --set train.max_steps=K.")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Shorthand for --set train.seed=S.")] = None,
    hosts: Annotated[Optional[str], typer.Option(help="HOST:SLOTS,... : print the multi-node commands.")] = None,
    print_command: Annotated[bool, typer.Option(help="Print the launcher command instead of running it.")] = False,
) -> None:
    """Train GPT-2 with one strategy; re-running the same command resumes from the last checkpoint."""
    overrides = list(set_ or [])
    if max_steps is not None:
        overrides.append(f"train.max_steps={max_steps}")
    if seed is not None:
        overrides.append(f"train.seed={seed}")
    try:
        code = _train(data, out, strategy, precision, nproc, params, preset, overrides, hosts, print_command)
    except UsageError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    raise typer.Exit(code)


def _train(data, out, strategy, precision, nproc, params, preset, overrides, hosts, print_command) -> int:
    host_list = launch.parse_hosts(hosts) if hosts else None
    world = sum(h.slots for h in host_list) if host_list else nproc
    spec = build_spec(data=data, out=out, strategy=strategy, precision=precision, nproc=world, params=params,
                      preset=preset, overrides=overrides, check_devices=host_list is None)
    launcher = REGISTRY[spec.strategy].launcher
    spec_path = out / "spec.json"
    if host_list:
        write_spec(spec, spec_path)
        for where, command in launch.multinode_commands(launcher, host_list, spec_path, run_id=out.name).items():
            typer.echo(f"# on {where}\n{command}")
        return 0
    preflight.check_data(spec)
    write_spec(spec, spec_path)
    command = launch.local_command(launcher, spec.nproc, spec_path, cuda=spec.device == "cuda")
    if print_command:
        typer.echo(" ".join(command) if command else f"(in-process) gpt2dist train --strategy {strategy}")
        return 0
    setup_logging()
    if command is None:
        training.run(spec)
        return 0
    code = subprocess.run(command, env=launch.launch_env(spec.nproc)).returncode
    if code:
        _mark_failed(out, code)
        typer.echo(f"error: training failed ({launcher} exited with {code}); the ranks' messages are above", err=True)
    return code
