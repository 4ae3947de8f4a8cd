"""Running the table: rows in order (or in worker processes), resumable, mergeable; then statistics and reports.

A finished row is a plain dict (``row_record``). Rows already present in an earlier ``probes.json`` (the output
folder's own, or files passed to merge) with the same group, backend, seeds, shape, budget and test probe are reused,
not retrained, so a table can be filled in over several runs and machines. A row may also be trained in seed ranges
(``eval.py --seed A --seeds N`` in separate runs): earlier rows that differ only in their seeds and together cover
the row's seeds exactly are joined into it, and a row they cover in part trains only the seeds they lack
(``earlier_parts``); an interrupted run keeps each finished seed chunk of a split row in the same form. The budget
includes the held-out split (``Budget.holdout``, and ``split``, ``data_seed`` and ``salt`` where they are not their
defaults: ``Budget.record``), so rows trained before the held-out set was made disjoint from the pool are never
reused, and rows of another split or data replicate are other experiments.

A plan's entries are (group, backend) pairs, trained with the run's budget and steps, or (group, backend, budget)
triples (``sweep``: several step counts or learning rates in one run). ``devices``: the rows' seed chunks are
spread over several devices (GPUs of one host), round-robin.
"""
from __future__ import annotations

import json
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, replace
from multiprocessing import get_context

import torch

from fpa_lightning.atomic import write_json
from fpa_lightning.probes.model import variant
from fpa_lightning.probes.stats import holm, sign_test, successes
from fpa_lightning.probes.train import Budget, train_row
from modules.probes.table import REFERENCE, Group
from modules.probes.verdicts import direction_to_test


def row_identity(group: Group, backend: str, seeds: list[int], budget: Budget) -> dict:
    """What makes two rows the same experiment. ``test_probe``: the probe of the held-out set where the group tests
    at another setting than it trains (None: the training probe). ``impl`` only where the group leaves the naive
    implementation (``Group.impl``), so rows recorded before that option existed stay reusable."""
    test_probe = group.test_probe.key if group.test_probe is not None else None
    identity = {"group": group.label, "probe": group.probe.key, "test_probe": test_probe, "backend": backend,
                "seeds": list(seeds), "shape": asdict(group.shape), "budget": budget.record(),
                "criterion": group.criterion}
    return identity if group.impl == "naive" else {**identity, "impl": group.impl}


def row_record(group: Group, backend: str, seeds: list[int], budget: Budget, device: str, progress=None,
               parts: list[dict] = ()) -> dict:
    """Train one row and return its record; with `parts` (chunks of earlier runs), only the seeds they lack."""
    return merge_chunks(group, backend, seeds, budget, device,
                        [*parts, train_chunk(group, backend, missing_seeds(seeds, parts), budget, device, progress)])


def missing_seeds(seeds: list[int], parts: list[dict]) -> list[int]:
    """The seeds of `seeds` that no part (chunk or earlier seed range) trained, in order."""
    done = {seed for part in parts for seed in part["seeds"]}
    return [seed for seed in seeds if seed not in done]


CHUNK_KEYS = ("seeds", "accuracies", "final_loss", "held_out_distinct", "seconds", "device", "machine",
              "held_out_parts", "part_overlap", "loss_curve")
"""What a row's record keeps of each chunk of seeds trained together (``train_chunk``); ``machine`` and the last three
only where the chunk has them (rows recorded before they existed have not)."""


def device_name(device: str) -> str:
    """The hardware behind a torch device string: the GPU's name, or "CPU". A row's seeds may be trained in chunks
    on different machines (merged runs), so each chunk records its own."""
    dev = torch.device(device)
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "CPU"


def train_chunk(group: Group, backend: str, seeds: list[int], budget: Budget, device: str, progress=None) -> dict:
    """Train some seeds of one row: what their part of the record needs, as plain (picklable) values."""
    run = train_row(group.probe, variant(backend), group.shape, seeds, budget, torch.device(device), progress,
                    test_probe=group.test_probe, impl=group.impl)
    return {"seeds": list(seeds), "accuracies": run.accuracies, "final_loss": run.final_loss,
            "held_out_distinct": run.held_out_distinct, "seconds": run.seconds, "device": device,
            "machine": device_name(device), "held_out_parts": run.held_out_parts, "part_overlap": run.part_overlap,
            "loss_curve": run.loss_curve}


def merge_chunks(group: Group, backend: str, seeds: list[int], budget: Budget, device: str, chunks: list[dict]) -> dict:
    """One row's record from the chunks its seeds were trained in (any order; chunks or earlier rows of seed
    ranges). ``seconds`` is their training time summed, so it means the same whether a row ran whole or split;
    ``device`` lists the chunks' devices (`device` for a chunk that names none), ``machine`` the chunks' machines ("not
    recorded" for a chunk from before chunks recorded it; none recorded: the row has no ``machine``)."""
    by_seed = {seed: (acc, loss) for c in chunks for seed, acc, loss in zip(c["seeds"], c["accuracies"],
                                                                           c["final_loss"])}
    curves = {seed: curve for c in chunks for seed, curve in zip(c["seeds"], c.get("loss_curve") or [])}
    if sorted(by_seed) != sorted(seeds) or sum(len(c["seeds"]) for c in chunks) != len(seeds):
        raise ValueError(f"{group.label} · {backend}: the chunks trained seeds "
                         f"{sorted(s for c in chunks for s in c['seeds'])}, not {sorted(seeds)}")
    accuracies = [by_seed[s][0] for s in seeds]
    success = successes(accuracies, group.criterion)
    extra = {key: chunks[0][key] for key in ("held_out_parts", "part_overlap") if chunks[0].get(key) is not None}
    if sorted(curves) == sorted(seeds):  # every chunk recorded its curves
        extra["loss_curve"] = [curves[s] for s in seeds]
    machines = [c.get("machine") or "not recorded" for c in chunks]
    if any(m != "not recorded" for m in machines):
        extra["machine"] = ", ".join(dict.fromkeys(machines))
    return {**row_identity(group, backend, seeds, budget), "probe_name": group.probe.name,
            "params": group.probe.params, "variant": variant(backend).description,
            "accuracies": accuracies, "success": success, "successes": sum(success),
            "final_loss": [by_seed[s][1] for s in seeds], "held_out_distinct": chunks[0]["held_out_distinct"],
            "seconds": round(sum(c["seconds"] for c in chunks), 1),
            "device": ", ".join(dict.fromkeys(c.get("device", device) for c in chunks)),
            "paper": group.paper.get(backend), **extra}


def seed_chunks(group: Group, seeds: list[int], chunks_per_row: int) -> list[list[int]]:
    """The seeds of one row split for the worker pool. A naive row stays one job, one vmapped model; a fast-path row
    (``Group.impl``) splits into `chunks_per_row` contiguous chunks. Each seed trains exactly as it would alone
    (``SeedEnsemble``), vmapped or not, so the chunks' merged record is the whole row's."""
    if group.impl == "naive" or chunks_per_row <= 1:
        return [list(seeds)]
    n = min(chunks_per_row, len(seeds))
    bounds = [round(i * len(seeds) / n) for i in range(n + 1)]
    return [list(seeds[a:b]) for a, b in zip(bounds, bounds[1:])]


PARTIAL = "probes.partial.json"
"""Rows finished so far by an interrupted run, in its output folder (read back like probes.json)."""


def load_rows(paths: list[str]) -> list[dict]:
    """Rows of earlier runs: probes.json files, or folders holding probes.json and/or probes.partial.json (missing
    files are skipped)."""
    rows = []
    for path in paths:
        files = [os.path.join(path, "probes.json"), os.path.join(path, PARTIAL)] if os.path.isdir(path) else [path]
        for file in filter(os.path.exists, files):
            with open(file, encoding="utf-8") as f:
                record = json.load(f)
            rows.extend(record["results"]["rows"] if "results" in record else record["rows"])
    return rows


def _find(rows: list[dict], identity: dict) -> dict | None:
    return next((r for r in rows if all(r.get(k) == v for k, v in identity.items())), None)


def _same_but_seeds(row: dict, identity: dict) -> bool:
    return all(row.get(k) == v for k, v in identity.items() if k != "seeds")


def seed_cover(rows: list[dict], seeds: list[int]) -> list[dict] | None:
    """Rows whose seeds partition `seeds` exactly (each row's seeds a disjoint part), or None. Tried in order of
    their first seed, so the first cover found is the earliest-recorded rows' (a depth-first exact cover)."""
    candidates = sorted((r for r in rows if set(r["seeds"]) <= set(seeds)), key=lambda r: min(r["seeds"], default=0))

    def cover(left: frozenset[int], start: int) -> list[dict] | None:
        if not left:
            return []
        first = min(left)
        for j in range(start, len(candidates)):
            part = set(candidates[j]["seeds"])
            if first in part and part <= left and len(part) == len(candidates[j]["seeds"]):
                rest = cover(left - part, j + 1)
                if rest is not None:
                    return [candidates[j], *rest]
        return None

    return cover(frozenset(seeds), 0)


def earlier_parts(group: Group, backend: str, seeds: list[int], budget: Budget, earlier: list[dict]) -> list[dict]:
    """Earlier rows of this row's experiment trained on disjoint parts of its seeds (seed ranges run apart, or the
    chunks an interrupted run saved), as chunks: an exact cover of the seeds where one exists, else as many disjoint
    parts as a greedy pick of the largest finds. Each seed trains as it would alone (``SeedEnsemble``,
    ``minibatch_pickers``), so a row joined from parts is the row trained whole."""
    identity = row_identity(group, backend, seeds, budget)
    candidates = [r for r in earlier if _same_but_seeds(r, identity) and len(set(r["seeds"])) == len(r["seeds"])]
    parts = seed_cover(candidates, seeds)
    if parts is None:
        parts, taken = [], set()
        for row in sorted((r for r in candidates if set(r["seeds"]) <= set(seeds)), key=lambda r: -len(r["seeds"])):
            if taken.isdisjoint(row["seeds"]):
                parts.append(row)
                taken.update(row["seeds"])
    return [{key: part[key] for key in CHUNK_KEYS if key in part} for part in parts]


ROW_KEYS = ("group", "probe", "test_probe", "backend", "seeds", "shape", "budget", "criterion", "impl")
"""The keys of ``row_identity``."""


def is_seed_part(row: dict, rows: list[dict]) -> bool:
    """Whether `row` trained a strict subset of the seeds of one of `rows` that is otherwise the same experiment
    (a seed range joined into that row, ``earlier_parts``)."""
    identity = {k: v for k, v in row.items() if k in ROW_KEYS}
    return any(_same_but_seeds(other, identity) and set(row["seeds"]) < set(other["seeds"]) for other in rows)


def budget_for(group: Group, budget: Budget, steps: int | None) -> Budget:
    return replace(budget, steps=steps or group.steps)


def sweep(plan: list[tuple[Group, str]], budget: Budget, steps: list[int | None] | None = None,
          lrs: list[float] | None = None) -> list[tuple[Group, str, Budget]]:
    """Every planned row at every step count (None: the group's own) and learning rate, as (group, backend,
    budget) triples: the step counts outermost, then the learning rates, then the plan's order."""
    return [(group, backend, replace(budget_for(group, budget, n), lr=lr))
            for n in (steps or [None]) for lr in (lrs or [budget.lr]) for group, backend in plan]


def _entry(item: tuple, budget: Budget, steps: int | None) -> tuple[Group, str, Budget]:
    group, backend, *given = item
    return group, backend, given[0] if given else budget_for(group, budget, steps)


def run_rows(plan: list[tuple], seeds: list[int], budget: Budget, steps: int | None, device: str | list[str],
             earlier: list[dict], workers: int = 1, log=print, partial: str | None = None) -> list[dict]:
    """Train every planned row not found in `earlier` (the seeds that earlier seed ranges lack); returns the records
    in plan order. Plan entries are (group, backend), trained with `budget` at `steps` (None: the group's own), or
    (group, backend, budget) (``sweep``). `device`: one device, or several for the worker pool to spread the seed
    chunks over. With `partial` (a file path), every finished row, and every finished chunk of a split row, is
    saved there at once, so an interrupted run loses nothing that finished."""
    devices = [device] if isinstance(device, str) else list(device)
    device = devices[0] if len(devices) == 1 else ", ".join(devices)
    plan = [_entry(item, budget, steps) for item in plan]
    todo, done, parts = [], {}, {}
    for i, (group, backend, row_budget) in enumerate(plan):
        found = _find(earlier, row_identity(group, backend, seeds, row_budget))
        parts[i] = [] if found is not None else earlier_parts(group, backend, seeds, row_budget, earlier)
        if found is None and sum(len(p["seeds"]) for p in parts[i]) == len(seeds):
            found = merge_chunks(group, backend, seeds, row_budget, device, parts[i])
        if found is not None:
            done[i] = found
        else:
            todo.append(i)
    resumed = sum(bool(parts[i]) for i in todo)
    log(f"probes: {len(plan)} rows, {len(plan) - len(todo)} reused from earlier results, {len(todo)} to train "
        f"({len(seeds)} seeds each, on {device}{f', {workers} workers' if workers > 1 else ''}"
        f"{f'; {resumed} of them only the seeds earlier seed ranges lack' if resumed else ''})")
    saved = _Saved(done, partial)
    started = time.time()

    def finished(n: int, i: int, record: dict) -> None:
        saved.row(i, record)
        elapsed = time.time() - started
        eta = elapsed / n * (len(todo) - n)
        log(f"[{n}/{len(todo)}] {record['group']} · {record['backend']}: {record['successes']}/{len(seeds)} seeds "
            f"succeed, mean accuracy {sum(record['accuracies']) / len(seeds):.3f} ({record['seconds']:.0f} s; "
            f"elapsed {elapsed / 60:.1f} min, about {eta / 60:.1f} min left)")

    jobs = [(plan[i][0], plan[i][1], seeds, plan[i][2], device, parts[i]) for i in todo]
    try:
        if workers > 1 or len(devices) > 1:
            _run_in_pool(todo, jobs, max(workers, len(devices)), finished, log, saved.seed_range, devices)
        else:
            for n, (i, (group, backend, _, row_budget, _, row_parts)) in enumerate(zip(todo, jobs), start=1):
                tested = f", tested on {group.test_probe.key}" if group.test_probe is not None else ""
                log(f"[{n}/{len(todo)}] {group.label} · {backend}: training {row_budget.steps} steps "
                    f"({group.probe.key}{tested}, {group.shape.describe()})")
                progress = _progress_printer(row_budget.steps, log)
                finished(n, i, row_record(group, backend, seeds, row_budget, device, progress, parts=row_parts))
    except BaseException:
        if partial is not None:
            log(f"probes: stopped; any rows and seed chunks that finished are in {partial}")
        raise
    return [done[i] for i in range(len(plan))]


class _Saved:
    """The partial file of a run: its finished rows and the finished seed chunks of rows not finished yet (each
    saved as a row of those seeds, which a later run joins, ``earlier_parts``)."""

    def __init__(self, done: dict[int, dict], path: str | None):
        self.done, self.path, self.ranges = done, path, {}

    def row(self, i: int, record: dict) -> None:
        self.done[i] = record
        self.ranges.pop(i, None)  # the row holds its chunks now
        self._write()

    def seed_range(self, i: int, record: dict) -> None:
        self.ranges.setdefault(i, []).append(record)
        self._write()

    def _write(self) -> None:
        if self.path is not None:
            ranges = [r for i in sorted(self.ranges) for r in self.ranges[i]]
            write_json(self.path, {"rows": [self.done[j] for j in sorted(self.done)] + ranges})


def _run_in_pool(todo: list[int], jobs: list[tuple], workers: int, finished, log, seed_range=None,
                 devices: list[str] | None = None) -> None:
    """Every job's row in a pool of worker processes; a fast-path row splits into seed chunks so that the pool has
    about two jobs per worker (``seed_chunks``), and a row is finished when its last chunk is. `seed_range(i,
    record)` receives each chunk that leaves its row unfinished, as a row of its seeds. `devices`: the chunks are
    given to these devices in turn (default: the jobs' own device)."""
    split = sum(job[0].impl != "naive" for job in jobs)
    per_row = -(-2 * workers // split) if split else 1
    turn = 0
    pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"), initializer=_worker_init,
                               initargs=(workers, os.getpid()))
    try:
        futures, waiting, parts = {}, {}, {}
        for i, job in zip(todo, jobs):
            group, backend, seeds, row_budget, device, earlier = job
            chunks = seed_chunks(group, missing_seeds(seeds, earlier), per_row)
            waiting[i], parts[i] = len(chunks), list(earlier)
            for chunk in chunks:
                label = f"{group.label} · {backend}" + (f", seeds {chunk[0]}–{chunk[-1]}" if len(chunks) > 1 else "")
                on = devices[turn % len(devices)] if devices else device
                turn += 1
                futures[pool.submit(_pool_job, group, backend, chunk, row_budget, on, label)] = (i, job)
        n = 0
        for k, future in enumerate(as_completed(futures), start=1):
            i, (group, backend, seeds, row_budget, device, _) = futures[future]
            chunk = future.result()
            parts[i].append(chunk)
            waiting[i] -= 1
            if len(futures) > len(jobs):  # rows were split: say how far the chunks are
                log(f"    chunk {k}/{len(futures)}: {group.label} · {backend}, seeds {chunk['seeds']} "
                    f"({chunk['seconds']:.0f} s)")
            if waiting[i] == 0:
                n += 1
                finished(n, i, merge_chunks(group, backend, seeds, row_budget, device, parts.pop(i)))
            elif seed_range is not None:
                seed_range(i, merge_chunks(group, backend, chunk["seeds"], row_budget, device, [chunk]))
    except BaseException:  # Ctrl-C, SIGINT to the runner alone, a failed chunk: stop now, not when the pool is done
        _stop_pool(pool)
        raise
    pool.shutdown()


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Cancel the queued chunks and end the running ones. Leaving the pool by `with` (shutdown(wait=True)) would wait
    for every submitted chunk, so an interrupted run went on training for nobody, or hung if interrupted again."""
    processes = list((pool._processes or {}).values())  # private, as Python < 3.14 has no terminate_workers()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        process.terminate()


def _pool_job(group: Group, backend: str, seeds: list[int], budget: Budget, device: str, label: str) -> dict:
    """train_chunk in a worker process, its progress printed from there (a closure cannot cross to the pool)."""
    return train_chunk(group, backend, seeds, budget, device,
                       _progress_printer(budget.steps, lambda line: print(f"  {label}:{line[3:]}", flush=True)))


def _worker_init(workers: int, runner: int) -> None:
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
    threading.Thread(target=_exit_without, args=(runner,), daemon=True, name="exit-without-runner").start()


def _exit_without(runner: int, every: float = 1.0) -> None:
    """Stop this worker once the process that runs the table (`runner`) is gone. SIGTERM or SIGKILL to the runner
    (a scheduler's kill, a time limit) skips the pool's shutdown, and its orphaned workers would otherwise train the
    rows they hold, and the next one queued, for nobody: on a shared machine that is minutes of every core. The
    finished rows are already in the partial file (``run_rows``)."""
    while os.getppid() == runner:
        time.sleep(every)
    os._exit(1)  # the worker's rows are lost either way; no cleanup can reach the gone runner


def _progress_printer(steps: int, log):
    started = time.time()
    every = max(50, steps // 10 // 50 * 50)  # progress arrives every 50 steps

    def progress(step: int, loss: float) -> None:
        if step % every == 0 or step == steps:
            rate = step / max(time.time() - started, 1e-9)
            log(f"    step {step}/{steps}  loss {loss:.4f}  {rate:.1f} steps/s  ETA {(steps - step) / rate:.0f} s")

    return progress


def comparisons(rows: list[dict]) -> list[dict]:
    """Within each group: FPA against every other backend trained with the same seeds and budget (exact one-sided
    sign tests on the paired seeds). Each comparison is tested in one direction (``verdicts.direction_to_test``: the
    paper's, where its counts claim one, else FPA better), and the tested p-values of the run are adjusted as one
    family (Holm): ``tested`` ("a" or "b"), ``p_tested`` and ``p_holm``."""
    out = []
    for reference in (r for r in rows if r["backend"] == REFERENCE):
        for other in rows:
            same = all(other.get(k) == reference.get(k) for k in ("group", "seeds", "budget", "test_probe"))
            if same and other["backend"] != REFERENCE:
                test = sign_test(reference["success"], other["success"])
                tested = direction_to_test(reference.get("paper"), other.get("paper"))
                out.append({"group": reference["group"], "probe": reference["probe"], "a": REFERENCE,
                            "b": other["backend"], "budget": reference["budget"], **test.as_dict(), "tested": tested,
                            "p_tested": test.p_value if tested == "a" else test.p_value_reverse})
    for c, adjusted in zip(out, holm([c["p_tested"] for c in out])):
        c["p_holm"] = adjusted
    return out
