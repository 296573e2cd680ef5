"""The one training loop. A strategy decides placement, wrapping and how gradients meet;
a precision policy decides casting and loss scaling; everything else is shared, so any
difference between strategies in the results comes from those two choices alone."""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from gpt2dist.config.schema import RunSpec, TrainConfig
from gpt2dist.config.sizes import weight_decayed
from gpt2dist.config.units import gradient_bytes
from gpt2dist.data.shards import open_shards
from gpt2dist.errors import Interrupted, UsageError
from gpt2dist.pipeline.layout import EVENTS
from gpt2dist.system.gpu_telemetry import GpuTelemetry
from gpt2dist.training import stops
from gpt2dist.training.batches import BatchSampler
from gpt2dist.training.checkpoint import load_checkpoint, load_other_runs_checkpoint, save_checkpoint
from gpt2dist.training.ledger import StepTracer, building_batch, timed_step
from gpt2dist.training.matmul_precision import pin_fp32_arithmetic
from gpt2dist.training.metrics import (
    MetricsLog,
    model_state_bytes,
    peak_memory_bytes,
    peak_reserved,
)
from gpt2dist.training.model import (build_model, checkpoint_blocks, compile_blocks, compile_whole,
                                     deterministic_algorithms, head_loss_of)
from gpt2dist.training.precision import Precision, make_precision
from gpt2dist.training.preflight import check_vocabulary
from gpt2dist.training.run_record import CHECKPOINT, METRICS, RankReport, now_iso, probe_placement, run_facts, trace_file
from gpt2dist.training.strategies import REGISTRY, Strategy
from gpt2dist.training.tensorboard_events import write_events

log = logging.getLogger(__name__)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up to lr, then cosine decay to min_lr at max_steps (a pure function of step)."""
    if step < cfg.lr_warmup_steps:
        return cfg.lr * (step + 1) / cfg.lr_warmup_steps
    span = max(1, cfg.max_steps - cfg.lr_warmup_steps)
    progress = min(1.0, (step - cfg.lr_warmup_steps) / span)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def optimizer_factory(cfg: TrainConfig, fused: bool, foreach: bool | None = None):
    """AdamW; weight decay on matrices and embeddings only (biases and LayerNorm gains exempt).
    foreach=False steps tensor by tensor (None: torch's default for the device)."""

    def make(model: torch.nn.Module) -> torch.optim.Optimizer:
        params = [p for p in model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if weight_decayed(p.dim())], "weight_decay": cfg.weight_decay},
            {"params": [p for p in params if not weight_decayed(p.dim())], "weight_decay": 0.0},
        ]
        return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=fused, foreach=foreach)

    return make


def step_seed(seed: int, step: int, replica: int) -> int:
    """Dropout seed for one replica at one step; makes resumption exact without saved RNG state."""
    return (seed * 1_000_003 + step) * 4099 + replica


class Trainer:
    """One rank's run: its placement and the record's probes, its data, its model as the strategy wraps it, then
    the steps (run)."""

    def __init__(self, spec: RunSpec, strategy: Strategy):
        self.spec, self.strategy = spec, strategy
        self.place = strategy.setup()
        self.matmul = pin_fp32_arithmetic(spec.precision, self.place.device)  # before any matmul runs
        # where the ranks run and how fast they reach each other, measured before anything else uses the links
        self.node_hardware, self.interconnect = probe_placement(strategy, self.place)
        self.rank0 = self.place.rank == 0
        self.out = Path(spec.out_dir)
        self._open_data()
        self.precision: Precision = make_precision(spec.precision, self.place.device, sharded=strategy.sharded_grads)
        self._build_model()
        self.rows = self.strategy.degrees.rows_per_pass
        self.tokens_per_step = spec.train.global_batch_size * spec.model.n_positions
        self.telemetry = GpuTelemetry(self.place.device) if self.rank0 else None
        self.state_bytes: dict | None = None  # measured once, at the first step this process runs
        self.saved_at, self.save_due = time.monotonic(), False  # train.checkpoint_minutes' clock

    def _open_data(self) -> None:
        spec, t = self.spec, self.spec.train
        shards = open_shards(Path(spec.data_dir), check_hash=False)  # the launcher verified hashes
        check_vocabulary(shards.meta, spec)
        pin = self.place.device.type == "cuda"
        self.train_batches = BatchSampler(shards.train, "train", spec.model.n_positions, t.global_batch_size, t.seed,
                                          pin_memory=pin)
        self.val_batches = BatchSampler(shards.val, "val", spec.model.n_positions, t.global_batch_size, t.seed,
                                        pin_memory=pin)

    def _build_model(self) -> None:
        """Single's model (from published weights where asked), checkpointed and compiled per block as train.* says,
        then placed and wrapped by the strategy with its optimizer, and the loss the loop calls."""
        spec, strategy, t = self.spec, self.strategy, self.spec.train
        model = build_model(spec.model, seed=t.seed)
        if spec.init_from is not None:  # into single's layout, which every strategy places from here
            from gpt2dist.training.hf_format import load_init  # here: safetensors only where a run starts from weights

            load_init(model, spec.init_from, spec.model)
        if t.activation_checkpointing == "block":
            checkpoint_blocks(model)
        conflict = strategy.compile_conflict or self.precision.compile_conflict
        self.compiled = t.compile and conflict is None
        self.continued: dict | None = None  # set by resume() from another run's checkpoint
        self.compile_skipped = conflict if t.compile else None  # run.json says why a requested compile did not apply
        whole = self.compiled and t.compile_whole_model
        if self.compiled:
            # past the recompile limit, dynamo would run eager code without a word; stop the run instead
            torch._dynamo.config.fail_on_recompile_limit_hit = True
            if not whole:
                compile_blocks(model)
        elif t.compile:
            log.warning("train.compile ignored: %s", conflict)
        uniform = strategy.uniform_parameters
        make_optimizer = optimizer_factory(t, fused=self.precision.fused_optimizer and uniform,
                                           foreach=None if uniform else False)
        self.model, self.optimizer = strategy.prepare(model, make_optimizer, self.precision)
        self.loss = strategy.loss_module(self.model, self.precision, head_loss_of(t, self.compiled and not whole))
        # a whole-model step runs deterministic algorithms (model.deterministic_algorithms)
        self.determinism = deterministic_algorithms if whole else contextlib.nullcontext
        if whole:  # the model's own state (what a checkpoint keeps) stays unwrapped
            self.loss = compile_whole(self.loss, t.cuda_graphs)

    def _save_due(self) -> bool:
        minutes = self.spec.train.checkpoint_minutes
        return bool(minutes) and time.monotonic() - self.saved_at >= 60 * minutes

    # -- one optimizer step -------------------------------------------------------------
    def train_step(self, step: int, traced: bool = False) -> dict:
        spec, strategy, precision = self.spec, self.strategy, self.precision
        device = self.place.device
        accum = strategy.degrees.grad_accum_steps
        torch.manual_seed(step_seed(spec.train.seed, step, self.place.data_rank))  # one replica's ranks draw alike
        lr = lr_at(step, spec.train)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with timed_step() as clock, self.determinism():  # the ledger's window is the one the step time measures
            data_time = 0.0
            loss_sum = torch.zeros((), device=device)
            place = self.place
            batches = self.train_batches.micro_batches(step, place.data_rank, place.data_world, self.rows)
            for micro in range(accum):
                fetch = time.perf_counter()
                with building_batch():
                    inputs, targets = next(batches)
                data_time += time.perf_counter() - fetch  # host work only: from pinned memory the copy is queued
                inputs = inputs.to(device, non_blocking=True)
                targets = targets.to(device, non_blocking=True)
                last = micro == accum - 1
                with strategy.accumulate(self.model, last):
                    loss = strategy.forward(self.loss, inputs, targets, accum)
                    if not strategy.schedules_backward:
                        with precision.scaled(loss, self.optimizer, last=last) as scaled:
                            scaled.backward()
                            if last:  # before the gradients are unscaled, clipped or stepped
                                strategy.sync_grads(self.optimizer)
                loss_sum += loss.detach().float()
            clip = spec.train.grad_clip or math.inf
            grad_norm = strategy.clip_grad_norm(precision.master_params(self.model, self.optimizer), clip)
            with strategy.step_context(self.optimizer):
                precision.step(self.optimizer)
            if self.state_bytes is None and self.rank0:  # gradients and optimizer state both exist only here
                self.state_bytes = model_state_bytes(self.model, self.strategy.local_optimizer(self.optimizer))
            self.optimizer.zero_grad()  # set_to_none is the default; Horovod rejects the kwarg
            # The step's one wait for the device: loss and gradient norm come back to the host together; the
            # micro-steps above queue work without reading anything back (tests/training/test_engine_structure.py).
            # A rank whose clock says a checkpoint is due says so in the same reduction, so all ranks agree.
            reduced = strategy.all_reduce_mean(torch.stack([loss_sum, loss_sum.new_tensor(float(self._save_due()))]))
            loss_value, norm_value, due = torch.stack(
                [reduced[0], grad_norm.float().to(reduced.device), reduced[1]]).tolist()
            self.save_due = due > 0
        elapsed = clock.wall_s
        shortest, longest = clock.window_bounds_s
        return {
            "kind": "train",
            "step": step,
            "loss": loss_value,
            "lr": lr,
            "grad_norm": norm_value,
            "step_time_s": elapsed,
            "data_time_s": data_time,
            "cpu_time_s": clock.cpu_s,  # this process, all its threads: far below step_time_s x threads = starved
            "end_unix_s": time.time(),  # places the step among the launcher's load samples
            "tokens_per_s": self.tokens_per_step / elapsed,
            "samples_per_s": spec.train.global_batch_size / elapsed,
            "peak_mem_bytes": peak_memory_bytes(device),
            **peak_reserved(device),
            **(self.telemetry.sample() if self.telemetry else {}),
            # the profiler slows a traced step: not a throughput sample; its window in the trace lies within these
            **({"traced": True, "trace_window_min_s": shortest, "trace_window_max_s": longest} if traced else {}),
        }

    def evaluate(self, step: int) -> dict:
        with self.determinism():
            return self._evaluate(step)

    @torch.no_grad()
    def _evaluate(self, step: int) -> dict:
        self.model.eval()
        total = torch.zeros((), device=self.place.device)
        count = 0
        for index in range(self.spec.train.eval_batches):
            place = self.place
            for inputs, targets in self.val_batches.micro_batches(index, place.data_rank, place.data_world, self.rows):
                total += self.strategy.evaluate_loss(self.loss, inputs.to(place.device), targets.to(place.device))
                count += 1
        self.model.train()
        val_loss = self.strategy.all_reduce_mean(total / count).item()
        return {"kind": "eval", "step": step, "val_loss": val_loss, "val_ppl": math.exp(min(val_loss, 50.0))}

    def checkpoint(self, step: int, report: RankReport | None) -> None:
        """Save the state after `step` and name it in rank 0's report, where a re-run resumes, even after
        SIGKILL."""
        model_state, optim_state = self.strategy.full_state_dict(self.model, self.optimizer, self.precision)
        if self.rank0:
            with stops.deferred():
                save_checkpoint(
                    self.out / CHECKPOINT,
                    step=step,
                    spec=self.spec,
                    model=model_state,
                    optimizer=optim_state,
                    optimizer_by_name=self.precision.optimizer_state_by_name,
                    precision=self.precision.state_dict(self.optimizer),
                    metrics=self.metrics.history,
                )
                write_events(self.out / EVENTS, self.metrics.history)  # TensorBoard's curves, as far as saved
                report.update(checkpoint_step=step, model_state_bytes=self.state_bytes)
        self.strategy.barrier()

    def resume(self) -> tuple[int, list[dict]]:
        """The step to start from and the metrics lines measured before it: from this run's own checkpoint,
        else from the other run's that spec.resume_from names."""
        path = self.out / CHECKPOINT
        state = load_checkpoint(path, self.spec.fingerprint(), stale=self.spec.stale_checkpoint)
        if state is None and self.spec.resume_from:
            path = Path(self.spec.resume_from)
            state = load_other_runs_checkpoint(path, self.spec, self.precision.optimizer_state_by_name)
            self.continued = {"checkpoint": str(path), "step": state["step"], **state["placement"]}
        if state is None:
            return 0, []
        if state["step"] > self.spec.train.max_steps:  # else it would report "completed" with more steps than asked
            if self.spec.stale_checkpoint == "restart" and path == self.out / CHECKPOINT:
                log.warning("%s is at step %d, past train.max_steps; starting afresh", path, state["step"])
                return 0, []
            raise UsageError(f"{path} is at step {state['step']}, past train.max_steps ({self.spec.train.max_steps}); "
                             f"ask for at least {state['step']} steps (--max-steps), or train afresh in another --out")
        self.strategy.load_full_state_dict(self.model, self.optimizer, self.precision,
                                           state["model"], state["optimizer"])
        self.precision.load_state_dict(state["precision"], self.optimizer)
        log.info("resumed from %s at step %d", path, state["step"])
        return state["step"], state["metrics"]

    # -- the run --------------------------------------------------------------------------
    def run(self) -> None:
        t = self.spec.train
        start, history = self.resume()
        report = RankReport(self.out, self.spec.attempt) if self.rank0 else None
        if report is not None:  # capture() runs git, mpirun, nvidia-smi
            report.update(status="running", **run_facts(self, start))
        self.metrics = metrics = MetricsLog(self.out / METRICS, enabled=self.rank0, history=history)
        # A bar at a terminal; in a log file (every pipeline job) one readable line per 5% of the run,
        # not a carriage-return bar that `less` shows as one endless line.
        interactive = sys.stderr.isatty()
        progress = tqdm(total=t.max_steps, initial=start, disable=not (self.rank0 and interactive),
                        desc=self.spec.strategy, unit="step")
        log_every = max(1, t.max_steps // 20)
        tracer = StepTracer(range(max(0, t.max_steps - t.ledger_steps), t.max_steps), self.place.device,
                            list_element_bytes=gradient_bytes(self.spec.precision))
        ledger = next(({k: v for k, v in line.items() if k not in ("kind", "step")}  # traced before a resume
                       for line in history if line.get("kind") == "ledger"), None)
        done = start  # steps finished, counted as checkpoint_step is: where the record says a stop or failure came
        try:
            for step in range(start, t.max_steps):
                stops.check()
                with tracer.step(step):
                    line = self.train_step(step, traced=step in tracer.steps)
                done = step + 1
                metrics.write(line)
                if tracer.finished(step):
                    ledger = tracer.ledger(summarise=self.rank0, keep=self.out / trace_file(self.place.rank),
                                           rank=self.place.rank)
                    if ledger is not None:
                        metrics.write({"kind": "ledger", "step": step + 1, **ledger})
                progress.set_postfix(loss=f"{line['loss']:.4f}", tok_s=f"{line['tokens_per_s']:.0f}", refresh=False)
                progress.update()
                if self.rank0 and not interactive and (done % log_every == 0 or done == t.max_steps):
                    log.info("step %d/%d  loss %.4f  %s tokens/s", done, t.max_steps, line["loss"],
                             f"{line['tokens_per_s']:,.0f}")
                if done % t.eval_interval == 0 or done == t.max_steps:
                    metrics.write(self.evaluate(done))
                if done % t.checkpoint_interval == 0 or done == t.max_steps or self.save_due:
                    self.checkpoint(done, report)
                    self.saved_at = time.monotonic()
        except BaseException:
            if report is not None:
                _report_the_end(report, done)
            raise
        finally:
            progress.close()
            metrics.close()
        if report is not None:  # the curves again: a run resumed at its last step saved no checkpoint here
            write_events(self.out / EVENTS, metrics.history)
            report.update(status="completed", finished_at=now_iso(), ledger=ledger, trace=self.kept_traces(tracer))

    def kept_traces(self, tracer: StepTracer) -> dict | None:
        """Which step each rank's kept trace holds, and the files, in rank order: none where this launch traced no
        step (train.ledger_steps 0, or resumed past its traced steps: a workflow tool deleted the earlier launch's
        traces with its other outputs)."""
        if tracer.profiler is None:
            return None
        return {"step": tracer.kept_step,
                "files": [trace_file(rank) for rank in range(self.place.world_size)]}


def _report_the_end(report: RankReport, done: int) -> None:
    """The steps finished when the loop ended, for the record's "interrupted (or failed) at step": whatever ended
    it, as a collective can fail before this rank's own stop arrives, once a stopped peer has gone. That stop's
    exception can then be raised inside this very write: the report is written once more (a process raises its
    stop once)."""
    try:
        report.update(ended_at_step=done, finished_at=now_iso())
    except Interrupted:
        report.update(ended_at_step=done, finished_at=now_iso())
        raise


def run(spec: RunSpec) -> bool:
    """Train one rank of `spec` (the launcher starts one call per process); returns whether this
    process was rank 0, the one that reports."""
    strategy = REGISTRY[spec.strategy](spec)
    try:
        trainer = Trainer(spec, strategy)
        trainer.run()
        return trainer.rank0
    finally:
        if strategy.placement is not None:
            strategy.teardown()
