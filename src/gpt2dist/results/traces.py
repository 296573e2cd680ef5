"""Each configuration's kept traces (one file per rank, the last traced step of its first repeat that kept them),
copied into the results under names of configuration and rank, for Perfetto and Holistic Trace Analysis."""

from __future__ import annotations

import shutil
from pathlib import Path

from gpt2dist.io import atomic_open
from gpt2dist.pipeline.layout import TRACES_DIR
from gpt2dist.pipeline.study import Study


def kept_traces(study: Study, records: dict[str, dict], runs_dir: Path) -> dict[str, dict]:
    """Config id -> the run whose traces stand for it: its first repeat (in study order) that kept one file per
    rank, each there. Runs trained before traces were kept have none: their configurations are left out."""
    picked = {}
    for run in study.runs:
        kept = (records.get(run.run_id) or {}).get("trace")
        if run.config_id not in picked and kept and all((runs_dir / run.run_id / f).is_file() for f in kept["files"]):
            picked[run.config_id] = {"run_id": run.run_id, "step": kept["step"], "files": kept["files"]}
    return picked


def copy_traces(picked: dict[str, dict], runs_dir: Path, out_dir: Path) -> dict[str, dict]:
    """Copy each configuration's kept traces to out_dir/traces, named by configuration and rank (each file written
    atomically, those of an earlier collect that no configuration keeps now deleted); what summary.json says of
    them, their paths relative to out_dir."""
    listed, wanted = {}, set()
    (out_dir / TRACES_DIR).mkdir(parents=True, exist_ok=True)  # a study without traces has it too: a rule's output
    for config, kept in picked.items():
        files = []
        for world_rank, name in enumerate(kept["files"]):
            relative = f"{TRACES_DIR}/{config}.rank{world_rank}.json.gz"
            with open(runs_dir / kept["run_id"] / name, "rb") as source, atomic_open(out_dir / relative, "wb") as out:
                shutil.copyfileobj(source, out)
            files.append(relative)
            wanted.add(relative)
        listed[config] = {**kept, "files": files}
    for stale in (out_dir / TRACES_DIR).glob("*.json.gz"):
        if f"{TRACES_DIR}/{stale.name}" not in wanted:
            stale.unlink()
    return listed
