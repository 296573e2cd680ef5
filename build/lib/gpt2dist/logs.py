"""Logging: rank 0 speaks at INFO, other ranks only warn, so output is read once."""

import logging
import os


def setup_logging() -> None:
    names = ("RANK", "HOROVOD_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")  # torchrun, horovodrun, mpirun, srun
    rank = int(next((os.environ[name] for name in names if name in os.environ), 0))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    logging.getLogger("torch.distributed").setLevel(logging.WARNING)
