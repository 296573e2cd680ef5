"""Commands that write the files the workflow tools read: dvc.yaml and the params schema."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from gpt2dist.cli.common import DEFAULT_PARAMS, Gpus, Nodes, Params, PresetName, app, one_line_errors, planned_study



@app.command("dvc-yaml")
@one_line_errors
def dvc_yaml(
    out: Annotated[Path, typer.Option(help="File to write.")] = Path("dvc.yaml"),
    params: Params = DEFAULT_PARAMS,
    preset: PresetName = None,
    gpus: Gpus = None,
    nodes: Nodes = None,
) -> None:
    """Write dvc.yaml for this machine's study: the same commands and paths as the Snakefile."""
    from gpt2dist.pipeline.dvc_stages import write_dvc_yaml

    study = planned_study(params, preset, gpus, nodes)
    write_dvc_yaml(study, out)
    typer.echo(f"ok: {out} with {len(study.runs)} train stages of preset {study.preset_name}")


@app.command()
@one_line_errors
def schema(out: Annotated[Path, typer.Option(help="File to write.")] = Path("workflow/schemas/params.schema.json")) -> None:
    """Write the JSON schema of params.yaml (Snakemake validates against it) from the typed config."""
    from gpt2dist.config.schema import write_params_schema

    write_params_schema(out)
    typer.echo(f"ok: {out}")
