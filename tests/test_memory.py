"""The planner's model state (config.memory) is what each rank measured, to the byte: on every run of both
reference studies and on each strategy's run here, fsdp-tp on 4 ranks and dp included. The control: without
its strategy's division of the parameters, the same count misses every sharded or split run. The activation
estimate is checked against CUDA's peak by bench/memory_model.py on a GPU node (bench/gpu_campaign.sh runs it)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tarfile

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gpt2dist.config.memory import busiest_rank, model_state, optimizer_partition, optimizer_shapes, predict
from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import RunSpec
from gpt2dist.config.sizes import parameter_shapes
from gpt2dist.config.strategies import STRATEGIES

from conftest import REPO, assert_answer_or_one_error, run_record

BUNDLES = ("cpu-study", "two-node-cpu", "two-node-splits-cpu")


def bundle_records(name: str) -> list[dict]:
    """Every run.json of a reference bundle; as many as its bundle.json lists (none missed)."""
    with tarfile.open(REPO / "docs" / "reference" / f"{name}.tar.gz") as bundle:
        listed = json.load(bundle.extractfile("bundle.json"))["runs"]
        records = [json.load(bundle.extractfile(member)) for member in bundle.getmembers()
                   if member.name.endswith("/run.json")]
    assert len(records) == len(listed) > 0
    return records


def measured(record: dict) -> tuple[int, int, int]:
    state = record["model_state_bytes"]
    return state["params"], state["grads"], state["optimizer"]


@pytest.mark.parametrize("bundle", BUNDLES)
def test_the_predicted_state_is_every_reference_runs_to_the_byte(bundle):
    records = bundle_records(bundle)
    misses = [(r["run_id"], measured(r), model_state(RunSpec.model_validate(r["config"]))) for r in records
              if measured(r) != model_state(RunSpec.model_validate(r["config"]))]
    assert misses == []


def test_without_the_strategys_division_the_count_misses_every_divided_run():
    """Control: rank 0 counted as holding every parameter whole, as a description that forgot its sharding or
    splitting would count it."""
    divided = [r for r in bundle_records("cpu-study") if r["strategy"] in ("fsdp", "tp", "pp") and r["nproc"] > 1]
    assert {r["strategy"] for r in divided} == {"fsdp", "tp", "pp"}
    for record in divided:
        spec = RunSpec.model_validate(record["config"])
        whole = parameter_shapes(spec.model).values()
        assert sum(math.prod(shape) for shape in whole) * 4 > measured(record)[0], record["run_id"]


@pytest.mark.slow  # a run per strategy
@pytest.mark.parametrize("strategy, nproc", [("ddp", 2), ("dp", 1), ("horovod", 2), ("fsdp", 2), ("tp", 2), ("pp", 2),
                                             ("fsdp-tp", 4), ("hsdp", 4), ("zero1", 2), ("zero2", 4)])
def test_the_predicted_state_is_each_strategys_run_here(strategy, nproc, trained):
    record = run_record(trained(strategy, nproc=nproc))
    spec = RunSpec.model_validate(record["config"])
    assert model_state(spec) == measured(record)
    assert predict(spec).state == record["model_state_bytes"]["total"]


def test_zero1s_busiest_rank_is_planned_and_rank_0_is_what_a_run_is_checked_against():
    """ZeroRedundancyOptimizer gives each tensor whole to the emptiest rank: for GPT-2 medium over 4 ranks another
    rank ends with more AdamW state than rank 0, so the plan counts that rank, while collect compares rank 0's
    prediction with what rank 0 measured. The control: at 8 ranks rank 0 is the busiest, and both agree."""
    _, preset = load_params(REPO / "params.yaml").preset("paper", size="medium")

    def spec(nproc: int) -> RunSpec:
        return RunSpec(data_dir="", out_dir="", preset="paper", strategy="zero1", precision="bf16", nproc=nproc,
                       device="cuda", model=preset.model, train=preset.train)

    four, eight = spec(4), spec(8)
    assert busiest_rank(four) != 0
    assert predict(four).optimizer > predict(four, busiest=False).optimizer == model_state(four)[2]
    assert busiest_rank(eight) == 0 and predict(eight) == predict(eight, busiest=False)
    shares = optimizer_partition(four)
    assert sorted(shape for share in shares for shape in share) == sorted(parameter_shapes(preset.model).values())
    # more ranks than tensors: each tensor to an empty rank of its own, the ranks past them holding nothing, counted
    # without a list per rank (recommend --gpus 99999999999 once filled 12 GB with them)
    huge, tensors = spec(10**11), len(parameter_shapes(preset.model))
    shares = optimizer_partition(huge)
    assert len(shares) == tensors and all(len(share) == 1 for share in shares)
    assert shares == optimizer_partition(spec(tensors))
    assert optimizer_shapes(huge, rank=10**11 - 1) == [] and busiest_rank(huge) == 0


@pytest.mark.slow  # a start of the bench per example (it refuses before importing torch)
@settings(max_examples=6, deadline=None)
# an argument of a command line is bytes: text that encodes to UTF-8 (no lone surrogate), without a NUL (the
# operating system's strings end at one)
@given(st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=8), min_size=1, max_size=3)
       .map(",".join).filter(lambda text: not set(text.split(",")) <= set(STRATEGIES)))
@example("")
@example("NaN")
@example("inf")
@example("-1")
@example("0")
@example("ddp,,fsdp")
@example("ddp,nope")
@example("-:")  # a value that looks like an option: given with "=", it is the list
def test_bench_memory_model_refuses_any_strategies_but_the_registrys_in_one_line(strategies):
    done = subprocess.run([sys.executable, str(REPO / "bench" / "memory_model.py"), f"--strategies={strategies}"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2  # nothing trained: the list is refused before the first run
    assert_answer_or_one_error(done.returncode, done.stdout, done.stderr)
    assert "unknown --strategy" in done.stderr


def test_a_chunked_head_loss_is_planned_with_one_chunks_logits():
    """GPT-2 small at micro-batch 16, context 1024, bf16: the whole loss's logits and their float32 softmax and
    gradient are 16k tokens x 50257 x 10 bytes (7.7 GiB), which train.head_loss_chunk_tokens cuts to one chunk's
    plus the two gradients the chunked loss keeps; the control: a chunk as large as the micro-batch plans no less."""
    _, preset = load_params(REPO / "params.yaml").preset("paper")

    def activations(chunk: int) -> int:
        train = preset.train.model_copy(update={"micro_batch_size": 16, "head_loss_chunk_tokens": chunk})
        return predict(RunSpec(data_dir="", out_dir="", preset="paper", strategy="single", precision="bf16", nproc=1,
                               device="cuda", model=preset.model, train=train)).activations

    tokens, vocab, width = 16 * 1024, preset.model.vocab_size, preset.model.n_embd
    saved = tokens * vocab * 10 - (4096 * vocab * 10 + tokens * width * 4 + vocab * width * 4)
    assert activations(0) - activations(4096) == saved > 5 * 2**30
    assert activations(tokens) >= activations(0)
