"""A run that completes leaves nothing in the temporary directory: torchrun's agent makes a log directory there for
every launch (torchelastic_*, never removed) unless told where; told one in the run directory, the runner removes it
when the launch ends (launch/commands.py's TORCHRUN_LOGS). A rank that fails still leaves torch's traceback file there
(docs/development.md)."""

from __future__ import annotations

import os
import subprocess

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
    # the control: the runner's own command without the log directory leaves torchrun's in the temporary one
    command = [part for part in local_command("torchrun", 2, out / "spec.json", "cpu")
               if not part.startswith("--log-dir=")]
    subprocess.run(command, env={**env, **launch_env(2)}, capture_output=True, timeout=240)
    assert [path.name.startswith("torchelastic_") for path in temporary.iterdir()] == [True]
