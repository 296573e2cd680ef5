"""forking_torchrun, torchrun whose ranks are forked from its agent: the agent imports torch once without Python's
cyclic collector and freezes what the imports made, so the ranks start with it frozen, and it ends without unloading
torch (1.4 s after its ranks had ended). The control: torch's own torchrun, whose ranks are fresh interpreters and
whose agent ends with the usual interpreter shutdown."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)

# the launcher as `python -m MODULE ARGS` runs it, with an exit handler that says whether the interpreter shut down
AGENT = """import atexit, runpy, sys
atexit.register(lambda: print("interpreter shutdown", flush=True))
module = sys.argv.pop(1)
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""
RANK = """import gc, os, sys
with open(os.path.join(sys.argv[1], "rank" + os.environ["RANK"]), "w") as out:
    out.write(str(gc.get_freeze_count()))
"""
LAUNCHERS = {"gpt2dist.launch.forking_torchrun": ["--start-method=fork", "--run-path"], "torch.distributed.run": []}


def test_ranks_start_with_the_agents_imports_frozen_and_the_agent_ends_without_shutting_down(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    frozen, said = {}, {}
    for module, start in LAUNCHERS.items():
        out = tmp_path / module
        out.mkdir()
        done = subprocess.run([sys.executable, "-c", AGENT, module, "--standalone", "--nproc-per-node=2",
                               f"--log-dir={tmp_path / 'logs'}", *start, str(script), str(out)],
                              capture_output=True, text=True, timeout=150, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        frozen[module] = [int((out / f"rank{rank}").read_text()) for rank in (0, 1)]
        said[module] = done.stdout
    forked, fresh = frozen["gpt2dist.launch.forking_torchrun"], frozen["torch.distributed.run"]
    assert min(forked) > 100_000 and fresh == [0, 0], frozen  # torch's and torch._dynamo's objects, or none
    assert "interpreter shutdown" not in said["gpt2dist.launch.forking_torchrun"]
    assert "interpreter shutdown" in said["torch.distributed.run"]
