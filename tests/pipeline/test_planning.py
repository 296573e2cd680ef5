"""Planning a GPU study on a host without GPUs (a cluster's login node): the GPUs per node come
from the user (`--config gpus_per_node=N`, params.yaml, `--gpus`), never from the planning host.
This machine has no GPU, so every test here is that situation for real."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace

import pytest
import torch
import yaml

from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.jobs import figures
from gpt2dist.pipeline.study import plan_study, resume_cases

from conftest import REPO, gpt2dist, train_args
from reduced_study import copy_workflow, run

pytestmark = pytest.mark.slow

# the paper preset's configurations at 1, 2, 4 and 8 GPUs
PAPER_CONFIGURATIONS = len({run.config_id for run in plan_study(load_params(REPO / "params.yaml"), "paper", 8).runs})


def resources(dry_run: str) -> dict[str, dict[str, str]]:
    """run id -> its train job's resources, from `snakemake -n` output (runs across nodes have a rule of their own)."""
    found = {}
    for block in re.split(r"rule train(?:_across_nodes)?:", dry_run)[1:]:
        run_id = re.search(r"wildcards: run=(\S+)", block)[1]
        found[run_id] = dict(item.split("=", 1) for item in re.search(r"resources: (.*)", block)[1].split(", "))
    return found


def test_snakemake_plans_the_paper_study_for_the_gpus_the_user_names(tmp_path):
    work = copy_workflow(tmp_path)
    planned = run(["snakemake", "-n", "-p", "--config", "gpus_per_node=8", "preset=paper"], work).stdout
    jobs = resources(planned)
    assert len(jobs) == PAPER_CONFIGURATIONS * 3
    assert jobs["ddp-bf16-n8-r0"]["gres"] == "gpu:8" and jobs["ddp-bf16-n8-r0"]["tasks"] == "8"
    assert jobs["dp-fp32-n8-r0"]["gres"] == "gpu:8" and jobs["dp-fp32-n8-r0"]["tasks"] == "1"  # one process drives 8
    assert jobs["single-fp32-n1-r0"]["runtime"] == "180"  # the preset's study.train_runtime_min
    assert "--preset paper" in planned and "--gpus 8 --nodes 1" in planned  # collect plans the same study later
    selftests = re.findall(r"rule selftest:.*?wildcards: config=(\S+).*?resources: .*?gres=(\S+)", planned, re.S)
    assert len(selftests) == PAPER_CONFIGURATIONS and ("ddp-bf16-n8", "gpu:8") in selftests
    # the paper preset's 2-node runs need a cluster of 2: dropped on one node, saying why
    assert "ddp-bf16-n8-2nodes, fsdp-bf16-n8-2nodes" in planned_stderr(work, "gpus_per_node=8", "preset=paper")

    fewer = run(["snakemake", "-n", "--config", "gpus_per_node=2", "preset=paper"], work)
    two_gpus = plan_study(load_params(work / "params.yaml"), "paper", 2)
    assert set(resources(fewer.stdout)) == {run.run_id for run in two_gpus.runs}
    assert max(run.nproc for run in two_gpus.runs) == 2
    assert "dp-fp32-n4, ddp-fp32-n4" in fewer.stderr and "(4 processes per node, a node has 2 GPUs)" in fewer.stderr


def planned_stderr(work, *config: str) -> str:
    return run(["snakemake", "-n", "--config", *config], work).stderr


def test_a_cluster_of_gpu_nodes_is_planned_from_a_host_without_gpus(tmp_path):
    """2 nodes x 8 GPUs, planned here (no GPU) with the repository's SLURM profile: a 2-node run is one job of 2
    nodes with 4 tasks and 4 GPUs on each, whose command spreads it over them, and so is its selftest; one-node
    runs stay one node; every later stage plans the same cluster."""
    work = copy_workflow(tmp_path)
    planned = run(["snakemake", "-n", "-p", "--profile", "workflow/profiles/slurm", "--config", "preset=paper",
                   "gpus_per_node=8", "nodes=2"], work).stdout
    jobs = resources(planned)
    slurm = ("nodes", "tasks", "tasks_per_node", "gres", "mpi")
    assert {k: jobs["horovod-apex-O1-n8-2nodes-r0"][k] for k in slurm} == {
        "nodes": "2", "tasks": "0", "tasks_per_node": "4", "gres": "gpu:4", "mpi": "srun"}
    assert {k: jobs["ddp-bf16-n8-r0"][k] for k in slurm} == {
        "nodes": "1", "tasks": "8", "tasks_per_node": "0", "gres": "gpu:8", "mpi": "srun"}
    assert {k: jobs["single-fp32-n1-r0"][k] for k in slurm} == {
        "nodes": "1", "tasks": "1", "tasks_per_node": "0", "gres": "gpu:1", "mpi": ""}
    assert jobs["ddp-bf16-n8-2nodes-r2"]["runtime"] == "180" and len(jobs) == (PAPER_CONFIGURATIONS + 5) * 3
    command = re.search(r"gpt2dist train [^\n]*--out results/runs/fsdp-bf16-n8-2nodes-r1 [^\n]*", planned)[0]
    assert "--strategy fsdp --precision bf16 --nproc 8 " in command and " --nodes 2 " in command
    selftest = re.search(r"wildcards: config=apex-ddp-apex-O2-n8-2nodes\n.*?resources: ([^\n]*)", planned, re.S)[1]
    assert "nodes=2" in selftest and "tasks_per_node=4" in selftest and "gres=gpu:4" in selftest
    assert "gpt2dist collect --runs results/runs --data data/tokens --out results --params params.yaml --preset paper " \
           "--gpus 8 --nodes 2" in planned


def test_a_gpu_study_on_a_host_without_gpus_needs_their_count_said(tmp_path, shards):
    """This host has no GPU: planning the paper preset from what it sees would make a CPU study of GPT-2 small."""
    work = copy_workflow(tmp_path)
    refused = run(["snakemake", "-n", "--config", "preset=paper"], work, check=False)
    assert refused.returncode != 0 and "preset 'paper' is a study for GPU nodes and this host has none" in refused.stderr
    on_purpose = run(["snakemake", "-n", "--config", "preset=patwardhan2024", "gpus_per_node=0"], work)
    assert "rule train" in on_purpose.stdout  # 0 said: a CPU study of it, as asked
    trained = gpt2dist("train", "--data", shards, "--out", tmp_path / "run", "--params", work / "params.yaml",
                       "--preset", "patwardhan2024", "--strategy", "ddp", "--nproc", "2", check=False)
    assert trained.returncode == 2 and trained.stderr.strip().splitlines() == [
        "error: preset 'patwardhan2024' is a study for GPU nodes and this machine has no CUDA GPU; train it on a GPU "
        "node (print its commands for other machines with --hosts and --gpus), or choose a CPU preset such as cpu"]
    assert not (tmp_path / "run").exists()


def test_the_papers_presets_plan_on_a_login_node_without_gpus(tmp_path):
    """Bai 2022's six rows on its 4 GPUs per node, Patwardhan et al.'s five on 2: every run a job with the
    GPUs and tasks its strategy needs, planned on this machine without a GPU."""
    work = copy_workflow(tmp_path)
    bai = resources(run(["snakemake", "-n", "--config", "gpus_per_node=4", "preset=bai2022"], work).stdout)
    assert len(bai) == 6 * 3
    assert bai["apex-ddp-apex-O2-n4-r0"]["tasks"] == "4" and bai["apex-ddp-apex-O2-n4-r0"]["gres"] == "gpu:4"
    assert bai["horovod-apex-O1-n4-r2"]["tasks"] == "4" and bai["dp-fp32-n4-r0"]["tasks"] == "1"
    patwardhan = resources(run(["snakemake", "-n", "--config", "gpus_per_node=2", "preset=patwardhan2024"],
                               work).stdout)
    assert {run_id.rsplit("-", 2)[0] for run_id in patwardhan} == {"single-fp32", "ddp-fp32", "fsdp-fp32",
                                                                   "tp-fp32", "pp-fp32"}
    assert patwardhan["pp-fp32-n2-r1"]["tasks"] == "2" and patwardhan["tp-fp32-n2-r0"]["gres"] == "gpu:2"


def test_the_two_node_study_runs_each_link_on_emulated_nodes(tmp_path):
    """two-node-cpu: ddp, fsdp and horovod on one machine and on 2 emulated nodes at 3 link bandwidths; every
    link run's train and selftest command puts it on its nodes, and the links figure is planned."""
    work = copy_workflow(tmp_path)
    planned = run(["snakemake", "-n", "-p", "--config", "preset=two-node-cpu"], work).stdout
    jobs = resources(planned)
    repeats = yaml.safe_load((work / "params.yaml").read_text())["presets"]["cpu"]["study"]["repeats"]
    assert len(jobs) == (1 + 3 + 3 * 3) * repeats  # two-node-cpu extends cpu: the reduced cpu's repeats hold
    command = re.search(r"gpt2dist train [^\n]*--out results/runs/fsdp-fp32-n2-2nodes-50mbit-r1 [^\n]*", planned)[0]
    assert "--nproc 2" in command and "--emulate-nodes 2 --link-mbit 50" in command
    assert "--emulate-nodes" not in re.search(r"gpt2dist train [^\n]*--out results/runs/ddp-fp32-n2-r0 [^\n]*",
                                              planned)[0]
    assert "results/figures/links.png" in planned and "results/link_model.csv" in planned
    with pytest.raises(Exception, match="emulated nodes .* train on CPU"):
        plan_study(load_params(work / "params.yaml"), "two-node-cpu", 2)


def test_the_links_figure_is_planned_where_the_link_model_has_its_one_machine_runs():
    """The links figure sets each run on a shaped link beside its configuration on one machine: a study of emulated
    nodes alone (a tune's there) plans none, as plot draws none; the control, two-node-cpu, plans it."""
    two_nodes = plan_study(load_params(REPO / "params.yaml"), "two-node-cpu", 0)
    assert "links" in figures(two_nodes)
    alone = replace(two_nodes, runs=[run for run in two_nodes.runs if run.nodes > 1])
    assert alone.runs and "links" not in figures(alone)


def test_the_resume_case_stays_when_a_larger_process_count_joins_the_study(params_file, tmp_path):
    """Its selftest command carries --resume: were the choice to move, finished runs would re-train."""
    params = yaml.safe_load(params_file.read_text())
    runs = params["presets"]["tiny"]["study"]["runs"]
    before = {run.config_id for run in resume_cases(plan_study(load_params(params_file), None, 0))}
    runs.append({"strategies": ["ddp"], "precisions": ["fp32", "bf16"], "nproc": [1, 4]})
    grown = tmp_path / "params.yaml"
    grown.write_text(yaml.safe_dump(params))
    assert before == {run.config_id for run in resume_cases(plan_study(load_params(grown), None, 0))} == \
        {"single-fp32-n1", "ddp-fp32-n2"}


def test_gpus_per_node_in_params_reaches_dvc_yaml_and_train_hosts(params_file, shards, tmp_path):
    params = yaml.safe_load(params_file.read_text()) | {"gpus_per_node": 4}
    gpu_params = tmp_path / "params.yaml"
    gpu_params.write_text(yaml.safe_dump(params))
    stages = tmp_path / "dvc.yaml"
    gpt2dist("dvc-yaml", "--params", gpu_params, "--out", stages)
    collect = yaml.safe_load(stages.read_text())["stages"]["collect"]["cmd"]
    assert "--gpus 4" in collect
    # commands for other machines describe those machines' GPUs, not this CPU-only host's
    one_row = ("--set", "train.micro_batch_size=1")  # 8 processes, one sequence each: the global batch of 8
    gpt2dist(*train_args(shards, gpu_params, tmp_path / "run", "ddp", "--hosts", "gpu-a:4,gpu-b:4", *one_row, nproc=8))
    assert json.loads((tmp_path / "run" / "spec.json").read_text())["device"] == "cuda"
    gpt2dist(*train_args(shards, params_file, tmp_path / "cpu-run", "ddp", "--hosts", "a:2,b:2", "--gpus", "0", nproc=4))
    assert json.loads((tmp_path / "cpu-run" / "spec.json").read_text())["device"] == "cpu"
    gpt2dist(*train_args(shards, params_file, tmp_path / "said", "ddp", "--hosts", "gpu-a:4,gpu-b:4", "--gpus", "4",
                         *one_row, nproc=8))
    assert json.loads((tmp_path / "said" / "spec.json").read_text())["device"] == "cuda"


@pytest.mark.parametrize(("hosts", "gpus", "expected"), [
    # the control of the case above: nothing says what the other machines have, and this host has no GPUs
    ("gpu-a:4,gpu-b:4", [], "this one has no GPUs to go by: give their GPUs per host with --gpus N"),
    ("gpu-a:8,gpu-b:8", ["--gpus", "4"], "gives gpu-a 8 processes but each host has 4 GPUs"),
    ("gpu-a:4", ["--gpus", "-1"], "Invalid value for '--gpus': -1 is below 0; it must be at least 0"),
])
def test_hosts_of_unknown_or_too_few_gpus_are_refused(hosts, gpus, expected, params_file, shards, tmp_path):
    without_gpus = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # a login node, whatever runs the test
    slots = sum(int(host.split(":")[1]) for host in hosts.split(","))
    result = gpt2dist(*train_args(shards, params_file, tmp_path, "ddp", "--hosts", hosts, *gpus, nproc=slots), check=False,
                      env=without_gpus)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], \
        result.stderr
    assert not (tmp_path / "spec.json").exists()


def test_gpus_without_hosts_is_refused(params_file, shards, tmp_path):
    result = gpt2dist(*train_args(shards, params_file, tmp_path, "ddp", "--gpus", "8"), check=False)
    assert result.returncode == 2 and "--gpus describes the --hosts machines" in result.stderr


@pytest.mark.skipif(torch.version.cuda is not None, reason="torch here is a CUDA build; the check is of a CPU-only one")
def test_doctor_names_a_cpu_only_torch_for_a_gpu_study():
    result = gpt2dist("doctor", "--gpus", "8", "--preset", "paper", "--params", REPO / "params.yaml", check=False)
    assert result.returncode == 2
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("error:") and "a CUDA build of torch" in error
    assert f"needed by all {PAPER_CONFIGURATIONS} configurations" in error


def test_the_workflow_passes_snakemakes_lint(tmp_path):
    """Every rule in a container, helpers in rules/common.smk: `snakemake --lint` finds nothing. The control: a
    copy whose plot rule names no container is flagged for it."""
    clean = run(["snakemake", "--lint"], REPO, check=False)
    assert clean.returncode == 0 and "Lints for" not in clean.stdout + clean.stderr, clean.stdout[-3000:]
    work = copy_workflow(tmp_path)
    plot = work / "workflow" / "rules" / "plot.smk"
    plot.write_text(re.sub(r"\n    container:\n.*\n", "\n", plot.read_text()))
    flagged = run(["snakemake", "--lint"], work, check=False)
    assert flagged.returncode != 0 and "Lints for rule plot" in flagged.stdout + flagged.stderr
