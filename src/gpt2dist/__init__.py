"""gpt2dist: which parallel strategy trains GPT-2 fastest, measured reproducibly."""

__version__ = "0.1.0"
