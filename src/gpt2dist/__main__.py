"""`python -m gpt2dist` is the `gpt2dist` command."""

from gpt2dist.cli import command_line

command_line()
