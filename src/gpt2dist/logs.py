"""Logging: rank 0 speaks at INFO, other ranks only warn, so output is read once."""

import logging
import os


def setup_logging() -> None:
    rank = int(os.environ.get("RANK", os.environ.get("HOROVOD_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", 0))))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,
        format=f"%(asctime)s [rank {rank}] %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    for noisy in ("torch.distributed", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
