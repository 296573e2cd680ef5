"""Pipeline parallelism (`torch.distributed.pipelining`) for every split with stages (pp, ddp-pp2, tp2-pp2, ...):
the blocks are split into stages, the embeddings on the first, the final LayerNorm, head and loss on the last. Each
data-parallel share of the global batch is one pipeline step of micro-batches of train.micro_batch_size. GPipe and
1F1B give each pipeline rank one stage; interleaved 1F1B and the interleaved zero-bubble schedule give it
train.pipeline_virtual_stages of them, pipeline rank r of p holding stages r, r + p, r + 2p, ..., so that the last
stage is on the last rank and the first on rank 0. A pipeline's ranks are one group of the mesh (its pp dimension);
each stage module the schedule runs may be wrapped by the data-parallel method (torch's stages know DDP's and
FSDP's gradient sync) and split by tensor parallelism, whose stage boundaries stay plain tensors.

GPT-2 ties the head to the token embedding, which now sit on different stages. As Megatron does, the first and
last stage each hold a copy (equal at the start) and sum their gradients after backward, over a group of the two
ranks of each pipeline (Megatron's embedding group), so both copies step identically and the pipeline trains the
same model as `single`. The schedule runs forward and backward itself, so the loop's loss scaler cannot wrap it:
splits with a pipeline take fp32, tf32 and bf16 (config refuses fp16 and Apex).

Checkpoints are the portable full state dict (torch_distributed gathers them): the ranks' parts merged on rank 0
under the original parameter names, the tied weight's optimizer state once, as `single` writes it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from gpt2dist.config.degrees import Degrees
from gpt2dist.config.schema import RunSpec
from gpt2dist.config.geometry import HEAD, pipeline_stage_blocks, rank_blocks
from gpt2dist.training.model import head_loss
from gpt2dist.training.strategies.base import Placement

EMBEDDING = "transformer.wte.weight"
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B,
             "zero-bubble": ScheduleInterleavedZeroBubble}


class RankPart(nn.Module):
    """What one pipeline rank holds of GPT-2, under the full model's parameter names (`transformer.h.3...`,
    `lm_head.weight`): the blocks of its stages, the embeddings on the first rank, ln_f and the head on the
    last. Its optimizer and checkpoints work on this module; the stages run on views of it."""

    def __init__(self, model: nn.Module, blocks: list[int], *, first: bool, last: bool):
        super().__init__()
        self.first, self.last = first, last
        self.transformer = nn.Module()
        source = model.transformer
        if first:
            self.transformer.wte, self.transformer.wpe, self.transformer.drop = source.wte, source.wpe, source.drop
        self.transformer.h = nn.ModuleDict({str(i): source.h[i] for i in blocks})
        if last:
            self.transformer.ln_f = source.ln_f
            self.lm_head = model.lm_head
            if not first:  # the head's own copy of the tied embedding
                self.lm_head.weight = nn.Parameter(source.wte.weight.detach().clone())

    head_loss: Callable[..., torch.Tensor] = staticmethod(head_loss)  # the run's (chunked or not): loss_module sets it

    def mean_loss(self, hidden: torch.Tensor, targets: torch.Tensor, autocast) -> torch.Tensor:
        """The last stage's head and mean next-token cross-entropy of these rows."""
        with autocast():
            return self.head_loss(hidden, self.lm_head.weight, targets) / targets.numel()


class Stage(nn.Module):
    """One stage's forward over modules of its rank's part: token ids (the first stage) or the previous stage's
    hidden states in; hidden states out (the last stage's after ln_f: the head runs in the loss, see
    Pipeline._loss). The last stage registers the head too, whose weight the zero-bubble schedule's
    weight-gradient pass must reach."""

    def __init__(self, part: RankPart, blocks: range, *, first: bool, last: bool, autocast):
        super().__init__()
        self.first, self.last, self.autocast = first, last, autocast
        if first:
            self.wte, self.wpe, self.drop = part.transformer.wte, part.transformer.wpe, part.transformer.drop
        self.blocks = nn.ModuleList(part.transformer.h[str(i)] for i in blocks)
        if last:
            self.ln_f, self.lm_head = part.transformer.ln_f, part.lm_head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            if self.first:
                x = self.drop(self.wte(x) + self.wpe(torch.arange(x.shape[1], device=x.device)))
            for block in self.blocks:
                x = block(x)  # no mask: SDPA attends causally
            if self.last:
                x = self.ln_f(x)
        return x


class Pipeline:
    """A rank's part of its pipeline, its stages and their schedule: the pipeline group is this rank's ranks along
    the mesh's pp dimension (`group`; None: every rank), in stage order."""

    def __init__(self, spec: RunSpec, degrees: Degrees, placement: Placement, model: nn.Module, group, autocast):
        self.spec, self.degrees, self.autocast, self.group = spec, degrees, autocast, group
        self.device = placement.device
        self.ranks = degrees.group(placement.rank, ("pp",))  # this pipeline's global ranks, stage rank by stage rank
        self.stage_rank = degrees.coordinates(placement.rank)["pp"]
        self.blocks = pipeline_stage_blocks(spec.model.n_layer, degrees.pp, degrees.pp_virtual)
        self.mine = range(self.stage_rank, len(self.blocks), degrees.pp)  # the global indices of this rank's stages
        self.part = RankPart(model, rank_blocks(spec, self.stage_rank), first=self.stage_rank == 0,
                             last=self.stage_rank == degrees.pp - 1).to(placement.device)
        # each pipeline's first and last rank sum the tied weight's gradients; every rank takes part in making them
        self.ends, _ = dist.new_subgroups_by_enumeration(
            [[ranks[0], ranks[-1]] for ranks in degrees.groups(("pp",))])
        self.micro_batches = degrees.pipeline_micro_batches

    def stages(self) -> list[nn.Module]:
        """This rank's stage modules (views of its part), in the pipeline's order, for the method to wrap."""
        last = len(self.blocks) - 1
        return [Stage(self.part, self.blocks[s], first=s == 0, last=s == last, autocast=self.autocast)
                for s in self.mine]

    def schedule(self, wrapped: list[nn.Module]) -> None:
        """The schedule over this rank's (wrapped) stages."""
        self.wrapped = dict(zip(self.mine, wrapped))  # what evaluation runs too: a sharded stage gathers in its forward
        stages = [PipelineStage(module, s, len(self.blocks), self.device, group=self.group)
                  for s, module in self.wrapped.items()]
        schedule = SCHEDULES[self.spec.train.pipeline_schedule]
        # scale_grads=False: the loss function already divides each micro-batch's mean by their number
        self.runner = schedule(stages[0] if issubclass(schedule, PipelineScheduleSingle) else stages,
                               self.micro_batches, loss_fn=self._loss, scale_grads=False)

    def wrapping(self) -> dict:
        """For run.json: the stages, their blocks, the schedule and its micro-batches."""
        return {"stages": len(self.blocks), "blocks_per_stage": [len(b) for b in self.blocks],
                "schedule": self.spec.train.pipeline_schedule, "micro_batches": self.micro_batches}

    def _loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One micro-batch's share of the pipeline's batch's mean loss. The head runs here rather than in the
        stage's forward because the schedule keeps every micro-batch's stage output until the step ends
        (torch 2.8 has no step(return_outputs=False)): the global batch's logits would be vocab_size / n_embd
        times the hidden states (26 GB in fp32 for GPT-2 small at 128 x 1024 tokens)."""
        return self.part.mean_loss(hidden, targets, self.autocast) / self.micro_batches

    def loss_module(self, loss) -> nn.Module:
        self.part.head_loss = loss
        return self.part  # the schedule computes the loss on the last stage

    def tied_copy(self) -> torch.Tensor | None:
        """This rank's copy of the tied embedding, where the first and last stage hold one each."""
        if self.degrees.pp == 1:
            return None
        return self.part.transformer.wte.weight if self.part.first else self.part.lm_head.weight if self.part.last \
            else None

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The schedule over this pipeline's batch, backward included; the loss detached, on every rank of it."""
        losses: list[torch.Tensor] = []
        ends = {"target": targets, "losses": losses} if self.part.last else {}
        self.runner.step(*([inputs] if self.part.first else []), **ends)
        tied = self.tied_copy()
        if tied is not None:
            grad = tied.grad.to_local() if hasattr(tied.grad, "to_local") else tied.grad  # a shard, under FSDP
            dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=self.ends)
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=self.device)
        dist.broadcast(loss, src=self.ranks[-1], group=self.group)  # the last stage's loss, for rank 0 to log
        return loss

    def evaluate_loss(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Forward only, stage to stage by send/recv in the stages' order, one training micro-batch at a time
        (the whole batch's logits at once would not fit where a training step does), then the mean loss to every
        rank of the pipeline."""
        ranks, last = self.degrees.pp, len(self.blocks) - 1
        rows = self.spec.train.micro_batch_size
        chunks = list(zip(inputs.split(rows), targets.split(rows)))
        views = self.wrapped
        total = torch.zeros((), device=self.device)
        with torch.no_grad():
            for micro_inputs, micro_targets in chunks:
                for s, stage in views.items():
                    if s == 0:
                        hidden = stage(micro_inputs)
                    else:
                        hidden = torch.empty((*micro_inputs.shape, self.spec.model.n_embd), device=self.device)
                        dist.recv(hidden, src=self.ranks[(s - 1) % ranks], group=self.group)
                        hidden = stage(hidden)
                    if s < last:
                        dist.send(hidden.float().contiguous(), dst=self.ranks[(s + 1) % ranks], group=self.group)
                    else:
                        total += self.part.mean_loss(hidden, micro_targets, self.autocast)
        loss = total / len(chunks)  # equal rows of equal length: the mean of the means is the batch's mean
        dist.broadcast(loss, src=self.ranks[-1], group=self.group)
        return loss

    def counted(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        """The gradients a norm counts: the tied weight once (the last stage's copy left out)."""
        tied = self.tied_copy()
        return [g for g in grads if not (self.part.last and not self.part.first and tied is not None
                                         and g is tied.grad)]

    # -- checkpoints: the ranks' parts under the full model's names ------------------------------
    def merged(self, parts: list[tuple[dict, dict]]) -> tuple[dict, dict]:
        """Every stage's (model, optimizer) state, full tensors under the model's names, merged as `single` keeps
        them: the head's copy equals the embedding, whose optimizer state is kept once, under its own name."""
        merged_model, merged_state, groups = {}, {}, []
        for part_model, part_optim in parts:
            merged_model.update(part_model)  # the last rank's head copy equals the first rank's embedding
            for name, state in part_optim["state"].items():
                merged_state.setdefault(name, state)
            for index, group in enumerate(part_optim["param_groups"]):
                if index == len(groups):
                    groups.append({**group, "params": []})
                groups[index]["params"] += [n for n in group["params"] if n not in groups[index]["params"]]
        merged_state.pop(HEAD, None)  # single keys the tied weight's state by the embedding's name only
        for group in groups:
            group["params"] = [n for n in group["params"] if n != HEAD]
        return merged_model, {"state": merged_state, "param_groups": groups}

    def local_state(self, model_state: dict, optim_state: dict) -> tuple[dict, dict]:
        """This rank's part of a full (single's) state: its parameters, the head's copy from the embedding's
        optimizer state, stepping with the embedding's hyperparameters."""
        names = {name for name, _ in self.part.named_parameters()}
        mine = {name: model_state[name] for name in self.part.state_dict().keys()}
        source = {name: EMBEDDING if name == HEAD and name not in optim_state["state"] else name for name in names}
        groups = []
        for group in optim_state["param_groups"]:
            kept = [n for n in group["params"] if n in names]
            if EMBEDDING in group["params"] and HEAD in names and HEAD not in kept:
                kept.append(HEAD)
            groups.append({**group, "params": kept})
        local = {"state": {name: optim_state["state"][source[name]] for name in names
                           if source[name] in optim_state["state"]},
                 "param_groups": groups}
        return mine, local
