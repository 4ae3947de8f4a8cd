"""The retrieval arm's pilot (`bash benchmarks/lm_study.sh pilot`; docs/lm_study.md, "Retrieval past the training
length: the pilot"): which synthetic share is the smallest at which a model finds 90 % of the pass keys at the
training length.

    python benchmarks/lm_study_pilot.py --out RESULTS/pilot.json --length 2048 \\
        --run 0.05 1e-3 0 RESULTS/eval/<run>/passkey_1x/passkey.json --run 0.1 1e-3 0 ...

Each --run is one pilot training (share, learning rate, seed) and the passkey.json that `eval.py --task passkey`
wrote for it; a missing file (a training or evaluation that failed or has not run) is recorded as missing and reaches
nothing. The summary, written to --out and printed: every run's pass-key successes, trials, rate and exact interval at
--length, and the pick: the smallest share whose rate (the point estimate) reaches --threshold, at any of the rates
given, or null when no share does. Where the runner also scored the recall of the synthetic documents' own facts
(``eval.py --task retrieval_recall``, in ``retrieval_recall/`` beside ``passkey_1x/``), each run adds it at --length
beside the same documents without their fact sentences: whether the model learned the training task at all, which
the pass keys (another format, by construction) cannot tell.
"""
from __future__ import annotations

import argparse
import json
import pathlib

THRESHOLD = 0.9  # the share is picked at 90 % of the pass keys (the criterion; docs/lm_study.md's pilot)


def passkey_at(result: dict, length: int) -> dict:
    """The one model's pass-key successes at ``length`` in an eval.py passkey result (its JSON, read)."""
    entries = [e for e in result["results"]["lengths"] if e["length"] == length]
    if not entries:
        raise ValueError(f"no pass-key result at length {length} (lengths: "
                         f"{[e['length'] for e in result['results']['lengths']]})")
    (model,) = entries[0]["models"]
    rate = model["rate"]
    return {"successes": model["successes"], "trials": model["n"], "rate": rate["estimate"],
            "interval": [rate["lower"], rate["upper"]], "confidence": rate["confidence"]}


def recall_at(result: dict, length: int) -> dict | None:
    """The one model's recall of the synthetic documents' facts at ``length`` in an eval.py retrieval_recall result
    (its JSON, read): items, exact rate and interval, mean value NLL, and the same without the fact sentences (the
    model's prior); None where that result has no such length."""
    entries = [e for e in result["results"]["lengths"] if e["length"] == length]
    if not entries:
        return None
    (model,) = entries[0]["models"]
    every = model["all"]
    return {"items": every["n"], "exact": every["exact"]["estimate"],
            "interval": [every["exact"]["lower"], every["exact"]["upper"]], "nll": every["nll"],
            "baseline_exact": every["baseline_exact"]["estimate"], "baseline_nll": every["baseline_nll"]}


def reaches(run: dict, threshold: float) -> bool:
    """Whether a run found at least ``threshold`` of its pass keys (a missing run reaches nothing)."""
    return "successes" in run and run["successes"] >= threshold * run["trials"] - 1e-9  # (90 of 100 is 0.9)


def pick_share(runs: list[dict], threshold: float = THRESHOLD) -> float | None:
    """The smallest share with a run that reaches ``threshold``, or None when none does."""
    reached = [run["share"] for run in runs if reaches(run, threshold)]
    return min(reached) if reached else None


def summarise(runs: list[tuple[str, str, str, pathlib.Path]], length: int, threshold: float) -> dict:
    """The pilot's summary from (share, lr, seed, passkey.json) of every run."""
    rows = []
    for share, lr, seed, path in runs:
        row = {"share": float(share), "lr": float(lr), "seed": int(seed), "file": str(path)}
        if path.is_file():
            row.update(passkey_at(json.loads(path.read_text()), length))
        else:
            row["missing"] = True
        recall = path.parent.parent / "retrieval_recall" / "retrieval_recall.json"  # the runner's folder beside it
        if recall.is_file():
            row["recall"] = recall_at(json.loads(recall.read_text()), length)
        rows.append(row)
    rows.sort(key=lambda r: (r["share"], r["lr"], r["seed"]))
    return {"length": length, "threshold": threshold, "runs": rows, "picked_share": pick_share(rows, threshold)}


def report(summary: dict) -> str:
    lines = [f"pilot: pass keys found at length {summary['length']}, by synthetic share"]
    for r in summary["runs"]:
        found = "missing" if r.get("missing") else f"{r['successes']}/{r['trials']} = {r['rate']:.2f}"
        recall = r.get("recall")
        if recall:
            found += (f"; the synthetic documents' facts: {recall['exact']:.2f} of {recall['items']} exact, value NLL "
                      f"{recall['nll']:.2f} (without the facts: {recall['baseline_exact']:.2f}, "
                      f"{recall['baseline_nll']:.2f})")
        lines.append(f"  share {r['share']:g} (lr {r['lr']:g}, seed {r['seed']}): {found}")
    picked = summary["picked_share"]
    lines.append(f"smallest share reaching {summary['threshold']:.0%}: "
                 + ("none" if picked is None else f"{picked:g}"))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=pathlib.Path, required=True, help="the summary JSON")
    parser.add_argument("--length", type=int, required=True, help="the pass-key length read (the training length)")
    parser.add_argument("--threshold", type=float, default=THRESHOLD)
    parser.add_argument("--run", nargs=4, action="append", required=True, metavar=("SHARE", "LR", "SEED", "JSON"))
    args = parser.parse_args(argv)
    summary = summarise([(s, lr, seed, pathlib.Path(p)) for s, lr, seed, p in args.run], args.length, args.threshold)
    args.out.write_text(json.dumps(summary, indent=1) + "\n")
    print(report(summary))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
