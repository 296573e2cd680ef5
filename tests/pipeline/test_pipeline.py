"""The pipeline end to end with the real tools, in a temporary copy of the repository on a
reduced cpu preset: Snakemake runs, re-runs and reports; DVC reproduces, tracks params and
metrics; Snakemake and DVC declare the same commands and outputs."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from matplotlib.collections import PathCollection

from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer

from gpt2dist.inputs import SUMMARY_KEYS
from gpt2dist.pipeline.layout import EVENTS
from gpt2dist.training.ledger import KEPT, read_trace

from reduced_study import REPO, assert_same_training_numbers, copy_workflow, run

pytestmark = pytest.mark.slow


def job_counts(dry_run_output: str) -> dict[str, int]:
    table = dry_run_output.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", table, re.M)}


@pytest.fixture
def workdir(tmp_path) -> Path:
    return copy_workflow(tmp_path)


RUN_IDS = {f"{config}-r{repeat}" for config in ("single-fp32-n1", "ddp-fp32-n2") for repeat in (0, 1)}


def tensorboard_runs(logdir: Path) -> dict[str, list[int]]:
    """What `tensorboard --logdir` finds there, read by its own multiplexer: each run (a directory with an event
    file) and the steps of its training loss."""
    multiplexer = EventMultiplexer(tensor_size_guidance={"scalars": 0})  # every point, not a sample
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    return {run: [event.step for event in multiplexer.Tensors(run, "train/loss")] for run in multiplexer.Runs()}


def test_snakemake_produces_everything_then_does_nothing(finished_copy):
    for name in ("throughput", "scaling", "loss_deviation", "loss_vs_time", "memory", "time_ledger"):
        for ext in ("png", "svg"):
            assert (finished_copy / "results" / "figures" / f"{name}.{ext}").stat().st_size > 1000
    summary = json.loads((finished_copy / "results" / "summary.json").read_text())
    # what the readers check a summary.json by, and the runs to export where runs kept their checkpoints
    assert set(SUMMARY_KEYS) <= set(summary) <= {*SUMMARY_KEYS, "export"} and summary["export"]
    assert summary["preset"] == "cpu" and set(summary["configs"]) == {"single-fp32-n1", "ddp-fp32-n2"}
    assert summary["configs"]["single-fp32-n1"]["speedup"] == pytest.approx(1.0)
    assert "| ddp " in (finished_copy / "results" / "summary.md").read_text()
    # every configuration's traced steps, split by where the time went, with ddp's all-reduce in it
    assert "## Where the time goes" in (finished_copy / "results" / "summary.md").read_text()
    ddp = summary["configs"]["ddp-fp32-n2"]
    assert ddp["ledger_comm_hidden_s"] + ddp["ledger_comm_exposed_s"] > 0 and ddp["traced_collective_bytes_per_step"] > 0
    assert summary["configs"]["single-fp32-n1"]["ledger_comm_exposed_s"] == 0
    # one run's kept traces per configuration, one per rank, linked from summary.md
    assert summary["traces"]["ddp-fp32-n2"]["files"] == ["traces/ddp-fp32-n2.rank0.json.gz",
                                                         "traces/ddp-fp32-n2.rank1.json.gz"]
    assert summary["traces"]["ddp-fp32-n2"]["run_id"] == "ddp-fp32-n2-r0"
    assert set(summary["traces"]) == set(summary["configs"])
    for rank, path in enumerate(summary["traces"]["ddp-fp32-n2"]["files"]):
        assert read_trace(finished_copy / "results" / path)[KEPT]["rank"] == rank
    assert "| [0](traces/ddp-fp32-n2.rank0.json.gz) [1](traces/ddp-fp32-n2.rank1.json.gz) |" in \
        (finished_copy / "results" / "summary.md").read_text()
    log = (finished_copy / "logs" / "train" / "ddp-fp32-n2-r1.log").read_text()
    assert "\r" not in log and "step 8/8" in log  # readable lines in a log file, no progress bar
    assert "profiler_start" not in log  # its traced steps add none of the profiler's own lines
    # each configuration's first repeat kept its final checkpoint (study.keep_checkpoints' default), no other run
    runs = finished_copy / "results" / "runs"
    assert {path.parent.parent.name for path in runs.glob("*/kept/checkpoint.pt")} == {
        "single-fp32-n1-r0", "ddp-fp32-n2-r0"} and not list(runs.glob("*/checkpoint.pt"))
    # `tensorboard --logdir results/runs`: every run, every step of its loss, under one tag (the strategies overlay)
    assert tensorboard_runs(runs) == {run: list(range(8)) for run in RUN_IDS}
    again = run(["snakemake", "--cores", "2"], finished_copy)
    assert "Nothing to be done" in again.stdout + again.stderr
    # control: a run directory without its event file is no run of TensorBoard's
    (runs / "ddp-fp32-n2-r1" / EVENTS).unlink()
    assert set(tensorboard_runs(runs)) == RUN_IDS - {"ddp-fp32-n2-r1"}


def test_the_study_prints_its_estimate_first_and_the_time_left_after_each_run(finished_copy):
    shown = (finished_copy / "snakemake.out").read_text()
    estimate = json.loads((finished_copy / "results" / "estimate.json").read_text())
    assert set(estimate["runs"]) == {"single-fp32-n1-r0", "ddp-fp32-n2-r0", "single-fp32-n1-r1", "ddp-fp32-n2-r1"}
    assert set(estimate["selftests"]) == {"single-fp32-n1", "ddp-fp32-n2"}
    assert estimate["calibration"]["step_s"]["fp32"] > 0 and estimate["calibration"]["launch_s"] > 0
    first_job = min(shown.index(f"rule {name}:") for name in ("prepare", "selftest"))
    assert re.search(r"estimate: about \d+ (s|min) for 4 runs and 2 selftests", shown[:first_job]), shown[:first_job]
    lefts = re.findall(r"study: (\d) of 4 runs done after \d+ (?:s|min); about \d+ (?:s|min) left", shown)
    assert sorted(lefts) == ["1", "2", "3", "4"]
    # with every run done there is nothing to time, and the estimate stays the one the study was made with
    again = run(["gpt2dist", "estimate", "--preset", "cpu", "--gpus", "0"], finished_copy)
    assert again.stdout.strip() == "estimate: all 4 runs of preset 'cpu' are done; nothing to time"
    assert json.loads((finished_copy / "results" / "estimate.json").read_text()) == estimate


def test_changing_a_training_key_reruns_train_collect_plot_not_prepare(finished_copy):
    params = yaml.safe_load((finished_copy / "params.yaml").read_text())
    params["presets"]["cpu"]["train"]["lr"] = 1e-3
    (finished_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    counts = job_counts(run(["snakemake", "-n"], finished_copy).stdout)
    # each configuration's selftest reads the train settings too; prepare does not
    assert counts == {"selftest": 2, "train": 4, "round_done": 1, "collect": 1, "plot": 1, "report": 1, "all": 1}


def test_adding_a_configuration_checks_and_trains_only_the_new_one(finished_copy):
    params = yaml.safe_load((finished_copy / "params.yaml").read_text())
    runs = params["presets"]["cpu"]["study"]["runs"]
    runs.append({"strategies": ["fsdp"], "precisions": ["fp32"], "nproc": [2]})
    (finished_copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    counts = job_counts(run(["snakemake", "-n"], finished_copy).stdout)
    # the new configuration's repeats only: the others' later repeats wait on a round marker, not on each run
    assert counts == {"selftest": 1, "train": 2, "round_done": 1, "collect": 1, "plot": 1, "report": 1, "all": 1}


def test_report_html_has_every_figure(finished_copy):
    run(["snakemake", "--report", "results/report.html"], finished_copy)
    html = (finished_copy / "results" / "report.html").read_text(errors="ignore")
    assert len(html) > 100_000 and "loss_deviation.png" in html and "throughput.png" in html and "findings.md" in html
    assert "Study: preset cpu, 2 configurations, 4 runs (2 repeats each)" in html  # captions name the study they show
    assert all(f"{name}.json.gz" in html for name in ("single-fp32-n1.rank0", "ddp-fp32-n2.rank0", "ddp-fp32-n2.rank1"))


def test_the_same_numbers_check_catches_one_loss_off_by_two_parts_in_a_million(finished_study, tmp_path):
    """The control of the cluster's and the image's studies' equality with this one (reduced_study)."""
    results = finished_study / "results"
    metrics = pd.read_csv(results / "metrics.csv")
    run_ids = sorted(metrics["run_id"].unique())
    assert_same_training_numbers(results, results, run_ids)
    row = metrics.index[(metrics["run_id"] == "ddp-fp32-n2-r0") & metrics["loss"].notna()][3]
    metrics.loc[row, "loss"] *= 1 + 2e-6
    (tmp_path / "results").mkdir()
    metrics.to_csv(tmp_path / "results" / "metrics.csv", index=False)
    with pytest.raises(AssertionError, match="Series are different"):
        assert_same_training_numbers(tmp_path / "results", results, run_ids)


def test_figures_are_drawn_from_the_table(finished_study):
    from gpt2dist.results.plots import FIGURES

    results = finished_study / "results"
    tables = [pd.read_csv(results / name) for name in ("runs.csv", "summary.csv", "metrics.csv")]
    configs = tables[1]["config_id"].nunique()
    bars = FIGURES["throughput"](*tables, "test")
    assert len([p for p in bars.axes[0].patches if p.get_height() > 0]) == configs
    runs_drawn = sum(len(c.get_offsets()) for c in bars.axes[0].collections if isinstance(c, PathCollection))
    assert runs_drawn == len(tables[0])  # every run is on the figure, disturbed or not
    deviation = FIGURES["loss_deviation"](*tables, "test")
    # every configuration but single itself (the tolerance line aside)
    assert len([line for line in drawn(deviation.axes[0].lines) if not line.get_label().startswith("_")]) == configs - 1
    scaling = FIGURES["scaling"](*tables, "test")
    curves = tables[1].dropna(subset=["speedup"])[["strategy", "precision"]].drop_duplicates().shape[0]
    assert len(scaling.axes[0].containers) == curves  # one error-bar line per strategy and precision
    assert any(line.get_label() == "ideal" for line in scaling.axes[0].lines)
    memory = FIGURES["memory"](*tables, "test")
    assert len([p for p in memory.axes[0].patches if p.get_height() > 0]) == 3 * configs  # params, grads, optimizer


def drawn(lines) -> list:
    """Lines with data (seaborn also adds empty proxy lines for its legend); the ideal line counts."""
    return [line for line in lines if len(line.get_xdata())]


def _snakemake_jobs(work: Path) -> dict[str, tuple[str, set[str]]]:
    """Dry-run of every job: rule name (train jobs by run id) -> (shell command, outputs)."""
    text = run(["snakemake", "-n", "-p", "--forceall"], work).stdout
    jobs = {}
    for block in text.split("rule ")[1:]:
        name = block.split(":", 1)[0]
        outputs = re.search(r"^\s+output: (.*)$", block, re.M)
        # the command up to its log; a train job then prints the study's time left, which DVC leaves out
        command = re.search(r"^Shell command: (.*?)(?: > \S+ 2>&1.*)?$", block, re.M)
        if name in ("all", "round_done"):  # round_done: Snakemake's order-only marker; DVC orders by stage order
            continue
        wildcard = re.search(r"wildcards: \w+=(\S+)", block)
        key = f"{name}@{wildcard[1]}" if wildcard else name
        jobs[key] = (command[1], set(outputs[1].split(", ")))
    return jobs


@pytest.mark.parametrize("selftests", [True, False])
def test_snakemake_and_dvc_declare_the_same_stages(selftests, tmp_path):
    """With selftests and without (`study.selftests: false`: no selftest job, and no run waits for one)."""
    workdir = copy_workflow(tmp_path, selftests=selftests)
    run(["gpt2dist", "dvc-yaml"], workdir)
    stages = yaml.safe_load((workdir / "dvc.yaml").read_text())["stages"]
    dvc = {}
    for name, stage in stages.items():
        if "foreach" in stage:
            for key, item in stage["foreach"].items():
                outs = {o if isinstance(o, str) else next(iter(o)) for o in stage["do"]["outs"]}
                dvc[f"{name}@{key}"] = (item["cmd"], {o.replace("${key}", key) for o in outs})
        else:
            declared = [*stage.get("outs", []), *stage.get("metrics", []), *stage.get("plots", [])]
            dvc[name] = (stage["cmd"], {o if isinstance(o, str) else next(iter(o)) for o in declared})
    jobs = _snakemake_jobs(workdir)
    assert jobs.keys() == dvc.keys()
    assert {key for key in jobs if key.startswith("selftest@")} == (
        {"selftest@single-fp32-n1", "selftest@ddp-fp32-n2"} if selftests else set())
    assert ("${item.selftest}" in stages["train"]["do"]["deps"]) == selftests
    for key, (command, outputs) in jobs.items():
        assert command == dvc[key][0], key
        assert outputs == dvc[key][1], key


def test_repeats_interleave_in_both_tools(workdir):
    """Every configuration's repeat 0 trains before any repeat 1, so a slow spell of the machine hits all
    configurations alike: in Snakemake's DAG through the round marker, in DVC by the plan `dvc repro` follows."""
    dag = run(["snakemake", "--dag"], workdir).stdout
    nodes = dict(re.findall(r'^\s*(\d+)\[label = "([^"]+)"', dag, re.M))
    edges = {(nodes[a], nodes[b]) for a, b in re.findall(r"^\s*(\d+) -> (\d+)", dag, re.M)}
    for config in ("single-fp32-n1", "ddp-fp32-n2"):
        assert (f"train\\nrun: {config}-r0", "round_done\\nround: 0") in edges
        assert ("round_done\\nround: 0", f"train\\nrun: {config}-r1") in edges
    run(["git", "init", "-q"], workdir)
    run(["dvc", "init", "-q"], workdir)
    (workdir / "src").symlink_to(REPO / "src")
    run(["gpt2dist", "dvc-yaml"], workdir)
    plan = run([sys.executable, "-c", "from dvc.repo import Repo; from dvc.repo.reproduce import plan_repro; "
                "print(' '.join(s.addressing for s in plan_repro(Repo('.').index.graph)))"], workdir).stdout.split()
    trains = [stage.rsplit("-r", 1)[1] for stage in plan if stage.startswith("train@")]
    assert trains == sorted(trains) and len(trains) == 4, plan


def test_repository_dvc_yaml_is_current(tmp_path):
    """The committed dvc.yaml is what `gpt2dist dvc-yaml` generates for the cpu preset."""
    run(["gpt2dist", "dvc-yaml", "--out", str(tmp_path / "dvc.yaml"), "--preset", "cpu"], REPO)
    assert (tmp_path / "dvc.yaml").read_text() == (REPO / "dvc.yaml").read_text()


def test_repository_schema_is_current(tmp_path):
    run(["gpt2dist", "schema", "--out", str(tmp_path / "schema.json")], REPO)
    assert (tmp_path / "schema.json").read_text() == (REPO / "workflow/schemas/params.schema.json").read_text()


TRAINS = {f"train@{run}" for run in RUN_IDS}


def collect_again(study: Path, runs: Path, out: Path) -> dict:
    """`gpt2dist collect` of the study's runs in `runs` into `out`: its summary.json."""
    run(["gpt2dist", "collect", "--runs", str(runs), "--data", "data/tokens", "--out", str(out), "--preset", "cpu",
         "--gpus", "0", "--nodes", "1"], study)
    return json.loads((out / "summary.json").read_text())


def test_dvc_commit_push_pull_exp_run_and_metrics_diff(finished_copy, tmp_path_factory):
    # DVC's bookkeeping is under test, not the study: the finished one, recorded by `dvc commit` as if `dvc repro`
    # had run it (the same commands: test_snakemake_and_dvc_declare_the_same_stages; `dvc repro` running stages:
    # below, and test_resume_in_pipeline.py's)
    workdir = finished_copy
    params_path = workdir / "params.yaml"
    params = yaml.safe_load(params_path.read_text())
    run(["git", "init", "-q"], workdir)
    run(["git", "config", "user.email", "t@example.invalid"], workdir)
    run(["git", "config", "user.name", "test"], workdir)
    run(["dvc", "init", "-q"], workdir)
    (workdir / "src").symlink_to(REPO / "src")  # stage deps name the package's code
    run(["gpt2dist", "dvc-yaml"], workdir)
    run(["git", "add", "-A"], workdir)  # under the repository's .gitignore, as in a clone of it
    run(["git", "commit", "-qm", "study"], workdir)
    run(["dvc", "commit", "--force"], workdir)
    assert "up to date" in run(["dvc", "status"], workdir).stdout.lower() or not run(["dvc", "status"], workdir).stdout.strip()
    # every output is in DVC's cache or in git, none in neither: git holds only the two small views
    remote = tmp_path_factory.mktemp("remote")
    run(["dvc", "remote", "add", "-d", "store", str(remote)], workdir)
    run(["dvc", "push", "-q"], workdir)
    run(["git", "add", "-A"], workdir)
    run(["git", "commit", "-qm", "results"], workdir)
    in_git = set(run(["git", "ls-files", "results"], workdir).stdout.split())
    assert {"results/headline/ddp-fp32-n2.json", "results/loss_curves.csv"} <= in_git
    assert not [path for path in in_git if not path.startswith(("results/headline/", "results/loss_curves.csv"))
                and not path.endswith(".gitignore")]

    # a colleague's clone: pull, and neither tool trains anything (Snakemake after `--touch`, since
    # pulled files get new mtimes in no particular order)
    clone = tmp_path_factory.mktemp("clone") / "study"
    run(["git", "clone", "-q", str(workdir), str(clone)], workdir)
    assert (clone / "results" / "headline" / "single-fp32-n1.json").is_file() and not (clone / "results" / "runs").exists()
    run(["dvc", "pull", "-q"], clone)
    # the runs' event files, traces and kept checkpoints travelled, and a collect after the pull links the traces
    pulled = clone / "results" / "runs"
    assert {path.parent.name for path in pulled.glob(f"*/{EVENTS}")} == RUN_IDS
    assert {str(path.relative_to(pulled)) for path in pulled.glob("*/kept/[!.]*")} == {  # not Snakemake's timestamp
        *(f"{run}/kept/trace-rank{rank}.json.gz" for run in RUN_IDS for rank in range(1 + run.startswith("ddp"))),
        "single-fp32-n1-r0/kept/checkpoint.pt", "ddp-fp32-n2-r0/kept/checkpoint.pt"}
    assert set(collect_again(clone, pulled, tmp_path_factory.mktemp("recollected"))["traces"]) == {
        "single-fp32-n1", "ddp-fp32-n2"}
    # control: runs whose traces did not travel (as before they were the train stage's outputs) link none
    untraced = Path(shutil.copytree(pulled, tmp_path_factory.mktemp("untraced") / "runs"))
    for trace in untraced.glob("*/kept/trace-*"):
        trace.unlink()
    assert collect_again(clone, untraced, tmp_path_factory.mktemp("recollected"))["traces"] == {}
    assert not re.search(r"^Running stage", run(["dvc", "repro"], clone).stdout, re.M)
    run(["snakemake", "--touch", "--cores", "1"], clone)
    for target in ("figures", "all"):
        assert "Nothing to be done" in run(["snakemake", "-n", target], clone).stdout, target
    # a plotting change (in the clone's own copy of the code): plot re-runs, nothing before it; a comment changes no
    # pixel and the figures carry no date, so they come out the same bytes and report, which reads them, stays
    (clone / "src").unlink()
    shutil.copytree(REPO / "src", clone / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    with open(clone / "src" / "gpt2dist" / "results" / "plots.py", "a") as handle:
        handle.write("# a plotting change\n")
    assert re.findall(r"^Running stage '([^'@]+)", run(["dvc", "repro"], clone).stdout, re.M) == ["plot"]
    forced = job_counts(run(["snakemake", "-n", "figures", "--forcerun", "plot"], clone).stdout)
    assert forced == {"plot": 1, "report": 1, "figures": 1}, forced
    # stages depend on the code they import, found by reading imports (no list kept by hand): a change to a
    # module only training imports makes the selftests and runs stale, and one to config every stage
    code = clone / "src" / "gpt2dist"
    stops = (code / "training" / "stops.py").read_text()
    (code / "training" / "stops.py").write_text(stops + "# a change to code only training runs\n")
    stale = set(re.findall(r"^(\S+):", run(["dvc", "status"], clone).stdout, re.M))
    assert stale == {"selftest@single-fp32-n1", "selftest@ddp-fp32-n2", *TRAINS}, stale
    (code / "training" / "stops.py").write_text(stops)
    with open(code / "config" / "schema.py", "a") as handle:
        handle.write("# a change to code every stage runs\n")
    stale = set(re.findall(r"^(\S+):", run(["dvc", "status"], clone).stdout, re.M))
    assert stale >= {"prepare", *TRAINS, "collect", "plot", "report"}, stale

    # a training key changes every configuration's selftest and run (collect follows them); not prepare
    params["presets"]["cpu"]["train"]["lr"] = 1e-3
    params_path.write_text(yaml.safe_dump(params, sort_keys=False))
    stale = set(re.findall(r"^(\S+):", run(["dvc", "status"], workdir).stdout, re.M))
    run(["git", "checkout", "params.yaml"], workdir)
    assert stale == {"selftest@single-fp32-n1", "selftest@ddp-fp32-n2", *TRAINS}, stale

    # an experiment on a results key: collect and what follows re-run, no training
    before = json.loads((workdir / "results" / "summary.json").read_text())
    exp = run(["dvc", "exp", "run", "-S", "presets.cpu.study.excluded_steps=1"], workdir).stdout
    ran = re.findall(r"^Running stage '([^'@]+)", exp, re.M)
    assert ran == ["collect", "plot", "report"], exp
    after = json.loads((workdir / "results" / "summary.json").read_text())
    assert after["configs"]["ddp-fp32-n2"]["tokens_per_s"] != before["configs"]["ddp-fp32-n2"]["tokens_per_s"]
    diff = run(["dvc", "metrics", "diff", "--all"], workdir).stdout
    assert re.search(r"headline/ddp-fp32-n2.json\s+tokens_per_s", diff)
    assert "presets.cpu.study.excluded_steps" in run(["dvc", "params", "diff"], workdir).stdout
    shown = run(["dvc", "metrics", "show"], workdir).stdout.splitlines()  # one row per configuration
    assert len([line for line in shown if "headline/" in line]) == 2 and max(map(len, shown)) < 120, shown
    run(["dvc", "plots", "show", "--json"], workdir)


@pytest.mark.parametrize(
    "change, fragment",
    [
        (lambda s: s["runs"][0].update(strategies=["ring"]), "ring"),
        (lambda s: s.update(repeats=0), "repeats"),
        (lambda s: s["runs"].append({"strategies": ["dp"], "precisions": ["fp32"], "nproc": [2]}),
         "dp-fp32-n2: strategy 'dp' drives one device per --nproc; 2 requested but 0 CUDA GPUs"),
    ],
)
def test_bad_params_stop_before_any_job(workdir, change, fragment):
    params = yaml.safe_load((workdir / "params.yaml").read_text())
    change(params["presets"]["cpu"]["study"])
    (workdir / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    result = run(["snakemake", "--cores", "2"], workdir, check=False)
    assert result.returncode != 0 and fragment in result.stdout + result.stderr
    assert not (workdir / "data").exists() and not (workdir / "results").exists()


def test_a_fresh_clone_under_dvc_runs_the_whole_study_and_shows_the_reference_numbers(tmp_path):
    """The README's DVC walkthrough on a clone of this repository: no lock claims a study, so every stage of the
    committed dvc.yaml runs, and `dvc metrics show` reads the reference study's committed headline meanwhile."""
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(REPO), str(clone)], tmp_path)
    # the committed dvc.yaml is the cpu study's as the code plans it now
    run(["gpt2dist", "dvc-yaml", "--preset", "cpu", "--gpus", "0", "--out", str(tmp_path / "dvc.yaml")], clone)
    assert (tmp_path / "dvc.yaml").read_text() == (clone / "dvc.yaml").read_text()
    stages = yaml.safe_load((clone / "dvc.yaml").read_text())["stages"]
    expected = sum(len(stage["foreach"]) if "foreach" in stage else 1 for stage in stages.values())
    stale = set(re.findall(r"^(\S+):$", run(["dvc", "status"], clone).stdout, re.M))
    assert len(stale) == expected and "train@single-fp32-n1-r0" in stale, sorted(stale)[:5]
    shown = run(["dvc", "metrics", "show"], clone).stdout
    committed = sorted(p.stem for p in (clone / "results" / "headline").iterdir())
    assert committed and all(f"results/headline/{config}.json" in shown for config in committed), shown
