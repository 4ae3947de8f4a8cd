"""What a long evaluation tells its user: an estimate before it starts and a progress bar while it runs.

Before any work, ``announce`` prints how many items and tokens a task will score and how long that should take,
estimated from timed passes (``calibrate``), and, when that is more than a minute, how to shorten it.
While it runs, ``Progress`` shows items done, tokens per second, elapsed time and the remaining time. Items of
different lengths cost differently (attention grows quadratically), so the remaining time is computed from the
same cost model as the estimate, not from a count of items.

Everything goes to stderr: stdout keeps the task's headline numbers. On a terminal the bar redraws one line; in a
log file (not a TTY) it writes a line every ``log_every`` seconds and a last one when the task ends.
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from fpa_lightning.model import Decoder


@dataclass(frozen=True)
class CostModel:
    """Seconds of scoring one input of T tokens ≈ constant + linear · T + quadratic · T² (a fixed cost per item such
    as decoding an answer; projections and MLPs grow with T, attention with T²), fitted to timed passes."""

    linear: float
    quadratic: float
    constant: float = 0.0

    def seconds(self, tokens: int) -> float:
        return self.constant + self.linear * tokens + self.quadratic * tokens * tokens

    @staticmethod
    def fit(short: int, short_s: float, long: int, long_s: float, constant: float = 0.0) -> CostModel:
        """The model through (short, short_s) and (long, long_s) with the given constant, the coefficients kept
        ≥ 0 (timing noise can make the exact solution negative)."""
        short_s, long_s = max(0.0, short_s - constant), max(0.0, long_s - constant)
        quadratic = max(0.0, (long_s / long - short_s / short) / (long - short))
        linear = max(0.0, short_s / short - quadratic * short)
        if linear == 0.0 and quadratic == 0.0:
            linear = long_s / long
        return CostModel(linear, quadratic, constant)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable, *args) -> tuple[object, float]:
    """fn(*args) and its wall-clock seconds, the device's queued work waited for before and after."""
    _synchronize(device)
    start = time.perf_counter()
    result = fn(*args)
    _synchronize(device)
    return result, time.perf_counter() - start


@dataclass(frozen=True)
class ScorePath:
    """A further way a task scores its items, at a cost of its own (decoding through the KV cache, say): the decoder,
    its score, and how many items of T tokens one call of the score takes as one batch (rows(T))."""

    decoder: Decoder
    score: Callable[[Decoder, torch.Tensor], object]
    rows: Callable[[int], int] = lambda tokens: 1


@torch.no_grad()
def calibrate(decoder: Decoder, length: int, score: Callable[[Decoder, torch.Tensor], object],
              longest: int | None = None, rows: Callable[[int], int] = lambda tokens: 1) -> CostModel:
    """Time ``score(decoder, ids)`` on random ids (rows(L), L), one item costing the call's time over rows(L) (a
    task that scores rows(L) items of L tokens per call: cache_prune's real eviction). At L = 16 (the constant), then
    at length / 2 and length, or, when the task's ``longest`` item is longer than ``length``, at length and longest,
    so that every item's cost is interpolated between two measured lengths rather than extrapolated from short ones
    (extrapolated from 1024 and 2048 tokens to 8192, cache_prune's estimate was 3.6 times its real time on an H200:
    docs/evaluation.md). Untimed passes at every length timed (16, short and long) come first, so that first-call
    costs (the allocator growing, kernels chosen or compiled for a new shape) stay out of the fit: a Triton kernel
    compiled during the one timed pass at the longest length made an H200 estimate 2.6 times the real time."""
    device = next(decoder.parameters()).device

    def seconds(tokens: int) -> float:
        batch = rows(tokens)
        ids = torch.randint(3, decoder.cfg.vocab_size, (batch, tokens), device=device)
        return timed(device, score, decoder, ids)[1] / batch

    short, long = (length, longest) if longest is not None and longest > length else (max(2, length // 2), length)
    tiny = min(16, short)
    for warm_up in sorted({tiny, short, long}):
        seconds(warm_up)
    return CostModel.fit(short, seconds(short), long, seconds(long), constant=seconds(tiny))


def format_seconds(seconds: float) -> str:
    """1:02:03 / 4:05 / 0:07."""
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def format_count(n: float) -> str:
    """12,345 -> 12.3k; 3,200,000 -> 3.2M."""
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{suffix}"
    return f"{n:.0f}"


@dataclass(frozen=True)
class Work:
    """One model's share of a task: the token length of every item it will score, in order."""

    model: int
    lengths: Sequence[int]


class Progress:
    """A progress bar over a task's items (see the module doc). ``advance`` after each item."""

    def __init__(self, label: str, work: list[Work] | None, costs: list[CostModel] | None = None, unit: str = "items",
                 log_every: float = 30.0, redraw_every: float = 0.2):
        self.label, self.unit = label, unit
        # without a cost model the remaining time is proportional to the remaining tokens
        self.costs = costs or [CostModel(1.0, 0.0)] * (1 + max((w.model for w in work or []), default=0))
        self.total_items = None if work is None else sum(len(w.lengths) for w in work)
        self.total_cost = None if work is None else sum(self.costs[w.model].seconds(n) for w in work for n in w.lengths)
        self.items = self.tokens = 0
        self.cost_done = 0.0
        self.stage = ""
        self.started = self._last_draw = time.perf_counter()
        self.log_every, self.redraw_every = log_every, redraw_every

    def set_stage(self, stage: str) -> None:
        """What is being scored now (e.g. "niah_single_1 4096 A"), shown in the bar."""
        self.stage = stage

    def advance(self, tokens: int, model: int = 0, items: int = 1) -> None:
        """``items`` items of ``tokens`` tokens in all were scored by model ``model``."""
        self.items += items
        self.tokens += tokens
        if self.total_cost is not None:
            self.cost_done += self.costs[model].seconds(tokens // items) * items
        now = time.perf_counter()
        interactive = sys.stderr.isatty()
        if now - self._last_draw >= (self.redraw_every if interactive else self.log_every):
            self._draw(interactive, now)

    def close(self) -> None:
        """The last state, always written (on a terminal it ends the redrawn line), and, when the plan had an
        estimate, the time taken against it: how far the announced estimate was off shows in every log."""
        interactive = sys.stderr.isatty()
        now = time.perf_counter()
        self._draw(interactive, now)
        if interactive:
            sys.stderr.write("\n")
        if self.total_cost and self.items == self.total_items:
            elapsed = now - self.started
            sys.stderr.write(f"{self.label}: took {format_seconds(elapsed)}, estimated "
                             f"{format_seconds(self.total_cost)} ({elapsed / self.total_cost:.2f}x the estimate)\n")
        sys.stderr.flush()

    def line(self, now: float | None = None) -> str:
        elapsed = (time.perf_counter() if now is None else now) - self.started
        done = f"{self.items}/{self.total_items}" if self.total_items is not None else f"{self.items}"
        parts = [f"{done} {self.unit}", f"{format_count(self.tokens / max(elapsed, 1e-9))} tok/s",
                 f"{format_seconds(elapsed)} elapsed"]
        if self.total_cost is not None and self.cost_done > 0:
            remaining = elapsed * max(0.0, self.total_cost - self.cost_done) / self.cost_done
            parts.append(f"ETA {format_seconds(remaining)}")
        stage = f" [{self.stage}]" if self.stage else ""
        return f"{self.label}{stage}: " + " · ".join(parts)

    def _draw(self, interactive: bool, now: float) -> None:
        self._last_draw = now
        text = self.line(now)
        sys.stderr.write(f"\r{text}\x1b[K" if interactive else text + "\n")
        sys.stderr.flush()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def announce(label: str, work: list[Work], estimate: float, device: torch.device, shorten: str,
             unit: str = "items") -> None:
    """Print the plan and its estimated time in seconds (stderr; the progress bar's ``total_cost``, which its last
    line compares with the time taken) before any work. ``shorten`` says how to make it shorter and is printed when
    the estimate exceeds a minute."""
    items = sum(len(w.lengths) for w in work)
    tokens = sum(sum(w.lengths) for w in work)
    message = (f"{label}: {items} {unit}, {format_count(tokens)} tokens; estimated {format_seconds(estimate)} on "
               f"{device.type} (from timed passes on it)")
    if estimate > 60 and shorten:
        message += f"; shorter: {shorten}"
    print(message, file=sys.stderr, flush=True)


def start(label: str, decoders: list[Decoder], work: list[Work], score: Callable[[Decoder, torch.Tensor], object],
          shorten: str, unit: str = "items",
          paths: Sequence[ScorePath] = ()) -> Progress:
    """Calibrate each model with ``score`` (the forward the task runs) at min(2048, its shortest item) and at its
    longest item (``calibrate``), announce the plan and return the task's progress bar. ``paths``: further ways of
    scoring whose cost differs from the main forward, calibrated the same way; ``Work.model`` numbers them after the
    decoders (len(decoders) + j)."""
    if not any(len(w.lengths) for w in work):
        return Progress(label, work, unit=unit)
    shortest = min(min(w.lengths) for w in work if len(w.lengths))
    longest = max(max(w.lengths) for w in work if len(w.lengths))
    base = min(2048, shortest)
    costs = [calibrate(d, base, score, longest) for d in decoders]
    costs += [calibrate(p.decoder, base, p.score, longest, p.rows) for p in paths]
    device = next(decoders[0].parameters()).device
    bar = Progress(label, work, costs, unit)
    announce(label, work, bar.total_cost, device, shorten, unit)
    return bar
