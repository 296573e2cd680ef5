"""`gpt2dist recommend`: strategies for a described GPU cluster ranked by predicted hours, fitting ones first,
with intervals from the GPU step model's out-of-source error on published GPU runs, stored GPU studies'
corrections and their leave-one-out error, and what it extrapolates."""

from __future__ import annotations

import json
import os
import re
import shlex

import numpy as np
import pandas as pd
import pytest
import yaml

from gpt2dist.config.presets import load_params
from gpt2dist.forecast.recommend import Stored, leave_one_out, read_stored, recommend, verdict_line
from gpt2dist.system.links import links_of

from conftest import REPO, gpt2dist

# the studies the command reads by default: every bundle under docs/reference, by its name
REFERENCE_STUDIES = sorted(p.with_name(p.name.removesuffix(".tar.gz")) for p in (REPO / "docs" / "reference").glob("*.tar.gz"))


def test_each_configuration_is_predicted_from_the_others_of_its_strategy():
    summary = pd.DataFrame({
        "config_id": ["single-n1", "ddp-a", "ddp-b", "ddp-c", "fsdp-a"],
        "strategy": ["single", "ddp", "ddp", "ddp", "fsdp"],
        "step_time_s": [1.0, 1.0, 1.2, 1.4, 2.0],
        "predicted_step_time_s": [1.0, 1.0, 1.0, 1.0, 1.0],
    }).assign(step_time_error=lambda s: s["predicted_step_time_s"] / s["step_time_s"] - 1)
    errors = leave_one_out([Stored("study", "cpu", summary)]).set_index("config_id")
    assert list(errors.index) == ["ddp-a", "ddp-b", "ddp-c", "fsdp-a"]  # single calibrates; it is not predicted
    assert errors.loc["ddp-a", "error"] == pytest.approx(1.3 / 1.0 - 1)  # corrected by the median of 1.2 and 1.4
    assert errors.loc["ddp-c", "error"] == pytest.approx(1.1 / 1.4 - 1)
    assert errors.loc["fsdp-a", "learned_from"] == 0 and errors.loc["fsdp-a", "error"] == pytest.approx(-0.5)
    # a study on another device kind teaches nothing about this one
    gpu = leave_one_out([Stored("study", "cpu", summary), Stored("gpus", "cuda", summary)])
    assert gpu[gpu["study"] == "study"].set_index("config_id").loc["ddp-a", "learned_from"] == 2


def recommended(*args: str):
    return gpt2dist("recommend", "--params", REPO / "params.yaml", *args)


def table_of(text: str) -> pd.DataFrame:
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ")]  # a table's row; prose wrapped at "|error|" is none
    return pd.DataFrame(rows[1:], columns=rows[0])


def test_the_ranking_puts_what_fits_first_then_the_fastest():
    _, preset = load_params(REPO / "params.yaml").preset("paper", cuda=True)
    ranked, _ = recommend("paper", preset, read_stored(REFERENCE_STUDIES), gpu="A100", gpus_per_node=8, nodes=1,
                          precision="bf16", tokens=1e10, memory_gb=16, links=links_of("A100"))
    runnable = ranked[ranked["note"] == ""]
    fits = runnable["fits"].astype(bool)
    assert fits.any() and (~fits).any() and not fits[fits.idxmin():].any()  # every fitting row above the rest
    assert runnable.loc[fits, "hours"].is_monotonic_increasing
    # every split of 8 GPUs whose tensor-parallel degree divides small's 12 heads, each with and without recompute
    assert {"ddp-tp2", "fsdp-pp2", "ddp-tp2-pp2", "tp4-pp2", "ddp-pp4", "pp"} <= set(runnable["strategy"])
    assert set(runnable.loc[runnable["strategy"] == "ddp-tp2", "recompute"]) == {False, True}
    text = recommended("--gpus", "8", "--gpu", "A100", "--memory-gb", "16").stdout
    table = table_of(text)
    assert list(table["strategy"]) == list(runnable["strategy"].head(len(table)))  # the printed table is the top
    assert re.search(rf"(Fastest that fits|Tied for fastest \(.*?\)): {table.loc[0, 'strategy']} at micro-batch "
                     rf"{table.loc[0, 'micro_batch']} x {table.loc[0, 'accumulation']}", " ".join(text.split())), text
    assert "tp: cannot run here: tp splits attention heads over 8 ranks" in text  # GPT-2 small's 12 heads
    assert "No strategy fits" in recommended("--gpus", "8", "--memory-gb", "1").stdout


def test_a_preset_of_model_sizes_is_ranked_at_each_size():
    text = recommended("--gpus", "8", "--preset", "paper-sizes", "--memory-gb", "40").stdout
    sections = re.findall(r"^GPT-2 (\w+), ([\d,]+)M parameters:$", text, re.M)
    assert [size for size, _ in sections] == ["small", "medium", "large", "xl"]
    _, preset = load_params(REPO / "params.yaml").preset("paper-sizes", cuda=True)
    ddp_peaks = []
    for size, _ in sections:
        ranked, _ = recommend("paper-sizes", preset, read_stored(REFERENCE_STUDIES), gpu="H100", gpus_per_node=8,
                              nodes=1, precision="bf16", tokens=1e10, memory_gb=40, links=links_of("H100"), size=size)
        at_the_presets = ranked["micro_batch"] == preset.train.micro_batch_size
        ddp_peaks.append(ranked[at_the_presets].query("strategy == 'ddp' and recompute == False")["peak_gib"].iloc[0])
    assert ddp_peaks == sorted(ddp_peaks) and ddp_peaks[-1] > 40 > ddp_peaks[0]  # XL's own model, not small's
    assert len(re.findall(r"^(Fastest that fits|Tied for fastest|No strategy fits)", text, re.M)) == 4
    assert "micro-batch (16) per GPU: 128 sequences" in " ".join(text.split())
    # the control: --sizes names the sizes; a preset of one model has no sections
    assert re.findall(r"^GPT-2 (\w+),", recommended("--gpus", "8", "--preset", "paper-sizes", "--sizes", "xl").stdout,
                      re.M) == ["xl"]
    assert "GPT-2 small," not in recommended("--gpus", "8").stdout


def test_strategies_within_the_ratio_error_of_the_fastest_are_a_tie():
    """Two candidates on one cluster share its error: which is faster is told by the model's error on the ratio of
    two runs, not by their hours' intervals."""
    fitting = pd.DataFrame({"strategy": ["ddp", "horovod", "pp"], "hours": [0.79, 0.85, 1.43],
                            "hours_low": [0.70, 0.75, 1.30], "hours_high": [0.95, 1.02, 1.72]})
    line = verdict_line(fitting, 0.10)
    assert line.startswith("Tied for fastest (the model cannot tell them apart: 2 configurations within 10% of ddp")
    assert "horovod, 0.85 hours (0.75 to 1.02)" in line and "pp" not in line
    # given the command that measures them, a tie names it on a line of its own, which the prose leaves whole
    assert "\n\n    gpt2dist tune --gpus 8\n\n" in verdict_line(fitting, 0.10, "gpt2dist tune --gpus 8")
    assert "gpt2dist tune" not in line
    # the control: with a smaller error the fastest is named alone, though the intervals overlap
    assert verdict_line(fitting, 0.05).startswith(
        "Fastest that fits: ddp, 0.79 hours (0.70 to 0.95), every other predicted slower by more than 5%, the model's "
        "error on the ratio of two runs of one search. On ")


def test_a_tie_names_the_tune_that_measures_it_on_the_cluster_asked_about(tmp_path):
    """recommend cannot tell its tied strategies apart; the `gpt2dist tune` it names, run as printed (a dry run here),
    plans this cluster (its GPU, nodes, link and memory, not tune's defaults) and measures every one of them, or
    says why this host cannot. The controls: the tune leaves out candidates predicted slower beyond its error (its
    list is a choice, not everything), and without the recommendation's options it plans tune's default cluster. A
    recommendation a tune calibrated names none (tests/forecast/test_tuned.py)."""
    asked = ("--gpus", "8", "--nodes", "2", "--gpu", "A100", "--memory-gb", "40", "--link-inside", "pcie4")
    text = recommended(*asked).stdout
    commands = re.findall(r"^    (gpt2dist tune .*)$", text, re.M)
    assert len(commands) == 1, text
    tied = re.search(r"Tied for fastest \(.*?\): (.*?)\. Choose among them", " ".join(text.split())).group(1)
    tied = {part.split(" at micro-batch")[0] for part in tied.split("; ")}
    assert len(tied) > 1
    tune = gpt2dist(*shlex.split(commands[0])[1:], "--dry-run", "--out", tmp_path / "tune", cwd=REPO).stdout
    said = " ".join(tune.split())
    assert said.startswith("tune: 2 node(s) of 8 A100 GPUs (40 GB), pcie4"), said
    measured = set(re.findall(r"^  (\S+): predicted", tune.split("Ruled out without running:")[0], re.M))
    refused = set(re.findall(r"^  (\S+): cannot run here", tune, re.M))
    assert tied <= measured | refused, (tied, measured, refused)
    slower = set(re.findall(r"^  (\S+): predicted [\d.]+x the pick's step", tune, re.M))
    assert slower and not slower & tied  # the control: it leaves out what is predicted slower beyond the error
    default = gpt2dist("tune", "--gpus", "8", "--dry-run", "--out", tmp_path / "default", cwd=REPO).stdout
    assert not " ".join(default.split()).startswith("tune: 2 node(s) of 8 A100 GPUs (40 GB), pcie4")


def test_the_tune_a_tie_names_reads_the_parameter_file_the_recommendation_read(tmp_path):
    """A recommendation of a preset from the user's own parameter file names a tune of that file (quoted where its
    path has a space), so the tune plans the preset recommended; the file a tune reads by default it leaves unsaid
    (test_tuned.py). The control: the same command without the file's option is refused, the default parameter file
    holding no such preset."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["presets"]["mine"] = {"extends": "paper"}
    own = tmp_path / "my params.yaml"
    own.write_text(yaml.safe_dump(params))
    stored = [arg for study in REFERENCE_STUDIES for arg in ("--study", study)]
    text = gpt2dist("recommend", "--params", own, "--preset", "mine", "--gpus", "8", "--nodes", "2", "--gpu", "A100",
                    "--memory-gb", "40", "--link-inside", "pcie4", *stored, cwd=REPO).stdout
    commands = re.findall(r"^    (gpt2dist tune .*)$", text, re.M)
    assert len(commands) == 1 and f"--params {shlex.quote(str(own))}" in commands[0], text
    argv = shlex.split(commands[0])[1:]
    tune = gpt2dist(*argv, "--dry-run", "--out", tmp_path / "tune", cwd=REPO).stdout
    assert " ".join(tune.split()).startswith("tune: 2 node(s) of 8 A100 GPUs (40 GB), pcie4"), tune
    at = argv.index("--params")
    refused = gpt2dist(*argv[:at], *argv[at + 2:], "--dry-run", "--out", tmp_path / "default", cwd=REPO, check=False)
    assert refused.returncode != 0 and "mine" in refused.stderr, refused.stderr


def test_the_intervals_are_the_out_of_source_error_on_published_gpu_runs():
    """The hours' intervals are the GPU step model's 5th to 95th percentile error on the published runs, out of
    source (gpu_fit.json), and the recommendation quotes it; the CPU reference studies correct nothing on GPUs.
    The control: with --mfu the intervals are the constant-MFU model's error on the same runs, wider."""
    from gpt2dist.forecast.published import FIT, read_table, validation

    _, preset = load_params(REPO / "params.yaml").preset("paper", cuda=True)
    shipped = json.loads(FIT.read_text())
    ranked, errors = recommend("paper", preset, read_stored(REFERENCE_STUDIES), gpu="H100", gpus_per_node=8,
                               nodes=2, precision="bf16", tokens=1e10, memory_gb=80, links=links_of("H100"))
    runnable = ranked[ranked["note"] == ""]
    assert errors.empty  # no stored study ran on GPUs
    assert np.allclose(runnable["hours_low"], runnable["hours"] * (1 + shipped["throughput_low_error"]))
    assert np.allclose(runnable["hours_high"], runnable["hours"] * (1 + shipped["throughput_high_error"]))
    text = " ".join(recommended("--gpus", "8", "--nodes", "2").stdout.splitlines())  # prose wraps at 100
    stated = re.search(r"the GPU step model's throughput is off by (\d+)% \(median; ([+-]\d+)% to ([+-]\d+)%", text)
    assert stated and int(stated[1]) == round(shipped["throughput_median_abs_error"] * 100), text
    assert int(stated[2]) == round(shipped["throughput_low_error"] * 100)
    assert "Extrapolating: no stored study of ours ran on GPUs" in text
    most = max(int(study.summary["nproc"].max()) for study in read_stored(REFERENCE_STUDIES))
    assert most < 16 and f"Extrapolating: 16 processes, the stored studies ran at most {most}." in text
    assert "Extrapolating: 2 real nodes" in text
    at_mfu, _ = recommend("paper", preset, read_stored(REFERENCE_STUDIES), gpu="H100", gpus_per_node=8, nodes=2,
                          precision="bf16", tokens=1e10, memory_gb=80, links=links_of("H100"), mfu=0.4)
    before = validation(read_table(), 0.4)[3]
    assert np.allclose(at_mfu.loc[at_mfu["note"] == "", "hours_high"],
                       at_mfu.loc[at_mfu["note"] == "", "hours"] * (1 + before["throughput_high_error"]))
    assert before["throughput_high_error"] - before["throughput_low_error"] > (
        shipped["throughput_high_error"] - shipped["throughput_low_error"])


@pytest.mark.parametrize("args, message", [
    (["--gpus", "0"], "error: Invalid value for '--gpus': 0 is below 1; it must be at least 1"),
    (["--gpus", "8", "--study", "/nonexistent/results"], "error: "),
    (["--gpus", "8", "--tokens", "0"], "error: Invalid value for '--tokens': 0 is at or below 0; it must be above 0"),
    (["--gpus", "8", "--tokens", "nan"], "error: Invalid value for '--tokens': 'nan' is not a finite number"),
    (["--gpus", "8", "--mfu", "2"], "error: Invalid value for '--mfu': 2 is above 1"),
    (["--gpus", "8", "--precision", "fp8"], "error: --precision 'fp8' is not one of fp32, tf32, bf16, fp16"),
    (["--gpus", "8", "--gpu", ""], "error: Invalid value for '--gpu': '' names no GPU whose peaks are known: name "
                                   "one of H200, "),
    # a Grace Hopper board is no H200, whatever links are given: refused before it is priced
    (["--gpus", "8", "--gpu", "GH200", "--link-inside", "nvlink4", "--link-across", "ndr", "--nics", "1"],
     "error: Invalid value for '--gpu': 'GH200' names no GPU whose peaks are known"),
])
def test_bad_recommend_input_is_one_error_line(args, message):
    result = gpt2dist("recommend", "--params", REPO / "params.yaml", *args, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode != 0 and len(lines) == 1 and lines[0].startswith(message), result.stderr


@pytest.mark.parametrize("command", [["recommend", "--gpus", "8"], ["plan", "--preset", "paper", "--gpus", "2"],
                                     ["project-scaling"]])
def test_prose_fits_the_terminal_and_tables_stay_whole(command):
    """At 80 columns every line but a table's fits (plan's drop warning was one line of 191 characters, recommend's
    prose lines up to 436); where there is no terminal, 100 columns. The control: with 200 columns some prose line
    is longer than 80, so the width came from the terminal."""
    def lines(columns: int) -> list[str]:
        env = {**os.environ, "COLUMNS": str(columns)}
        result = gpt2dist(*command, "--params", REPO / "params.yaml", env=env, cwd=REPO)
        return (result.stdout + result.stderr).splitlines()

    def prose(text: list[str]) -> list[str]:  # a table's rows are padded into columns: two spaces or a bar
        return [line for line in text if "  " not in line.strip() and not line.startswith("|")]

    narrow = prose(lines(80))
    assert narrow and max(map(len, narrow)) <= 80, max(narrow, key=len)
    assert max(map(len, prose(lines(200)))) > 80


@pytest.mark.timeout(60)
def test_a_cluster_of_any_size_is_ranked_in_seconds():
    """`recommend --gpus 99999999999` (the every-option property's find) once filled 12 GB with zero1's per-rank
    partition and ran past a minute; it is ranked like any cluster."""
    result = gpt2dist("recommend", "--params", REPO / "params.yaml", "--gpus", "99999999999")
    assert result.returncode == 0 and "candidates of 99999999999 GPUs" in result.stdout
    _, preset = load_params(REPO / "params.yaml").preset("paper", cuda=True)
    ranked, _ = recommend("paper", preset, [], gpu="H100", gpus_per_node=99999999999, nodes=1, precision="bf16",
                          tokens=1e10, memory_gb=80, links=links_of("H100"))
    assert (ranked.loc[ranked["strategy"] == "zero1", "note"] == "").all()  # partitioned and priced


def test_each_split_is_searched_at_each_micro_batch_and_the_largest_is_not_always_the_fastest():
    """The global batch follows the GPUs (the preset's micro-batch on each); each split runs it at every power of
    two that divides its replicas' share, the rest accumulated. A pipeline's smaller micro-batch gives it more
    micro-batches to fill its bubble with: one pipeline of 8 stages is predicted fastest below its largest
    micro-batch. The control: ddp, which has no bubble, is fastest at its largest, its launches fewest."""
    _, preset = load_params(REPO / "params.yaml").preset("paper", cuda=True)
    ranked, _ = recommend("paper", preset, [], gpu="H100", gpus_per_node=8, nodes=1, precision="bf16", tokens=1e10,
                          memory_gb=80, links=links_of("H100"))
    plain = ranked[(ranked["note"] == "") & ~ranked["recompute"].astype(bool)]
    for strategy, replicas, stages in (("pp", 1, 8), ("ddp", 8, 1)):
        runs = plain[plain["strategy"] == strategy]
        rows = 8 * preset.train.micro_batch_size // replicas
        # a pipeline needs a micro-batch per stage at least (torch's 1F1B)
        assert set(runs["micro_batch"]) == {2**power for power in range(rows.bit_length()) if rows // 2**power >= stages}
        assert (runs["accumulation"] * runs["micro_batch"] == rows).all()
        fastest = runs.loc[runs["hours"].idxmin(), "micro_batch"]
        assert (fastest < runs["micro_batch"].max()) == (stages > 1), (strategy, fastest)
