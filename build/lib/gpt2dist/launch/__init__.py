"""Launching: the command lines that start ranks (python, torchrun, horovodrun, srun), the runner, the worker.
May import training and everything below it; results and cli stay out."""
