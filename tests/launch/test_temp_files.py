"""A run that completes leaves nothing in the temporary directory: torchrun's agent makes a log directory there for
every launch (torchelastic_*, never removed) unless told where; told one in the run directory, the runner removes it
when the launch ends (launch/commands.py's TORCHRUN_LOGS). Nor does a launch whose rank fails: torch's traceback file
for it goes to a temporary directory of the agent's own (launch/forking_torchrun.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from gpt2dist.launch.commands import TORCHRUN_LOGS, launch_env, local_command

from conftest import gpt2dist, run_record, train_args

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_a_torchrun_launch_leaves_nothing_in_the_temporary_directory(shards, params_file, tmp_path):
    temporary, out = tmp_path / "tmp", tmp_path / "run"
    temporary.mkdir()
    # torch's compile cache (one directory there, made to outlive runs) kept out of the one looked at
    env = {**os.environ, "TMPDIR": str(temporary), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "compile-cache")}
    gpt2dist(*train_args(shards, params_file, out, "ddp", "--max-steps", "2", nproc=2), env=env)
    assert run_record(out)["status"] == "completed"
    assert sorted(temporary.iterdir()) == [] and not (out / TORCHRUN_LOGS).exists()
    # the control: the runner's own command without the log directory, under torchrun's own agent (as a GPU launch
    # has it), leaves torchrun's in the temporary one
    command = [{"gpt2dist.launch.forking_torchrun": "torch.distributed.run"}.get(part, part)
               for part in local_command("torchrun", 2, out / "spec.json", "cpu") if not part.startswith("--log-dir=")]
    subprocess.run(command, env={**env, **launch_env(2)}, capture_output=True, timeout=240)
    assert [path.name.startswith("torchelastic_") for path in temporary.iterdir()] == [True]


def test_a_rank_that_raises_leaves_no_traceback_file(tmp_path):
    """torchrun's agent as a CPU run launches it (forking_torchrun), one of its two ranks raising; the control: torchrun
    itself, the same ranks, leaves the traceback file torch's start_processes wrote for the rank."""
    script = tmp_path / "rank.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 fails')\n")
    left = {}
    for launcher in ("gpt2dist.launch.forking_torchrun", "torch.distributed.run"):
        temporary = tmp_path / launcher
        temporary.mkdir()
        command = [sys.executable, "-m", launcher, "--standalone", "--nproc-per-node=2", "--start-method=fork",
                   "--run-path", str(script)]
        ended = subprocess.run(command, env={**os.environ, "TMPDIR": str(temporary)}, capture_output=True, text=True,
                               timeout=120)
        assert ended.returncode == 1 and "RuntimeError: rank 1 fails" in ended.stderr, ended.stderr[-3000:]
        left[launcher] = [path.name for path in temporary.glob("pytorch-errorfile-*")]
    assert not left["gpt2dist.launch.forking_torchrun"] and left["torch.distributed.run"], left
