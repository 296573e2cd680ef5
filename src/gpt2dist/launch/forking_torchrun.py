"""torchrun whose ranks are forked from it with their modules already imported: `python -m
gpt2dist.launch.forking_torchrun TORCHRUN_ARGS`, for runs on CPUs (commands.local_command).

torchrun starts each rank as a fresh interpreter that imports torch, gpt2dist's training code and
torch._dynamo (which torch's optimizers import on their first step): about 4 CPU-seconds a rank on a
2-core EPYC, while a small CPU run's steps take one. Here torchrun's own agent, rendezvous and rank
environment are unchanged (this is torchrun's `main`), and its `--start-method=fork --run-path` starts
each rank as a fork of this process, which imported those modules once. Not for GPUs: a process that
forks ranks must not have touched CUDA, and a GPU run's launch is a small part of it.
"""

import os
import sys
import tempfile

from gpt2dist.launch import lifetime

with lifetime.importing_without_collection():
    import torch._dynamo  # noqa: F401  (imported once here, for every rank forked from this process)
    from torch._inductor.runtime.cache_dir_utils import cache_dir
    from torch.distributed.run import main, parse_args

    import gpt2dist.launch.worker  # noqa: F401


def main_in_a_temporary_directory_of_its_own() -> None:
    """torchrun's main, the temporary directory of this process and of the ranks it forks one that is removed when it
    ends: torch's start_processes leaves there a traceback file for each rank that raises (one whose peer died
    too), which it reads and never removes. Inside torchrun's log directory where one is given (the runner's, in the
    run directory, which the runner removes even after a killed launch), so a killed agent leaves nothing in /tmp
    either. Torch's compile cache, which is placed in the temporary directory when first asked for, is placed now:
    it outlives runs."""
    cache_dir()
    logs = parse_args(sys.argv[1:]).log_dir
    if logs:
        os.makedirs(logs, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpt2dist-torchrun-", dir=logs, ignore_cleanup_errors=True) as scratch:
        tempfile.tempdir = scratch
        main()


if __name__ == "__main__":
    # unloading torch here took 1.4 s after the ranks had ended, which the run waited for; a rank's failure raises
    # (torch's ChildFailedError), its traceback printed as torchrun prints it
    lifetime.run_then_exit_now(main_in_a_temporary_directory_of_its_own)
