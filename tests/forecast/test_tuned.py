"""A tune's calibration as `recommend --calibration` reads it (forecast/tuned.py): each split the tune measured
predicted at its measurement, the others corrected by the measured ratios' geometric mean, said, and carried to
another cluster only as an assumption it states; refused for another GPU. The file is written as the tune writes it
(results/tune.py); the CPU path runs on a real tune in tests/pipeline/test_tune_in_pipeline.py, the GPU one at the
next lent GPU in tests/training/test_gpu.py."""

from __future__ import annotations

import json
import math

import pytest

from gpt2dist.config.presets import load_params
from gpt2dist.forecast.recommend import recommend
from gpt2dist.forecast.shortlist import Cluster
from gpt2dist.results.tune import calibration_of
from gpt2dist.system.links import links_of

from conftest import REPO, gpt2dist
from test_recommend import table_of

CLUSTER = Cluster("cuda", 8, 1, gpu="H100", gpus_per_node=8, links=links_of("H100"), memory_gb=80)
MEASURED = {"ddp": 1.5, "fsdp": 0.8}  # measured / predicted step


def predicted_step_s(strategy: str) -> float:
    """recommend's own prediction of a split on CLUSTER, as the tune priced it."""
    name, preset = load_params(REPO / "params.yaml").preset("paper", cuda=True)
    table, _ = recommend(name, preset, [], gpu="H100", gpus_per_node=8, nodes=1, precision="bf16", tokens=1e10,
                         memory_gb=80, links=CLUSTER.links)
    return float(table[(table["strategy"] == strategy) & ~table["recompute"].astype(bool)]["step_ms"].iloc[0]) / 1e3


@pytest.fixture(scope="module")
def tuned_file(tmp_path_factory):
    plan = {"started_at": "2026-12-03T12:00:00+00:00", "preset": "paper", "size": None, "precision": "bf16",
            "cluster": CLUSTER.as_dict(), "model": "the GPU step model", "basis": None, "ratio_error": 0.22}
    rows = [{"strategy": name, "predicted_step_s": predicted_step_s(name), "repeats": 3,
             "measured_step_s": predicted_step_s(name) * ratio, "measured_step_low_s": None,
             "measured_step_high_s": None} for name, ratio in MEASURED.items()]
    path = tmp_path_factory.mktemp("tune") / "calibration.json"
    path.write_text(json.dumps(calibration_of(plan, {"hardware": "8x NVIDIA H100 80GB HBM3"}, rows)))
    return path


def recommended(*args) -> str:
    return gpt2dist("recommend", "--params", REPO / "params.yaml", *args).stdout


def test_each_measured_split_is_predicted_at_its_measurement_and_the_others_by_their_mean(tuned_file):
    plain = table_of(recommended("--gpus", "8", "--gpu", "H100")).drop_duplicates("strategy").set_index("strategy")
    text = recommended("--calibration", tuned_file)  # the tuned cluster, by default
    said = " ".join(text.split())
    assert "Calibrated by the tune of 2026-12-03T12:00:00+00:00" in said and "took 0.80x to 1.50x" in said
    # its ties are not sent to a tune again (the control: uncalibrated, they are)
    assert "Tied for fastest" in said and "gpt2dist tune" not in said
    plain_text = gpt2dist("recommend", "--params", REPO / "params.yaml", "--gpus", "8", "--gpu", "H100", cwd=REPO)
    assert "    gpt2dist tune --gpus 8 --gpu H100 --preset paper --precision bf16\n" in plain_text.stdout
    table = table_of(text).drop_duplicates("strategy").set_index("strategy")
    for name, ratio in MEASURED.items():
        assert table.loc[name, "tuned"] == f"x{ratio:.2f} measured"
        assert float(table.loc[name, "step_ms"]) == pytest.approx(predicted_step_s(name) * ratio * 1e3, abs=0.01)
        # the control: uncalibrated, its prediction
        assert float(plain.loc[name, "step_ms"]) == pytest.approx(predicted_step_s(name) * 1e3, abs=0.01)
    typical = math.sqrt(1.5 * 0.8)
    others = [name for name in table.index if name not in MEASURED and name in plain.index]
    assert others and all(table.loc[name, "tuned"] == f"x{typical:.2f} typical" for name in others)
    for name in others:
        assert float(table.loc[name, "step_ms"]) == pytest.approx(float(plain.loc[name, "step_ms"]) * typical, rel=0.01)


def test_beyond_the_tuned_cluster_the_ratios_are_carried_over_as_it_says(tuned_file):
    said = " ".join(recommended("--gpus", "8", "--nodes", "4", "--calibration", tuned_file).split())
    assert "carried over to 32 processes on 4 node(s), the tune ran 8 on 1, which assumes the ratios hold there" \
        in said
    assert "carried over" not in " ".join(recommended("--calibration", tuned_file).split())  # the tuned cluster


@pytest.mark.parametrize("args, message", [
    (["--gpu", "A100"], "error: --calibration {path} was measured on H100 GPUs, and this recommendation is for a "
                        "A100: give --gpu H100, or tune on a A100"),
    (["--mfu", "0.4"], "error: --calibration from a tune corrects the GPU step model's prediction, which --mfu "
                       "replaces; leave one out"),
])
def test_a_tune_s_calibration_is_refused_where_it_does_not_hold(args, message, tuned_file):
    done = gpt2dist("recommend", "--params", REPO / "params.yaml", "--calibration", tuned_file, *args, check=False)
    assert done.returncode == 2 and done.stderr.strip() == message.format(path=tuned_file), done.stderr


def test_a_calibration_that_is_not_a_tune_s_is_one_error_line(tuned_file, tmp_path):
    said = json.loads(tuned_file.read_text())
    said["tune"]["splits"]["ddp"]["measured_step_s"] = -1.0
    (tmp_path / "bad.json").write_text(json.dumps(said))
    done = gpt2dist("recommend", "--params", REPO / "params.yaml", "--calibration", tmp_path / "bad.json", check=False)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: --calibration {tmp_path / 'bad.json'}: its tune measured no split (or a step that is not a positive "
        "time); run the tune again where its runs complete")


def test_plan_refuses_a_tune_s_calibration_naming_what_reads_it(tuned_file):
    """plan corrects the GPU step model's computation by estimate's calibration; a tune's corrects recommend's splits."""
    done = gpt2dist("plan", "--params", REPO / "params.yaml", "--preset", "paper", "--gpus", "8", "--calibration",
                    tuned_file, check=False)
    assert done.returncode == 2 and done.stderr.strip() == (
        f"error: --calibration {tuned_file} is a tune's: recommend reads it (each split corrected by what the tune "
        "measured); plan and project-scaling take the one `gpt2dist estimate` writes")
