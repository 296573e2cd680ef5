"""gpt2dist: which data-parallel strategy trains GPT-2 fastest, measured reproducibly."""

__version__ = "0.1.0"
