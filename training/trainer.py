"""The trainer loop shared by every algorithm.

One iteration: load the worker's slice of the global batch, forward, backward,
then the algorithm's step (communication and update). Each phase is timed into
the rank's timeline; rank 0 also writes the per-step metrics as it goes, so a
crash keeps what was measured.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from training import inject
from training.algorithms import AllreduceSSGD, make_strategy
from training.config import TrainConfig
from training.datasets import GlobalBatchSampler, load_dataset
from training.gpt_shape import is_gpt, resolve_shape
from training.measure.layer_timing import LayerTimer, sampling_every
from training.measure.memory import MemoryMeter
from training.measure.timeline import Timeline
from training.models import build_model, logits_of
from training.shape import resolve_input_shape


@torch.no_grad()
def evaluate(model: nn.Module, source, device: torch.device, batch: int = 512) -> tuple[float, float]:
    """(accuracy, mean loss) over every target of a whole split: per sample for a classifier,
    per token for a language model (its loss in nats, exp of it the perplexity)."""
    was_training = model.training
    model.eval()
    correct, loss_sum, count = 0, 0.0, 0
    for start in range(0, len(source), batch):
        idx = torch.arange(start, min(start + batch, len(source)))
        x, y = source.batch(idx)
        x, y = x.to(device), y.to(device)
        out = logits_of(model(x))
        loss_sum += F.cross_entropy(out, y, reduction="sum").item()
        correct += (out.argmax(dim=1) == y).sum().item()
        count += y.numel()
    model.train(was_training)
    return correct / count, loss_sum / count


def language_model_params(cfg: TrainConfig) -> dict[str, Any]:
    """`language_model_shape` of a config, its data loaded here."""
    return language_model_shape(cfg, *load_dataset(cfg, resolve_input_shape(cfg)))


def language_model_shape(cfg: TrainConfig, train_set, test_set) -> dict[str, Any]:
    """A GPT's resolved dimensions, training FLOPs per token and its data's token counts
    (MLflow params and summary.json's `language_model`)."""
    shape = resolve_shape(cfg.model, {**cfg.model_options, "seq_len": resolve_input_shape(cfg)[2]},
                          cfg.num_classes or train_set.num_classes)
    return {**shape.as_dict(), "parameters": shape.parameters(), "flops_per_token": shape.flops_per_token(),
            "train_tokens": train_set.tokens, "test_tokens": test_set.tokens,
            "tokens_per_step": cfg.workers * cfg.batch_size * shape.seq_len}


class Trainer:
    """A worker: model, data, the algorithm's strategy, and the loop."""

    def __init__(self, cfg: TrainConfig, rank: int, timeline: Timeline, device: torch.device,
                 workers_group, ps_group, out: Path) -> None:
        self.cfg, self.rank, self.timeline, self.device, self.out = cfg, rank, timeline, device, out
        shape = resolve_input_shape(cfg)
        self.train_set, self.test_set = load_dataset(cfg, shape)
        classes = cfg.num_classes or self.train_set.num_classes
        torch.manual_seed(cfg.seed)  # the same initial weights on every worker
        self.net = build_model(cfg.model, shape, classes, cfg.model_options).to(device)
        self.sampler = GlobalBatchSampler(len(self.train_set), cfg.workers, cfg.batch_size, cfg.seed)
        # A language model's sequences: what tokens/s and MFU count (None for a classifier).
        self.lm = language_model_shape(cfg, self.train_set, self.test_set) if is_gpt(cfg.model) else None
        self.strategy = make_strategy(cfg, self.net, timeline, rank, workers_group, ps_group)
        self.overlapped = isinstance(self.strategy, AllreduceSSGD) and cfg.overlap and cfg.workers > 1
        self.eval_time = 0.0
        # The first evaluation at or above the target accuracy (at or below the target
        # loss): training seconds and steps to it.
        self.reached_at: float | None = None
        self.reached_step: int | None = None
        self.loss_reached_at: float | None = None
        self.loss_reached_step: int | None = None
        self.loss_value = float("nan")
        # Per-layer compute sampled in situ every k-th iteration (layers_insitu.json).
        self.layer_timer = LayerTimer(self.net, device, sampling_every(), cfg.measure_warmup)
        if self.layer_timer.cpu_clock:
            timeline.cpu_phases = ("update",)
        # Memory on the same iterations: the state the strategy holds and the activations saved.
        snapshot = self.out / f"memory_snapshot.rank{self.rank}.pickle" if cfg.memory_snapshot else None
        self.memory = MemoryMeter(device, self.strategy.held_state, sampling_every(), cfg.measure_warmup, snapshot)
        # A known slowdown in one component, to test the regression alarm (none without a delay).
        inject.install(cfg, self.net, timeline)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def checkpoint_state(self, loss: float) -> dict[str, Any]:
        return {
            "model": {k: v.detach().cpu() for k, v in self.net.state_dict().items()},
            "strategy": self.strategy.checkpoint_state(),
            "rng": torch.get_rng_state(),
            "records": self.timeline.records,
            "clock": self.timeline.now(),
            "eval_time": self.eval_time,
            "reached_at": self.reached_at,
            "reached_step": self.reached_step,
            "loss_reached": [self.loss_reached_at, self.loss_reached_step],
            "loss": loss,
            "traffic": [self.strategy.stats.bytes_sent, self.strategy.stats.bytes_received],
        }

    def load_checkpoint_state(self, state: dict[str, Any]) -> float:
        """Restore a checkpoint; returns the timeline clock it was taken at."""
        self.net.load_state_dict(state["model"])
        self.strategy.load_checkpoint_state(state["strategy"])
        torch.set_rng_state(state["rng"])
        self.timeline.records = list(state["records"])
        self.eval_time, self.reached_at = state["eval_time"], state["reached_at"]
        self.reached_step = state.get("reached_step")
        self.loss_reached_at, self.loss_reached_step = state.get("loss_reached", [None, None])
        self.loss_value = state["loss"]
        self.strategy.stats.bytes_sent, self.strategy.stats.bytes_received = state["traffic"]
        return state["clock"]

    def run(self, steps: int, done: int, on_step: Callable[[int], None]) -> dict[str, Any]:
        """Train steps done..steps-1; `on_step(t)` after each step (checkpoints)."""
        cfg, tl = self.cfg, self.timeline
        model = self.strategy.model
        model.train()
        lead = self.rank == 0
        metrics = _open_metrics(self.out / "metrics.jsonl", done) if lead else None
        last_end = tl.now()
        global_batch = cfg.workers * cfg.batch_size
        try:
            self.strategy.start(resumed=done > 0)
            for t in range(done, steps):
                tl.begin(t)
                with tl.phase("data"):
                    x, y = self.train_set.batch(self.sampler.indices(t, self.rank))
                    x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
                self.layer_timer.arm(t)
                with tl.phase("forward"):
                    with self.memory.forward(t, steps):
                        loss = F.cross_entropy(logits_of(model(x)), y)
                    self.loss_value = loss.item()
                if not math.isfinite(self.loss_value):
                    raise Diverged(t + 1, self.loss_value)
                b0 = tl.now()
                tl.current = f"backward of step {t}"
                self.layer_timer.backward()
                loss.backward()
                self._sync()
                b1 = tl.now()
                self.memory.collect()
                if self.overlapped:  # DDP's wait for the last buckets is communication
                    compute_end = min(max(self.strategy.backward_compute_end(), b0), b1)
                    tl.mark("backward", b0, compute_end)
                    tl.mark("comm_exposed", compute_end, b1)
                else:
                    tl.mark("backward", b0, b1)
                self.strategy.step(t)
                self._sync()
                rec = tl.end()
                self.layer_timer.collect()
                if lead:
                    row: dict[str, Any] = {
                        "step": t + 1,
                        "loss": self.loss_value,
                        # The timeline clock starts at 0 with training (and continues on resume).
                        "time_s": rec["end"] - self.eval_time,
                        "throughput_samples_per_s": global_batch / max(rec["end"] - last_end, 1e-9),
                    }
                    if self.lm:
                        row["throughput_tokens_per_s"] = row["throughput_samples_per_s"] * self.lm["seq_len"]
                    last_end = rec["end"]
                    if cfg.eval_every and (t + 1) % cfg.eval_every == 0 and t + 1 < steps:
                        e0 = tl.now()
                        with tl.pause(f"evaluation after step {t}"):
                            row["accuracy"], row["test_loss"] = evaluate(self.net, self.test_set, self.device)
                        self._note_target(row["accuracy"], row["test_loss"], row["time_s"], t + 1)
                        e1 = tl.now()
                        rec["eval"] = [e0, e1]  # not training: the paces leave it out
                        self.eval_time += e1 - e0
                        last_end = tl.now()
                    metrics.write(json.dumps(row) + "\n")
                    metrics.flush()
                on_step(t)
            self.strategy.finish()
            train_time = tl.now() - self.eval_time
            result: dict[str, Any] = {"train_time_s": train_time, "memory": self.memory.result(self.rank, "worker")}
            if lead:
                self.layer_timer.write(self.out, tl.records, cfg.model, cfg.batch_size)
                with tl.pause("the final evaluation"):
                    acc, test_loss = evaluate(self.net, self.test_set, self.device)
                self._note_target(acc, test_loss, train_time, steps)
                metrics.write(json.dumps({"step": steps, "accuracy": acc, "test_loss": test_loss,
                                          "time_s": train_time}) + "\n")
                result |= {
                    "final_loss": self.loss_value,
                    "final_test_loss": test_loss,
                    "final_accuracy": acc,
                    **self.accuracy_figures(),
                    "parameters": sum(p.numel() for p in self.net.parameters()),
                    "parameter_bytes": sum(p.numel() * p.element_size() for p in self.net.parameters()),
                    "language_model": self.lm,
                }
                if cfg.save_params:
                    torch.save({k: v.detach().cpu() for k, v in self.net.state_dict().items()},
                               self.out / "params.pt")
            return result
        finally:
            if metrics:
                metrics.close()

    def _note_target(self, accuracy: float, loss: float, time_s: float, step: int) -> None:
        cfg = self.cfg
        if cfg.target_accuracy and self.reached_at is None and accuracy >= cfg.target_accuracy:
            self.reached_at, self.reached_step = time_s, step
        if cfg.target_loss and self.loss_reached_at is None and loss <= cfg.target_loss:
            self.loss_reached_at, self.loss_reached_step = time_s, step

    def accuracy_figures(self) -> dict[str, Any]:
        """Time-to-target: training seconds (warm-up included, evaluation excluded) and
        steps to the first evaluation at or above the target accuracy, and at or below the
        target loss. A run that never reached a target says so: target_reached false (every
        target given must be reached), that target's figures None (no target: all None)."""
        cfg = self.cfg
        reached = [r is not None for t, r in ((cfg.target_accuracy, self.reached_at),
                                               (cfg.target_loss, self.loss_reached_at)) if t]
        return {"target_reached": all(reached) if reached else None,
                "time_to_accuracy_s": self.reached_at, "steps_to_accuracy": self.reached_step,
                "time_to_loss_s": self.loss_reached_at, "steps_to_loss": self.loss_reached_step}


class Diverged(RuntimeError):
    """The loss became NaN or infinite: the run ends with status "diverged"."""

    def __init__(self, step: int, loss: float) -> None:
        super().__init__(f"loss is {loss} at step {step}")
        self.step, self.loss = step, loss


def _open_metrics(path: Path, done: int):
    """Open metrics.jsonl for appending after `done` steps: rows of steps not
    covered by the checkpoint being resumed (or all rows, on a fresh start) go."""
    kept = []
    if done and path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a row cut short by the crash
            if row.get("step", 0) <= done:
                kept.append(line)
    f = open(path, "w")
    f.writelines(line + "\n" for line in kept)
    f.flush()
    return f

