"""params.yaml, read once into a `Params` (`load_params`): its presets, each resolved by name ('auto'
included) with the presets it extends and --set overrides laid over it, then validated, and the cluster its
studies are planned for. Every command, the planner and the workflows read the file through a `Params`, so all
see it the same way."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from gpt2dist.config import machine
from gpt2dist.config.schema import ModelShape, Preset, validation_message
from gpt2dist.config.sizes import shape_of
from gpt2dist.errors import UsageError

# Keys renamed since studies were first bundled: section -> {old name: new name}. A bundle keeps the params.yaml
# its runs were made with; `upgraded` reads such a file with today's names.
RENAMED = {"train": {"warmup_steps": "lr_warmup_steps"}, "study": {"warmup_steps": "excluded_steps"}}
# A preset may say `extends: NAME`: it is NAME's tree with its own keys laid over it (mappings merge key
# by key, except one of another `kind`; lists and values replace). Chains are allowed; a cycle is an error.
EXTENDS = "extends"
# The cpu study's variant that `preset: auto` picks on a CPU without bf16 instructions (fewer, shorter bf16 runs)
EMULATED_BF16 = "cpu-emulated-bf16"
# libyaml's loader where PyYAML was built with it: 0.1 s per read of params.yaml in Python
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _read(path: Path) -> dict:
    """The raw params.yaml mapping, with one-line errors for a missing or malformed file."""
    try:
        raw = yaml.load(Path(path).read_text(), Loader=YAML_LOADER)
    except FileNotFoundError:
        raise UsageError(f"params file {path} not found (pass --params FILE)") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"params file {path} is not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(raw, dict) or not isinstance(raw.get("presets"), dict):
        raise UsageError(f"params file {path} has no 'presets' mapping")
    return raw


def load_params(path: Path | str) -> Params:
    """params.yaml read and checked for its `presets` mapping (a preset is validated when it is resolved)."""
    return Params(Path(path), _read(Path(path)))


@dataclass(frozen=True)
class Params:
    """One params.yaml as read: `raw` the file's mapping, `path` where it was read (named in errors)."""

    path: Path
    raw: dict

    def preset(self, requested: str | None = None, *, cuda: bool = False, cpu_bf16: str | None = None,
               overrides: list[str] | tuple[str, ...] = (), size: str | None = None) -> tuple[str, Preset]:
        """The preset's name and its validated settings. `requested` None means params.yaml's `preset`;
        'auto' picks paper when `cuda` (CUDA GPUs are visible), else cpu, or its variant for CPUs that
        emulate bf16 (EMULATED_BF16, where params.yaml has it) when `cpu_bf16` (default: this machine's) says so.
        `size`: the model at that size (config.sizes), before the overrides (which may change it further)."""
        name = requested or self.raw.get("preset", "auto")
        if name == "auto":
            emulated = (cpu_bf16 or machine.cpu_bf16()) == "emulated" and EMULATED_BF16 in self.raw["presets"]
            name = "paper" if cuda else EMULATED_BF16 if emulated else "cpu"
        tree = preset_tree(self.raw, self.path, name)
        if size:
            tree["model"] = {**(tree.get("model") or {}), **shape_of(size, _model_sizes(tree, self.path, name))}
        for assignment in overrides:
            _apply_override(tree, assignment)
        try:
            return name, Preset.model_validate(tree)
        except ValidationError as err:
            raise UsageError(f"{self.path} preset '{name}': {validation_message(err, Preset, '')}") from None

    def section_keys(self, name: str) -> dict[str, list[str]]:
        """Per section, the params.yaml keys a preset's values come from: its own and those of the presets it
        extends, nearest first (what DVC must watch: `presets.two-node-cpu.model` alone does not exist).
        For a preset that `preset` has accepted."""
        presets, keys = self.raw["presets"], {}
        while name is not None:
            for section in presets[name]:
                if section != EXTENDS:
                    keys.setdefault(section, []).append(f"presets.{name}.{section}")
            name = presets[name].get(EXTENDS)
        return keys

    @property
    def gpus_per_node(self) -> int | None:
        """GPUs per node the file plans studies for; None: it leaves that to the planning host."""
        gpus = self.raw.get("gpus_per_node")
        if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 0):
            raise UsageError(f"gpus_per_node in {self.path} must be a whole number of GPUs per node, 0 or more "
                             f"(not {gpus!r})")
        return gpus

    @property
    def nodes(self) -> int:
        """Nodes of the cluster the file's studies may span (1 where it does not say)."""
        nodes = self.raw.get("nodes", 1)
        if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
            raise UsageError(f"nodes in {self.path} must be a whole number of nodes, 1 or more (not {nodes!r})")
        return nodes


def upgraded(raw: dict) -> dict:
    """A params.yaml mapping with renamed keys under their current names (for files made by older versions)."""
    raw = copy.deepcopy(raw)
    for preset in raw.get("presets", {}).values():
        for section, renames in RENAMED.items():
            values = preset.get(section) if isinstance(preset, dict) else None
            for old, new in renames.items():
                if isinstance(values, dict) and old in values and new not in values:
                    values[new] = values.pop(old)
    return raw


def _model_sizes(tree: dict, path: Path, name: str) -> dict[str, ModelShape]:
    """The preset's study.model_sizes, validated (a size is applied before the whole preset is)."""
    study = tree.get("study")
    try:
        return TypeAdapter(dict[str, ModelShape]).validate_python(
            study.get("model_sizes") or {} if isinstance(study, dict) else {})
    except ValidationError as err:
        raise UsageError(f"{path} preset '{name}': study.model_sizes: {err.errors()[0]['msg']}") from None


def preset_tree(raw: dict, path: Path, name: str, seen: tuple[str, ...] = ()) -> dict:
    """A preset's settings as a plain tree, with what it extends merged in."""
    presets = raw["presets"]
    if name not in presets:
        raise UsageError(f"unknown preset '{name}' (available: {', '.join(presets)})")
    if name in seen:
        raise UsageError(f"{path}: presets extend each other in a circle ({' -> '.join((*seen, name))}); break it")
    own = copy.deepcopy(presets[name])
    if not isinstance(own, dict):
        raise UsageError(f"{path}: preset '{name}' must be a mapping of sections (data, model, train, study)")
    parent = own.pop(EXTENDS, None)
    if parent is None:
        return own
    if not isinstance(parent, str) or parent not in presets:
        raise UsageError(f"{path}: preset '{name}' extends '{parent}', which is not a preset "
                         f"(available: {', '.join(presets)})")
    return _laid_over(preset_tree(raw, path, parent, (*seen, name)), own)


def _laid_over(base: dict, top: dict) -> dict:
    """`top` over `base`, mappings merged key by key; a mapping of another `kind` (a data source, a tokenizer)
    replaces the base's whole, since none of its keys belong to the other kind."""
    merged = dict(base)
    for key, value in top.items():
        below = base.get(key)
        same_kind = isinstance(value, dict) and isinstance(below, dict) and value.get("kind", below.get("kind")) == \
            below.get("kind")
        merged[key] = _laid_over(below, value) if same_kind else value
    return merged


def _apply_override(tree: dict, assignment: str) -> None:
    key, sep, raw_value = assignment.partition("=")
    if not sep or not key:
        raise UsageError(f"--set '{assignment}' is not of the form key=value (e.g. model.n_layer=2)")
    *parents, leaf = key.split(".")
    node = tree
    for name in parents:
        child = node.setdefault(name, {})
        if not isinstance(child, dict):
            raise UsageError(f"--set '{assignment}': '{name}' is a value, not a section")
        node = child
    try:
        node[leaf] = yaml.safe_load(raw_value)
    except yaml.YAMLError as exc:
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise UsageError(f"--set '{assignment}': the value '{raw_value}' is not valid YAML ({problem}); quote text "
                         f"that starts with [, {{ or a quote, e.g. --set \"{key}='...'\"") from None
