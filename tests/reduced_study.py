"""A temporary copy of the workflow on a reduced cpu study, and the real tools run in it:
shared by the local pipeline tests and the SLURM cluster test."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

from gpt2dist.system.conditions import QUIET_WAIT_ENV

from conftest import REPO, quiet_wait_for_studies

BIN = Path(sys.executable).parent
# Limits under which collect flags no run as disturbed: for the studies whose tests check where the numbers come
# from, or whether two studies agree (test_verdicts_hold.py), not how busy the machine was, so that they run beside
# other tests. The tests of the flags themselves (test_disturbed_study.py, test_added_repeats_in_pipeline.py) keep
# the preset's.
UNJUDGED = {"max_foreign_cpu_share": 1.0, "min_cpu_share": 0.0, "max_step_time_spread": 1e6,
            "max_repeat_deviation": 1e6}
# .dvcignore: directory deps skip __pycache__; .gitignore: what a clone of the repository versions
COPIED = ["Snakefile", "params.yaml", "workflow", ".dvcignore", ".gitignore"]
# The corpus: the paragraphs of the repository's own documents. Not the embedded corpus, whose text
# (the standard library's docstrings) depends on the Python version: a study in the image
# (Python 3.13) must read the same text as the host's to give the same numbers.
CORPUS = ["README.md", "containers/README.md", "docs/reference/cpu-study/summary.md", "docs/pipeline.md", "docs/results.md",
          "docs/runs.md"]


def reduce_params(path: Path, **study) -> None:
    """Shrink the cpu preset: tiny model, few steps, a small corpus and a 4-run study."""
    params = yaml.safe_load(path.read_text())
    cpu = params["presets"]["cpu"]
    cpu["data"] = {"source": {"kind": "files", "paths": ["corpus/*.jsonl"]},
                   "tokenizer": {"kind": "bpe", "vocab_size": 512}, "val_fraction": 0.2}
    cpu["model"].update(n_layer=1, n_head=2, n_embd=32, n_positions=32, vocab_size=512)
    # a checkpoint at the last step only, as the cpu preset keeps: its selftests then check no resume (two more
    # launches per strategy, tested once in tests/test_selftest.py), and no reduced study needs to resume
    cpu["train"].update(max_steps=8, lr_warmup_steps=2, eval_interval=4, checkpoint_interval=8, global_batch_size=8,
                        micro_batch_size=2)
    cpu["study"] = {"repeats": 2, "excluded_steps": 2, "runs": [
        {"strategies": ["single"], "precisions": ["fp32"], "nproc": [1]},
        {"strategies": ["ddp"], "precisions": ["fp32"], "nproc": [2]},
    ], **study}
    params["preset"] = "cpu"
    path.write_text(yaml.safe_dump(params, sort_keys=False))


def copy_workflow(dest: Path, **study) -> Path:
    """The Snakefile, workflow/, a reduced params.yaml (its study updated with `study`) and its
    corpus in `dest`."""
    for name in COPIED:
        (shutil.copytree if (REPO / name).is_dir() else shutil.copy)(REPO / name, dest / name)
    paragraphs = [text for name in CORPUS for text in (REPO / name).read_text().split("\n\n") if text.strip()]
    (dest / "corpus").mkdir()
    (dest / "corpus" / "paragraphs.jsonl").write_text("".join(json.dumps({"text": text}) + "\n" for text in paragraphs))
    reduce_params(dest / "params.yaml", **study)
    return dest


def hog(seconds: float) -> subprocess.Popen:
    """A bounded busy loop (it ends by itself if the test dies first)."""
    code = f"import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"
    return subprocess.Popen([sys.executable, "-c", code])


def run(cmd: list[str], cwd: Path, check: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**(env or os.environ), "CUDA_VISIBLE_DEVICES": "", "DVC_NO_ANALYTICS": "1"}
    env[QUIET_WAIT_ENV] = quiet_wait_for_studies()
    env["PATH"] = f"{BIN}:{env['PATH']}"
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if check and result.returncode:
        raise AssertionError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


def assert_same_training_numbers(results: Path, reference: Path, run_ids: list[str],
                                 among_others: bool = False) -> None:
    """`results` holds exactly these runs (or these `among_others`), and each step's loss, grad norm and val loss
    of each equal the reference study's to 1e-6 (the same fp32 computation, started or built another way)."""
    steps = {where: pd.read_csv(r / "metrics.csv").set_index(["run_id", "step"]).sort_index()
             for where, r in (("results", results), ("reference", reference))}
    held = set(steps["results"].index.get_level_values("run_id"))
    assert held >= set(run_ids) if among_others else held == set(run_ids), (sorted(held), run_ids)
    steps["results"] = steps["results"].loc[sorted(run_ids)]
    expected = steps["reference"].loc[steps["results"].index]
    for column in ("loss", "grad_norm", "val_loss"):
        pd.testing.assert_series_equal(steps["results"][column], expected[column], rtol=1e-6)
