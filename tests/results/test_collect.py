"""Summary statistics: intervals that stay in their domain, speedups paired by repeat round, which
run a speedup is measured against, and disturbed runs kept out of every number and claim."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from gpt2dist.config.schema import StudyConfig
from gpt2dist.errors import UsageError
from gpt2dist.pipeline.run import parse_run_id
from gpt2dist.pipeline.study import plan_study
from gpt2dist.results import per_run
from gpt2dist.results.summarise import SUMMARISED, baseline_of, in_study_order, summarise
from gpt2dist.results.disturbance import conditions_of, disturbance, foreign_share_while_steady, outliers
from gpt2dist.results.findings import CONTRADICTED, NOISE, SUPPORTED, UNTESTABLE, check_claims
from gpt2dist.forecast.link_model import predicted_vs_measured
from gpt2dist.config.presets import load_params
from gpt2dist.results.statistics import log_interval, paired_ratio, ratio_text, verdict

from conftest import REPO


def runs_table(rates: dict[str, list[float]], disturbed: dict[str, str] | None = None, **columns) -> pd.DataFrame:
    """Per-run rows as collect.per_run makes them: every summarised metric = the run's rate."""
    rows = []
    for config, per_round in rates.items():
        for repeat, rate in enumerate(per_round):
            run = parse_run_id(f"{config}-r{repeat}")
            rows.append({"config_id": config, "strategy": run.strategy, "precision": run.precision,
                         "nproc": run.nproc, "nodes": run.nodes, "link_mbit": run.link_mbit or math.nan,
                         "emulated": run.nodes > 1,  # a cluster's nodes: pass emulated={config: False}
                         **({"size": run.size} if run.size else {}),  # a study of sizes: every config has one
                         "repeat": repeat, "run_id": run.run_id,
                         **dict.fromkeys(SUMMARISED, rate), "param_bytes": 1.0, "grad_bytes": 1.0,
                         "optimizer_bytes": 2.0, "predicted_model_state_bytes": 4.0, "steps_to_target": 10.0,
                         "comm_bytes_per_step": 0.0, "link_bytes_per_step": math.nan,
                         "grad_accum_steps": 1, "backend": "gloo", "busbw_gb_s": math.nan, "hardware": "CPU",
                         "disturbed": (disturbed or {}).get(run.run_id, ""),
                         **{k: v[config] if isinstance(v, dict) else v for k, v in columns.items()}})
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def study():
    return plan_study(load_params(REPO / "params.yaml"), "cpu", 0)


def test_throughput_intervals_never_leave_the_positive_numbers():
    # the case: one starved repeat among steady ones gave "5,095 (-4,921 to 18,524)"
    centre, low, high = log_interval([14_700, 15_100, 1_200])
    assert 0 < low < centre < high
    assert log_interval([5.0, 5.0, 5.0]) == pytest.approx((5.0, 5.0, 5.0))
    one = log_interval([7.0])
    assert one[0] == pytest.approx(7.0) and math.isnan(one[1]) and math.isnan(one[2])


def test_speedup_pairs_rounds_so_a_slow_round_cancels():
    # round 1 was slow for both: unpaired, the spread hides a 2x speedup; paired, it is plain
    fast = pd.Series([200.0, 100.0, 202.0], index=[0, 1, 2])
    base = pd.Series([100.0, 50.0, 100.0], index=[0, 1, 2])
    ratio, low, high, pairs = paired_ratio(fast, base)
    assert pairs == 3 and ratio == pytest.approx(2.0, rel=0.01) and 1.9 < low < high < 2.1
    assert verdict(low, high, pairs) == "faster"
    assert verdict(0.8, 1.3, 3) == "not distinguishable" and verdict(0.5, 0.9, 3) == "slower"
    assert verdict(*paired_ratio(fast.iloc[:1], base)[1:3], 1) == "too few repeats"


def _row(strategy: str, precision: str, nproc: int = 2, nodes: int = 1, emulated: bool = False) -> dict:
    return {"strategy": strategy, "precision": precision, "nproc": nproc, "nodes": nodes, "emulated": emulated}


def test_baseline_is_the_one_process_run_of_the_same_precision():
    configs = {"single-fp32-n1", "ddp-apex-O1-n1", "ddp-apex-O1-n2", "horovod-fp16-n2", "ddp-bf16-n4"}
    assert baseline_of(_row("ddp", "fp32"), configs) == "single-fp32-n1"
    assert baseline_of(_row("ddp", "apex-O1"), configs) == "ddp-apex-O1-n1"  # no single apex run: ddp's own n=1
    assert baseline_of(_row("horovod", "apex-O1"), configs) is None  # never another strategy's or precision's
    assert baseline_of(_row("horovod", "fp16"), configs) is None  # never fp32: that would count fp16's gain as scaling
    # across a cluster's nodes: the same strategy on one node with as many processes per node
    assert baseline_of(_row("ddp", "bf16", nproc=8, nodes=2), configs) == "ddp-bf16-n4"
    assert baseline_of(_row("ddp", "fp32", nproc=2, nodes=2, emulated=True), configs) == "single-fp32-n1"


def test_across_a_clusters_nodes_speedup_is_over_one_node_and_efficiency_per_node(study):
    rates = {"single-bf16-n1": [100.0, 100.0], "ddp-bf16-n4": [380.0, 380.0], "ddp-bf16-n8-2nodes": [608.0, 608.0]}
    summary = summarise(runs_table(rates, emulated=False), study, None).set_index("config_id")
    across = summary.loc["ddp-bf16-n8-2nodes"]
    assert across["baseline"] == "ddp-bf16-n4" and across["speedup"] == pytest.approx(1.6)
    assert across["scaling_efficiency"] == pytest.approx(0.8)  # 1.6 over 2 nodes, not over 8 processes
    assert summary.loc["ddp-bf16-n4", "scaling_efficiency"] == pytest.approx(0.95)  # 3.8 over 4 processes


def test_runs_from_different_hardware_are_not_compared_unless_asked():
    runs = runs_table({"single-fp32-n1": [100.0, 100.0], "ddp-fp32-n2": [190.0, 190.0]})
    per_run.refuse_mixed_hardware(runs)  # one kind of machine: nothing to say
    mixed = runs.assign(hardware=["NVIDIA H100 80GB HBM3 (NVLink)", "NVIDIA H100 80GB HBM3 (NVLink)",
                                  "NVIDIA A100-SXM4-80GB (NVLink)", "NVIDIA H100 80GB HBM3 (NVLink)"])
    with pytest.raises(UsageError, match=r"different hardware \(NVIDIA A100-SXM4-80GB \(NVLink\): ddp-fp32-n2-r0; "
                                         r"NVIDIA H100 80GB HBM3 \(NVLink\): .*--mixed-hardware"):
        per_run.refuse_mixed_hardware(mixed)


def test_hardware_is_the_device_model_and_how_gpus_are_linked():
    cpu = {"devices": {"cpu": "AMD EPYC 7B13", "gpus": []}}
    assert per_run.hardware_of(cpu) == "AMD EPYC 7B13"
    topology = "\tGPU0\tGPU1\nGPU0\t X \tNV18\nGPU1\tNV18\t X \n"
    h100 = {"devices": {"cpu": "x", "gpus": ["NVIDIA H100 80GB HBM3"] * 2, "topology": topology}}
    assert per_run.hardware_of(h100) == "NVIDIA H100 80GB HBM3 (NVLink)"
    pcie = {"devices": {**h100["devices"], "topology": topology.replace("NV18", "PIX")}}
    assert per_run.hardware_of(pcie) == "NVIDIA H100 80GB HBM3 (PCIe)"
    # every node's devices count, not only rank 0's
    two = {**h100, "node_hardware": [{"devices": {"NVIDIA H100 80GB HBM3": 4}}, {"devices": {"NVIDIA H200": 4}}]}
    assert per_run.hardware_of(two) == "NVIDIA H100 80GB HBM3 + NVIDIA H200 (NVLink)"


def test_summary_says_when_there_is_no_baseline(study):
    rates = {"single-fp32-n1": 100.0, "ddp-fp32-n2": 180.0, "ddp-apex-O1-n1": 300.0, "ddp-apex-O1-n2": 540.0,
             "horovod-fp16-n2": 400.0}
    summary = summarise(runs_table({c: [r, r] for c, r in rates.items()}), study, None).set_index("config_id")
    assert summary.loc["ddp-fp32-n2", "speedup"] == pytest.approx(1.8)
    assert summary.loc["ddp-apex-O1-n2", "speedup"] == pytest.approx(1.8)
    assert summary.loc["ddp-apex-O1-n1", "scaling_efficiency"] == pytest.approx(1.0)  # not 3.0: fp16 is no scaling
    assert summary.loc["horovod-fp16-n2", "vs_baseline"] == "no baseline"
    assert math.isnan(summary.loc["horovod-fp16-n2", "speedup"])


def test_disturbed_runs_are_left_out_and_marked(study):
    rates = {"single-fp32-n1": [100.0, 30.0, 101.0], "ddp-fp32-n2": [190.0, 188.0, 192.0]}
    runs = runs_table(rates, disturbed={"single-fp32-n1-r1": "other processes used 50% of its CPUs"})
    summary = summarise(runs, study, None).set_index("config_id")
    single = summary.loc["single-fp32-n1"]
    assert single["repeats"] == 2 and single["disturbed_runs"] == 1 and not single["from_disturbed"]
    assert single["tokens_per_s_ci_low"] > 90  # the starved repeat does not drag the interval down
    # paired over the two rounds both have undisturbed, not round 1's 188/30 = 6x
    assert summary.loc["ddp-fp32-n2", "speedup"] == pytest.approx(1.9, rel=0.01)
    assert summary.loc["ddp-fp32-n2", "speedup_pairs"] == 2


def test_an_outlier_is_flagged_either_way_and_repeats_that_merely_disagree_are_not():
    rates = {"single-fp32-n1": [100.0, 104.0, 160.0], "ddp-fp32-n2": [100.0, 60.0, 98.0],
             "fsdp-fp32-n2": [100.0, 125.0, 150.0], "tp-fp32-n2": [100.0, 300.0]}
    found = outliers(runs_table(rates), 0.3).set_axis(runs_table(rates)["run_id"])
    # a planted fast run: 57% above the median of the other two, which agree within 4%
    assert found["single-fp32-n1-r2"] == ("an outlier: 1.57x faster than the median of its configuration's other "
                                          "runs (102 tokens/s; limit 1.30x either way)")
    # slower, as a ratio too: the median of the others (99) is 1.65 times it
    assert found["ddp-fp32-n2-r1"].startswith("an outlier: 1.65x slower than the median")
    # the controls: three repeats spread evenly (no run twice as far out as the others' spread), two repeats
    # (no others to judge by), and the remaining runs of the flagged configurations
    flagged = {run for run, why in found.items() if why}
    assert flagged == {"single-fp32-n1-r2", "ddp-fp32-n2-r1"}, found
    # a run already disturbed is not one of the others a run is judged by
    table = runs_table(rates, disturbed={"single-fp32-n1-r0": "other processes used 50% of its CPUs"})
    found = outliers(table, 0.3).set_axis(table["run_id"])
    assert {run for run, why in found.items() if why} == {"ddp-fp32-n2-r1"}


def test_a_configuration_with_only_disturbed_runs_says_so(study):
    runs = runs_table({"single-fp32-n1": [100.0, 90.0], "ddp-fp32-n2": [190.0, 180.0]},
                      disturbed={"ddp-fp32-n2-r0": "x", "ddp-fp32-n2-r1": "y"})
    summary = summarise(runs, study, None).set_index("config_id")
    assert summary.loc["ddp-fp32-n2", "from_disturbed"] and summary.loc["ddp-fp32-n2", "repeats"] == 2
    assert summary.loc["ddp-fp32-n2", "vs_baseline"] == "only disturbed runs"  # a number, but no verdict


def test_disturbance_names_every_reason_and_ignores_what_was_not_recorded():
    limits = StudyConfig(runs=[{"strategies": ["single"], "precisions": ["fp32"], "nproc": [1]}])
    steady = pd.DataFrame({"step_time_s": [0.10, 0.10, 0.11, 0.30, 0.10], "cpu_time_s": [0.1] * 5,
                           "clock_event_reasons": [0, 0, 0x40, 0, 0]})
    record = {"strategy": "single", "conditions": {"foreign_cpu_share": [0.45, 0.45]}, "threads": {"torch": 2},
              "placement": {"device": "cpu"}}
    measures = conditions_of(record, steady)
    assert measures["cpu_share"] == pytest.approx(0.5)
    why = disturbance(measures, limits)
    assert "other processes used 45%" in why and "rank 0 got 50%" in why and "GPU slowed itself" in why
    # 4 ranks of a thread each on 2 cores get half each by the machine's count, not starved; the control: the same
    # half for 2 ranks on those cores is
    crowded = {**record, "threads": {"torch": 1, "cpu_affinity": [0, 1]}, "nproc": 4,
               "node_hardware": [{"host": "vm", "ranks": 4}]}
    assert conditions_of(crowded, steady.assign(cpu_time_s=0.05))["cpu_share"] == pytest.approx(1.0)
    alone = {**crowded, "nproc": 2, "node_hardware": [{"host": "vm", "ranks": 2}]}
    assert conditions_of(alone, steady.assign(cpu_time_s=0.05))["cpu_share"] == pytest.approx(0.5)
    # an old record without conditions, steady steps: nothing to flag, nothing invented
    quiet = conditions_of({"strategy": "single", "placement": {"device": "cpu"}}, steady.assign(step_time_s=0.1).drop(columns=[
        "cpu_time_s", "clock_event_reasons"]))
    assert disturbance(quiet, limits) == ""


def test_only_load_samples_during_the_measured_steps_count():
    # start-up (first sample) was busy, the steps themselves (t = 101.0 to 103.0) were quiet
    conditions = {"foreign_cpu_share": [0.9, 0.0, 0.02, 0.01], "sample_ends_unix_s": [100.0, 101.0, 102.0, 103.0],
                  "interval_s": 1.0}
    steady = pd.DataFrame({"end_unix_s": [101.5, 102.0, 102.5, 103.0], "step_time_s": [0.5] * 4})
    assert foreign_share_while_steady(conditions, steady) == pytest.approx(0.015)  # the samples ending 102, 103
    assert foreign_share_while_steady(conditions, steady.drop(columns="end_unix_s")) == pytest.approx(0.2325)


def findings(runs: pd.DataFrame, study) -> dict[str, dict]:
    summary = summarise(runs, study, None)
    return {f["claim"]: f for f in check_claims(runs, summary, predicted_vs_measured(summary))}


def test_claims_get_verdicts_from_the_intervals(study):
    clear = runs_table({"single-fp32-n1": [100.0, 101.0, 99.0], "ddp-fp32-n2": [190.0, 192.0, 189.0],
                        "fsdp-fp32-n2": [150.0, 151.0, 149.0], "horovod-fp32-n2": [170.0, 171.0, 169.0]},
                       model_state_bytes={"single-fp32-n1": 4.0, "ddp-fp32-n2": 4.0, "fsdp-fp32-n2": 2.0,
                                          "horovod-fp32-n2": 4.0})
    verdicts = {k: f["verdict"] for k, f in findings(clear, study).items()}
    assert verdicts["bai-ddp-fastest-fp32"] == SUPPORTED
    assert verdicts["patwardhan-fsdp-memory"] == SUPPORTED
    assert verdicts["patwardhan-ddp-between"] == CONTRADICTED  # fsdp < ddp and single < ddp: not between
    faster_fsdp = clear.assign(tokens_per_s=clear["tokens_per_s"].where(clear["strategy"] != "fsdp", 250.0))
    assert findings(faster_fsdp, study)["patwardhan-ddp-between"]["verdict"] == SUPPORTED
    assert verdicts["bai-ddp-apex-fastest"] == UNTESTABLE and verdicts["bai-sublinear-nodes"] == UNTESTABLE
    noisy = clear.assign(tokens_per_s=clear["tokens_per_s"] * clear["repeat"].map({0: 1.0, 1: 1.6, 2: 0.7})
                         .where(clear["strategy"] == "ddp", 1.0))
    assert findings(noisy, study)["bai-ddp-fastest-fp32"]["verdict"] == NOISE
    slower = clear.assign(tokens_per_s=clear["tokens_per_s"].where(clear["strategy"] != "ddp", 120.0))
    assert findings(slower, study)["bai-ddp-fastest-fp32"]["verdict"] == CONTRADICTED


def test_fsdp_memory_claim_needs_ranks_to_shard_over(study):
    """A one-GPU study ran FSDP on one rank, which holds the whole model like every other strategy there: the H200's
    study called the claim contradicted. With one rank it is untestable; the control, two ranks, still judges it."""
    alone = {"single-bf16-n1": [100.0, 101.0], "ddp-bf16-n1": [99.0, 100.0], "fsdp-bf16-n1": [90.0, 91.0]}
    whole = dict.fromkeys(alone, 4.0)
    found = findings(runs_table(alone, model_state_bytes=whole), study)["patwardhan-fsdp-memory"]
    assert found["verdict"] == UNTESTABLE and "2 or more processes" in found["statistic"], found
    pairs = {"single-fp32-n1": [100.0, 101.0], "ddp-fp32-n2": [190.0, 191.0], "fsdp-fp32-n2": [150.0, 151.0]}
    state = {"single-fp32-n1": 4.0, "ddp-fp32-n2": 4.0, "fsdp-fp32-n2": 4.0}
    judged = findings(runs_table(pairs, model_state_bytes=state), study)["patwardhan-fsdp-memory"]
    assert judged["verdict"] == CONTRADICTED


def test_a_study_of_nodes_alone_leaves_the_one_machine_claims_untestable(study):
    """A tune on emulated nodes measures no configuration on one machine: the claims about one node are untestable
    there (they once ended collect with a traceback); the control, the same with a one-machine run, judges them."""
    rates = {"ddp-fp32-n2-2nodes-10mbit": [100.0, 101.0, 99.0], "fsdp-fp32-n2-2nodes-10mbit": [60.0, 61.0, 59.0]}
    verdicts = {claim: found["verdict"] for claim, found in findings(runs_table(rates), study).items()}
    assert verdicts["bai-ddp-fastest-fp32"] == verdicts["bai-ddp-apex-fastest"] == UNTESTABLE, verdicts
    rates |= {"ddp-fp32-n2": [190.0, 192.0, 189.0], "fsdp-fp32-n2": [150.0, 151.0, 149.0]}
    assert findings(runs_table(rates), study)["bai-ddp-fastest-fp32"]["verdict"] == SUPPORTED


def test_disturbed_runs_cannot_make_a_claim_supported(study):
    # Negative control: ddp "beats" horovod only because every horovod run was starved.
    rates = {"ddp-fp32-n2": [190.0, 191.0, 189.0], "horovod-fp32-n2": [60.0, 62.0, 61.0],
             "fsdp-fp32-n2": [150.0, 151.0, 149.0], "single-fp32-n1": [100.0, 101.0, 99.0]}
    starved = {f"horovod-fp32-n2-r{r}": "other processes used 60% of its CPUs" for r in range(3)}
    assert findings(runs_table(rates), study)["bai-ddp-fastest-fp32"]["verdict"] == SUPPORTED  # if not flagged
    careful = findings(runs_table(rates, disturbed=starved), study)["bai-ddp-fastest-fp32"]
    assert careful["verdict"] == UNTESTABLE and "horovod-fp32-n2" in careful["statistic"]


def test_tensor_parallel_claim_needs_less_memory_and_lower_throughput(study):
    rates = {"single-fp32-n1": [100.0, 101.0, 99.0], "ddp-fp32-n2": [190.0, 192.0, 189.0],
             "tp-fp32-n2": [120.0, 121.0, 119.0]}
    state = {"single-fp32-n1": 4.0, "ddp-fp32-n2": 4.0, "tp-fp32-n2": 2.5}
    trade = findings(runs_table(rates, model_state_bytes=state), study)
    assert trade["patwardhan-tp-memory"]["verdict"] == SUPPORTED, trade["patwardhan-tp-memory"]
    assert "tp-fp32-n2/ddp-fp32-n2 = 0.62" in trade["patwardhan-tp-memory"]["statistic"]
    # model parallelism is no rival in Bai 2022's data-parallel claims
    assert "tp-" not in trade["bai-ddp-fastest-fp32"]["statistic"]
    no_saving = findings(runs_table(rates, model_state_bytes={**state, "tp-fp32-n2": 4.0}), study)
    assert no_saving["patwardhan-tp-memory"]["verdict"] == CONTRADICTED
    assert findings(runs_table({"single-fp32-n1": [1.0, 1.0]}), study)["patwardhan-tp-memory"]["verdict"] == UNTESTABLE


def test_bai_ddp_with_apex_is_apex_ddp_where_the_study_has_it(study):
    rates = {"ddp-fp32-n4": [100.0, 101.0, 99.0], "ddp-apex-O1-n4": [150.0, 151.0, 149.0],
             "apex-ddp-apex-O2-n4": [300.0, 301.0, 299.0], "horovod-fp32-n4": [90.0, 91.0, 89.0],
             "horovod-apex-O1-n4": [270.0, 271.0, 269.0]}
    found = findings(runs_table(rates, model_state_bytes=1.0), study)
    assert found["bai-ddp-apex-fastest"]["statistic"].startswith("apex-ddp-apex-O2-n4/")
    assert found["bai-ddp-apex-fastest"]["verdict"] == SUPPORTED
    assert "ddp apex/fp32 = 3.00" in found["bai-apex-horovod-gain"]["statistic"]


def test_a_paper_presets_names_label_the_table():
    bai = plan_study(load_params(REPO / "params.yaml"), "bai2022", 4)
    assert bai.labels == {"single-fp32-n1": "Single GPU", "dp-fp32-n4": "Single Parameter Server",
                          "ddp-fp32-n4": "Distributed Parameter Server", "horovod-fp32-n4": "Horovod",
                          "apex-ddp-apex-O2-n4": "Distributed Parameter Server + Apex",
                          "horovod-apex-O1-n4": "Horovod + Apex"}
    summary = summarise(runs_table({c: [100.0, 100.0] for c in bai.labels}, model_state_bytes=1.0), bai, None)
    assert dict(zip(summary["config_id"], summary["label"])) == bai.labels


def link_runs(kept_by_horovod: float, kept_by_ddp: float, horovod_precision: str = "apex-O1") -> pd.DataFrame:
    """One machine and two emulated nodes at 1000 and 50 Mbit/s: on the slowest link horovod (with Apex unless
    told otherwise) and ddp keep these shares of their one-machine throughput; step times follow tokens/s, and the
    modelled bytes make the link model exact."""
    rates, bytes_per_step = {"single-fp32-n1": [100.0, 101.0, 99.0]}, {"single-fp32-n1": 0.0}
    for config, kept in ((f"horovod-{horovod_precision}", kept_by_horovod), ("ddp-fp32", kept_by_ddp)):
        one = [190.0, 192.0, 188.0]
        rates[f"{config}-n2"] = one
        rates[f"{config}-n2-2nodes-1000mbit"] = [r * 0.95 for r in one]
        rates[f"{config}-n2-2nodes-50mbit"] = [r * kept for r in one]
        bytes_per_step[f"{config}-n2"] = 0.0
        for mbit, share in ((1000, 0.95), (50, kept)):  # step time = 1 / rate: added time = (1/share - 1) / 190
            added = (1 / share - 1) / 190.0
            bytes_per_step[f"{config}-n2-2nodes-{mbit}mbit"] = added * mbit * 1e6 / 8
    runs = runs_table(rates, model_state_bytes=1.0, comm_bytes_per_step=bytes_per_step)
    return runs.assign(step_time_s=1 / runs["tokens_per_s"])


def test_robust_across_nodes_compares_what_each_strategy_keeps_on_the_slowest_link(study):
    robust = findings(link_runs(kept_by_horovod=0.5, kept_by_ddp=0.3), study)
    assert robust["bai-horovod-apex-robust"]["verdict"] == SUPPORTED, robust["bai-horovod-apex-robust"]
    assert robust["bai-sublinear-nodes"]["verdict"] == SUPPORTED, robust["bai-sublinear-nodes"]
    assert findings(link_runs(0.3, 0.5), study)["bai-horovod-apex-robust"]["verdict"] == CONTRADICTED
    # the claim is about Horovod with Apex: the same runs without Apex measure something, but judge nothing
    without = findings(link_runs(0.5, 0.3, horovod_precision="fp32"), study)["bai-horovod-apex-robust"]
    assert without["verdict"] == UNTESTABLE and "no horovod run with Apex" in without["statistic"], without
    assert "horovod fp32/ddp fp32 = " in without["statistic"], without
    # one-node claims do not take runs on emulated nodes as rivals
    assert "2nodes" not in robust["bai-ddp-fastest-fp32"]["statistic"]


def test_a_link_model_far_off_leaves_communication_unproven(study):
    runs = link_runs(0.5, 0.3)
    wrong = runs.assign(comm_bytes_per_step=runs["comm_bytes_per_step"] * 3)  # the model predicts 3x the link time
    found = findings(wrong, study)["bai-sublinear-nodes"]
    assert found["verdict"] == NOISE and "worst error" in found["statistic"], found


def test_ratios_without_an_interval_are_said_in_words():
    assert ratio_text(1.78, 1.5, 2.1) == "1.78 (1.50 to 2.10)"
    assert ratio_text(1.78, math.nan, math.nan) == "1.78 (one undisturbed pair, so no interval; run more repeats)"
    assert ratio_text(math.nan, math.nan, math.nan) == ("not measured (no undisturbed pair of runs; re-run the "
                                                        "disturbed ones)")


def test_a_bound_that_excludes_1_never_prints_as_1():
    """'0.94 (0.89 to 1.00) ... slower, beyond the noise' hid that the interval ends at 0.996: more decimals where
    two round a bound that excludes 1 to 1.00, either side; the control: a bound of exactly 1, and bounds two
    decimals keep apart from 1, stay at two."""
    assert ratio_text(0.944, 0.894, 0.996) == "0.944 (0.894 to 0.996)"
    assert ratio_text(1.08, 1.0004, 1.2) == "1.0800 (1.0004 to 1.2000)"
    assert ratio_text(0.9, 0.8, 1.0) == "0.90 (0.80 to 1.00)" and ratio_text(0.9, 0.8, 0.99) == "0.90 (0.80 to 0.99)"


def test_a_cpu_label_without_the_cpu_identity_says_what_was_recorded():
    """Runs from before gpt2dist recorded family, model and flags: whether bf16 ran in hardware still tells the
    reference machine (AVX512-BF16) from an AVX2-only one, and the label says what is missing."""
    devices = {"cpu": "AMD EPYC 7B13", "cpu_cores": 2, "gpus": [], "cpu_bf16": "emulated"}
    bf16 = {"a": {"devices": devices, "precision": "fp32"}, "b": {"devices": devices, "precision": "bf16"}}
    missing = "family, model and flags not recorded"
    assert per_run.hardware_label(bf16) == (f"AMD EPYC 7B13 (bf16 emulated; 2 cores; {missing})", None)
    native = {k: v | {"devices": devices | {"cpu_bf16": "native"}} for k, v in bf16.items()}
    assert per_run.hardware_label(native) == (f"AMD EPYC 7B13 (bf16 in hardware; 2 cores; {missing})", None)
    old = {k: v | {"devices": {k2: v2 for k2, v2 in devices.items() if k2 != "cpu_bf16"}} for k, v in bf16.items()}
    assert per_run.hardware_label(old) == (f"AMD EPYC 7B13 (2 cores; {missing})", None)  # before that field too


def test_a_cpu_label_says_when_its_bf16_rows_ran_emulated():
    identity = {"family": "25", "model": "1", "stepping": "1", "mhz": 2445, "speed_flags": ["AVX2"]}
    devices = {"cpu": "AMD EPYC", "cpu_cores": 2, "gpus": [], "cpu_bf16": "emulated", "cpu_identity": identity}
    bf16 = {"a": {"devices": devices, "precision": "fp32"}, "b": {"devices": devices, "precision": "bf16"}}
    assert per_run.hardware_label(bf16)[0].endswith("; 2 cores at 2.4 GHz, bf16 emulated)")
    fp32_only = {"a": bf16["a"]}  # control: no bf16 row, nothing to warn about
    assert per_run.hardware_label(fp32_only)[0].endswith("; 2 cores at 2.4 GHz)")


def test_the_label_tells_two_machines_of_one_name_apart():
    identity = {"family": "25", "model": "1", "stepping": "1", "mhz": 2445, "speed_flags": ["AVX2"]}
    avx2 = {"cpu": "AMD EPYC", "cpu_cores": 2, "gpus": [], "cpu_bf16": "emulated", "cpu_identity": identity}
    bf16 = avx2 | {"cpu_bf16": "native", "cpu_identity": identity | {"model": "17", "speed_flags": [
        "AVX2", "AVX-512", "AVX512-BF16"]}}
    label = per_run.hardware_label({"a": {"devices": avx2, "precision": "bf16"}})[0]
    assert label == "AMD EPYC (family 25 model 1, AVX2 only; 2 cores at 2.4 GHz, bf16 emulated)"
    assert per_run.hardware_label({"a": {"devices": bf16, "precision": "bf16"}})[0] == (
        "AMD EPYC (family 25 model 17, AVX2 + AVX-512 + AVX512-BF16; 2 cores at 2.4 GHz)")
    # and runs from the two are refused as mixed hardware, which their model names alone would not show
    assert per_run.hardware_of({"devices": avx2}) != per_run.hardware_of({"devices": bf16})
    gpu = {"cpu": "x", "gpus": ["NVIDIA H200"], "gpu_memory_gib": [140], "driver": "580.159.04",
           "power_limit_w": 700.0, "topology": "\tGPU0\nGPU0\t X \n"}
    # one GPU links to no other: no "PCIe", which would read as the H200's PCIe form (the H200 study's figures said
    # it of an SXM part); the control, two GPUs on PCIe switches, still says how they are linked
    assert per_run.hardware_label({"a": {"devices": gpu}}) == (
        "1x NVIDIA H200 (140 GiB, driver 580.159.04, 700 W limit)", "NVIDIA H200")
    two = gpu | {"gpus": ["NVIDIA H200"] * 2, "topology": "\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\t X \n"}
    assert per_run.hardware_label({"a": {"devices": two}})[0] == (
        "2x NVIDIA H200 (140 GiB, driver 580.159.04, 700 W limit, PCIe)")


def node_runs(kept_by_horovod: float, kept_by_ddp: float) -> pd.DataFrame:
    """Horovod with Apex and ddp in bf16 on one node of 4 processes and across 2 of a cluster's nodes of 4 each,
    keeping these shares of twice their one-node throughput."""
    rates = {"single-bf16-n1": [100.0, 101.0, 99.0]}
    for config, kept in (("horovod-apex-O1", kept_by_horovod), ("ddp-bf16", kept_by_ddp)):
        one = [380.0, 384.0, 376.0]
        rates[f"{config}-n4"] = one
        rates[f"{config}-n8-2nodes"] = [2 * r * kept * (1 + 0.01 * i) for i, r in enumerate(one)]
    return runs_table(rates, model_state_bytes=1.0, emulated=False)


def test_across_a_clusters_nodes_the_node_claims_use_those_runs_and_say_so(study):
    found = findings(node_runs(kept_by_horovod=0.9, kept_by_ddp=0.7), study)
    robust, sublinear = found["bai-horovod-apex-robust"], found["bai-sublinear-nodes"]
    assert robust["verdict"] == SUPPORTED and "across a cluster's nodes" in robust["statistic"], robust
    assert sublinear["verdict"] == SUPPORTED and "across a cluster's nodes" in sublinear["statistic"], sublinear
    # controls: ddp keeping more contradicts the robustness; a speedup above the node count, the sublinearity
    assert findings(node_runs(0.7, 0.9), study)["bai-horovod-apex-robust"]["verdict"] == CONTRADICTED
    assert findings(node_runs(1.2, 1.1), study)["bai-sublinear-nodes"]["verdict"] == CONTRADICTED
    # one-node claims still compare one-node runs only
    assert "2nodes" not in found["bai-ddp-fastest-fp32"]["statistic"]


def test_the_same_loss_claim_reads_disturbed_runs_too(study):
    # load slows a run, it does not change what it learns: with its one run starved, ddp still answers the claim
    rates, losses = {"single-fp32-n1": [100.0], "ddp-fp32-n2": [190.0]}, {"single-fp32-n1": 3.0, "ddp-fp32-n2": 3.0}
    starved = {"ddp-fp32-n2-r0": "other processes used 60% of its CPUs"}
    same = findings(runs_table(rates, disturbed=starved, final_val_loss=losses), study)["patwardhan-same-loss"]
    assert same["verdict"] == SUPPORTED and "ddp-fp32-n2 r0" in same["statistic"]
    # the control: the starved run's loss is what is compared, so a loss 10% off there contradicts the claim
    apart = runs_table(rates, disturbed=starved, final_val_loss={**losses, "ddp-fp32-n2": 3.3})
    assert findings(apart, study)["patwardhan-same-loss"]["verdict"] == CONTRADICTED


def test_gpt2s_four_sizes_keep_the_studys_order_in_the_summary_the_figures_and_the_answer():
    from gpt2dist.results.plots import ranked
    from gpt2dist.results.ranking import rank

    study = plan_study(load_params(REPO / "params.yaml"), "paper-sizes", 8)
    assert study.sizes == ["small", "medium", "large", "xl"]
    # run directories are read in name order, where large comes before medium and small
    rates = {f"{strategy}-bf16-n8-{size}": [rate, rate] for size, rate in
             (("large", 300.0), ("medium", 600.0), ("small", 1000.0), ("xl", 150.0)) for strategy in ("ddp", "fsdp")}
    runs = runs_table(dict(sorted(rates.items())))
    summary = summarise(runs, study, None)
    assert list(dict.fromkeys(summary["size"])) == study.sizes
    assert [entry["size"] for entry in rank(runs, summary)] == study.sizes
    figure = ranked(summary, "tokens_per_s", ascending=False)
    assert list(dict.fromkeys(figure["placement"].str.split(",").str[0])) == [f"GPT-2 {size}" for size in study.sizes]
    # the control: a study that names its sizes in another order lists them in that order
    reordered = in_study_order(summary, ["xl", "small", "large", "medium"])
    assert list(dict.fromkeys(reordered["size"])) == ["xl", "small", "large", "medium"]
    # and without the plan's order, the runs' name order is what a summary would have shown
    assert list(dict.fromkeys(in_study_order(runs)["size"])) == ["large", "medium", "small", "xl"]
