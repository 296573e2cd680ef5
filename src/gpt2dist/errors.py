"""The exception types the CLI turns into one `error:` line: bad input (exit 2) and a stop signal (exit 128+N)."""

import argparse
import re
import signal


class UsageError(Exception):
    """Bad params, data or environment. The message names the problem and the fix."""


class Interrupted(BaseException):
    """A stop signal ended the run. A BaseException, like KeyboardInterrupt, so that no `except Exception`
    on the way up swallows it; the message says where the run stopped and how to resume it."""

    def __init__(self, signum: int, message: str = ""):
        self.signum = signum
        super().__init__(message or f"interrupted by {self.signal_name}")

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name


def error_line(problem: object) -> str:
    """The one line a failure is reported with: a message that embeds another tool's (a multi-line
    ImportError, say) is folded onto it."""
    return "error: " + " ".join(str(problem).split())


class OneLineArgumentParser(argparse.ArgumentParser):
    """argparse for the scripts beside the CLI (bench/): a bad command line ends in one `error:` line and status 2,
    as the CLI's does, instead of argparse's usage block; the script's docstring is its --help, line breaks kept."""

    def __init__(self, description: str | None):
        super().__init__(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)

    def error(self, message: str):
        self.exit(2, error_line(f"{message}; {self.prog} --help lists its options") + "\n")


EXCEPTION = re.compile(r"\b(\w+(?:Error|Exception)): .+")
RANK_PREFIX = re.compile(r"^\[\d+\]<std(?:err|out)>:")


def failure_line(stderr: str) -> str:
    """The line of a failed process's stderr that says what went wrong: the first a rank raised or said (an
    exception's last line, or an `error:` line; the launchers' own failures come after it), else the last line.
    horovodrun's prefix of a rank's lines ("[1]<stderr>:") is dropped."""
    lines = [RANK_PREFIX.sub("", line).strip() for line in stderr.splitlines()]
    lines = [line for line in lines if line]
    said = [line if line.startswith("error:") else match[0] for line in lines
            if line.startswith("error:") or (match := EXCEPTION.search(line))]
    return (said[:1] or lines[-1:] or ["exited without a message"])[0][:300]
