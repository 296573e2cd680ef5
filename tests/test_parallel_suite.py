"""The suite's two pytest-xdist workers (tests/conftest.py), run on small suites of their own: a test marked
`alone` runs while the other worker runs nothing, and made_once makes a directory once for both workers; a run the
tests train is trained again once where a rank died of a signal, as the pipeline retries one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from torch.multiprocessing import ProcessExitedException, ProcessRaisedException

from conftest import REPO, retried_after_a_crash, start_ranks

pytestmark = pytest.mark.slow  # pytest sessions of their own, two workers each

SHARED = """
import json, os, time, pytest

@pytest.mark.parametrize("i", range(8))
def test_shared(i, shared_dir):
    start = time.time(); time.sleep(0.5)
    with open(os.environ["INTERVALS"], "a") as log:
        log.write(json.dumps(["shared", start, time.time(), str(shared_dir)]) + "\\n")
"""
ALONE = """
import json, os, time, pytest

{mark}
def test_judges_the_machine(shared_dir):
    start = time.time(); time.sleep(2.0)
    with open(os.environ["INTERVALS"], "a") as log:
        log.write(json.dumps(["alone", start, time.time(), str(shared_dir)]) + "\\n")
"""
FIXTURE = """
import os, pytest
from conftest import made_once

@pytest.fixture(scope="session")
def shared_dir(tmp_path_factory, request):
    def make(path):
        with open(os.environ["MAKES"], "a") as log:
            log.write("made\\n")
    return {make_it}
"""


def run_suite(tmp_path, mark: str, make_it: str, outcome: dict[str, int]) -> tuple[list, int]:
    """The two modules in two workers, and the intervals each test slept in and how often the directory was made."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a_shared.py").write_text(SHARED)
    (suite / "test_b_alone.py").write_text(ALONE.format(mark=mark))
    (suite / "made_fixture.py").write_text(FIXTURE.format(make_it=make_it))
    intervals, makes = tmp_path / "intervals.jsonl", tmp_path / "makes"
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'tests'}:{suite}", "INTERVALS": str(intervals), "MAKES": str(makes)}
    result = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "made_fixture", "-p",
                             "no:cacheprovider", "-q", "-n", "2",
                             "--rootdir", str(suite), str(suite)], cwd=suite, env=env, capture_output=True, text=True,
                            timeout=180)
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", result.stdout.strip().splitlines()[-1])}
    assert result.returncode == 0 and {k: counts.get(k, 0) for k in ("passed", "skipped", "failed")} == outcome, \
        result.stdout[-3000:] + result.stderr[-2000:]
    return [json.loads(line) for line in intervals.read_text().splitlines()], len(makes.read_text().splitlines())


# the mark on the sleeping test, whether it is to hold the machine alone, and how its directory is made
CASES = {"alone": ("@pytest.mark.alone", True, "made_once(request.config, 'x', make)"),
         "gpu": ("@pytest.mark.gpu", torch.cuda.is_available(), "made_once(request.config, 'x', make)"),
         "unmarked": ("", False, "(make(own := tmp_path_factory.mktemp('x')), own)[1]")}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", CASES)
def test_an_alone_test_has_the_machine_and_made_once_makes_once(tmp_path, case):
    """A GPU test holds the machine alone where a GPU is; elsewhere it skips. The control (not marked, and a
    directory of each worker's own from mktemp): the other worker's tests run beside the test, and each worker makes
    its directory."""
    mark, alone, make_it = CASES[case]
    skips = case == "gpu" and not torch.cuda.is_available()
    outcome = {"passed": 8 if skips else 9, "skipped": int(skips), "failed": 0}
    intervals, makes = run_suite(tmp_path, mark, make_it, outcome)
    sleeping = [i for i in intervals if i[0] == "alone"]
    assert len(sleeping) == (0 if skips else 1), intervals
    for _, start, end, _ in sleeping:
        beside = [i for i in intervals if i[0] == "shared" and i[1] < end and i[2] > start]
        assert (beside == []) is alone, (start, end, intervals)
    shared = case != "unmarked"
    assert makes == (1 if shared else 2)
    assert (len({i[3] for i in intervals}) == 1) is shared  # every test got the one directory


def _crash_unless(rank: int, marker: str) -> None:
    """A rank that dies of SIGSEGV where `marker` is missing, and leaves it for the next try."""
    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGSEGV)


def _raise(rank: int) -> None:
    raise RuntimeError("a rank's own error")


@pytest.mark.timeout(120)
def test_a_rank_killed_by_a_signal_is_trained_again_once_from_nothing(tmp_path):
    out, marker = tmp_path / "run", tmp_path / "crashed"
    out.mkdir()
    (out / "partial").touch()
    with pytest.warns(UserWarning, match="run: a rank died of SIGSEGV; trained again once"):
        retried_after_a_crash(out, lambda: start_ranks(_crash_unless, str(marker), nprocs=2))
    assert marker.exists() and not (out / "partial").exists()
    # controls: a second crash fails, and so does an error a rank raises, tried once
    tries = []
    with pytest.raises(ProcessExitedException, match="SIGSEGV"), pytest.warns(UserWarning, match="trained again"):
        retried_after_a_crash(out, lambda: (tries.append(1), marker.unlink(missing_ok=True),
                                            start_ranks(_crash_unless, str(marker), nprocs=1)))
    assert len(tries) == 2
    with pytest.raises(ProcessRaisedException, match="a rank's own error"):
        retried_after_a_crash(out, lambda: (tries.append(1), start_ranks(_raise, nprocs=1)))
    assert len(tries) == 3
