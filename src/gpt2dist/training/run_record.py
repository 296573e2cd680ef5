"""run.json, one run's record, has one writer: the process that launched the ranks (`gpt2dist train`),
or rank 0 itself when the ranks were started by hand from printed multi-node commands (their spec then
names no launch attempt).

Rank 0 reports what training did through rank0.json, which only rank 0 writes (a whole new file at each
change, replaced atomically). The record's writer writes run.json once when the launch starts, and once
when the ranks have ended: the report, if it belongs to this launch (the attempt id in the spec), with
what the launcher saw around it (the command, the machine's load, the exit status, a stop signal).
Nothing reads, merges and rewrites run.json. What rank 0 says of its run when it starts (run_facts: the
placement, the probes of the nodes and their links, the wrapping, the modelled traffic, the environment) is made
here too.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from gpt2dist.config.schema import RunSpec
from gpt2dist.config.traffic import traffic
from gpt2dist.io import atomic_write_json, atomic_write_text
from gpt2dist.pipeline.layout import EVENTS, KEPT_DIR

RECORD, REPORT, METRICS = "run.json", "rank0.json", "metrics.jsonl"
CHECKPOINT = "checkpoint.pt"  # what a re-run resumes from; never a workflow tool's output (pipeline.layout.KEPT_DIR)


def trace_file(rank: int) -> str:
    """A rank's kept trace in its run directory: its last traced step as the profiler exports it, gzipped."""
    return f"{KEPT_DIR}/trace-rank{rank}.json.gz"


def final_checkpoint(run_dir: Path) -> Path:
    """The checkpoint a run left: its own checkpoint.pt, else the final one moved into kept/ (the pipeline's
    study.keep_checkpoints); the former's path where neither is there."""
    own, kept = Path(run_dir) / CHECKPOINT, Path(run_dir) / KEPT_DIR / CHECKPOINT
    return kept if kept.exists() and not own.exists() else own


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def probe_placement(strategy, place) -> tuple[list[dict], dict | None]:
    """Where a run's ranks run, node by node, and how fast their process group moves data (training.interconnect):
    every rank takes part, before anything else uses the links."""
    # here: the launcher, which writes the record, never loads torch
    from gpt2dist.training.interconnect import nodes_of, probe_bandwidth, this_node

    nodes = nodes_of(strategy.gather(this_node(place.device)))
    if place.world_size == 1:
        return nodes, None
    return nodes, probe_bandwidth(strategy.all_reduce_sum, strategy.barrier, place.device, place.world_size)


def run_facts(trainer, resumed_from: int) -> dict:
    """What rank 0 reports of a training.loop.Trainer's run as it starts (from step `resumed_from`)."""
    from gpt2dist.system import environment  # here too: it asks torch for the devices

    spec, strategy = trainer.spec, trainer.strategy
    return {
        "run_id": trainer.out.name,
        "strategy": spec.strategy,
        "precision": spec.precision,
        "nproc": spec.nproc,
        "seed": spec.train.seed,
        "preset": spec.preset,
        "grad_accum_steps": strategy.degrees.grad_accum_steps,
        "compiled": trainer.compiled,
        "compile_skipped": trainer.compile_skipped,
        "tokens_per_step": trainer.tokens_per_step,
        "placement": strategy.placement_record(),
        "node_hardware": trainer.node_hardware,
        "interconnect": trainer.interconnect,
        "wrapping": strategy.wrapping,
        "communication": dataclasses.asdict(traffic(spec)),  # modelled bytes per step, not measured
        "matmul": trainer.matmul,
        "config": spec.model_dump(),
        "fingerprint": spec.fingerprint(),
        "resumed_from_step": resumed_from,
        "continued_from": trainer.continued,  # another run's checkpoint (--resume-from), its strategy and step
        "checkpoint_step": resumed_from,
        "started_at": now_iso(),
        "threads": environment.threads(),
        "gpu_telemetry": trainer.telemetry.unavailable or "nvml",
        **environment.capture(),
    }


def new_attempt() -> str:
    """An id for one launch of a run: it ties rank 0's report to the launch that reads it."""
    return uuid.uuid4().hex[:16]


class RankReport:
    """What rank 0 tells the record's writer: the whole report, rewritten atomically at each change."""

    def __init__(self, out: Path, attempt: str | None):
        self.path = Path(out) / REPORT
        self.fields: dict = {"attempt": attempt}

    def update(self, **fields) -> None:
        self.fields.update(fields)
        atomic_write_json(self.path, self.fields)


def read_report(out: Path, attempt: str | None) -> dict | None:
    """Rank 0's report of this launch; None when it wrote none (an earlier launch's does not count)."""
    try:
        report = json.loads((Path(out) / REPORT).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return report if report.get("attempt") == attempt else None


@dataclass
class Outcome:
    """How the ranks ended, as their launcher saw it."""

    exit_code: int = 0
    stopped_by: int | None = None  # the stop signal forwarded to the ranks, if any
    facts: dict = field(default_factory=dict)  # what the launch mode adds to the record (e.g. emulated nodes)


def start_record(spec: RunSpec, **facts) -> None:
    """run.json while the ranks run: this launch's settings, status running."""
    out = Path(spec.out_dir)
    atomic_write_json(out / RECORD, {"status": "running", "run_id": out.name, "attempt": spec.attempt,
                                     "strategy": spec.strategy, "precision": spec.precision, "nproc": spec.nproc,
                                     "preset": spec.preset, **facts})


def finish_record(spec: RunSpec, outcome: Outcome, **facts) -> dict:
    """Write run.json from rank 0's report and the launch's facts once the ranks have ended; return it.

    The checkpoint of a completed run that is not to be kept goes (or moves into kept/) only after run.json says
    completed: a launcher killed before that leaves it, and the same command resumes at the last step."""
    out = Path(spec.out_dir)
    report = read_report(out, spec.attempt)
    record = {**(report or {}), "run_id": out.name, "attempt": spec.attempt, **facts, **outcome.facts}
    ended_at = record.pop("ended_at_step", None)  # where rank 0's loop ended before its last step, if it did
    trained = report is not None and report.get("status") == "completed"
    if outcome.stopped_by is not None and not trained:  # a signal after the last step changes nothing
        record.update(status="interrupted", signal=signal.Signals(outcome.stopped_by).name,
                      finished_at=record.get("finished_at") or now_iso())
        if ended_at is not None:
            record["interrupted_at_step"] = ended_at
    elif outcome.exit_code or not trained:
        record.update(status="failed", exit_code=outcome.exit_code, finished_at=now_iso())
        if ended_at is not None:
            record["failed_at_step"] = ended_at
        if not outcome.exit_code:
            record["error"] = "the ranks exited without reporting a completed run"
    else:
        record["status"] = "completed"
        if spec.final_checkpoint_in_kept:
            record["kept_checkpoint"] = f"{KEPT_DIR}/{CHECKPOINT}"
        elif not spec.keep_checkpoint:
            record["checkpoint_step"] = None
    atomic_write_json(out / RECORD, record)
    (out / KEPT_DIR).mkdir(exist_ok=True)
    if record["status"] == "completed" and spec.final_checkpoint_in_kept and (out / CHECKPOINT).exists():
        os.replace(out / CHECKPOINT, out / KEPT_DIR / CHECKPOINT)
    elif record["status"] == "completed" and not spec.keep_checkpoint:
        (out / CHECKPOINT).unlink(missing_ok=True)
    for name in (METRICS, EVENTS):  # a run that failed before its first step (or checkpoint): the workflow tools'
        if not (out / name).exists():  # outputs exist, and run.json says what happened
            atomic_write_text(out / name, "")
    return record
