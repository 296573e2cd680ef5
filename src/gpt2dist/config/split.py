"""A strategy's name as a split of the devices: a data-parallel method (how the data-parallel ranks hold the model
state: replicated, sharded, ...) and the tensor- and pipeline-parallel degrees, as Megatron-LM, DeepSpeed and
torchtitan take them. `ddp-tp2-pp2` is ddp over groups of 2 x 2 ranks that split each replica: every layer over 2
ranks, the blocks over 2 stages; `tp2-pp2` is that replica alone, `fsdp-pp4` FSDP over 4-stage pipelines.

The twelve strategies of the study are named points of the grammar, their degrees following the run as before:
`tp` splits every layer over all processes, `pp` is one pipeline of all processes, `fsdp-tp` is FSDP over
tensor-parallel groups of train.tensor_parallel_size ranks; `single`, `dp`, `horovod` and `apex-ddp` are
one-dimensional. Torch-free: the schema validates names with it, config.degrees derives a run's degrees from it."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpt2dist.config.methods import METHODS, NONE, PATWARDHAN
from gpt2dist.errors import UsageError

# Data-parallel methods that take tensor- and pipeline-parallel degrees, in their order in tables; NONE names a
# split without data parallelism, one replica split over every process
COMPOSING = tuple(name for name, method in METHODS.items() if method.composes and name != NONE)
# A degree that follows the run instead of a number in the name
ALL_PROCESSES = "nproc"  # tp: every layer over all processes; pp: one stage per process
TENSOR_PARALLEL_SETTING = "train.tensor_parallel_size"  # fsdp-tp's tensor-parallel degree


@dataclass(frozen=True)
class Split:
    """A strategy's name parsed: its data-parallel method and its degrees, each a number, 1, or one of the markers
    above (the named points whose degree follows the run)."""

    name: str
    method: str
    tp: int | str = 1
    pp: int | str = 1
    summary: str = ""  # a named split's line for `gpt2dist strategies` (a named method's is its record's)
    papers: dict[str, str] = field(default_factory=dict)
    listed: int | None = None  # where a named one sorts in every table and figure

    @property
    def named(self) -> bool:
        """One of the study's twelve strategies (their run ids, tests and stored bundles keep these names)."""
        return self.name in NAMED

    @property
    def splits_model(self) -> bool:
        """Whether the model itself is divided over processes (by layer slice or by stage)."""
        return self.tp != 1 or self.pp != 1

    def degrees(self, nproc: int, tensor_parallel_size: int) -> tuple[int, int]:
        """(tp, pp) for a run of `nproc` processes."""
        def resolve(degree: int | str) -> int:
            return nproc if degree == ALL_PROCESSES else tensor_parallel_size if degree == TENSOR_PARALLEL_SETTING \
                else degree
        return resolve(self.tp), resolve(self.pp)


# The named points that split the model: one replica over every process, by layer or by stage, and FSDP over
# tensor-parallel groups; the study's other named strategies are its methods (config.methods), each by its own name
NAMED_SPLITS = (
    Split("tp", NONE, tp=ALL_PROCESSES, listed=5, papers={PATWARDHAN: "tensor parallelism"},
          summary="tensor parallelism (DTensor): every layer split over all --nproc ranks, one replica"),
    Split("pp", NONE, pp=ALL_PROCESSES, listed=6, papers={PATWARDHAN: "pipeline parallelism"},
          summary="pipeline parallelism (torch.distributed.pipelining): consecutive blocks per stage, one replica"),
    Split("fsdp-tp", "fsdp", tp=TENSOR_PARALLEL_SETTING, listed=7,
          summary="FSDP over tensor-parallel groups of train.tensor_parallel_size ranks (2-D mesh)"),
)
# The study's named strategies, in the order of every table and figure
NAMED: dict[str, Split] = {split.name: split for split in sorted(
    [Split(name, name, summary=method.summary, papers=dict(method.papers), listed=method.listed)
     for name, method in METHODS.items() if method.listed is not None] + list(NAMED_SPLITS),
    key=lambda split: split.listed)}
# Any name's shape, the named points included: the run-id pattern and the params schema's (split_name checks more)
NAME_PATTERN = r"[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*"
_WORD = r"(?!(?:tp|pp)\d)[a-z][a-z0-9]*"  # a method's word: anything but a degree
_COMPOSED = re.compile(rf"^(?:(?P<method>{_WORD}(?:-{_WORD})*)-)?(?P<degrees>(?:tp|pp)\d+(?:-(?:tp|pp)\d+)*)$")
_DEGREE = re.compile(r"(tp|pp)(\d+)")
EXAMPLES = "ddp-tp2, fsdp-pp2, ddp-tp2-pp2, tp2-pp2"


def composed_name(method: str, tp: int, pp: int) -> str:
    """The canonical name of a method with degrees: the method (none: left out), then tp, then pp, each above 1."""
    parts = ([] if method == NONE else [method]) + [f"{dim}{n}" for dim, n in (("tp", tp), ("pp", pp)) if n > 1]
    return "-".join(parts)


def parse_split(name: str, said: str = "--strategy") -> Split:
    """The split a strategy's name says, or a UsageError naming what is wrong and the spelling that works (`said`:
    where the name was given, for the message)."""
    if name in NAMED:
        return NAMED[name]
    match = _COMPOSED.match(name) if isinstance(name, str) else None
    if match is None:
        raise UsageError(f"unknown {said} {name!r} (allowed: {', '.join(NAMED)}, or a data-parallel method with "
                         f"degrees such as {EXAMPLES})")
    method = match["method"] or NONE
    if method in METHODS and not METHODS[method].composes:
        raise UsageError(f"{said} {name}: {method} takes no tensor- or pipeline-parallel degree: "
                         f"{METHODS[method].no_degrees}")
    if method in NAMED and method not in COMPOSING:
        raise UsageError(f"{said} {name}: {method} is a strategy, not a data-parallel method; give the degrees as "
                         f"numbers after a method, as in {EXAMPLES}")
    if method not in COMPOSING and method != NONE:
        raise UsageError(f"{said} {name}: unknown data-parallel method '{method}' (allowed: "
                         f"{', '.join(COMPOSING)}, or none as in tp2-pp2)")
    found = _DEGREE.findall(match["degrees"])
    dims = [dim for dim, _ in found]
    if len(set(dims)) < len(dims):
        raise UsageError(f"{said} {name}: a degree is given twice; give each of tp and pp once")
    for dim, digits in found:
        if int(digits) < 2:
            raise UsageError(f"{said} {name}: {dim}{digits} is no split (a degree is 2 or more); leave it out, "
                             f"as in {composed_name(method, 1, 1) or 'tp2'}")
    degrees = {dim: int(digits) for dim, digits in found}
    canonical = composed_name(method, degrees.get("tp", 1), degrees.get("pp", 1))
    if canonical != name:
        raise UsageError(f"{said} {name}: write it {canonical} (the method first, then tp, then pp)")
    return Split(name, method, degrees.get("tp", 1), degrees.get("pp", 1))


def refuse_unread_settings(split: Split, keys: set[str]) -> None:
    """A degree set on the command line (the keys of its --set) for a strategy that does not read it would train
    another split than the one asked for, silently: `--strategy ddp --set train.tensor_parallel_size=2` is plain
    ddp."""
    method = split.method if split.method in COMPOSING else "ddp"
    if "train.tensor_parallel_size" in keys and split.tp != TENSOR_PARALLEL_SETTING:
        raise UsageError(f"train.tensor_parallel_size sets the named strategy fsdp-tp's degree, and --strategy "
                         f"{split.name} does not read it; name the degrees in the strategy instead, as in "
                         f"{composed_name(method, 2, 1)} or {composed_name(method, 2, 2)}")
    if "train.data_parallel_shard_size" in keys and split.method != "hsdp":
        raise UsageError(f"train.data_parallel_shard_size sets the shard groups of hsdp and its splits, and --strategy "
                         f"{split.name} does not read it; use --strategy hsdp (or hsdp-tp2, ...), or drop the setting")


def strategy_order(name: str) -> tuple:
    """Where a strategy sorts in tables and figures: the named ones in their order, then the others by method and
    degrees. A name the grammar does not parse sorts last (it is refused before it is ever drawn)."""
    if name in NAMED:
        return (0, list(NAMED).index(name), 0, 0)
    try:
        split = parse_split(name)
    except UsageError:
        return (2, 0, 0, 0, name)
    methods = [NONE, *COMPOSING]
    return (1, methods.index(split.method), split.tp, split.pp)
