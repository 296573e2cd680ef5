"""`gpt2dist selftest`: every configuration of the chosen study for a few steps on a tiny GPT-2
(the preset's vocabulary and context, 2 layers), plus one checkpoint-and-resume per strategy.

The paper study is about a hundred runs of minutes each; a configuration that crashes on this
node should be known in minutes, not after hours. Each check is a real `gpt2dist train`
subprocess, so a crash in one (a CUDA error, a missing library, a hung rank) cannot take the
others down, and its error line is the one a user would see. The shards are random tokens
written here: the selftest checks the training machinery, and needs no `prepare` first.
`calibrate` trains the preset's own model the same way for a few steps, to time it.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from gpt2dist.config.strategies import describe, REFERENCE
from gpt2dist.data.shards import write_shards
from gpt2dist.errors import UsageError, failure_line
from gpt2dist.io import atomic_write_json
from gpt2dist.launch.locks import hold_the_machine
from gpt2dist.pipeline.duration import Calibration
from gpt2dist.pipeline.run import Run
from gpt2dist.pipeline.study import configurations, resume_cases, study_precisions, Study

STEPS = 4
CALIBRATION_STEPS = 3  # the first warms up; the median of the other two is the step time
FAILED_OUTPUT_LINES = 40
RESUME_AT = 2  # warm-up (1 step) + 1: the cosine decay, laid out over max_steps, has not moved yet, so
# the --max-steps RESUME_AT run takes the same first steps as the STEPS one it is compared with
# A resumed run must end where an uninterrupted one ends; reduced precisions and GPU reductions
# are not bitwise repeatable, so they get a looser bound.
RESUME_RTOL = {"fp32": 1e-5}
RESUME_RTOL_REDUCED = 1e-2


@dataclass
class Check:
    name: str
    ok: bool
    seconds: float
    error: str = ""


def overrides(study: Study, steps: int) -> list[str]:
    """A tiny version of the study's model and a global batch that every process count divides."""
    batch = math.lcm(*(run.nproc for run in study.runs))
    stages = max([2, *(degrees.pp * degrees.pp_virtual for degrees in (
        describe(run.strategy).degrees(run.nproc, study.preset.train) for run in study.runs))])  # a block per stage
    return [
        f"model.n_layer={stages}",
        f"train.global_batch_size={batch}",
        "train.micro_batch_size=1",
        f"train.max_steps={steps}",
        "train.lr_warmup_steps=1",
        f"train.eval_interval={steps}",
        "train.eval_batches=1",
    ]


def write_random_shards(directory: Path, study: Study, rows_per_step: int, steps: int) -> Path:
    """Enough uniformly random tokens of the preset's vocabulary for `steps` steps (and an evaluation)."""
    model = study.preset.model
    rng = np.random.default_rng(0)
    tokens = {split: [rng.integers(0, model.vocab_size, size=rows_per_step * (model.n_positions + 1) * (steps + 2),
                                   dtype=np.uint16)]
              for split in ("train", "val")}
    write_shards(directory, tokens, vocab_size=model.vocab_size, eos_id=0, tokenizer={"name": "selftest-random"},
                 source={"name": "selftest-random"})
    return directory


def train(study: Study, shards: Path, run: Run, out: Path, timeout_s: float, *sets: str) -> str | None:
    """`gpt2dist train` of one configuration with `--set` overrides; None when it succeeded, else its error line."""
    command = [sys.executable, "-m", "gpt2dist", "train", "--data", str(shards), "--out", str(out), "--params",
               str(study.params.path), "--preset", study.preset_name, "--strategy", run.strategy, "--precision", run.precision,
               "--nproc", str(run.nproc), *run.size_args(), *run.node_args(), *(arg for value in sets for arg in ("--set", value))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"no result within {timeout_s:g} s (a hung rank or collective?)"
    if not done.returncode:
        return None
    # the error line goes in the table; what led to it, to the log (a launcher's own complaint included)
    tail = done.stderr.splitlines()[-FAILED_OUTPUT_LINES:]
    print(f"--- {run.config_id}: the last {len(tail)} lines of its output ---", *tail, sep="\n", file=sys.stderr)
    return failure_line(done.stderr)


class Selftest:
    def __init__(self, study: Study, workdir: Path, timeout_s: float):
        self.study, self.workdir, self.timeout_s = study, workdir, timeout_s
        self.shards = write_random_shards(workdir / "shards", study, math.lcm(*(run.nproc for run in study.runs)), STEPS)
        self.base = overrides(study, STEPS)

    def train(self, run: Run, out: Path, *extra: str) -> str | None:
        """Run `gpt2dist train` for one configuration; None when it succeeded, else its error line."""
        return train(self.study, self.shards, run, out, self.timeout_s, *self.base, *extra)

    def configuration(self, run: Run) -> Check:
        started = time.perf_counter()
        out = self.workdir / run.config_id
        # one checkpoint, at the end: on the paper preset each is most of a gigabyte
        error = self.train(run, out, f"train.checkpoint_interval={STEPS}")
        (out / "checkpoint.pt").unlink(missing_ok=True)
        return Check(run.config_id, error is None, time.perf_counter() - started, error or "")

    def resume(self, run: Run) -> Check:
        """Stop after RESUME_AT steps, re-run to STEPS, and compare with the uninterrupted run."""
        name, out = f"resume {run.config_id}", self.workdir / f"resume-{run.config_id}"
        started = time.perf_counter()
        every = f"train.checkpoint_interval={RESUME_AT}"
        error = self.train(run, out, every, f"train.max_steps={RESUME_AT}") or self.train(run, out, every)
        if error is None:
            error = resume_mismatch(out, self.workdir / run.config_id, run.precision)
        (out / "checkpoint.pt").unlink(missing_ok=True)
        return Check(name, error is None, time.perf_counter() - started, error or "")


def calibration_sets(steps: int = CALIBRATION_STEPS) -> tuple[str, ...]:
    """A timing run's settings: `steps` steps, no traced ones, one evaluation and checkpoint at the end."""
    return (f"train.max_steps={steps}", "train.lr_warmup_steps=1", "train.ledger_steps=0",
            f"train.eval_interval={steps}", f"train.checkpoint_interval={steps}")


def timed_step(study: Study, shards: Path, precision: str, out: Path, timeout_s: float, *sets: str,
               steps: int = CALIBRATION_STEPS, warmup: int = 1) -> float:
    """Single's step of the preset's model here, `steps` of them in one `gpt2dist train`: the median of all but the
    first `warmup`, which carry the warm-up."""
    error = train(study, shards, Run(REFERENCE, precision, 1, 0), out, timeout_s, *calibration_sets(steps), *sets)
    if error:
        raise UsageError(f"calibration in {precision} failed: {error}")
    times = [line["step_time_s"] for line in map(json.loads, (out / "metrics.jsonl").read_text().splitlines())
             if line["kind"] == "train"]
    return statistics.median(times[warmup:])


def calibrate(study: Study, timeout_s: float = 600, steps: int = CALIBRATION_STEPS, warmup: int = 1) -> Calibration:
    """Time `steps` steps of the preset's own model in one process (the median of all but the first `warmup`), once
    per precision of the study: the measure the study's duration estimate scales (pipeline/duration.py), and a
    tune's CPU step model starts from."""
    step_s, launch_s = {}, []
    with tempfile.TemporaryDirectory(prefix="gpt2dist-calibrate-", ignore_cleanup_errors=True) as tmp:
        shards = write_random_shards(Path(tmp) / "shards", study, study.preset.train.global_batch_size, steps)
        for precision in study_precisions(study):
            started = time.perf_counter()
            step_s[precision] = timed_step(study, shards, precision, Path(tmp) / precision, timeout_s, steps=steps,
                                           warmup=warmup)
            process_s = time.perf_counter() - started  # the process from spawn to exit, as a study's job pays it
            launch_s.append(process_s - steps * step_s[precision])
    return Calibration(step_s, statistics.median(launch_s))


def micro_batch_steps(study: Study, precision: str, micro_batches: tuple[int, ...],
                      timeout_s: float = 600) -> dict[int, float]:
    """Single's step of the preset's model here at each micro-batch, one pass a step (its global batch the micro-
    batch): what calibrates the GPU step model on this GPU (forecast.plan.calibrate_gpu)."""
    with tempfile.TemporaryDirectory(prefix="gpt2dist-calibrate-", ignore_cleanup_errors=True) as tmp:
        shards = write_random_shards(Path(tmp) / "shards", study, max(micro_batches), CALIBRATION_STEPS)
        return {rows: timed_step(study, shards, precision, Path(tmp) / f"{precision}-{rows}", timeout_s,
                                 f"train.micro_batch_size={rows}", f"train.global_batch_size={rows}")
                for rows in micro_batches}


def final_loss(run_dir: Path) -> float:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line["kind"] == "train"][-1]["loss"]


def resume_mismatch(resumed: Path, whole: Path, precision: str) -> str | None:
    record = json.loads((resumed / "run.json").read_text())
    if record.get("resumed_from_step") != RESUME_AT:
        return f"the re-run started at step {record.get('resumed_from_step')}, not at its checkpoint's {RESUME_AT}"
    uninterrupted = whole / "run.json"
    if not uninterrupted.exists() or json.loads(uninterrupted.read_text()).get("status") != "completed":
        return "no uninterrupted run to compare with (its configuration failed)"
    a, b = final_loss(resumed), final_loss(whole)
    rtol = RESUME_RTOL.get(precision, RESUME_RTOL_REDUCED)
    if abs(a - b) > rtol * abs(b):
        return f"resumed run ends at loss {a:.6f}, uninterrupted at {b:.6f} (tolerance {rtol:g} relative)"
    return None


def run_selftest(study: Study, out: Path, *, only: list[str] | None = None, resume: bool = False,
                 timeout_s: float = 600, report=print) -> list[Check]:
    """Run the checks, report each as it ends, and write `out` (atomically) with all of them.

    Without `only`: every configuration, and a resume for each strategy's resume case. With it:
    those configurations, each also resumed when `resume` is set (the pipeline's job per configuration)."""
    if only:
        runs = {run.config_id: run for run in configurations(study)}
        unknown = [config for config in only if config not in runs]
        if unknown:
            raise UsageError(f"--only {', '.join(unknown)}: not a configuration of preset '{study.preset_name}' "
                             f"(it has {', '.join(runs)})")
        chosen = [runs[config] for config in only]
        resumed = chosen if resume else []
    else:
        chosen, resumed = configurations(study), resume_cases(study)
    checks: list[Check] = []
    # The checks' own runs share the lock: a timeout must not count time spent waiting for another run.
    # Shared with other selftests (the pipeline runs one per configuration, several at once on a CPU
    # machine), never with a timed run. ignore_cleanup_errors: the ranks of a timed-out check may
    # still be leaving their directory. Beside `out`, not in /tmp: a multi-node check's ranks on the
    # other nodes read its shards, and a cluster shares the project's directory, not its nodes' /tmp.
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".selftest-", dir=out.parent, ignore_cleanup_errors=True) as tmp, \
            hold_the_machine(shared=True):
        test = Selftest(study, Path(tmp), timeout_s)
        total = len(chosen) + len(resumed)
        for run in chosen:
            checks.append(test.configuration(run))
            report(checks[-1], len(checks), total)
        for run in resumed:
            checks.append(test.resume(run))
            report(checks[-1], len(checks), total)
    atomic_write_json(out, {
        "preset": study.preset_name,
        "device": study.device,
        "steps": STEPS,
        "passed": sum(check.ok for check in checks),
        "failed": sum(not check.ok for check in checks),
        "checks": [asdict(check) for check in checks],
    })
    return checks
