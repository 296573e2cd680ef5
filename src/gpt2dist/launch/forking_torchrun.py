"""torchrun whose ranks are forked from it with their modules already imported: `python -m
gpt2dist.launch.forking_torchrun TORCHRUN_ARGS`, for runs on CPUs (commands.local_command).

torchrun starts each rank as a fresh interpreter that imports torch, gpt2dist's training code and
torch._dynamo (which torch's optimizers import on their first step): about 4 CPU-seconds a rank on a
2-core EPYC, while a small CPU run's steps take one. Here torchrun's own agent, rendezvous and rank
environment are unchanged (this is torchrun's `main`), and its `--start-method=fork --run-path` starts
each rank as a fork of this process, which imported those modules once. Not for GPUs: a process that
forks ranks must not have touched CUDA, and a GPU run's launch is a small part of it.
"""

from gpt2dist.launch import lifetime

with lifetime.importing_without_collection():
    import torch._dynamo  # noqa: F401  (imported once here, for every rank forked from this process)
    from torch.distributed.run import main

    import gpt2dist.launch.worker  # noqa: F401

if __name__ == "__main__":
    # unloading torch here took 1.4 s after the ranks had ended, which the run waited for; a rank's failure raises
    # (torch's ChildFailedError), its traceback printed as torchrun prints it
    lifetime.run_then_exit_now(main)
