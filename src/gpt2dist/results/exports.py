"""The runs whose weights a study hands on: at each placement, the fastest configuration of the top tier that kept a
final checkpoint (study.keep_checkpoints), and its run that kept it, for `gpt2dist export --run <run-id>`."""

from __future__ import annotations

from pathlib import Path

from gpt2dist.pipeline.study import Study


def kept_checkpoint(record: dict, run_dir: Path) -> bool:
    """Whether a run kept its final checkpoint and it is there (after a `dvc pull`, or in a bundle made with
    --checkpoints; not in a bundle made without)."""
    kept = record.get("kept_checkpoint")
    return bool(kept) and (run_dir / kept).is_file()


def runs_to_export(study: Study, records: dict[str, dict], runs_dir: Path, answer: list[dict]) -> list[dict]:
    """Per placement of the answer (in its order), the top tier's fastest configuration with a run that kept its
    final checkpoint, and that run (its first such repeat in study order); none where no run kept one."""
    kept: dict[str, str] = {}
    for run in study.runs:
        record = records.get(run.run_id)
        if record is not None and kept_checkpoint(record, runs_dir / run.run_id):
            kept.setdefault(run.config_id, run.run_id)
    chosen = []
    for group in answer:
        top = [row["config_id"] for row in group["ranked"] if row.get("tier") == 1 or row["gap"] == "fastest"]
        config = next((config for config in top if config in kept), None)
        if config is not None:
            chosen.append({"placement": group["placement"], "config_id": config, "run_id": kept[config]})
    return chosen
