"""The link model: a step on emulated nodes = the one-machine step + modelled bytes over the link, set
against measurement; and its projection of the papers' presets to GPU clusters."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest
from conftest import REPO

from gpt2dist.config.presets import load_params
from gpt2dist.config.sizes import parameter_count
from gpt2dist.errors import UsageError
from gpt2dist.forecast.link_model import predicted_vs_measured, projection
from gpt2dist.system.hardware import peak_flops
from gpt2dist.system.links import NCCL_SHARE, Links, links_of


def summary_row(config: str, strategy: str, nodes: int, link: float, step: float, sent: float) -> dict:
    return {"config_id": config, "strategy": strategy, "precision": "fp32", "nproc": 2, "nodes": nodes,
            "link_mbit": link, "step_time_s": step, "step_time_s_ci_low": step * 0.9, "step_time_s_ci_high": step * 1.1,
            "comm_bytes_per_step": sent, "link_bytes_per_step": sent * 1.05 if nodes > 1 else math.nan}


def test_prediction_is_the_one_machine_step_plus_bytes_over_bandwidth():
    summary = pd.DataFrame([
        summary_row("ddp-fp32-n2", "ddp", 1, math.nan, 0.2, 3.75e6),
        summary_row("ddp-fp32-n2-2nodes-100mbit", "ddp", 2, 100.0, 0.6, 3.75e6),
        summary_row("fsdp-fp32-n2-2nodes-100mbit", "fsdp", 2, 100.0, 1.0, 9e6),  # no one-machine run: no prediction
    ])
    model = predicted_vs_measured(summary)
    assert list(model["config_id"]) == ["ddp-fp32-n2-2nodes-100mbit"]
    row = model.iloc[0]
    assert row["modelled_link_s"] == pytest.approx(0.3)  # 3.75 MB x 8 / 100 Mbit/s
    assert row["predicted_step_time_s"] == pytest.approx(0.5)
    assert row["measured_link_s"] == pytest.approx(0.4)
    assert row["error"] == pytest.approx(0.5 / 0.6 - 1)


def test_a_study_without_emulated_nodes_has_an_empty_model():
    summary = pd.DataFrame([summary_row("ddp-fp32-n2", "ddp", 1, math.nan, 0.2, 3.75e6)])
    assert predicted_vs_measured(summary).empty
    assert predicted_vs_measured(summary.drop(columns=["nodes", "link_mbit"])).empty  # an older study's summary


def test_projection_crosses_the_nics_only_between_nodes():
    name, preset = load_params(REPO / "params.yaml").preset("bai2022")
    one_nic = Links("nvlink4", "ndr", 1)  # 50 GB/s across nodes, far below NVLink's 450
    table = projection(name, preset, gpu="NVIDIA H100 80GB HBM3", precision="bf16", mfu=0.4, gpus_per_node=8,
                       node_counts=[1, 2, 4], links=one_nic).set_index(["strategy", "nodes"])
    ddp = table.loc["ddp"]
    compute_s = ddp.loc[1, "compute_ms"] / 1e3
    gradients = parameter_count(preset.model) * 4  # fp32 gradients under autocast

    def exposed(gpus: int, bandwidth: float) -> float:  # the all-reduce less what backward covers
        sent = 2 * (gpus - 1) / gpus * gradients
        return sent / bandwidth - min(sent * (1 - root_share_of(preset)) / bandwidth, 2 / 3 * compute_s)

    # at the bus bandwidth NCCL was measured to reach over each link (system.links)
    assert ddp.loc[1, "communication_ms"] / 1e3 == pytest.approx(exposed(8, 450e9 * NCCL_SHARE["nvlink4"]))
    assert ddp.loc[2, "communication_ms"] / 1e3 == pytest.approx(exposed(16, 50e9 * NCCL_SHARE["across"]))
    assert (ddp["compute_ms"] == ddp.loc[1, "compute_ms"]).all()  # weak scaling: each GPU's work is the same
    assert ddp.loc[1, "scaling_efficiency"] > ddp.loc[2, "scaling_efficiency"] > ddp.loc[4, "scaling_efficiency"]
    assert (table.loc["fsdp", "communication_ms"] > ddp["communication_ms"]).all()  # gathers in forward and backward
    assert set(table.loc[["ddp", "horovod", "fsdp"], "note"]) == {"projection"}
    assert table.loc["apex-ddp", "note"].str.startswith("not projected: strategy 'apex-ddp' pairs with Apex amp").all()


def root_share_of(preset) -> float:
    """The embeddings' and final layer norm's share of the parameters, counted here from the model's shape."""
    m = preset.model
    outside_blocks = m.vocab_size * m.n_embd + m.n_positions * m.n_embd + 2 * m.n_embd
    return outside_blocks / parameter_count(m)


def test_projection_at_the_presets_sizes_ranks_each_size():
    name, preset = load_params(REPO / "params.yaml").preset("paper-sizes")
    table = projection(name, preset, gpu="H100", precision="bf16", mfu=0.4, gpus_per_node=8, node_counts=[1],
                       links=links_of("H100"), sizes=["small", "xl"])
    projected = table[table["note"] == "projection"].set_index(["size", "strategy"])
    # four times the layers' FLOPs and more: each size's own model, not the preset's small one
    assert projected.loc[("xl", "ddp"), "compute_ms"] > 10 * projected.loc[("small", "ddp"), "compute_ms"]
    assert list(dict.fromkeys(table["size"])) == ["small", "xl"]


@pytest.mark.parametrize("kwargs, message", [
    ({"gpu": "a toaster"}, "no datasheet known for GPU 'a toaster'"),
    ({"mfu": 1.5}, "--mfu is a fraction of the peak in (0, 1], got 1.5"),
    ({"gpu": "V100", "precision": "bf16"}, "GPU 'V100' has no bf16 arithmetic; choose a precision it computes in"),
    ({"precision": "fp64"}, "--precision 'fp64' is not one of fp32, tf32, bf16"),
    ({"gpus_per_node": 0}, "--gpus-per-node and --nodes count at least 1, got 0 GPUs per node"),
    ({"node_counts": [1, 0]}, "--gpus-per-node and --nodes count at least 1, got 8 GPUs per node and nodes 1,0"),
])
def test_projection_refuses_what_it_cannot_know(kwargs, message):
    name, preset = load_params(REPO / "params.yaml").preset("bai2022")
    settings = {"gpu": "H100", "precision": "bf16", "gpus_per_node": 8, "node_counts": [1],
                "links": links_of("H100")} | kwargs
    with pytest.raises(UsageError, match=re.escape(message)):
        projection(name, preset, **settings)


def test_gpu_names_match_in_any_case():
    assert peak_flops("a100", "bf16") == peak_flops("NVIDIA A100-SXM4-80GB", "bf16") == 312e12
    assert peak_flops("h100 pcie", "bf16") == 756e12  # the longest fragment still wins
    assert peak_flops("a toaster", "bf16") is None


def test_project_scaling_prints_a_labelled_projection():
    from conftest import gpt2dist

    shown = gpt2dist("project-scaling", "--params", REPO / "params.yaml", "--preset", "patwardhan2024", "--nodes", "1,2")
    assert shown.stdout.startswith("Projection (not a measurement) of preset patwardhan2024: H100 bf16")
    # ddp, horovod, fsdp, zero1, zero2 and hsdp at 1 and 2 nodes (apex-ddp takes no bf16), no size column
    assert len(re.findall(r"^\| (ddp|horovod|fsdp|zero1|zero2|hsdp) +\|", shown.stdout, re.M)) == 12
    assert "apex-ddp: not projected" in shown.stdout and "| size" not in shown.stdout
    sizes = gpt2dist("project-scaling", "--params", REPO / "params.yaml", "--preset", "paper-sizes", "--nodes", "1")
    assert len(re.findall(r"^\| (small|medium|large|xl) +\| ddp ", sizes.stdout, re.M)) == 4  # the preset's sizes
    wrong = gpt2dist("project-scaling", "--params", REPO / "params.yaml", "--nodes", "one,two", check=False)
    assert wrong.returncode == 2
    assert wrong.stderr.strip() == ("error: --nodes 'one,two': 'one' is not a whole number; give a comma-separated "
                                    "list, e.g. 1,2,4,8")
