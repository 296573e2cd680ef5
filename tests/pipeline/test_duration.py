"""The study's time left: the estimate of the runs not yet done, scaled by how the finished ones compared
with theirs (pipeline/duration.py); `gpt2dist estimate` itself runs in the pipeline tests."""

from __future__ import annotations

import time
from dataclasses import replace

import yaml

from conftest import REPO, gpt2dist
from gpt2dist.pipeline.duration import Calibration, estimate_line, progress_line, run_seconds, selftest_seconds
from gpt2dist.config.presets import load_params
from gpt2dist.pipeline.jobs import selftest_command
from gpt2dist.pipeline.study import configurations, pipeline_resume_cases, plan_study, resume_cases, study_precisions

STUDY = plan_study(load_params(REPO / "params.yaml"), "cpu", 0)  # 60 runs: 20 configurations x 3 repeats
CALIBRATION = Calibration({"fp32": 0.25, "bf16": 3.0}, launch_s=6.0)


def _estimate(preset: str = "cpu", seconds: float = 10.0) -> dict:
    return {"preset": preset, "written_at_unix_s": time.time() - 120,
            "runs": {run.run_id: seconds for run in STUDY.runs}}


def test_the_time_left_is_the_rest_of_the_estimate_scaled_by_the_finished_runs():
    finished = {run.run_id: 20.0 for run in STUDY.runs[:30]}  # twice as long as estimated
    assert progress_line(STUDY, finished, _estimate()) == (
        "study: 30 of 60 runs done after 2 min; about 10 min left (the finished runs took 2x their estimate)")
    # control: runs as fast as estimated leave half of it
    on_time = dict.fromkeys(finished, 10.0)
    assert "about 5 min left (the finished runs took 1x" in progress_line(STUDY, on_time, _estimate())
    assert "about 10 min left" in progress_line(STUDY, {}, _estimate())


def test_added_repeats_count_at_their_configuration_s_estimate_and_a_study_budget_bounds_what_is_left(tmp_path):
    """The repeats added rounds decided (a tune's halving rounds) join the count, each estimated as its configuration's
    planned runs are; where study.added_repeats.max_study_minutes bounds the study, the line says what the added rounds
    may still take of it. The control: the same runs without that budget say nothing of one."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["presets"]["cpu"]["study"]["added_repeats"] = {"rounds": 2, "max_study_minutes": 20}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    budgeted = plan_study(load_params(tmp_path / "params.yaml"), "cpu", 0)
    grown = replace(budgeted, runs=[*budgeted.runs, replace(budgeted.runs[0], repeat=3)])
    finished = {run.run_id: 10.0 for run in grown.runs}
    line = progress_line(grown, finished, _estimate())
    assert line.startswith("study: 61 of 61 runs done (1 added) after 2 min; about 0 s left (the finished runs took "
                           "1x their estimate)"), line
    assert line.endswith("added rounds may take up to 10 min more, within the study's 20 min of runs"), line
    unbudgeted = replace(grown, preset=STUDY.preset)
    assert "added rounds may" not in progress_line(unbudgeted, finished, _estimate())


def test_an_estimate_of_another_study_is_not_used():
    assert progress_line(STUDY, {}, _estimate("paper")) == (
        "study: 0 of 60 runs done (no estimate of this study's duration was made here)")
    assert "no estimate" in progress_line(STUDY, {}, None)
    assert "no estimate" not in progress_line(STUDY, {}, _estimate())


def test_the_estimate_counts_steps_launches_and_what_is_left():
    ddp_bf16 = next(run for run in STUDY.runs if run.config_id == "ddp-bf16-n2")
    # on CPUs each rank of a run starts on the shared cores
    assert run_seconds(STUDY, CALIBRATION, ddp_bf16) == 2 * 6.0 + STUDY.preset.train.max_steps * 3.0
    selftests = selftest_seconds(STUDY, CALIBRATION, cores=2)
    # two one-process checks share the two cores, a two-process one has them
    assert selftests["ddp-fp32-n2"] == 2 * 6.0
    assert selftests["ddp-bf16-n1"] == 1 * 6.0 / 2
    estimate = {"calibration": {"step_s": CALIBRATION.step_s, "launch_s": 6.0}, "selftests": selftests,
                "runs": {run.run_id: run_seconds(STUDY, CALIBRATION, run) for run in STUDY.runs}}
    whole = sum(estimate["runs"].values()) + sum(selftests.values())
    assert estimate_line(estimate, {}, set()).startswith(
        f"estimate: about {whole / 60:.0f} min for 60 runs and {len(configurations(STUDY))} selftests")
    done = {run.run_id: 1.0 for run in STUDY.runs if run.precision == "bf16"}
    rest = sum(seconds for run_id, seconds in estimate["runs"].items() if run_id not in done)
    assert estimate_line(estimate, done, set(selftests)).startswith(
        f"estimate: about {rest / 60:.0f} min for 30 runs and 0 selftests")


def test_selftests_resume_only_where_a_run_can_stop_between_checkpoints(tmp_path):
    """A checked resume launches twice more: the cpu presets' runs keep no checkpoint but the last, so an
    interrupted one starts again, and their selftests check no resume."""
    assert pipeline_resume_cases(STUDY) == [] and resume_cases(STUDY)
    assert not any("--resume" in selftest_command(STUDY, run) for run in configurations(STUDY))
    # control: checkpoints every 10 of 20 steps make resuming part of the study, and its selftests check it
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["presets"]["cpu"]["train"]["checkpoint_interval"] = 10
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    mid_run = plan_study(load_params(tmp_path / "params.yaml"), "cpu", 0)
    assert pipeline_resume_cases(mid_run) == resume_cases(mid_run)
    ddp = next(run for run in resume_cases(mid_run) if run.strategy == "ddp")
    assert "--resume" in selftest_command(mid_run, ddp)
    resumed = selftest_seconds(mid_run, CALIBRATION, cores=2)[ddp.config_id]
    assert resumed == 3 * 2 * 6.0 == 3 * selftest_seconds(STUDY, CALIBRATION, cores=2)[ddp.config_id]


def test_the_precisions_timed_are_the_study_s_in_the_registry_s_order():
    """`gpt2dist estimate` names the precisions it times, and times them, in the registry's order (config.schema,
    through study_precisions); it once sorted its own set by name. The control: the cpu preset's two by name."""
    assert study_precisions(STUDY) == ["fp32", "bf16"]
    assert sorted({run.precision for run in STUDY.runs}) == ["bf16", "fp32"]


def test_a_study_without_selftests_counts_none(tmp_path):
    """`study.selftests: false`: the estimate counts no selftest (the pipeline tests check that none is planned)."""
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["presets"]["cpu"]["study"]["selftests"] = False
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    unchecked = plan_study(load_params(tmp_path / "params.yaml"), "cpu", 0)
    assert selftest_seconds(unchecked, CALIBRATION, cores=2) == {}
    assert len(selftest_seconds(STUDY, CALIBRATION, cores=2)) == len(configurations(STUDY))  # control: on by default


def test_an_unreadable_run_record_ends_the_estimate_in_one_line_and_writes_nothing(params_file, tmp_path):
    """An empty run.json under --runs once ended in a traceback; before that, counted as no run at all, the study's
    estimate went on as if the runs were not given. The control: the same directory without it is estimated (no
    timing: the tiny preset's one-process study, planned for GPUs this host lacks, says so and writes nothing)."""
    record = tmp_path / "runs" / "single-fp32-n1-r0" / "run.json"
    record.parent.mkdir(parents=True)
    record.write_text("")
    done = gpt2dist("estimate", "--params", params_file, "--runs", tmp_path / "runs", "--out", tmp_path / "e.json",
                    check=False)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {record} cannot be read"), done
    assert "delete its run directory" in lines[0] and not (tmp_path / "e.json").exists()
    record.unlink()
    assert gpt2dist("progress", "--params", params_file, "--runs", tmp_path / "runs").stdout.startswith(
        "study: 0 of 4 runs done")
