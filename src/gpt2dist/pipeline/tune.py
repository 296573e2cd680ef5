"""A tune's study (`gpt2dist tune`): a preset of its own, written with the user's presets into the params.yaml of the
tune's directory, so that its runs are a study's runs: the same rules, run records, containers and SLURM profile,
collected, bundled and rebuilt as any study. It extends the user's preset (the same model, data and settings), its
runs a short window each (steps left out as warm-up, the measured ones, one traced for the time ledger), its
candidates one run group on the tune's cluster, its first round the planned repeats (interleaved, as a study's),
and its halving rounds the study's added rounds within the tune's budget (study.added_repeats)."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

from gpt2dist.config.presets import Params, preset_tree
from gpt2dist.errors import UsageError
from gpt2dist.io import atomic_write_text

TUNE_PRESET = "tune"


@dataclass(frozen=True)
class Window:
    """A tune run's steps: `warmup` left out of its throughput (allocation, caches, compilation), `measured` counted,
    `traced` profiled for the time ledger after them (left out too: the profiler slows them)."""

    warmup: int
    measured: int
    traced: int = 1

    @property
    def steps(self) -> int:
        return self.warmup + self.measured + self.traced


@dataclass(frozen=True)
class Rounds:
    """How the tune's rounds go: the first round's repeats of every candidate, then at most `added` rounds that
    repeat the undecided (all candidates without `halving`), their runs within `study_minutes` of run time in all,
    a gap under `resolve` counting as a tie (None: the preset's)."""

    repeats: int
    added: int
    study_minutes: float
    halving: bool = True
    resolve: float | None = None


def tune_preset(base: str, candidates: list[str], group: dict, window: Window, rounds: Rounds,
                train: dict | None = None) -> dict:
    """The tune's preset: `base`'s, its runs the `candidates` as one run group (`group`: the cluster's nproc,
    nodes, links and the precision and size), each a `window` of steps, repeated as `rounds` say; `train`: more
    train settings (a GPU tune's global batch)."""
    added = {"rounds": rounds.added, "max_runs": 0, "max_minutes": 0, "halving": rounds.halving,
             "max_study_minutes": round(rounds.study_minutes, 3),
             **({"resolve": rounds.resolve} if rounds.resolve is not None else {})}
    return {
        "extends": base,
        "train": {"max_steps": window.steps, "eval_interval": window.steps, "eval_batches": 1,
                  "checkpoint_interval": window.steps, "checkpoint_minutes": 0, "ledger_steps": window.traced,
                  **(train or {})},
        # the tune writes the study's estimate before Snakemake starts: its start need not time single again
        "study": {"repeats": rounds.repeats, "excluded_steps": window.warmup, "selftests": False,
                  "time_at_start": False,
                  # the tune checked memory with the cluster's own GPUs; a second check would drop differently
                  "gpu_memory_gb": None, "added_repeats": added, "runs": [{"strategies": candidates, **group}]},
    }


def tune_params(params: Params, base: str, preset: dict, gpus_per_node: int, nodes: int, workdir: Path) -> dict:
    """The user's params.yaml with the tune's preset added and chosen, planned for its cluster, and every path that
    was relative to `workdir` (the directory the study runs in: a data source's files, a tokenizer's directory, the
    image) made absolute, since the tune's study runs in a directory of its own."""
    raw = copy.deepcopy(params.raw)
    if base == TUNE_PRESET or TUNE_PRESET in raw["presets"]:
        raise UsageError(f"{params.path} has a preset named '{TUNE_PRESET}', the name gpt2dist tune gives its own; "
                         "rename that preset")
    data = preset_tree(raw, params.path, base).get("data") or {}
    source, tokenizer, own = data.get("source") or {}, data.get("tokenizer") or {}, {}
    if source.get("kind") == "files":
        own["source"] = {"kind": "files", "paths": [_absolute(path, workdir) for path in source.get("paths", [])]}
    elif source.get("kind") == "hf" and (workdir / str(source.get("name"))).is_dir():  # a local dataset directory
        own["source"] = {"kind": "hf", "name": _absolute(source["name"], workdir)}
    if tokenizer.get("path"):
        own["tokenizer"] = {"kind": tokenizer["kind"], "path": _absolute(tokenizer["path"], workdir)}
    raw["presets"][TUNE_PRESET] = {**preset, **({"data": own} if own else {})}
    raw |= {"preset": TUNE_PRESET, "gpus_per_node": gpus_per_node, "nodes": nodes,
            "container": _absolute(raw.get("container", ""), workdir)}
    return raw


def _absolute(path: str, workdir: Path) -> str:
    return str(path) if Path(path).is_absolute() else str((workdir / path).absolute())


def write_params(raw: dict, path: Path) -> Path:
    atomic_write_text(path, yaml.safe_dump(raw, sort_keys=False))
    return path
