"""params.yaml loading: presets, --set overrides, and combinations refused at load time."""

import collections
import copy
from pathlib import Path

import pytest
import yaml

from gpt2dist.config import machine
from gpt2dist.config.planning import check_plan_fits
from gpt2dist.config.presets import EMULATED_BF16, load_params
from gpt2dist.config.schema import InitWeights
from gpt2dist.config.strategies import check_run, degrees_of, STRATEGIES
from gpt2dist.errors import UsageError
from gpt2dist.launch.runner import build_spec
from gpt2dist.pipeline.jobs import caption_facts, train_command
from gpt2dist.pipeline.study import plan_study

from conftest import REPO, TINY_PRESET

REPO_PARAMS = REPO / "params.yaml"


def load_preset(path, name, overrides=()):
    return load_params(path).preset(name, overrides=overrides)[1]


def spec_for(params_file, shards, **kw):
    args = dict(data=shards, out=Path("/tmp/unused"), strategy="single", precision="fp32", nproc=1,
                params=load_params(params_file), preset=None, overrides=[], node_gpus=8)
    args.update(kw)
    return build_spec(**args)


@pytest.mark.parametrize("preset", ["cpu", "paper"])
def test_repository_presets_validate(preset):
    loaded = load_preset(REPO_PARAMS, preset)
    assert loaded.model.n_embd % loaded.model.n_head == 0


def test_paper_preset_is_gpt2_small():
    m = load_preset(REPO_PARAMS, "paper").model
    assert (m.n_layer, m.n_embd, m.n_head, m.n_positions, m.vocab_size) == (12, 768, 12, 1024, 50257)


def test_auto_picks_by_cuda_and_by_the_cpus_bf16():
    assert load_params(REPO_PARAMS).preset(None, cuda=False, cpu_bf16="native")[0] == "cpu"
    assert load_params(REPO_PARAMS).preset(None, cuda=False, cpu_bf16="unknown")[0] == "cpu"
    assert load_params(REPO_PARAMS).preset(None, cuda=False, cpu_bf16="emulated")[0] == EMULATED_BF16
    assert load_params(REPO_PARAMS).preset(None, cuda=True, cpu_bf16="emulated")[0] == "paper"
    assert load_params(REPO_PARAMS).preset("paper", cuda=False)[0] == "paper"
    assert load_params(REPO_PARAMS).preset("cpu", cuda=False, cpu_bf16="emulated")[0] == "cpu"  # named: taken as named
    expected = EMULATED_BF16 if machine.cpu_bf16() == "emulated" else "cpu"  # without cpu_bf16: this machine's
    assert load_params(REPO_PARAMS).preset(None, cuda=False)[0] == expected


def test_auto_on_an_emulating_cpu_keeps_cpu_where_params_has_no_variant(tmp_path):
    path = _params_with(tmp_path, {"cpu": TINY_PRESET, "paper": TINY_PRESET})
    assert load_params(path).preset(None, cuda=False, cpu_bf16="emulated")[0] == "cpu"


def test_the_emulated_bf16_variant_is_the_cpu_study_with_fewer_shorter_bf16_runs():
    """Every fp32 configuration of cpu, repeated as often; bf16 only where it tells the emulation's cost apart from a
    strategy's (single at 1 process, ddp at 2), repeated as often so that it is placed; all runs shorter."""
    cpu, emulated = plan_study(load_params(REPO_PARAMS), "cpu", 0), plan_study(load_params(REPO_PARAMS), EMULATED_BF16, 0)
    repeats = collections.Counter(r.config_id for r in emulated.runs)
    cpu_repeats = collections.Counter(r.config_id for r in cpu.runs)
    assert {c: n for c, n in repeats.items() if "-fp32-" in c} == {c: n for c, n in cpu_repeats.items() if "-fp32-" in c}
    bf16 = {c for c in repeats if "-bf16-" in c}
    assert bf16 == {"single-bf16-n1", "ddp-bf16-n2"} and {repeats[c] for c in bf16} == {cpu_repeats["ddp-bf16-n2"]}
    assert emulated.preset.study.added_repeats.rounds == 1 and emulated.preset.study.added_repeats.max_minutes == 2
    assert emulated.preset.model == cpu.preset.model and emulated.preset.data == cpu.preset.data
    assert emulated.preset.train.max_steps < cpu.preset.train.max_steps
    measured = (emulated.preset.train.max_steps - emulated.preset.study.excluded_steps
                - emulated.preset.train.ledger_steps)
    assert measured >= 5  # steps left for the throughput statistics
    assert "12 configurations, 36 runs (3 repeats each)" in caption_facts(emulated)
    assert "60 runs (3 repeats each)" in caption_facts(cpu)


def test_a_group_of_runs_repeats_as_often_as_it_says(tmp_path):
    study = {**TINY_PRESET["study"], "runs": [{"strategies": ["single"], "precisions": ["fp32"], "nproc": [1]},
                                              {"strategies": ["ddp"], "precisions": ["fp32"], "nproc": [2],
                                               "repeats": 1}]}
    path = _params_with(tmp_path, {"tiny": {**TINY_PRESET, "study": study}})
    assert [r.run_id for r in plan_study(load_params(path), "tiny", 0).runs] == ["single-fp32-n1-r0", "ddp-fp32-n2-r0",
                                                                     "single-fp32-n1-r1"]
    study["runs"][1]["repeats"] = 0
    path = _params_with(tmp_path, {"tiny": {**TINY_PRESET, "study": study}})
    with pytest.raises(UsageError, match="repeats: Input should be greater than or equal to 1"):
        plan_study(load_params(path), "tiny", 0)


def test_set_overrides_one_dotted_key(params_file):
    loaded = load_preset(params_file, "tiny", ["model.n_layer=3", "train.lr=1e-3", "train.compile=true"])
    assert loaded.model.n_layer == 3 and loaded.train.lr == 1e-3 and loaded.train.compile is True
    assert loaded.model.n_embd == TINY_PRESET["model"]["n_embd"]


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("model.n_layr=2", "unknown key 'model.n_layr' (allowed here: n_layer, n_head"),
        ("trian.lr=1", "unknown key 'trian'"),
        ("model.n_layer=0", "model.n_layer: Input should be greater than 0"),
        ("model.n_head=3", "n_embd (32) must be divisible by n_head (3)"),
        ("train.lr=fast", "train.lr: Input should be a valid number"),
        ("train.min_lr=1", "min_lr (1.0) must not exceed lr"),
        ("model.n_layer", "not of the form key=value"),
        ("study.keep_checkpoints=best", "study.keep_checkpoints: Input should be 'none', 'fastest' or 'all'"),
    ],
)
def test_bad_values_name_the_key(params_file, override, fragment):
    with pytest.raises(UsageError, match=None) as err:
        load_preset(params_file, "tiny", [override])
    assert fragment in str(err.value)


@pytest.mark.parametrize("keep, repeats", [("fastest", {0}), ("all", {0, 1}), ("none", set())])
def test_the_runs_that_keep_their_final_checkpoint_are_the_ones_study_keep_checkpoints_names(keep, repeats, tmp_path):
    """fastest (the default): each configuration's first repeat, as which is fastest is known only once all have
    run; all; none. A run that keeps it moves it into kept/, where the tools declare it; every other drops it."""
    params = {"preset": "tiny", "container": "unused.sif", "presets": {"tiny": copy.deepcopy(TINY_PRESET)}}
    if keep != "fastest":
        params["presets"]["tiny"]["study"]["keep_checkpoints"] = keep
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    study = plan_study(load_params(tmp_path / "params.yaml"), "tiny", 0)
    for run in study.runs:
        flags = {flag for flag in train_command(study, run).split() if "keep-checkpoint" in flag or "in-kept" in flag}
        assert flags == ({"--final-checkpoint-in-kept"} if run.repeat in repeats else {"--no-keep-checkpoint"}), run


def test_unknown_preset_lists_available(params_file):
    with pytest.raises(UsageError, match=r"unknown preset 'huge' \(available: tiny\)"):
        load_params(params_file).preset("huge")


def test_missing_params_file(tmp_path):
    with pytest.raises(UsageError, match="not found"):
        load_params(tmp_path / "nope.yaml").raw


def test_params_without_presets(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"preset": "auto"}))
    with pytest.raises(UsageError, match="no 'presets' mapping"):
        load_params(path).raw


@pytest.mark.parametrize(
    "kw, fragment",
    [
        (dict(strategy="ddp", nproc=3), "global_batch_size (8) must be divisible by nproc x train.micro_batch_size (3 x 2 = 6)"),
        (dict(strategy="dp", nproc=2), "'dp' drives one device per --nproc; 2 requested but 0 CUDA GPUs"),
        (dict(strategy="single", nproc=2), "strategy 'single' runs one process"),
        (dict(strategy="fsdp", precision="apex-O1"), "cannot wrap fsdp's sharded or split parameters"),
        (dict(strategy="dp", precision="apex-O2"), "'apex-O2' patches the model's forward, which DataParallel"),
        (dict(strategy="ddp", precision="apex-O2"), "'apex-O2' needs CUDA"),
        (dict(strategy="ddp", nproc=2, precision="bf16", fsdp_mixed_precision=True),
         "train.fsdp_mixed_precision applies to --strategy fsdp, zero2 or hsdp with --precision bf16 or fp16, not ddp "
         "with bf16"),
        (dict(strategy="fsdp", nproc=2, precision="fp32", fsdp_mixed_precision=True), "not fsdp with fp32"),
        (dict(strategy="tp", nproc=2, precision="fp16", device="cuda"), "use tp with bf16"),
        (dict(strategy="pp", nproc=2, precision="fp16"), "use pp with bf16"),
    ],
)
def test_impossible_combinations(params_file, shards, kw, fragment):
    # built without the dependency check, so the apex rows reach check_combination without apex installed
    spec = spec_for(params_file, shards)
    kw = dict(kw)
    if kw.pop("fsdp_mixed_precision", False):
        spec = spec.model_copy(update={"train": spec.train.model_copy(update={"fsdp_mixed_precision": True})})
    spec = spec.model_copy(update=kw)
    with pytest.raises(UsageError) as err:
        check_run(spec, visible_gpus=0)
    assert fragment in str(err.value)


@pytest.mark.parametrize("strategy, precision", [("dp", "apex-O1"), ("ddp", "apex-O2"), ("horovod", "apex-O2")])
def test_apex_combinations_that_can_run(params_file, shards, strategy, precision):
    """The dp x apex-O2 refusal is that pair only: neighbouring apex runs on a CUDA machine pass."""
    spec = spec_for(params_file, shards).model_copy(update=dict(strategy=strategy, precision=precision, device="cuda"))
    check_run(spec, visible_gpus=1)


def test_unknown_strategy_and_precision(params_file, shards):
    with pytest.raises(UsageError, match=r"unknown --strategy 'pipeline' \(allowed: single, dp, ddp, horovod, fsdp, tp, pp, fsdp-tp, apex-ddp, zero1, zero2, hsdp, or a data-parallel method with degrees such as ddp-tp2, "):
        spec_for(params_file, shards, strategy="pipeline")
    with pytest.raises(UsageError, match="unknown --precision 'fp8'"):
        spec_for(params_file, shards, precision="fp8")


def test_grad_accumulation_follows_world_size(params_file, shards):
    assert degrees_of(spec_for(params_file, shards)).grad_accum_steps == 4
    assert degrees_of(spec_for(params_file, shards, strategy="ddp", nproc=2)).grad_accum_steps == 2
    assert degrees_of(spec_for(params_file, shards, strategy="ddp", nproc=2)).processes == 2
    assert degrees_of(spec_for(params_file, shards, strategy="dp", nproc=2)).processes == 1


def test_fingerprint_changes_with_computation_not_paths(params_file, shards):
    base = spec_for(params_file, shards)
    assert base.fingerprint() == spec_for(params_file, shards, out=Path("/elsewhere")).fingerprint()
    assert base.fingerprint() != spec_for(params_file, shards, overrides=["train.lr=1e-3"]).fingerprint()


def test_weights_a_run_starts_from_enter_its_identity_by_content_not_path(params_file, shards):
    """A run started from other weights computes something else, wherever they lie; a run started from none keeps
    the identity runs had before --init-from existed, so their checkpoints still resume. The control: another hash
    is another run."""
    base = spec_for(params_file, shards)
    here, there, other = (base.model_copy(update={"init_from": InitWeights(path=path, sha256=digest)})
                          for path, digest in (("/a", "0" * 64), ("/b", "0" * 64), ("/a", "1" * 64)))
    assert here.fingerprint() == there.fingerprint() != base.fingerprint()
    assert here.computation_fingerprint() == there.computation_fingerprint() != base.computation_fingerprint()
    assert other.fingerprint() != here.fingerprint()
    assert other.computation_fingerprint() != here.computation_fingerprint()
    assert "init_from" not in base._identity()


def test_a_cpu_plan_on_a_gpu_machine_names_the_regenerate_command(params_file, tmp_path):
    """The committed dvc.yaml plans the cpu study (--gpus 0); on a GPU node it must stop, not train it on CUDA."""
    with pytest.raises(UsageError, match=r"planned for CPU .* this machine has 8 CUDA GPUs; .*gpt2dist dvc-yaml"):
        check_plan_fits(load_params(params_file), 0, 8)
    check_plan_fits(load_params(params_file), 0, 0)  # a CPU machine
    check_plan_fits(load_params(params_file), 8, 8)  # a regenerated plan
    check_plan_fits(load_params(params_file), 8, 0)  # planned on a login node for the cluster's GPUs
    pinned = tmp_path / "params.yaml"
    pinned.write_text(yaml.safe_dump({**yaml.safe_load(params_file.read_text()), "gpus_per_node": 0}))
    check_plan_fits(load_params(pinned), 0, 8)  # a CPU study on a GPU machine, said in params.yaml


def test_every_description_has_a_runtime_class_its_launcher_can_start():
    # the launcher plans from the torch-free descriptions without importing the strategies: they must agree
    from gpt2dist.training.strategies import REGISTRY
    from gpt2dist.training.strategies.horovod import Horovod
    from gpt2dist.training.strategies.torch_distributed import TorchDistributed

    assert set(STRATEGIES) == set(REGISTRY)
    kinds = {"torchrun": TorchDistributed, "horovodrun": Horovod}
    for strategy, description in STRATEGIES.items():
        implementation, launcher = REGISTRY[strategy], description.launcher
        if launcher == "python":
            assert not issubclass(implementation, (TorchDistributed, Horovod)), strategy
        else:
            assert issubclass(implementation, kinds[launcher]), strategy


def _params_with(tmp_path, presets: dict) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump({"preset": "auto", "container": "unused.sif", "presets": presets}))
    return path


def test_a_preset_extends_another_key_by_key(tmp_path):
    child = {"extends": "tiny", "model": {"n_layer": 4}, "study": {"runs": [
        {"strategies": ["ddp"], "precisions": ["bf16"], "nproc": [2]}]}}
    path = _params_with(tmp_path, {"tiny": TINY_PRESET, "child": child, "grandchild": {"extends": "child"}})
    for name in ("child", "grandchild"):
        loaded = load_preset(path, name)
        assert loaded.model.n_layer == 4 and loaded.model.n_embd == TINY_PRESET["model"]["n_embd"]  # merged
        assert [g.strategies for g in loaded.study.runs] == [["ddp"]]  # a list replaces the parent's
        assert loaded.study.repeats == TINY_PRESET["study"]["repeats"]
    assert load_preset(path, "tiny").model.n_layer == TINY_PRESET["model"]["n_layer"]  # the parent is untouched


def test_a_mapping_of_another_kind_replaces_the_parents_whole(tmp_path):
    """A child that reads files where its parent reads the embedded corpus keeps none of the embedded keys;
    the same kind still merges key by key (the control: min_chars is kept when only val_fraction changes)."""
    files = tmp_path / "corpus.txt"
    files.write_text("text " * 1000)
    child = {"extends": "tiny", "data": {"source": {"kind": "files", "paths": [str(files)]}}}
    same = {"extends": "tiny", "data": {"source": {"kind": "embedded"}, "val_fraction": 0.2}}
    path = _params_with(tmp_path, {"tiny": TINY_PRESET, "child": child, "same": same})
    assert load_preset(path, "child").data.source.kind == "files"
    kept = load_preset(path, "same").data
    assert kept.source.min_chars == TINY_PRESET["data"]["source"]["min_chars"] and kept.val_fraction == 0.2


@pytest.mark.parametrize("presets, message", [
    ({"a": {"extends": "b"}, "b": {"extends": "a"}}, r"presets extend each other in a circle \(a -> b -> a\)"),
    ({"a": {"extends": "nowhere"}}, r"preset 'a' extends 'nowhere', which is not a preset \(available: a\)"),
])
def test_a_bad_extends_is_one_error(tmp_path, presets, message):
    with pytest.raises(UsageError, match=message):
        load_params(_params_with(tmp_path, presets)).preset("a")


def test_the_schema_accepts_extending_presets_and_refuses_unknown_sections(tmp_path):
    import json

    import jsonschema

    schema = json.loads((REPO / "workflow" / "schemas" / "params.schema.json").read_text())
    params = yaml.safe_load(REPO_PARAMS.read_text())
    jsonschema.validate(params, schema)
    params["presets"]["two-node-cpu"]["stduy"] = {}  # a typo Snakemake's validation must catch
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(params, schema)


def test_keys_renamed_since_a_bundle_was_made_are_read_under_their_new_names(tmp_path):
    from gpt2dist.config.presets import upgraded

    old = copy.deepcopy(TINY_PRESET)
    old["train"]["warmup_steps"] = old["train"].pop("lr_warmup_steps")
    old["study"]["warmup_steps"] = old["study"].pop("excluded_steps")
    path = _params_with(tmp_path, {"tiny": old})
    with pytest.raises(UsageError, match="unknown key 'train.warmup_steps'"):  # today's reader refuses the old names
        load_preset(path, "tiny")
    path.write_text(yaml.safe_dump(upgraded(yaml.safe_load(path.read_text()))))
    loaded = load_preset(path, "tiny")
    assert (loaded.train.lr_warmup_steps, loaded.study.excluded_steps) == (TINY_PRESET["train"]["lr_warmup_steps"],
                                                                        TINY_PRESET["study"]["excluded_steps"])


def test_cpu_bf16_is_native_only_with_bf16_instructions():
    """The flags line decides: AVX512-BF16 or AMX make bf16 native; AVX2 alone emulates it."""
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n"
    assert machine.cpu_bf16(avx2) == "emulated"
    assert machine.cpu_bf16(avx2.replace("avx2", "avx2 avx512f avx512_bf16")) == "native"
    assert machine.cpu_bf16(avx2.replace("avx2", "avx2 amx_tile amx_bf16")) == "native"
    assert machine.cpu_bf16("processor\t: 0\nmodel name\t: some CPU\n") == "unknown"  # no flags line: say so


def test_two_cpus_of_one_name_are_told_apart_by_family_model_and_instruction_sets():
    """Two virtual machines that both say "AMD EPYC": one AVX2-only, one with AVX512-BF16."""
    zen3 = ("processor\t: 0\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC\nstepping\t: 1\n"
            "cpu MHz\t\t: 2445.404\nflags\t\t: fpu sse2 avx avx2 fma\n\nprocessor\t: 1\ncpu family\t: 99\n")
    assert machine.cpu_identity(zen3) == {"family": "25", "model": "1", "stepping": "1", "mhz": 2445,
                                          "speed_flags": ["AVX2"]}  # the first processor's fields only
    zen4 = zen3.replace("model\t\t: 1\n", "model\t\t: 17\n").replace("avx2", "avx2 avx512f avx512_bf16")
    assert machine.cpu_identity(zen4)["speed_flags"] == ["AVX2", "AVX-512", "AVX512-BF16"]
    assert machine.cpu_identity(zen4) != machine.cpu_identity(zen3)
    assert machine.cpu_identity("") == {}  # nothing to read: nothing claimed


def test_an_extending_presets_values_are_watched_where_they_are_written():
    """DVC watches params by key: an extending preset's sections come from itself and its parents."""
    keys = load_params(REPO_PARAMS).section_keys(EMULATED_BF16)
    assert keys["model"] == ["presets.cpu.model"]  # not `presets.cpu-emulated-bf16.model`, which is not written
    assert keys["train"] == [f"presets.{EMULATED_BF16}.train", "presets.cpu.train"]
    raw = load_params(REPO_PARAMS).raw
    for name in raw["presets"]:
        found = load_params(REPO_PARAMS).section_keys(name)
        assert {"data", "model", "train", "study"} <= found.keys(), name
        for key in (k for ks in found.values() for k in ks):
            _, preset, section = key.split(".")
            assert section in raw["presets"][preset], key
