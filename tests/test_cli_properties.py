"""Property-based: any value of a numeric option, any text, NaN, infinities, zero and negatives, ends either in
the command's answer (status 0) or in exactly one 'error:' line with status 2, never a traceback. Run in this
process through the command's own entry point (as `gpt2dist` runs), seeded and bounded in examples."""

from __future__ import annotations

import contextlib
import io
import json
import math
import re
import shutil
import sys

import pytest
from hypothesis import HealthCheck, example, given, seed, settings
from hypothesis import strategies as st

from gpt2dist.cli import run

from conftest import REPO, assert_answer_or_one_error

PARAMS = str(REPO / "params.yaml")
# each command with the arguments that make it valid, and its numeric options (a list option takes a list)
COMMANDS = {
    "plan": (["--params", PARAMS, "--preset", "paper", "--gpus", "8"], ["--mfu", "--gpus", "--nodes", "--memory-gb",
                                                                        "--budget-s", "--nics"]),
    "recommend": (["--params", PARAMS, "--gpus", "8"], ["--gpus", "--nodes", "--memory-gb", "--tokens", "--mfu",
                                                       "--nics"]),
    "project-scaling": (["--params", PARAMS, "--preset", "paper"], ["--mfu", "--gpus-per-node", "--nodes", "--nics"]),
    "validate-published": ([], ["--mfu"]),
    "doctor": (["--params", PARAMS, "--preset", "paper", "--no-gpu"], ["--gpus", "--nodes"]),
    "dvc-yaml": (["--params", PARAMS, "--preset", "paper", "--out", "{tmp}/dvc.yaml"], ["--gpus", "--nodes"]),
    "selftest": (["--params", PARAMS, "--preset", "cpu", "--only", "no-such-config"], ["--timeout"]),
    "add-round": (["--params", PARAMS, "--preset", "cpu", "--round", "1", "--runs", "{tmp}/none", "--results",
                   "{tmp}/none"], ["--round", "--gpus", "--nodes"]),
}
CASES = [(command, option) for command, (_, options) in COMMANDS.items() for option in options]
NUMBERS = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e999", "0", "-0", "-1", "", " ", "1,", ",", "0x10", "1_0"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.integers(min_value=-10**20, max_value=10**20).map(str),
    st.text(max_size=6),
)


def invoke(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv, sys.argv = sys.argv, ["gpt2dist", *args]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ended:
            run()
    finally:
        sys.argv = argv
    return ended.value.code, out.getvalue(), err.getvalue()


# train prints its launch command instead of training (--print-command): every check before a launch runs
TRAIN_OPTIONS = ["--nproc", "--max-steps", "--seed", "--nodes", "--link-mbit", "--emulate-nodes", "--size"]


def with_value(base: list[str], option: str, value: str) -> list[str]:
    if option not in base:
        return [*base, option, value]
    at = base.index(option)
    return [*base[:at], option, value, *base[at + 2:]]


@pytest.mark.parametrize("command, option", CASES, ids=[f"{c}{o}" for c, o in CASES])
@seed(20261126)
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=NUMBERS)
def test_any_value_is_an_answer_or_one_error_line(command, option, value, tmp_path_factory):
    base = [arg.replace("{tmp}", str(tmp_path_factory.getbasetemp())) for arg in COMMANDS[command][0]]
    assert_answer_or_one_error(*invoke(command, *with_value(base, option, value)))


@pytest.mark.parametrize("option", TRAIN_OPTIONS)
@seed(20261126)
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=NUMBERS)
def test_any_value_of_a_train_option_is_a_launch_or_one_error_line(option, value, shards, params_file, tmp_path):
    base = ["--data", str(shards), "--out", str(tmp_path / "run"), "--params", str(params_file), "--strategy", "ddp",
            "--print-command"]
    code, out, err = invoke("train", *with_value(base, option, value))
    assert_answer_or_one_error(code, out, err)


@pytest.mark.parametrize("args, message", [
    (["plan", "--mfu", "nan"], "error: Invalid value for '--mfu': 'nan' is not a finite number"),
    (["recommend", "--gpus", "8", "--tokens", "-inf"], "error: Invalid value for '--tokens': '-inf' is not a finite"),
    (["plan", "--memory-gb", "80,nan"], "error: --memory-gb '80,nan': 'nan' is not a finite number"),
    (["plan", "--frobnicate"], "error: No such option: --frobnicate"),
])
def test_the_error_names_the_option_and_the_problem(args, message):
    """The property's control, each a case it fails without the typed options: before them, `recommend --tokens
    nan` answered with status 0, 'nan tokens' and a table of nan hours, and an unknown option gave click's
    usage block instead of one line."""
    code, _, err = invoke(*args)
    assert code == 2 and err.startswith(message), err


HOSTS = st.lists(st.tuples(st.sampled_from(["a", "b", "node-1", "", "a:b"]), st.integers(-2, 40)), min_size=1,
                 max_size=3).map(lambda hosts: ",".join(f"{name}:{slots}" for name, slots in hosts))
SETS = st.one_of(st.text(max_size=12), st.builds(lambda key, value: f"{key}={value}",
                                                  st.sampled_from(["model.n_layer", "train.lr", "study", "x.y.z", "",
                                                                   "train.data_parallel_shard_size",
                                                                   "train.pipeline_virtual_stages",
                                                                   "train.pipeline_schedule",
                                                                   "train.activation_checkpointing",
                                                                   "train.head_loss_chunk_tokens",
                                                                   "train.cuda_graphs"]),
                                                  st.one_of(st.text(max_size=8), NUMBERS)))


@seed(20261126)
@settings(max_examples=10, deadline=None)
@given(sizes=st.one_of(NUMBERS, st.sampled_from(["small", "xl,small", "small,,xl", "XL", "small,huge", ",", "medium "])))
def test_any_sizes_are_a_plan_or_one_error_line(sizes):
    assert_answer_or_one_error(*invoke("plan", "--params", PARAMS, "--preset", "paper-sizes", "--gpus", "8",
                                       "--sizes", sizes))


# the cluster's text options: a GPU's name, its links, the arithmetic and the model sizes
TEXT_CASES = [(command, option) for command in ("plan", "recommend", "project-scaling")
              for option in ("--gpu", "--link-inside", "--link-across")] + [
    ("recommend", "--precision"), ("project-scaling", "--precision"), ("recommend", "--sizes"),
    ("project-scaling", "--sizes")]
NAMES = st.one_of(NUMBERS, st.sampled_from(["H100", "GH200", "h100 pcie", "pcie3-host", "ndr", "fp8", "bf16", "xl",
                                            "small,,xl", "nvlink4 ", "NVLINK4"]))


@pytest.mark.parametrize("command, option", TEXT_CASES, ids=[f"{c}{o}" for c, o in TEXT_CASES])
@seed(20261128)
@settings(max_examples=4, deadline=None)
@given(value=NAMES)
def test_any_name_of_a_gpu_link_arithmetic_or_size_is_an_answer_or_one_error_line(command, option, value):
    assert_answer_or_one_error(*invoke(command, *with_value(COMMANDS[command][0], option, value)))


@seed(20261126)
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(hosts=HOSTS, gpus=st.sampled_from(["0", "1", "4", "-1", "nan"]), nproc=st.sampled_from([None, "1", "4", "8"]))
def test_any_hosts_are_launch_commands_or_one_error_line(hosts, gpus, nproc, shards, params_file, tmp_path):
    """--hosts is checked as any run is (process count, batch, the hosts' GPUs) and --nproc must agree with it."""
    args = ["--data", str(shards), "--out", str(tmp_path / "run"), "--params", str(params_file), "--strategy", "ddp",
            "--hosts", hosts, "--gpus", gpus, *(["--nproc", nproc] if nproc else [])]
    assert_answer_or_one_error(*invoke("train", *args))


@seed(20261126)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(assignment=SETS)
@example(assignment="train.head_loss_chunk_tokens=nan")
@example(assignment="train.head_loss_chunk_tokens=inf")
@example(assignment="train.head_loss_chunk_tokens=-1")
@example(assignment="train.head_loss_chunk_tokens=0")
@example(assignment="train.head_loss_chunk_tokens=2.5")
@example(assignment="train.cuda_graphs=nan")
@example(assignment="train.cuda_graphs=-1")
@example(assignment="train.cuda_graphs=true")  # without compile_whole_model, and on CPU: refused either way
def test_any_set_is_a_launch_or_one_error_line(assignment, shards, params_file, tmp_path):
    args = ["--data", str(shards), "--out", str(tmp_path / "run"), "--params", str(params_file), "--strategy", "single",
            "--print-command", "--set", assignment]
    assert_answer_or_one_error(*invoke("train", *args))


CONTENTS = st.one_of(st.sampled_from([b"", b"\n", b"{}", b"[]", b"null", b'{"preset": "cpu"}', b"presets:\n  cpu: {}\n",
                                      b"PK\x03\x04", b"\x1f\x8b\x08\x00", b"\x80\x02}q\x00."]),
                     st.binary(max_size=64), st.text(max_size=64).map(str.encode))


@seed(20261126)
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=CONTENTS, where=st.sampled_from(["resume-from", "summary", "stored", "bundle", "estimate"]))
def test_a_file_of_any_content_where_another_kind_is_expected_is_one_error_line(content, where, shards,
                                                                              params_file, tmp_path_factory):
    """A checkpoint, a study's summary.json (its own, or a stored study's to compare with), a bundle or an estimate
    given as any bytes: never a parser's traceback. (A stdlib pickle of a dict, the last sample, is no checkpoint
    either: torch.save writes a zip archive.)"""
    folder = tmp_path_factory.mktemp("file")
    target = folder / {"resume-from": "checkpoint.pt", "summary": "summary.json", "stored": "other/summary.json",
                       "bundle": "study.tar.gz", "estimate": "estimate.json"}[where]
    target.parent.mkdir(exist_ok=True)
    target.write_bytes(content)
    (folder / "own").mkdir()
    shutil.copy(REPO / "docs" / "reference" / "cpu-study" / "summary.json", folder / "own" / "summary.json")
    args = {"resume-from": ["train", "--data", str(shards), "--out", str(folder / "run"), "--params", str(params_file),
                            "--strategy", "single", "--print-command", "--resume-from", str(target)],
            "summary": ["report", "--results", str(folder)],
            "stored": ["report", "--results", str(folder / "own"), "--against", str(folder)],
            "bundle": ["figures", "--from", str(target), "--out", str(folder / "rebuilt")],
            "estimate": ["progress", "--params", str(params_file), "--runs", str(folder), "--estimate", str(target)]}
    code, out, err = invoke(*args[where])
    if where == "estimate" and code == 0:  # an estimate is advice: one it cannot read is said and left out
        return
    assert code == 2, (where, content, out, err)
    assert_answer_or_one_error(code, out, err)


@seed(20261201)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=CONTENTS)
@example(content=b"")
@example(content=b'{"status": "completed"}')
def test_a_run_record_of_any_content_is_read_or_one_error_line_naming_it(content, params_file, tmp_path_factory):
    """A finished run's run.json as any bytes, where estimate and progress count what is done: a JSON object is
    read (a completed one without its times counts as not finished); anything else is one line naming the file
    and what to do, never a count that leaves the run out without a word (an empty one did)."""
    runs = tmp_path_factory.mktemp("runs")
    record = runs / "single-fp32-n1-r0" / "run.json"  # the tiny preset's first run
    record.parent.mkdir()
    record.write_bytes(content)
    code, out, err = invoke("progress", "--params", str(params_file), "--runs", str(runs))
    assert_answer_or_one_error(code, out, err, answer="study:")
    try:
        readable = isinstance(json.loads(content), dict)
    except ValueError:
        readable = False
    assert (code == 0) is readable, (content, out, err)
    if not readable:
        assert f"{record} cannot be read" in err and "delete its run directory" in err


# A safetensors header (8 bytes of its length, then JSON) that promises bytes the file lacks
PROMISING = b'{"transformer.wte.weight": {"dtype": "F32", "shape": [512, 32], "data_offsets": [0, 65536]}}'


@seed(20261126)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=CONTENTS, where=st.sampled_from(["config.json", "model.safetensors", "checkpoint.pt"]))
@example(content=len(PROMISING).to_bytes(8, "little") + PROMISING, where="model.safetensors")
def test_transformers_files_of_any_content_are_one_error_line(content, where, shards, params_file, tmp_path_factory):
    """--init-from's config.json or model.safetensors, or the checkpoint that export reads, given as any bytes: one
    line naming the file, never a parser's traceback."""
    folder = tmp_path_factory.mktemp("transformers")
    shape = {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32, "vocab_size": 512}  # the tiny preset's
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", **shape}))
    (folder / where).write_bytes(content)
    if where == "checkpoint.pt":
        args = ["export", "--run", str(folder), "--out", str(folder / "hf")]
    else:
        args = ["train", "--data", str(shards), "--out", str(folder / "run"), "--params", str(params_file),
                "--strategy", "single", "--print-command", "--init-from", str(folder)]
    code, out, err = invoke(*args)
    assert code == 2 and where in err, (where, content, out, err)
    assert_answer_or_one_error(code, out, err)


# Every option of every command, read from the app itself, so that an option added later is fuzzed too. The
# narrower properties above fuzzed hand-picked lists (numbers, the cluster's names, train's launch options), and
# what they did not list is where the last faults hid: recommend --precision, report --against, train --size ''
# and estimate --runs were in none of them. Each command's arguments keep it cheap (no training, no timing):
# train only prints its commands, selftest names no configuration, estimate plans for GPUs this host lacks.
CHEAP = {
    "add-round": ["--params", "{params}", "--preset", "tiny", "--round", "1", "--runs", "{tmp}/none", "--results",
                  "{tmp}/none"],
    "bundle": ["--params", "{params}", "--preset", "tiny", "--runs", "{tmp}/none", "--out", "{tmp}/study.tar.gz"],
    "collect": ["--params", "{params}", "--preset", "tiny", "--runs", "{tmp}/none", "--out", "{tmp}/collected"],
    "doctor": ["--params", "{params}", "--preset", "tiny", "--no-gpu"],
    "dvc-yaml": ["--params", "{params}", "--preset", "tiny", "--out", "{tmp}/dvc.yaml"],
    "estimate": ["--params", PARAMS, "--preset", "paper", "--gpus", "8", "--runs", "{tmp}/none", "--out",
                 "{tmp}/estimate.json"],
    "export": ["--run", "{tmp}/none", "--out", "{tmp}/exported"],
    "figures": ["--from", "{tmp}/none.tar.gz", "--out", "{tmp}/rebuilt"],
    "plan": COMMANDS["plan"][0],
    "plot": ["--results", "{tmp}/none"],
    "prepare": ["--params", "{params}", "--preset", "tiny", "--out", "{tmp}/tokens", "--no-progress"],
    "progress": ["--params", "{params}", "--preset", "tiny", "--runs", "{tmp}/none", "--estimate", "{tmp}/none.json"],
    "project-scaling": COMMANDS["project-scaling"][0],
    "recommend": COMMANDS["recommend"][0],
    "report": ["--results", "{tmp}/none"],
    "schema": ["--out", "{tmp}/params.schema.json"],
    "selftest": ["--params", "{params}", "--preset", "tiny", "--only", "no-such-config", "--out", "{tmp}/st.json"],
    "strategies": [],
    "train": ["--data", "{shards}", "--out", "{tmp}/run", "--params", "{params}", "--strategy", "ddp",
              "--print-command"],
    # planned for GPUs, not run: no timing and no Snakemake
    "tune": ["--params", PARAMS, "--preset", "paper", "--gpus", "8", "--dry-run", "--out", "{tmp}/tune"],
    "validate-published": [],
}
# (command, option) pairs whose any value would start the work the arguments above avoid
COSTLY = {("estimate", "--gpus"): "0 plans GPT-2 small for this CPU and times it (the Gpus type is plan's, fuzzed there)",
          ("selftest", "--only"): "a configuration's name starts its selftest (the names are run ids, parsed by plan)",
          ("tune", "--gpus"): "0 tunes this machine's CPUs, which times single's step first (the Gpus type is plan's, "
                              "fuzzed there)"}


def every_option() -> list[tuple[str, str]]:
    """(command, option) for each option of each command that takes a value (flags take none)."""
    import typer

    from gpt2dist.cli import app

    commands = typer.main.get_command(app).commands
    return [(name, param.opts[0]) for name, command in sorted(commands.items()) for param in command.params
            if param.param_type_name == "option" and not param.is_flag and param.opts[0] != "--help"]


OPTIONS = every_option()
FUZZED = [case for case in OPTIONS if case not in COSTLY]
TEXTS = st.one_of(NUMBERS, NAMES, st.sampled_from(["", " ", "/", ".", "..", "-", "--", "~", "a b", "tiny", "paper",
                                                   "results", "-1", "ddp-fp32-n2"]),
                  st.text(max_size=8).filter(lambda text: "\x00" not in text))  # no shell passes a NUL


def test_every_option_of_every_command_is_fuzzed_or_says_why_not():
    """The list comes from the app: the options the hand-picked lists missed are in it, and only COSTLY is left out."""
    assert {("recommend", "--precision"), ("report", "--against"), ("train", "--size"), ("estimate", "--runs"),
            ("prepare", "--out"), ("figures", "--from")} <= set(FUZZED)
    assert set(CHEAP) == {command for command, _ in OPTIONS}, "give each command arguments that keep it cheap"
    assert set(COSTLY) <= set(OPTIONS)


@pytest.mark.parametrize("command, option", FUZZED, ids=[f"{c}{o}" for c, o in FUZZED])
@seed(20261128)
@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=TEXTS)
def test_any_text_for_any_option_is_an_answer_or_one_error_line(command, option, value, shards, params_file,
                                                                tmp_path_factory, monkeypatch):
    tmp = tmp_path_factory.mktemp("any")
    monkeypatch.chdir(tmp)  # a relative path among the values is written here, not in the repository
    base = [arg.format(tmp=tmp, params=params_file, shards=shards) if "{" in arg else arg for arg in CHEAP[command]]
    assert_answer_or_one_error(*invoke(command, *with_value(base, option, value)))


CALIBRATED = {"gpu": "H100", "precision": "bf16", "micro_batches": [8, 16], "measured_s": [0.02, 0.035],
              "predicted_s": [0.018, 0.031], "scale": 1.15, "offset_s": 0.001, "preset_step_s": [0.07, 0.062]}
JSON_NUMBERS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6), st.just(0),
                         st.text(max_size=4), st.none(), st.lists(st.floats(), max_size=3))


@seed(20261202)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(
    st.binary(max_size=32),
    st.sampled_from(["[]", "{}", '{"gpu_calibration": []}', '{"gpu_calibration": {"bf16": 1}}']).map(str.encode),
    st.tuples(st.sampled_from(sorted(CALIBRATED)), JSON_NUMBERS).map(
        lambda change: json.dumps({"gpu_calibration": {"bf16": CALIBRATED | dict([change])}},
                                  allow_nan=True).encode())))
@example(content=json.dumps({"gpu_calibration": {"bf16": CALIBRATED}}).encode())  # the answer
@example(content=json.dumps({"gpu_calibration": {"bf16": CALIBRATED | {"preset_step_s": [math.nan, 0.06]}}},
                            allow_nan=True).encode())
@example(content=json.dumps({"gpu_calibration": {"bf16": CALIBRATED | {"measured_s": [-0.02, 0.035]}}}).encode())
def test_any_calibration_file_is_a_plan_or_one_error_line(content, tmp_path_factory):
    """--calibration's estimate.json of any bytes, any JSON, or estimate's calibration with any field changed (NaN,
    infinities, zero, negatives, text, nothing): plan's answer or one error line, never a traceback; a timing that
    is not a finite positive number is refused, not printed as "nan ms"."""
    path = tmp_path_factory.mktemp("calibration") / "estimate.json"
    path.write_bytes(content)
    code, out, err = invoke("plan", *COMMANDS["plan"][0], "--calibration", str(path))
    assert_answer_or_one_error(code, out, err)
    assert code == 0 or "--calibration" in err or str(path) in err, err  # refused for the file, not another reason
    assert code != 0 or not re.search(r"\b(nan|inf)\b|-\d[\d.]* ms against", out), out


TUNED = {"made_at": "2026-12-03T12:00:00+00:00", "preset": "paper", "size": None, "precision": "bf16",
         "hardware": "8x H100", "model": "the GPU step model", "basis": None, "ratio_error": 0.22,
         "cluster": {"device": "cuda", "nproc": 8, "nodes": 1, "emulated": False, "link_mbit": None, "gpu": "H100",
                     "gpus_per_node": 8, "links": {"inside": "nvlink4", "across": "ndr", "nics": 8}, "memory_gb": 80},
         "splits": {"ddp": {"predicted_step_s": 0.05, "measured_step_s": 0.06}}}
CPU_TUNED = TUNED | {"precision": "fp32", "preset": "cpu", "model": "the CPU step model",
                     "basis": {"single_step_s": 0.1, "busbw_gb_s": 0.9, "busbw_from": "stored"},
                     "cluster": {"device": "cpu", "nproc": 2, "nodes": 1, "emulated": False, "link_mbit": None,
                                 "gpu": None, "gpus_per_node": 0, "links": None, "memory_gb": 6.0}}


def _changed(tuned: dict, where: str, value) -> bytes:
    """A tune's calibration with one field (or a cluster's, or its split's, or its basis's) changed."""
    section, _, key = where.partition(".")
    if key:
        inner = dict(tuned[section] or {}) if section != "splits" else {"ddp": dict(tuned["splits"]["ddp"])}
        (inner["ddp"] if section == "splits" else inner)[key] = value
        return json.dumps({"tune": tuned | {section: inner}}, allow_nan=True).encode()
    return json.dumps({"tune": tuned | {section: value}}, allow_nan=True).encode()


FIELDS = sorted([*TUNED, *(f"cluster.{key}" for key in TUNED["cluster"]), "splits.measured_step_s",
                 "splits.predicted_step_s", "basis.single_step_s", "basis.busbw_gb_s"])


@seed(20261203)
@settings(max_examples=16, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=st.one_of(
    st.sampled_from(['{"tune": []}', '{"tune": {}}', '{"tune": {"splits": 1}}']).map(str.encode),
    st.tuples(st.sampled_from([TUNED, CPU_TUNED]), st.sampled_from(FIELDS), JSON_NUMBERS).map(lambda c: _changed(*c))))
@example(content=json.dumps({"tune": TUNED}).encode())  # the answers
@example(content=json.dumps({"tune": CPU_TUNED}).encode())
def test_any_tune_calibration_is_a_recommendation_or_one_error_line(content, tmp_path_factory):
    """--calibration's calibration.json as a tune writes it (on GPUs or CPUs), any field changed to any value: the
    recommendation or one error line naming the file, never a traceback."""
    path = tmp_path_factory.mktemp("tuned") / "calibration.json"
    path.write_bytes(content)
    code, out, err = invoke("recommend", "--params", PARAMS, "--calibration", str(path))
    assert_answer_or_one_error(code, out, err)
    assert code == 0 or "--calibration" in err or str(path) in err or "preset" in err, err


@seed(20261202)
@settings(max_examples=6, deadline=None)
@given(name=st.sampled_from(["kernel_s", "gemm_efficiency", "link_efficiency", "", "mfu", "kernel_s=1"]),
       value=NUMBERS)
def test_any_held_constant_is_a_validation_or_one_error_line(name, value):
    """validate-published --hold NAME=VALUE with any name and any number: its answer or one error line."""
    assert_answer_or_one_error(*invoke("validate-published", "--format", "csv", "--hold", f"{name}={value}"))
