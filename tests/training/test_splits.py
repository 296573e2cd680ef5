"""Splits of the devices (config.split): a data-parallel method with tensor- and pipeline-parallel degrees, each
combination against the single-process curve (fp32, the equivalence tolerance), its model state predicted to the
byte and its mesh recorded; the mesh torch lays out held to config.degrees', a transposed one caught; the twelve
named strategies kept as points of the grammar (stored runs' fingerprints unchanged); and the splits refused, in one
line each. Each split's kill-and-resume is in test_train_cli.py with every strategy's, its continuation under
another split in the cross-strategy chain (test_resume_across_strategies.py)."""

from __future__ import annotations

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from test_equivalence import RTOL, assert_follows_reference, train_with_fault
from torch.distributed.device_mesh import init_device_mesh

from gpt2dist.config.memory import model_state
from gpt2dist.config.presets import load_params
from gpt2dist.config.schema import RunSpec, TrainConfig
from gpt2dist.config.split import NAMED, composed_name, parse_split
from gpt2dist.config.strategies import check_run, describe, STRATEGIES
from gpt2dist.errors import UsageError
from gpt2dist.training.strategies.torch_distributed import TorchDistributed

from conftest import REPO, TINY_PRESET, gpt2dist, read_metrics, run_record, train_args

# Megatron's DP x TP, DP x PP, torchtitan's PP + FSDP, TP x PP, and all three: 2 x 2 x 2 ranks
SPLITS = [("ddp-tp2", 4), ("ddp-pp2", 4), ("fsdp-pp2", 4), ("tp2-pp2", 4), ("ddp-tp2-pp2", 8)]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("strategy, nproc", SPLITS, ids=[s for s, _ in SPLITS])
def test_each_split_follows_single_process(strategy, nproc, reference, trained):
    run = trained(strategy, nproc=nproc)
    assert_follows_reference(reference, run)
    val = [[line["val_loss"] for line in read_metrics(r, "eval")] for r in (run, reference)]
    assert val[0] == pytest.approx(val[1], rel=1e-5)
    record = run_record(run)
    spec = RunSpec.model_validate(record["config"])
    state = record["model_state_bytes"]
    measured = (state["params"], state["grads"], state["optimizer"])
    assert measured == model_state(spec)  # to the byte
    # the control: the count of the method alone, unsplit, misses what the split holds
    assert model_state(spec.model_copy(update={"strategy": describe(strategy).method.name.replace("none", "ddp")},
                                       deep=True)) != measured
    placement, split = record["placement"], parse_split(strategy)
    degrees = placement["degrees"]
    assert degrees["tp"] == split.tp and degrees["pp"] == split.pp
    assert degrees["dp_replicate"] * degrees["dp_shard"] * degrees["tp"] * degrees["pp"] == nproc
    for group in placement["groups"].get("tp", []):  # consecutive ranks: inside one node
        assert group == list(range(group[0], group[0] + len(group)))


def test_the_layout_runs_pp_outermost_and_tp_innermost():
    """ddp-tp2-pp2 on 8 ranks: tensor-parallel pairs of neighbours, data-parallel pairs two apart, pipelines of
    stages four apart; a rank's share of the batch is its data-parallel coordinate alone."""
    train = TrainConfig(**TINY_PRESET["train"])
    degrees = describe("ddp-tp2-pp2").degrees(8, train)
    assert degrees.groups(("tp",)) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert degrees.groups(("dp_replicate", "dp_shard")) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert degrees.groups(("pp",)) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert [degrees.data_rank(rank) for rank in range(8)] == [0, 0, 1, 1, 0, 0, 1, 1]
    assert degrees.rows_per_pass == 4 and degrees.pipeline_micro_batches == 2 and degrees.grad_accum_steps == 1


class TransposedMesh(TorchDistributed):
    """A mesh laid out tp outermost: tensor-parallel groups of ranks two apart, which read different rows."""

    checked = True

    def _world_mesh(self, device):
        sizes = self.degrees.sizes()
        mesh = init_device_mesh(device.type, (sizes["tp"], sizes["dp_replicate"], sizes["dp_shard"]),
                                mesh_dim_names=("tp", "dp_replicate", "dp_shard"))
        if self.checked:
            self.check_layout(mesh)
        return mesh


class UncheckedTransposedMesh(TransposedMesh):
    checked = False


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_transposed_mesh_is_refused_and_would_leave_the_curve(reference, shards, params_file, tmp_path):
    """The layout check refuses a mesh whose groups are not config.degrees' before a step; and the control of the
    equivalence test: the same transposed mesh unchecked already leaves single's curve at its first step, beyond the
    tolerance each step of that test is held to (two steps here: the first is what decides)."""
    with pytest.raises(Exception, match=r"the device mesh's tp group \[\d, \d\] is not config.degrees' \[\d, \d\]"):
        train_with_fault("ddp-tp2", TransposedMesh, shards, params_file, tmp_path / "checked", nproc=4)
    train_with_fault("ddp-tp2", UncheckedTransposedMesh, shards, params_file, tmp_path / "unchecked", nproc=4,
                     overrides=["train.max_steps=2"])
    first, theirs = read_metrics(tmp_path / "unchecked")[0]["loss"], read_metrics(reference)[0]["loss"]
    assert abs(first / theirs - 1) > RTOL, (first, theirs)


# What a252f20, the code before the grammar, computed for paper's bf16 run of each named strategy (FINGERPRINTED's
# process counts): a changed fingerprint would refuse every stored checkpoint of theirs as another run's
BEFORE_THE_GRAMMAR = {"single": "bca0b22ba6641d79", "dp": "beb028ae7c69bc7b", "ddp": "c02ecba65942e4f7",
                      "horovod": "5c55ff366cd12a5e", "fsdp": "702834154a53e24a", "tp": "c8f1be8cf2712275",
                      "pp": "2a0126c87d0f0374", "fsdp-tp": "9ebeb40fb3f3c1b5", "apex-ddp": "b864611a244b77e0",
                      "zero1": "d3beea8a30f27c97", "zero2": "1f8e5cc2d2374cf7", "hsdp": "82ce843ce4d51218"}
FINGERPRINTED = {"single": 1, "fsdp-tp": 4, "hsdp": 4}  # the others at 2 processes


def test_the_named_strategies_keep_their_fingerprints():
    """The twelve names became points of the grammar without changing what identifies a run."""
    _, preset = load_params(REPO / "params.yaml").preset("paper")

    def spec(strategy: str) -> RunSpec:
        return RunSpec(data_dir="", out_dir="", preset="paper", strategy=strategy, precision="bf16",
                       nproc=FINGERPRINTED.get(strategy, 2), device="cuda", model=preset.model, train=preset.train)

    assert {name: spec(name).fingerprint() for name in NAMED} == BEFORE_THE_GRAMMAR
    # the control: a degree in the name is another placement, another fingerprint
    assert spec("ddp").model_copy(update={"strategy": "ddp-tp2"}).fingerprint() != BEFORE_THE_GRAMMAR["ddp"]


@pytest.mark.parametrize("name", list(NAMED))
def test_each_named_strategy_is_a_point_of_the_grammar(name):
    """tp is one replica split by layer over every process, pp one stage per process, fsdp-tp FSDP over
    train.tensor_parallel_size-rank groups; the one-dimensional ones take no degree. Their degrees equal those of
    the split the grammar spells for the same run."""
    train = TrainConfig(**{**TINY_PRESET["train"], "global_batch_size": 16})
    for nproc in (1,) if name == "single" else (2, 4):
        named = STRATEGIES[name].degrees(nproc, train)
        if not describe(name).splits_model:
            assert named.tp == named.pp == 1
            continue
        method = describe(name).method.name
        spelled = describe(composed_name(method, named.tp, named.pp)).degrees(nproc, train)
        assert (named.sizes(), named.rows_per_pass, named.grad_accum_steps) == \
            (spelled.sizes(), spelled.rows_per_pass, spelled.grad_accum_steps), name


@given(st.one_of(st.text(max_size=24), st.from_regex(r"\A(?:[a-z0-9]{1,6}-)?(?:tp|pp)[0-9]{1,2}(?:-(?:tp|pp)[0-9]{1,2})?\Z")))
@example("ddp-pp2-tp2")
@example("zero1-tp2")
@example("tp1")
@example("fsdp-tp-pp2")
def test_any_name_is_a_split_whose_name_it_is_or_one_line_saying_why(text):
    try:
        split = parse_split(text)
    except UsageError as refusal:
        message = str(refusal)
        assert message and "\n" not in message and ("strategy" in message)
        return
    assert split.name == text
    assert split.named or composed_name(split.method, split.tp, split.pp) == text


REFUSED = [
    ("ddp-tp2-pp2", 6, (), "fp32", "splits each replica over tp 2 x pp 2 = 4 processes, and --nproc 6 is not a "
                                   "multiple of 4; use --nproc 4 or 8"),
    ("tp2-pp2", 8, (), "fp32", "names no data-parallel method to hold them; use ddp-tp2-pp2 or fsdp-tp2-pp2"),
    ("zero1-tp2", 4, (), "fp32", "zero1 takes no tensor- or pipeline-parallel degree"),
    ("ddp-pp2-tp2", 4, (), "fp32", "write it ddp-tp2-pp2"),
    ("ddp-tp4", 4, (), "fp32", "model.n_head (2) is not divisible by 4; use a tensor-parallel degree that divides 2"),
    ("ddp-pp4", 4, (), "fp32", "at least one block on each of its 4 stages, but the model has 2"),
    ("fsdp-pp2", 4, (), "fp16", "use fsdp-pp2 with bf16"),
    ("ddp", 2, ("--set", "train.tensor_parallel_size=2"), "fp32", "does not read it; name the degrees in the "
                                                                  "strategy instead, as in ddp-tp2 or ddp-tp2-pp2"),
]


@pytest.mark.parametrize("strategy, nproc, extra, precision, expected", REFUSED, ids=[f"{s}-n{n}" for s, n, *_ in REFUSED])
def test_a_split_that_cannot_run_is_one_error_line_naming_the_fix(strategy, nproc, extra, precision, expected, shards,
                                                                  params_file, tmp_path):
    result = gpt2dist(*train_args(shards, params_file, tmp_path / "run", strategy, *extra, nproc=nproc,
                                  precision=precision), check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], \
        result.stderr
    assert not (tmp_path / "run").exists()


def test_a_tensor_parallel_group_that_would_span_nodes_is_refused():
    """Tensor parallelism's four all-reduces per block and micro-batch stay inside a node: ddp-tp4 on 2 nodes of 2
    processes is refused naming the degree that fits; ddp-tp2 there runs its pairs inside each node."""
    spec = RunSpec(data_dir="", out_dir="", preset="tiny", strategy="ddp-tp4", precision="fp32", nproc=4, nodes=2,
                   device="cpu", model={**TINY_PRESET["model"], "n_head": 4}, train=TINY_PRESET["train"])
    with pytest.raises(UsageError, match="a tensor-parallel group would span nodes .* use a tensor-parallel degree "
                                         "that divides 2"):
        check_run(spec, 0)
    check_run(spec.model_copy(update={"strategy": "ddp-tp2"}), 0)
