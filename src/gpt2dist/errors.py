"""The one exception type for bad input: the CLI prints its message as one line and exits 2."""


class UsageError(Exception):
    """Bad params, data or environment. The message names the problem and the fix."""
