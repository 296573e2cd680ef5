"""System: facts about the machine and scheduler (hardware peaks, GPUs, SLURM allocation, environment, doctor).
May import data, pipeline, config and the shared ground; never training, launch or results."""
