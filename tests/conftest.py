"""Shared fixtures: a tiny preset, learnable synthetic shards, and helpers that run the real CLI."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import psutil
import pytest
import yaml

from gpt2dist.cli import WARNING_CONTINUED
from gpt2dist.config.strategies import describe
from gpt2dist.data.shards import write_shards
from gpt2dist.launch.lifetime import ended
from gpt2dist.launch.locks import MACHINE_LOCK_ENV
from gpt2dist.system.conditions import QUIET_WAIT_ENV

# The system pieces some tests need, each with the variable that makes its absence a failure; .ci/run
# installs every piece and sets every variable. Elsewhere a missing piece skips, naming it.
PIECES = {"GPT2DIST_REQUIRE_SLURM": "SLURM and munge", "GPT2DIST_REQUIRE_IMAGE": "root, podman, runc, mmdebstrap",
          "GPT2DIST_REQUIRE_NODES": "root, iproute2, openssh-server",
          "GPT2DIST_REQUIRE_TOKENIZER": "GPT-2's tokenizer files (containers/fetch_gpt2_tokenizer.sh, with npm)",
          "GPT2DIST_REQUIRE_BROWSER": "Debian's chromium and the playwright package"}
# Skips that no machine setting can choose away, by their exact reasons: no GPU or too few, no Apex (its build
# needs CUDA), a GPU older than Ampere, and a combination the study itself refuses (the GPU matrix's skips).
GPU_SKIPS = {"needs a CUDA GPU", "needs 2 CUDA GPUs", "needs 4 CUDA GPUs", "needs 8 CUDA GPUs",
             "needs NVIDIA Apex (the container image)",
             "needs NVIDIA Apex (the container image builds it)", "TF32 needs an Ampere or newer GPU"}
STUDY_REFUSES = "the study refuses this combination: "
# A run waits for a quiet machine (up to 10 s by default) before it trains. A test's `gpt2dist train` measures
# nothing, so it starts at once. A study's runs (reduced_study.run) wait as a user's do, at most QUIET_WAIT_S (a CI
# machine's own background work can keep it from ever being quiet; Snakemake's bookkeeping between jobs, what the
# wait is for, takes about a second), where the test has the machine to itself (quiet_wait_for_studies): beside
# the other worker's tests the wait only ran out its clock before every run.
QUIET_WAIT_S = 3
os.environ[QUIET_WAIT_ENV] = "0"
_machine_to_itself = True  # the running test's, set by pytest_runtest_protocol


def quiet_wait_for_studies() -> str:
    """What a study started now waits for a quiet machine (QUIET_WAIT_ENV's value)."""
    return str(QUIET_WAIT_S) if _machine_to_itself else "0"


# Tests run in two pytest-xdist workers (pyproject's addopts), each handed whole modules: a module's fixtures (a
# SLURM cluster, network namespaces, an image) live in one worker. The modules that start SLURM clusters or network
# namespaces share one group, so that no two of those run at once.
SHARED_GROUPS = {"tests/launch/test_slurm_cluster.py": "nodes", "tests/launch/test_emulated_nodes.py": "nodes"}
# Modules that take minutes (docs/development.md's table), handed out first, the longest first, so that no worker is
# left alone with one of them at the end; the rest follow in the order they are collected.
LONGEST_FIRST = ["tests/launch/test_slurm_cluster.py", "tests/launch/test_emulated_nodes.py",
                 "tests/training/test_train_cli.py", "tests/pipeline/test_tune_in_pipeline.py",
                 "tests/containers/test_image.py",
                 "tests/pipeline/test_verdicts_hold.py", "tests/training/test_resume_across_strategies.py",
                 "tests/launch/test_signals.py", "tests/training/test_engine_structure.py",
                 "tests/training/test_pipeline_parallel.py",
                 "tests/pipeline/test_pipeline.py", "tests/pipeline/test_added_repeats_in_pipeline.py",
                 "tests/results/test_bundle.py", "tests/training/test_zero_and_hsdp.py", "tests/test_memory.py",
                 "tests/pipeline/test_sizes_in_pipeline.py", "tests/pipeline/test_splits_in_pipeline.py",
                 "tests/pipeline/test_resume_in_pipeline.py"]
@pytest.hookimpl(optionalhook=True)  # a pytest without xdist (the image's) has no such hook
def pytest_xdist_make_scheduler(config, log):
    """xdist's default scheduling, by test, made to hand out whole modules and SHARED_GROUPS, in collection order."""
    if config.getvalue("dist") != "load":
        return None
    config.option.loadscopereorder = False  # the order pytest_collection_modifyitems gave
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return SHARED_GROUPS.get(module, module)

    return ModuleGroups(config, log)


def _is_worker(config: pytest.Config) -> bool:
    """Whether this pytest is an xdist worker (not the controller, nor a run without workers). Not by the
    environment: a pytest that a test starts inherits its worker's."""
    return hasattr(config, "workerinput")


def _run_dir(config: pytest.Config) -> Path:
    """The directory every worker of this run shares: each worker's own is below the run's (pytest keeps the
    TempPathFactory that the tmp_path fixtures use on the config)."""
    base = config._tmp_path_factory.getbasetemp()
    return base.parent if _is_worker(config) else base


def pytest_configure(config):
    """An xdist worker starts with COLUMNS=80 where a pytest without workers has none: the commands the tests run
    (their prose wraps to the terminal's width, 100 columns where there is none) see what they would see alone."""
    if _is_worker(config):
        os.environ.pop("COLUMNS", None)


@contextlib.contextmanager
def _flocked(path: str | Path, mode: int):
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        yield


def runs_alone(item: pytest.Item) -> bool:
    """A test that judges how busy the machine was (a study's disturbance flags and tiers, the load monitor) runs
    while no other test does: marked `alone`, or `gpu` where a GPU is (a GPU test has the device to itself). Where
    none is, a GPU test only skips, and waiting for the machine to skip left its worker idle until the other
    worker's test ended (75 s of the suite's 127 skips in one measured run)."""
    if item.get_closest_marker("alone") is not None:
        return True
    return item.get_closest_marker("gpu") is not None and cuda_visible()


@functools.cache
def cuda_visible() -> bool:
    """Asked only where a test is marked gpu: a pytest session of a few tests that need no torch (the suite's
    own tests run such sessions) does not import it for this."""
    import torch
    return torch.cuda.is_available()


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """Every test holds the machine shared, an `alone` test exclusively, from before its fixtures are set up
    until after they are torn down (outside pytest-timeout's clock). A waiting `alone` test holds the turnstile,
    so that the other worker's next test waits behind it instead of keeping the machine shared for ever. Only a
    test that holds it alone has its studies wait for a quiet machine (quiet_wait_for_studies)."""
    global _machine_to_itself
    if not _is_worker(item.config):
        yield
        return
    base = _run_dir(item.config)
    _machine_to_itself = runs_alone(item)
    with open(base / "machine.lock", "a") as machine:  # closing it releases the lock
        with _flocked(base / "turnstile.lock", fcntl.LOCK_EX):
            fcntl.flock(machine, fcntl.LOCK_EX if _machine_to_itself else fcntl.LOCK_SH)
        yield


@pytest.fixture(scope="session", autouse=True)
def machine_lock_of_this_worker(tmp_path_factory) -> None:
    """gpt2dist's machine lock keeps two timed runs off one machine. The tests that time runs hold the machine alone
    (`alone`), so each worker's launches take a lock of their own: the other worker's launch fills
    the core that one launch's single-process phases (the CLI, torchrun's imports, a 1-process run) leave idle."""
    os.environ[MACHINE_LOCK_ENV] = str(tmp_path_factory.getbasetemp() / "gpt2dist-machine.lock")


def made_once(config: pytest.Config, name: str, make) -> Path:
    """The directory `name`, filled by `make(directory)` once in the whole run: each xdist worker has session
    fixtures of its own, so the first worker that asks makes it and the other waits for it and reads it."""
    path = _run_dir(config) / "made-once" / name
    path.parent.mkdir(exist_ok=True)
    with _flocked(f"{path}.lock", fcntl.LOCK_EX):
        if not Path(f"{path}.made").exists():
            shutil.rmtree(path, ignore_errors=True)
            path.mkdir()
            make(path)
            Path(f"{path}.made").touch()
    return path

def require(*variables: str, missing: str | None) -> None:
    """Skip naming the missing piece, or fail where one of `variables` is 1 (CI, which installs it)."""
    if not missing:
        return
    required = [name for name in variables if os.environ.get(name) == "1"]
    if required:
        pytest.fail(f"{required[0]}=1 but {missing}")
    pytest.skip(missing)


def unchosen_skips(reasons: list[str]) -> list[str]:
    """Skip reasons that are neither a GPU's absence nor allowed by an unset GPT2DIST_REQUIRE_* variable:
    with every variable set (as in CI), any skip but a GPU's is a piece that went missing unnoticed."""
    if not all(os.environ.get(name) == "1" for name in PIECES):
        return []
    return [reason for reason in reasons if reason not in GPU_SKIPS and not reason.startswith(STUDY_REFUSES)]


_skip_reasons: list[str] = []


def pytest_collection_modifyitems(config, items):
    """The longest modules first (LONGEST_FIRST). Tests marked gpu skip where torch sees no CUDA device. Tests marked
    gpu_image run only when the -m expression names that marker: they take an hour."""
    def rank(item: pytest.Item) -> int:
        module = item.nodeid.split("::")[0]
        return LONGEST_FIRST.index(module) if module in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: each module's tests keep their order
    gpu_tests = [item for item in items if item.get_closest_marker("gpu") is not None]
    if gpu_tests and not cuda_visible():
        for item in gpu_tests:
            item.add_marker(pytest.mark.skipif(True, reason="needs a CUDA GPU"), append=False)  # its reason first
    if "gpu_image" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker("gpu_image") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


def pytest_runtest_logreport(report):
    if report.skipped and isinstance(report.longrepr, tuple):
        _skip_reasons.append(report.longrepr[2].removeprefix("Skipped: "))


def pytest_collectreport(report):
    """A module that skips itself while it is collected counts as much as a test's skip."""
    if report.skipped and isinstance(report.longrepr, tuple):
        _skip_reasons.append(report.longrepr[2].removeprefix("Skipped: "))


def pytest_sessionfinish(session, exitstatus):
    if _is_worker(session.config):  # its reports reach the controller, which counts the skips
        return
    unchosen = unchosen_skips(_skip_reasons)
    if unchosen:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            f"error: {len(unchosen)} skip(s) that no unset GPT2DIST_REQUIRE_* allows: {sorted(set(unchosen))}; "
            "install the piece they name (see .ci/run)", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter):
    counted: dict[str, int] = {}
    for reason in _skip_reasons:
        counted[reason] = counted.get(reason, 0) + 1
    if counted:
        terminalreporter.write_sep("-", "skip reasons")
        for reason, count in sorted(counted.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{count:4d}  {reason}")

TINY_PRESET = {
    "data": {"source": {"kind": "embedded", "min_chars": 3000}, "tokenizer": {"kind": "bpe", "vocab_size": 512},
             "val_fraction": 0.1},
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32, "n_positions": 32, "vocab_size": 512, "dropout": 0.0},
    "train": {
        "global_batch_size": 8, "micro_batch_size": 2, "max_steps": 12, "lr": 3e-3, "min_lr": 3e-4,
        "lr_warmup_steps": 3, "weight_decay": 0.1, "grad_clip": 1.0, "eval_interval": 6, "eval_batches": 2,
        "checkpoint_interval": 6, "compile": False, "seed": 7,
    },
    "study": {"repeats": 2, "excluded_steps": 2, "runs": [
        {"strategies": ["single"], "precisions": ["fp32"], "nproc": [1]},
        {"strategies": ["ddp"], "precisions": ["fp32"], "nproc": [2]},
    ]},
}

REPO = Path(__file__).resolve().parent.parent

def synthetic_tokens(n_tokens: int, vocab: int, seed: int) -> np.ndarray:
    """Shifted copies of one random motif plus noise: learnable, so losses move every step."""
    rng = np.random.default_rng(seed)
    motif = rng.integers(0, vocab, size=97)
    reps = n_tokens // len(motif) + 1
    stream = np.concatenate([np.roll(motif, i) for i in range(reps)])[:n_tokens]
    noise = rng.random(n_tokens) < 0.1
    stream[noise] = rng.integers(0, vocab, size=int(noise.sum()))
    return stream.astype(np.uint16)


@pytest.fixture(scope="session")
def params_file(pytestconfig) -> Path:
    preset = yaml.safe_dump({"preset": "tiny", "container": "unused.sif", "presets": {"tiny": TINY_PRESET}})
    return made_once(pytestconfig, "params", lambda made: (made / "params.yaml").write_text(preset)) / "params.yaml"


def make_shards(directory: Path, vocab: int = 500, train_tokens: int = 40_000, val_tokens: int = 4_000) -> Path:
    write_shards(
        directory,
        {"train": [synthetic_tokens(train_tokens, vocab, 1)], "val": [synthetic_tokens(val_tokens, vocab, 2)]},
        vocab_size=vocab,
        eos_id=0,
        tokenizer={"name": "synthetic"},
        source={"name": "synthetic-motif"},
    )
    return directory


@pytest.fixture(scope="session")
def finished_study(pytestconfig) -> Path:
    """One complete local Snakemake run of the reduced study, read by the pipeline's checks (a test that runs
    Snakemake in it works in finished_copy) and the cluster's and the image's comparisons. Made beside other tests,
    so none of its runs is judged disturbed (UNJUDGED): what is checked of it is where its numbers come from."""
    from reduced_study import UNJUDGED, copy_workflow, run

    def make(work: Path) -> None:
        done = run(["snakemake", "--cores", "2"], copy_workflow(work, **UNJUDGED))
        (work / "snakemake.out").write_text(done.stdout + done.stderr)  # what the user saw, for the progress checks

    return made_once(pytestconfig, "pipeline", make)


def copy_of_study(study: Path, dest: Path) -> Path:
    """A study copied to `dest` with its file times (Snakemake finds it up to date) and its links as links."""
    return Path(shutil.copytree(study, dest, symlinks=True))


@pytest.fixture
def finished_copy(finished_study, tmp_path) -> Path:
    """A copy of the finished study for a test that runs Snakemake in it or edits it: the finished study itself is
    read by other tests while this one runs."""
    return copy_of_study(finished_study, tmp_path / "study")


@pytest.fixture(scope="session")
def shards(pytestconfig) -> Path:
    return made_once(pytestconfig, "shards", make_shards)


@pytest.fixture(scope="session")
def trained(shards, params_file, pytestconfig):
    """`gpt2dist train` of a (strategy, extra arguments, process count, precision), made once a session: the
    equivalence, multi-node and resume tests compare against the same runs instead of each training its own.
    The tests only read these runs. torchrun's ranks are forked here (train_in_forked_ranks): these runs are
    what the tests compare with; launched runs of fsdp, ddp and horovod are held against them by their
    kill-and-resume tests (test_train_cli.py, test_signals.py)."""
    runs: dict[tuple, Path] = {}

    def run(strategy: str, *extra: str, nproc: int = 1, precision: str = "fp32") -> Path:
        key = (strategy, nproc, precision, *extra)
        if key not in runs:
            digest = hashlib.sha1(repr(key).encode()).hexdigest()[:8]

            def make(out: Path) -> None:
                if describe(strategy).launcher == "torchrun":
                    retried_after_a_crash(out, lambda: train_in_forked_ranks(shards, params_file, out, strategy, *extra,
                                                                             nproc=nproc, precision=precision))
                else:  # single and dp train in the command's own process; horovod's ranks need horovodrun
                    gpt2dist(*train_args(shards, params_file, out, strategy, *extra, nproc=nproc, precision=precision))

            runs[key] = made_once(pytestconfig, f"{strategy}-n{nproc}-{precision}-{digest}", make)
        return runs[key]

    return run


@pytest.fixture(scope="session")
def reference_study(pytestconfig):
    """docs/reference/<study> rebuilt from its bundle by `gpt2dist figures`, once a session: the tests of the
    tables, figures and predictions read it; none writes to it."""
    built: dict[str, Path] = {}

    def rebuilt(study: str) -> Path:
        if study not in built:
            built[study] = made_once(pytestconfig, f"reference-{study}", lambda made: gpt2dist(
                "figures", "--from", REPO / "docs" / "reference" / f"{study}.tar.gz", "--out", made / "rebuilt")) / "rebuilt"
        return built[study]

    return rebuilt


@pytest.fixture(scope="session")
def reference(trained) -> Path:
    """The single-process fp32 run every strategy's equivalence test compares with."""
    out = trained("single")
    assert len(read_metrics(out)) >= 10
    return out


@pytest.fixture(scope="session")
def single_in(trained):
    """single's run in a precision, with extra train arguments: what a reduced precision alone does, the
    measure for every strategy in that precision."""
    return lambda precision, *extra: trained("single", *extra, precision=precision)


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs of the bytes asked for, mounted in tmp_path (as root) and unmounted after the test: a disk that
    fills up."""
    mounted: list[Path] = []

    def mount(size_bytes: int) -> Path:
        require("GPT2DIST_REQUIRE_IMAGE", "GPT2DIST_REQUIRE_NODES", missing=None if os.geteuid() == 0 else "root")
        where = tmp_path / f"disk{len(mounted)}"
        where.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)], check=True)
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "--lazy", str(where)], check=True)


def gpt2dist(*args: str, check: bool = True, env: dict | None = None, **popen) -> subprocess.CompletedProcess:
    """Run the real `gpt2dist` command line."""
    env = {**(env or os.environ), "PYTHONUNBUFFERED": "1"}
    result = subprocess.run([sys.executable, "-m", "gpt2dist", *map(str, args)], capture_output=True, text=True,
                            env=env, **popen)
    if check and result.returncode != 0:
        raise AssertionError(f"gpt2dist {' '.join(map(str, args))} failed ({result.returncode}):\n{result.stderr[-4000:]}")
    return result


# The ranks a test starts itself (the fault controls, the counted payloads, the cross-strategy chain) are forked
# by multiprocessing's forkserver, a process per pytest process that imported torch, torch._dynamo and gpt2dist's
# training code once; spawn started each rank as a fresh interpreter that imported them again (34 ranks at 3.4
# CPU-seconds each in a suite run on a 2-core EPYC). The forkserver never trains, so its children start as clean as
# spawn's, CUDA untouched. Each child still imports the test modules its function and classes come from: the
# forkserver (Python 3.11's) does not see the tests' folders on sys.path.
multiprocessing.set_forkserver_preload(["torch", "torch._dynamo", "torch.distributed.fsdp",
                                        "torch.distributed.tensor.parallel", "pytest", "psutil", "yaml", "gpt2dist.cli",
                                        "gpt2dist.launch.runner", "gpt2dist.training.loop",
                                        "gpt2dist.training.strategies.ddp", "gpt2dist.training.strategies.fsdp"])
RANKS = multiprocessing.get_context("forkserver")  # for what the ranks hand back (RANKS.SimpleQueue())


def _rank_in_environment(rank: int, fn, environ: dict[str, str], *args) -> None:
    """The forkserver's children inherit its environment of when it started: a rank sees its test's instead, as
    spawn's did."""
    os.environ.clear()
    os.environ.update(environ)
    fn(rank, *args)


def start_ranks(fn, *args, nprocs: int) -> None:
    """fn(rank, *args) in `nprocs` processes forked from the forkserver, joined; a rank's exception fails the test."""
    import torch.multiprocessing
    ranks = torch.multiprocessing.start_processes(_rank_in_environment, args=(fn, dict(os.environ), *args),
                                                  nprocs=nprocs, join=False, start_method="forkserver")
    try:
        while not ranks.join():
            pass
    finally:
        remove_traceback_files(ranks)


def retried_after_a_crash(out: Path, train) -> None:
    """`train()` into `out`, once more from nothing where a rank was killed by a signal, as the pipeline's train rule
    retries a run (`retries: 1`): torch gathering FSDP's state on CPU rarely dies of SIGSEGV (issue 88: once in a study, once
    in a CI suite; not reproduced in 1,500 gathers). The crash is said as a warning; an error a rank raised, a rank
    that exited with an error code, or a second crash fails the test."""
    from torch.multiprocessing import ProcessExitedException
    try:
        train()
    except ProcessExitedException as crash:
        if crash.signal_name is None:
            raise
        warnings.warn(f"{out.name}: a rank died of {crash.signal_name}; trained again once (its stack is in the "
                      "test's captured stderr)", stacklevel=2)
        shutil.rmtree(out)
        out.mkdir()
        train()


def remove_traceback_files(ranks) -> None:
    """The traceback files of failed ranks, which torch reads and leaves in the temporary directory."""
    for traceback_file in ranks.error_files:
        Path(traceback_file).unlink(missing_ok=True)


def free_port() -> int:
    """A TCP port on the loopback that nothing listens on now: a test's ranks rendezvous there."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def as_torchrun_rank(rank: int, nproc: int, port: int) -> None:
    """Make this process rank `rank` of `nproc` on this machine as torchrun would: its place and rendezvous in the
    environment, and the threads a launch gives each of its ranks (launch_env's split of the cores)."""
    import torch

    from gpt2dist.launch.commands import THREAD_VARIABLES, launch_env
    threads = launch_env(nproc)[THREAD_VARIABLES[0]]
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **dict.fromkeys(THREAD_VARIABLES, threads))
    torch.set_num_threads(int(threads))


def rank_of_spec(rank: int, spec_path: str, port: int, nproc: int) -> None:
    """What a rank that torchrun started runs: the ranks' entry point on the run's spec.json."""
    from gpt2dist.launch import worker
    as_torchrun_rank(rank, nproc, port)
    assert worker.main([spec_path]) == 0


def train_in_forked_ranks(shards: Path, params: Path, out: Path, strategy: str, *extra: str, nproc: int,
                          precision: str = "fp32") -> None:
    """`gpt2dist train` (train_args), its ranks forked from the forkserver instead of started by torchrun: the command
    line writes the spec it would launch (--print-command), and each rank runs it as a torchrun rank does, with the
    same threads: for a torchrun strategy the same run to the bit (fsdp's and ddp's launched kill-and-resume runs
    are held against `trained`'s), where a launch costs 2 to 3 times as much, torchrun's start most of it."""
    gpt2dist(*train_args(shards, params, out, strategy, *extra, nproc=nproc, precision=precision), "--print-command")
    start_ranks(rank_of_spec, str(out / "spec.json"), free_port(), nproc, nprocs=nproc)


def assert_answer_or_one_error(code: int, out: str, err: str, answer: str = "") -> None:
    """Any input gets an answer (exit 0, output starting with `answer`, no complaint but warnings) or one
    `error:` line with exit 2: never a traceback."""
    assert "Traceback" not in out + err
    lines = [line for line in err.strip().splitlines() if not line.startswith(("warning: ", WARNING_CONTINUED))]
    if code == 0:
        assert out.strip().startswith(answer) and out.strip() and not lines, (out[:300], err)
    else:
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)


def train_args(shards: Path, params: Path, out: Path, strategy: str, *extra: str, nproc: int = 1,
               precision: str = "fp32") -> list[str]:
    return ["train", "--data", shards, "--params", params, "--out", out, "--strategy", strategy,
            "--nproc", str(nproc), "--precision", precision, *extra]


def read_metrics(run_dir: Path, kind: str = "train") -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [line for line in lines if line["kind"] == kind]


def assert_same_losses(expected: Path, got: Path, rtol: float = 1e-6) -> None:
    """Every step's loss of `got` within `rtol` of `expected`'s: the same fp32 computation, started another way
    (two processes' runs of it differ by up to 1e-7 here)."""
    want, have = read_metrics(expected), read_metrics(got)
    assert [line["step"] for line in have] == [line["step"] for line in want]
    worst = max(abs(a["loss"] - b["loss"]) / a["loss"] for a, b in zip(want, have))
    assert worst <= rtol, f"{got} left {expected}'s losses by {worst:.2e} (allowed {rtol:g})"


def final_params(run_dir: Path) -> dict:
    import torch
    return torch.load(run_dir / "checkpoint.pt", map_location="cpu", weights_only=False)["model"]


def run_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "run.json").read_text())


def rank_report(run_dir: Path) -> dict:
    """What rank 0 reported (rank0.json): the checkpoint a run can resume from, even when its launcher died."""
    return json.loads((run_dir / "rank0.json").read_text())


class Launch:
    """A `gpt2dist train` in a session of its own, so that a signal sent to it reaches only it; its
    family is every process of the run: the launcher's descendants and ranks that sshd started."""

    def __init__(self, args: list, out: Path, log: Path):
        self.out, self.log = out, log
        with log.open("w") as stderr:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpt2dist", *map(str, args)],
                                         stdout=subprocess.DEVNULL, stderr=stderr,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"}, start_new_session=True)
        self.family: list[psutil.Process] = []

    def wait_for(self, ready, timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the run ended early:\n{self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the run did not get there in time"
            time.sleep(0.05)
        launcher = psutil.Process(self.proc.pid)
        spec = str(self.out / "spec.json")
        ranks = [p for p in psutil.process_iter(["cmdline"]) if spec in (p.info["cmdline"] or [])]
        self.family = list({p.pid: p for p in [launcher, *launcher.children(recursive=True), *ranks]}.values())

    def survivors(self, within_s: float) -> list[str]:
        """The run's processes still running `within_s` after it was stopped, each with what it waits in
        (an exited process its parent has not collected yet counts as ended)."""
        deadline = time.monotonic() + within_s
        while (running := [p for p in self.family if not ended(p)]) and time.monotonic() < deadline:
            time.sleep(0.1)
        return [_described(p) for p in running]

    def stop_all(self) -> None:
        """Clean-up after a failed assertion: end every process of this run, by pid."""
        for process in self.family:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.kill()
        self.proc.wait()


def _described(process: psutil.Process) -> str:
    with contextlib.suppress(psutil.NoSuchProcess, OSError):
        wchan = Path(f"/proc/{process.pid}/wchan").read_text()
        return f"{process.pid} {process.name()} {process.status()} in {wchan or '-'}: {' '.join(process.cmdline())}"
    return f"{process.pid} (gone)"


@pytest.fixture
def launches():
    """Launches a test started; whatever the outcome, none outlives the test."""
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.stop_all()


def has_metrics(out: Path):
    return lambda: (out / "metrics.jsonl").exists() and bool(read_metrics(out))


def has_checkpoint(out: Path):
    return lambda: (out / "rank0.json").exists() and rank_report(out).get("checkpoint_step", 0) > 0


# Kill-and-resume: a run killed after a checkpoint, then the same command, must end bitwise where the uninterrupted
# run ends (test_train_cli.py for most strategies, test_signals.py for ddp's and horovod's launchers).

def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the launcher and every rank, as a node failure would (torchrun starts ranks in new sessions)."""
    family = [proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))]
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    psutil.wait_procs([psutil.Process(pid) for pid in family if psutil.pid_exists(pid)], timeout=30)


def _start(args):
    return subprocess.Popen([sys.executable, "-m", "gpt2dist", *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


RESUME_STEPS = 12
RESUME_EXTRA = ["--max-steps", str(RESUME_STEPS), "--set", "train.checkpoint_interval=2"]


def kill_point(case: str) -> int:
    """The checkpoint after which the case's run is killed: drawn over the run, seeded by the case's name so
    a failure repeats, and printed so the log says which."""
    step = random.Random(case).randrange(2, RESUME_STEPS, 2)
    print(f"{case}: killed once the checkpoint of step {step} exists")
    return step


def kill_after_checkpoint(args, out, step: int) -> None:
    proc = _start(args)
    deadline = time.monotonic() + 120
    while not checkpoint_at_least(out, step) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    _kill_tree(proc)
    # "running" if every process died at once; "interrupted" if a rank outlived the snapshot of the
    # family, saw its launcher die and stopped cleanly. Either way the run did not finish.
    assert run_record(out)["status"] in ("running", "interrupted"), "the run finished before it could be killed"


def kill_forked_ranks_after_checkpoint(shards: Path, params: Path, out: Path, strategy: str, *extra: str, nproc: int,
                                       step: int, precision: str = "fp32") -> None:
    """train_in_forked_ranks' run SIGKILLed, every rank at once (a node's failure), once the checkpoint of `step`
    exists: the ranks' own resume, without a launcher's start around each of the two runs (the launchers' kills
    are single's, fsdp's, ddp's and horovod's tests)."""
    import torch.multiprocessing

    gpt2dist(*train_args(shards, params, out, strategy, *extra, nproc=nproc, precision=precision), "--print-command")
    context = torch.multiprocessing.start_processes(
        _rank_in_environment, args=(rank_of_spec, dict(os.environ), str(out / "spec.json"), free_port(), nproc),
        nprocs=nproc, join=False, start_method="forkserver")
    deadline = time.monotonic() + 120
    while (not checkpoint_at_least(out, step) and all(p.is_alive() for p in context.processes)
           and time.monotonic() < deadline):
        time.sleep(0.01)
    for process in context.processes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(process.pid, signal.SIGKILL)
    for process in context.processes:
        process.join(30)
    remove_traceback_files(context)  # a rank that saw its peer die first
    assert checkpoint_at_least(out, step) and rank_report(out).get("status") != "completed", \
        "the run ended, or never reached its checkpoint, before it could be killed"


def checkpoint_at_least(out, step: int) -> bool:
    with contextlib.suppress(FileNotFoundError, ValueError):
        return rank_report(out).get("checkpoint_step", 0) >= step
    return False


def assert_resumed_exactly(resumed_dir, whole_dir) -> None:
    """Bitwise: every step's loss and the final parameters equal the uninterrupted run's."""
    resumed, uninterrupted = read_metrics(resumed_dir), read_metrics(whole_dir)
    assert [line["step"] for line in resumed] == list(range(RESUME_STEPS))
    assert [line["loss"] for line in resumed] == [line["loss"] for line in uninterrupted]
    import torch
    a, b = final_params(resumed_dir), final_params(whole_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
