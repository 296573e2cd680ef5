"""Every subcommand ends bad input (a missing or unreadable file or directory) with one `error:` line and
exit status 2, never a traceback, through the real command line."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch

from gpt2dist.errors import OneLineArgumentParser, failure_line
from gpt2dist.inputs import SUMMARY_KEYS
from gpt2dist.pipeline.layout import SLURM_PROFILE

from conftest import REPO, gpt2dist

CASES = {
    "prepare-missing-params": "params file",
    "verify-missing-directory": "no token shards in",
    "verify-empty-meta": "meta.json is not valid JSON",
    "train-missing-data": "no token shards in",
    "collect-empty-runs": "has no run.json",
    "plot-missing-summary": "summary.json is missing; run `gpt2dist collect` first",
    "plot-empty-table": "runs.csv cannot be read (No columns to parse from file); re-run `gpt2dist collect`",
    "report-missing-summary": "summary.json is missing; run `gpt2dist collect` first",
    "report-unreadable-summary": "summary.json cannot be read (Expecting value",
    "dvc-yaml-missing-params": "params file",
    "schema-out-below-a-file": "file: File exists; check that path",
    "doctor-missing-params": "params file",
    "dvc-yaml-gpus-per-node-in-words": "gpus_per_node in ",
    "selftest-unknown-configuration": "--only ring-fp32-n1: not a configuration of preset 'tiny' (it has single-",
    "selftest-resume-alone": "--resume goes with --only",
    "estimate-missing-params": "params file",
    "progress-unreadable-estimate": "estimate.json cannot be read (Expecting property name",
    # files of the wrong kind, told apart before they are read (an UnpicklingError traceback before)
    "train-resume-from-params": "params.yaml is a params file, not a checkpoint",
    "train-resume-from-empty-json": "run.json is an empty file, not a checkpoint",
    "train-damaged-own-checkpoint": "checkpoint.pt is a text file, not a checkpoint",
    # a --set value that YAML cannot parse (the parser's traceback before)
    "train-set-unparsable-value": "--set 'model.n_layer=[': the value '[' is not valid YAML",
    # --hosts: the run is checked as any other, and --nproc is not silently dropped
    "train-hosts-disagree-with-nproc": "--nproc 3 disagrees with --hosts, whose slots add up to 4",
    "train-hosts-batch-indivisible": "train.global_batch_size (8) must be divisible by",
    # past one node outside an allocation: the line names the way in, the profile the repository ships
    "train-nodes-outside-an-allocation": f"snakemake --profile {SLURM_PROFILE}), or print each node's command",
    # an option that does not apply to the mode is refused, not ignored
    "plan-mfu-for-cpus": "--gpu, --mfu, --calibration and the links set a GPU's step time",
    # a study directory whose summary.json is not collect's (a KeyError traceback before)
    "report-foreign-summary": "summary.json is not what `gpt2dist collect` writes (no preset, hardware, device",
    "recommend-foreign-summary": "summary.json is not what `gpt2dist collect` writes (no preset, hardware, device",
    # export: a run it cannot export, or an --out it would overwrite; init: weights that are not there
    "export-without-checkpoint": "has no checkpoint.pt (nor kept/checkpoint.pt): export needs a run's checkpoint",
    "export-without-record": "has no run.json: export reads the run's model settings from its record",
    "export-into-a-full-out": "exists and is not an empty directory; export into a new or empty one",
    "train-init-from-missing": "does not exist: name the directory holding config.json and model.safetensors",
    "train-init-from-without-weights": "has no model.safetensors: save the model there with save_pretrained",
}


def _args(case: str, tmp: Path, shards: Path, params: Path) -> list:
    missing = tmp / "missing"
    if case == "prepare-missing-params":
        return ["prepare", "--out", tmp / "tokens", "--params", missing]
    if case == "verify-missing-directory":
        return ["verify", missing]
    if case == "verify-empty-meta":
        (tmp / "meta.json").write_text("")
        return ["verify", tmp]
    if case == "train-missing-data":
        return ["train", "--data", missing, "--out", tmp / "run", "--strategy", "single", "--params", params]
    if case == "collect-empty-runs":
        (tmp / "runs").mkdir()
        return ["collect", "--runs", tmp / "runs", "--data", shards, "--out", tmp, "--params", params]
    if case == "plot-empty-table":
        (tmp / "summary.json").write_text(json.dumps(dict.fromkeys(SUMMARY_KEYS)))  # collect's keys; runs.csv empty
        (tmp / "runs.csv").write_text("")
        return ["plot", "--results", tmp]
    if case.endswith("foreign-summary"):
        (tmp / "summary.json").write_text('{"answer": "fastest is single"}')
        return ["report", "--results", tmp] if case.startswith("report") else ["recommend", "--gpus", "8", "--study", tmp]
    if case.startswith(("plot", "report")):
        if case == "report-unreadable-summary":
            (tmp / "summary.json").write_text("")
        return [case.split("-")[0], "--results", tmp]
    if case == "dvc-yaml-missing-params":
        return ["dvc-yaml", "--out", tmp / "dvc.yaml", "--params", missing]
    if case == "schema-out-below-a-file":
        (tmp / "file").write_text("")
        return ["schema", "--out", tmp / "file" / "schema.json"]
    if case == "doctor-missing-params":
        return ["doctor", "--no-gpu", "--params", missing]
    if case == "dvc-yaml-gpus-per-node-in-words":
        (tmp / "params.yaml").write_text(params.read_text() + "gpus_per_node: eight\n")
        return ["dvc-yaml", "--out", tmp / "dvc.yaml", "--params", tmp / "params.yaml"]
    if case == "selftest-unknown-configuration":
        return ["selftest", "--params", params, "--only", "ring-fp32-n1", "--out", tmp / "selftest.json"]
    if case == "selftest-resume-alone":
        return ["selftest", "--params", params, "--resume", "--out", tmp / "selftest.json"]
    if case == "estimate-missing-params":
        return ["estimate", "--params", missing, "--out", tmp / "estimate.json"]
    if case == "progress-unreadable-estimate":
        (tmp / "estimate.json").write_text("{")
        return ["progress", "--params", params, "--runs", tmp, "--estimate", tmp / "estimate.json"]
    if case.startswith("export"):
        (tmp / "run").mkdir()
        if case == "export-without-checkpoint":
            (tmp / "run" / "run.json").write_text('{"status": "failed"}')
        elif case == "export-without-record":
            torch.save({"model": {}}, tmp / "run" / "checkpoint.pt")
        else:
            (tmp / "out").mkdir()
            (tmp / "out" / "notes.txt").write_text("mine")
        return ["export", "--run", tmp / "run", "--out", tmp / "out"]
    train = ["train", "--data", shards, "--out", tmp / "run", "--strategy", "single", "--params", params]
    if case == "train-init-from-missing":
        return [*train, "--init-from", missing]
    if case == "train-init-from-without-weights":
        (tmp / "gpt2").mkdir()
        (tmp / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_layer": 2, "n_head": 2,
                                                              "n_embd": 32, "n_positions": 32, "vocab_size": 512}))
        return [*train, "--init-from", tmp / "gpt2"]
    if case == "train-resume-from-params":
        return [*train, "--resume-from", params]
    if case == "train-resume-from-empty-json":
        (tmp / "run.json").write_text("\n")
        return [*train, "--resume-from", tmp / "run.json"]
    if case == "train-damaged-own-checkpoint":
        (tmp / "run").mkdir()
        (tmp / "run" / "checkpoint.pt").write_text("not saved by torch")
        return train
    if case == "train-set-unparsable-value":
        return [*train, "--set", "model.n_layer=["]
    if case == "train-nodes-outside-an-allocation":
        return [*train, "--strategy", "ddp", "--nproc", "2", "--nodes", "2"]
    if case.startswith("train-hosts"):
        hosts = ["--strategy", "ddp", "--gpus", "0"]
        return [*train, *hosts, *(["--hosts", "a:2,b:2", "--nproc", "3"] if "nproc" in case else ["--hosts", "a:3,b:3"])]
    if case == "plan-mfu-for-cpus":
        return ["plan", "--params", params, "--mfu", "0.3"]
    raise AssertionError(case)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("case", CASES)
def test_bad_input_ends_with_one_error_line(case, tmp_path, shards, params_file):
    args = _args(case, tmp_path, shards, params_file)
    before = set(tmp_path.rglob("*"))
    result = gpt2dist(*args, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and CASES[case] in lines[0], result.stderr
    assert set(tmp_path.rglob("*")) == before, "bad input left outputs behind"


def test_the_slurm_profile_that_errors_name_is_the_repositorys():
    assert (REPO / SLURM_PROFILE / "config.yaml").is_file()


def test_version_names_the_installed_package():
    from importlib.metadata import version

    assert gpt2dist("--version").stdout == f"gpt2dist {version('gpt2dist')}\n"


def test_the_error_line_is_the_root_cause():
    ranks = ("[1]<stderr>:Traceback (most recent call last):\n"
             "[1]<stderr>:TypeError: zero_grad() got an unexpected keyword argument 'set_to_none'\n"
             "[0]<stderr>:RuntimeError: Horovod has been shut down\n"
             "error: training failed (horovodrun exited with 1); the ranks' messages are above\n")
    assert failure_line(ranks) == "TypeError: zero_grad() got an unexpected keyword argument 'set_to_none'"
    assert failure_line("warning: x\nerror: unknown preset 'gpu'\n") == "error: unknown preset 'gpu'"
    assert failure_line("error: train.bin is corrupt\nerror: training failed (torchrun exited with 1)\n") == \
        "error: train.bin is corrupt"
    assert failure_line("") == "exited without a message"
    refused = ("[1]<stderr>:error: --resume-from x: its single run keeps AdamW's state by parameter name\n"
               "Traceback (most recent call last):\n"
               "RuntimeError: Horovod detected that one or more processes exited with non-zero status\n")
    assert failure_line(refused) == "error: --resume-from x: its single run keeps AdamW's state by parameter name"


def test_a_bench_scripts_bad_command_line_is_one_error_line(capsys):
    def refusal(parser: argparse.ArgumentParser) -> tuple[int, str]:
        parser.add_argument("--strategies")
        with pytest.raises(SystemExit) as exited:
            parser.parse_args(["--strategies"])
        return exited.value.code, capsys.readouterr().err

    ours = OneLineArgumentParser("what the script measures")
    assert refusal(ours) == (2, f"error: argument --strategies: expected one argument; {ours.prog} --help lists its "
                                "options\n")
    # the control: argparse's own parser puts a usage block before its error line
    code, err = refusal(argparse.ArgumentParser(description="what the script measures"))
    assert code == 2 and err.startswith("usage:") and len(err.splitlines()) == 2


def test_a_gpu_study_planned_without_gpus_names_a_command_that_plans_it(tmp_path):
    """The refusal's own suggestion, run as written, plans the study (it once named `gpt2dist --gpus 8`, no command)."""
    params = REPO / "params.yaml"
    refused = gpt2dist("estimate", "--preset", "paper", "--params", params, check=False, cwd=tmp_path)
    assert refused.returncode == 2 and "as in gpt2dist estimate --gpus 8," in refused.stderr, refused.stderr
    suggested = ["estimate", "--gpus", "8"]
    assert gpt2dist(*suggested, "--preset", "paper", "--params", params, cwd=tmp_path).stdout.startswith("estimate:")
    # the control: the command it named before is not one
    assert gpt2dist("--gpus", "8", check=False, cwd=tmp_path).returncode == 2
