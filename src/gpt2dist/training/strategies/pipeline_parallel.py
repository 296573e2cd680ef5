"""Pipeline parallelism (`torch.distributed.pipelining`): the blocks are split into stages, the
embeddings on the first, the final LayerNorm, head and loss on the last. One pipeline step per
optimizer step takes the whole global batch as global_batch_size / micro_batch_size micro-batches.
GPipe and 1F1B give each process one stage; interleaved 1F1B and the interleaved zero-bubble schedule
give it train.pipeline_virtual_stages of them, rank r holding stages r, r + nproc, r + 2 nproc, ...,
so that the last stage is on the last rank and the first on rank 0.

GPT-2 ties the head to the token embedding, which now sit on different stages. As Megatron
does, the first and last stage each hold a copy (equal at the start) and sum their gradients
after backward, so both copies step identically and the pipeline trains the same model as
`single`. The schedule runs forward and backward itself, so the loop's loss scaler cannot
wrap it: pp takes fp32, tf32 and bf16 (config refuses fp16 and Apex).

Checkpoints are the portable full state dict: the ranks' parts gathered on rank 0 under
the original parameter names, the tied weight's optimizer state once, as `single` writes it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.pipelining import (
    PipelineStage,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
)
from torch.distributed.pipelining.schedules import PipelineScheduleSingle

from gpt2dist.config.strategies import pipeline_stage_blocks, rank_blocks
from gpt2dist.training.model import head_loss
from gpt2dist.training.strategies.base import log_wrapping
from gpt2dist.training.strategies.torch_distributed import TorchDistributed

EMBEDDING, HEAD = "transformer.wte.weight", "lm_head.weight"
SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B, "interleaved-1f1b": ScheduleInterleaved1F1B,
             "zero-bubble": ScheduleInterleavedZeroBubble}


class RankPart(nn.Module):
    """What one rank holds of GPT-2, under the full model's parameter names (`transformer.h.3...`,
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
    PipelineParallel._loss). The last stage registers the head too, whose weight the zero-bubble schedule's
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

class PipelineParallel(TorchDistributed):
    name = "pp"
    compile_conflict = "the pipeline schedule drives each stage's forward and backward itself"
    schedules_backward = True

    def prepare(self, model, make_optimizer, precision):
        place = self.placement
        ranks, rank, t = self.degrees.pp, place.rank, self.spec.train
        self.blocks = pipeline_stage_blocks(self.spec.model.n_layer, ranks, self.degrees.pp_virtual)
        mine = range(rank, len(self.blocks), ranks)  # the global indices of this rank's stages
        self.part = RankPart(model, rank_blocks(self.spec, rank), first=rank == 0,
                             last=rank == ranks - 1).to(place.device)
        self.autocast = precision.autocast
        last = len(self.blocks) - 1
        stages = [PipelineStage(Stage(self.part, self.blocks[s], first=s == 0, last=s == last,
                                      autocast=precision.autocast), s, len(self.blocks), place.device)
                  for s in mine]
        # the first and last stage sum the tied weight's gradients; every rank takes part in making the group
        self.ends = dist.new_group([0, ranks - 1]) if ranks > 1 else None
        self.micro_batches = self.degrees.pipeline_micro_batches
        schedule = SCHEDULES[t.pipeline_schedule]
        # scale_grads=False: the loss function already divides each micro-batch's mean by their number
        self.schedule = schedule(stages[0] if issubclass(schedule, PipelineScheduleSingle) else stages,
                                 self.micro_batches, loss_fn=self._loss, scale_grads=False)
        self.wrapping = {"stages": len(self.blocks), "blocks_per_stage": [len(b) for b in self.blocks],
                         "schedule": t.pipeline_schedule, "micro_batches": self.micro_batches}
        log_wrapping(self, f"{len(self.blocks)} stages on {ranks} ranks holding blocks "
                           f"{[f'{b.start}-{b.stop - 1}' for b in self.blocks]}, {t.pipeline_schedule} over "
                           f"{self.micro_batches} micro-batches")
        return self.part, make_optimizer(self.part)

    def _loss(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One micro-batch's share of the global batch's mean loss. The head runs here rather than in the
        stage's forward because the schedule keeps every micro-batch's stage output until the step ends
        (torch 2.8 has no step(return_outputs=False)): the global batch's logits would be vocab_size / n_embd
        times the hidden states (26 GB in fp32 for GPT-2 small at 128 x 1024 tokens)."""
        return self.part.mean_loss(hidden, targets, self.autocast) / self.micro_batches

    def loss_module(self, model, precision, loss):
        self.part.head_loss = loss
        return model  # the schedule computes the loss on the last stage

    def _tied_copy(self) -> torch.Tensor | None:
        """This rank's copy of the tied embedding, where the first and last stage hold one each."""
        if self.ends is None:
            return None
        return self.part.transformer.wte.weight if self.part.first else self.part.lm_head.weight if self.part.last \
            else None

    def forward(self, loss_module, inputs, targets, accum):
        """The schedule over the whole batch, backward included; the loss detached."""
        place = self.placement
        losses: list[torch.Tensor] = []
        ends = {"target": targets, "losses": losses} if self.part.last else {}
        self.schedule.step(*([inputs] if self.part.first else []), **ends)
        tied = self._tied_copy()
        if tied is not None:
            dist.all_reduce(tied.grad, op=dist.ReduceOp.SUM, group=self.ends)
        loss = torch.stack(losses).sum().detach() if losses else torch.zeros((), device=place.device)
        dist.broadcast(loss, src=place.world_size - 1)  # the last stage's loss, for rank 0 to log
        return loss

    def evaluate_loss(self, loss_module, inputs, targets):
        """Forward only, stage to stage by send/recv in the stages' order, one training micro-batch at a time
        (the whole global batch's logits at once would not fit where a training step does), then the mean loss to
        every rank."""
        place = self.placement
        rank, ranks, last = place.rank, place.world_size, len(self.blocks) - 1
        rows = self.spec.train.micro_batch_size
        chunks = list(zip(inputs.split(rows), targets.split(rows)))
        views = {s: Stage(self.part, self.blocks[s], first=s == 0, last=s == last, autocast=self.autocast)
                 for s in range(rank, last + 1, ranks)}
        total = torch.zeros((), device=place.device)
        with torch.no_grad():
            for micro_inputs, micro_targets in chunks:
                for s, stage in views.items():
                    if s == 0:
                        hidden = stage(micro_inputs)
                    else:
                        hidden = torch.empty((*micro_inputs.shape, self.spec.model.n_embd), device=place.device)
                        dist.recv(hidden, src=(s - 1) % ranks)
                        hidden = stage(hidden)
                    if s < last:
                        dist.send(hidden.float().contiguous(), dst=(s + 1) % ranks)
                    else:
                        total += self.part.mean_loss(hidden, micro_targets, self.autocast)
        loss = total / len(chunks)  # equal rows of equal length: the mean of the means is the batch's mean
        dist.broadcast(loss, src=ranks - 1)
        return loss

    def global_grad_norm(self, grads):
        """Each rank holds its own parameters whole: squared local norms add up over the ranks, the tied
        weight counted once (the last rank's copy left out)."""
        tied = self._tied_copy()
        counted = [g for g in grads if not (self.part.last and tied is not None and g is tied.grad)]
        squared = torch.nn.utils.get_total_norm(counted).to(self.placement.device, torch.float32).square()
        dist.all_reduce(squared, op=dist.ReduceOp.SUM)
        return squared.sqrt()

    # -- checkpoints: the ranks' parts under the full model's names ------------------------------
    def _local_optimizer_state(self, optimizer) -> dict:
        state = get_optimizer_state_dict(self.part, optimizer, options=StateDictOptions(full_state_dict=True))
        on_cpu = {name: {key: value.cpu() if torch.is_tensor(value) else value for key, value in per_param.items()}
                  for name, per_param in state["state"].items()}
        return {**state, "state": on_cpu}

    def full_state_dict(self, model, optimizer, precision):
        model_state = {k: v.detach().cpu() for k, v in self.part.state_dict().items()}
        optim_state = self._local_optimizer_state(optimizer)
        parts = [None] * self.placement.world_size if self.placement.rank == 0 else None
        dist.gather_object((model_state, optim_state), parts, dst=0)
        if self.placement.rank != 0:
            return {}, {}
        merged_model, merged_state, groups = {}, {}, []
        for part_model, part_optim in parts:
            merged_model.update(part_model)  # the last rank's head copy equals the first rank's embedding
            for name, state in part_optim["state"].items():
                merged_state.setdefault(name, state)
            for index, group in enumerate(part_optim["param_groups"]):
                if index == len(groups):
                    groups.append({**group, "params": []})
                groups[index]["params"] += [n for n in group["params"] if n not in groups[index]["params"]]
        if self.placement.world_size > 1:  # single keys the tied weight's state by the embedding's name only
            merged_state.pop(HEAD, None)
            for group in groups:
                group["params"] = [n for n in group["params"] if n != HEAD]
        return merged_model, {"state": merged_state, "param_groups": groups}

    def load_full_state_dict(self, model, optimizer, precision, model_state, optim_state):
        mine = self.part.state_dict().keys()
        self.part.load_state_dict({name: model_state[name] for name in mine})
        names = {name for name, _ in self.part.named_parameters()}
        source = {name: EMBEDDING if name == HEAD and name not in optim_state["state"] else name for name in names}
        groups = []
        for group in optim_state["param_groups"]:
            kept = [n for n in group["params"] if n in names]
            if EMBEDDING in group["params"] and HEAD in names and HEAD not in kept:
                kept.append(HEAD)  # the head's copy steps with the embedding's hyperparameters
            groups.append({**group, "params": kept})
        local = {"state": {name: optim_state["state"][source[name]] for name in names
                           if source[name] in optim_state["state"]},
                 "param_groups": groups}
        set_optimizer_state_dict(self.part, optimizer, local, options=StateDictOptions(full_state_dict=True))
