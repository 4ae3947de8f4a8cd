"""Decoding speed with the KV cache: ms per step at batch 1 and 8 for prompt lengths 1k-16k, FPA (with and without
eviction at -10), FoX and softmax on the 110M shapes, all in one run, with ratios to softmax from the same run.

    PYTHONPATH=. python benchmarks/decode.py [--modes eager graph] [--compile-lengths 1024 8192 16384]
                                            [--fpa-ckpt PATH] [--json out.json] [--decode-attention auto]

What is timed: ``DecodeSession.step`` (fpa_lightning.generation), one new token per row, after the prompt is
prefilled by the parallel forward (fused kernels) and a few warm-up steps; CUDA events around ``--steps`` steps.
Modes: eager (kernel by kernel), graph (the step captured once in a CUDA graph and replayed), compile (the step
``torch.compile``d, then captured; batch 1 at ``--compile-lengths``: every cache shape compiles anew, ~1 min each;
``--compile-mode`` picks torch.compile's mode, recorded as the row's "compile_mode").
Weights are bf16 (gate maps float32, ``cast_weights``); the models are freshly initialised, so FPA and FoX start as
ALiBi: with eviction at -10 head h keeps about 10/m_h keys (16 to 2560). ``--fpa-ckpt`` uses a trained FPA
checkpoint's weights instead (its kept fraction is then the real one). ``--decode-attention`` picks the attention
over the cache (``DecodeSession``'s attention_impl: auto, the fused Triton op on a GPU; naive, the einsums around a
softmax; fused); every row records the one that ran under "decode_attention".
On a CPU (no CUDA) it runs tiny shapes in eager mode only: a check that the script works, not a measurement.

``--profile`` (default then: batch 1, lengths 1k 8k 16k) also records ``--profile-steps`` steps of every
measurement under ``torch.profiler`` (after the timed steps, in the same session; one discarded profiler warm-up
step first) and prints, per step: the device kernels (kernels, memcpys and memsets) and their summed device time,
split into the groups of ``KERNEL_GROUPS`` (first matching regex of the kernel name; the top "other" names are
printed so that the groups can be refined); the host's CUDA synchronisations (sync API calls inside the steps) and
the CPU time of the ``DecodeSession.step`` call. The kernel time is a sum of durations, not the wall time: the gap
to the timed ms/step is the device idling between kernels (launch overhead). In graph mode the kernels replayed by
the graph are counted when the profiler sees them (CUPTI reports graph kernels in recent torch); when it does not,
the row says so instead of printing zeros. Caveat of naming: the naive cached attention of a decode step is two
einsums (batched GEMMs, in "matmul") around a softmax ("softmax/reduce"), the fused one two Triton kernels
(_decode_attn_*, in "attention"), and the composite RMSNorm is pow/mean/rsqrt/mul (only the rsqrt lands in "norm");
"attention" holds fused attention kernels only. With the fused step ops (ops/decode/step, taken with the fused op) a
norm is one kernel (_add_rms_norm, "norm"), a new token's RoPE and cache writes one ("cache write"), SwiGLU's
activation one (_silu_mul, "elementwise"), and a layer's attention with FPA's bias two (_step_attn, "attention");
each row records the step's attention per layer kind under "step_attention" (e.g. "fused_step"). The rows of ``--json`` carry the
profile under "profile"; ``--trace-dir DIR`` writes a Chrome trace per measurement. On a CPU the profile groups the
aten ops (self CPU time, every op call counted, views and allocations in "view/alloc") into the same groups.
Should a row say the profiler saw no kernels after earlier profiles in the same process, profile that configuration
alone (one --variants, --modes and --lengths per run).

    PYTHONPATH=. python benchmarks/decode.py --profile [--variants fpa softmax] [--trace-dir traces/]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
from collections.abc import Iterable

import torch

from fpa_lightning import Decoder, ModelConfig
from fpa_lightning.evaluation.checkpoint import load_decoder
from fpa_lightning.generation import DecodeSession, PruneRule, cast_weights
from fpa_lightning.generation.session import COMPILE_MODES

SHAPES_110M = dict(vocab_size=32000, n_layer=12, d_model=768, n_head=12, d_mlp=2048, max_seq_len=2048)
SHAPES_TINY = dict(vocab_size=512, n_layer=2, d_model=64, n_head=2, d_mlp=128, max_seq_len=64)
VARIANTS = {  # name: (backend, eviction threshold)
    "softmax": ("sdpa", None),
    "fox": ("fox", None),
    "fpa": ("fpa", None),
    "fpa-prune-10": ("fpa", -10.0),
}


def build(backend: str, shapes: dict, device: torch.device, dtype: torch.dtype, ckpt: str | None) -> Decoder:
    if ckpt is not None and backend == "fpa":
        decoder = load_decoder(ckpt, device).decoder
    else:
        torch.manual_seed(0)
        decoder = Decoder(ModelConfig(**shapes, attention={"backend": backend})).to(device).eval()
    return cast_weights(decoder, dtype) if dtype != torch.float32 else decoder


def time_steps(session: DecodeSession, token: torch.Tensor, steps: int, warmup: int) -> float:
    """Median-free mean ms per step over `steps` steps, after `warmup` (the first of which captures a graph)."""
    for _ in range(warmup):
        token = session.step(token).argmax(dim=-1)
    if session.device.type != "cuda":
        import time

        start = time.perf_counter()
        for _ in range(steps):
            token = session.step(token).argmax(dim=-1)
        return 1000 * (time.perf_counter() - start) / steps
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        token = session.step(token).argmax(dim=-1)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def measure(decoder: Decoder, threshold: float | None, batch: int, length: int, mode: str, steps: int,
            warmup: int, profile_steps: int = 0, trace: str | None = None, attention_impl: str = "auto",
            compile_mode: str = "default") -> dict:
    device = next(decoder.parameters()).device
    rule = None if threshold is None else PruneRule(threshold=threshold)
    total = steps + warmup + (1 + profile_steps if profile_steps else 0)  # the profiler's warm-up step included
    # no capacity check inside the timed steps: the check (one sync, maybe a resize and a new capture) is
    # amortised over check_every steps in real use
    session = DecodeSession(decoder, rule=rule, cuda_graph=mode != "eager",
                            compile=compile_mode if mode == "compile" else False,
                            check_every=total + 1, attention_impl=attention_impl)
    generator = torch.Generator().manual_seed(length)
    prompts = list(torch.randint(3, decoder.cfg.vocab_size, (batch, length), generator=generator))
    with torch.no_grad():
        logits = session.prefill(prompts, max_new_tokens=total + 1)
        ms = time_steps(session, logits.argmax(dim=-1), steps, warmup)
        # which tokens are fed does not change the work of a step: the prompt's next tokens serve again
        profile = profile_decode(session, logits.argmax(dim=-1), profile_steps, trace) if profile_steps else None
    stats, impl, step_impl = session.stats(), session.attention_impl_used, session.step_attention_impl_used
    del session
    if device.type == "cuda":
        torch.cuda.empty_cache()
    result = {"ms_per_step": ms, "ms_per_token": ms / batch, "kept_fraction": stats["kept_fraction"],
              "cache_mib": stats["cache_bytes"] / 2**20, "state_share": stats["state_fraction_of_kv"],
              "capacity": stats["capacity"], "decode_attention": impl, "step_attention": step_impl,
              **({"compile_mode": compile_mode} if mode == "compile" else {})}
    return result if profile is None else {**result, "profile": profile}


# --- the per-step profile (--profile) -----------------------------------------------------------------------------
# Kernel-name groups, tried in order, first match wins (case-insensitive). The order settles the names that match
# several: flash and fmha kernels are cutlass templates (attention before matmul); argmax is a
# reduce_kernel<ArgMaxOps> (sampling before reductions; with eviction the cache's first-free-slot search, one argmax
# per layer, lands there too); cuBLAS's splitKreduce_kernel finishes a GEMM (matmul before
# reductions); index_elementwise_kernel and direct_copy_kernel run as *elementwise_kernel (index/copy before
# elementwise, but inductor's fused pointwise triton_poi_* kernels stay elementwise whatever ops they fuse).
KERNEL_GROUPS = (
    ("norm", r"layer_?norm|rms_?norm|group_norm|batch_norm|rsqrt|RowwiseMoments"),
    ("attention", r"flash|fmha|sdpa|scaled_dot_product|efficient_attention|attention|attn|flex|_fpa_|_fwd_kernel"),
    ("sampling", r"argmax|argmin|ArgM(ax|in)Ops|multinomial|topk|top_k|radix|(?<![a-z])sort(?![a-z])|sampl"),
    ("matmul", r"gemm|gemv|cutlass|cublas|xmma|nvjet|matmul|splitKreduce|dot_kernel"
               r"|(?<![a-z])(addmm|baddbmm|bmm|mm|dot)(?![a-z])"),
    ("softmax/reduce", r"softmax|reduce|reduction|triton_(red|per)_"
                       r"|(?<![a-z])(sum|mean|amax|amin|max|min|cum(sum|max|min|prod)|logsumexp|norm)(?![a-z])"),
    ("cache write", r"_store_token"),
    ("index/copy", r"^(?!triton_poi).*(index|gather|scatter|memcpy|memset|copy|catarray|embedding|searchsorted"
                   r"|bucketize|(?<![a-z])(cat|stack|nonzero|take)(?![a-z]))"),
    ("elementwise", r"elementwise|triton_poi|pointwise|_silu_mul"),
)
_KERNEL_RULES = [(group, re.compile(pattern, re.IGNORECASE)) for group, pattern in KERNEL_GROUPS]
# On a CPU the "kernels" are aten ops: these names go to a group directly (the rest through the kernel regexes:
# aten::_softmax, aten::scaled_dot_product_attention, aten::index_put_, aten::argmax, ... match them as they are).
# Views and allocations launch no kernel on a GPU; they get a group of their own rather than swelling "other".
ATEN_GROUPS = {
    "view/alloc": "view view_as reshape _reshape_alias _unsafe_view as_strided t transpose permute expand expand_as "
                  "unsqueeze squeeze select slice narrow unbind split split_with_sizes chunk flatten unflatten alias "
                  "detach movedim unfold empty empty_like empty_strided new_empty new_empty_strided resize zeros "
                  "zeros_like new_zeros ones ones_like new_ones full full_like new_full arange lift_fresh "
                  "lift_fresh_copy scalar_tensor result_type promote_types resolve_conj resolve_neg",
    "elementwise": "add sub rsub mul div neg exp exp2 expm1 log log1p log2 pow sqrt abs sign silu gelu relu tanh "
                   "sigmoid softplus logsigmoid log_sigmoid log_sigmoid_forward where masked_fill fill zero clamp "
                   "clamp_min clamp_max minimum maximum eq ne lt le gt ge bitwise_and bitwise_or bitwise_not "
                   "bitwise_xor logical_and logical_or logical_not __and__ __or__ __invert__ __xor__ lerp addcmul "
                   "addcdiv cos sin floor ceil round trunc remainder fmod reciprocal erf square isinf isnan "
                   "nan_to_num xlogy",
    "index/copy": "to _to_copy clone contiguous copy item _local_scalar_dense",
    "matmul": "linear mm addmm bmm baddbmm matmul einsum dot",
}
_ATEN_GROUP = {op: group for group, ops in ATEN_GROUPS.items() for op in ops.split()}
GROUPS = ("matmul", "attention", "softmax/reduce", "norm", "cache write", "elementwise", "index/copy", "sampling",
          "view/alloc", "other")  # the order of the table's columns: every group of KERNEL_GROUPS, view/alloc, other
# host calls that wait for the device (a .item(), a .cpu(), a non-async copy); the driver API spellings too
SYNC_CALLS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cuCtxSynchronize", "cuStreamSynchronize", "cuEventSynchronize", "cuMemcpyDtoH", "cuMemcpyDtoH_v2"}
# host calls that put exactly one kernel, memcpy or memset on the device outside a CUDA graph
_EAGER_LAUNCH = re.compile(r"^cu(da)?(Launch(Cooperative)?Kernel(Ex|ExC)?(_v2)?|Memcpy\w*|Memset\w*)$")
_GRAPH_LAUNCH = {"cudaGraphLaunch", "cuGraphLaunch"}
STEP_LABEL, ITERATION_LABEL = "DecodeSession.step", "decode iteration"  # record_function ranges of the profile


def kernel_group(name: str) -> str:
    """The group of a device kernel's name (or, on a CPU, of an aten op's name, e.g. "aten::mm"): see
    KERNEL_GROUPS and ATEN_GROUPS; "other" when nothing matches."""
    if name.startswith("aten::"):
        op = name[len("aten::"):]
        op = op[:-1] if op.endswith("_") and not op.endswith("__") else op  # in-place ops: add_ as add
        if op in _ATEN_GROUP:
            return _ATEN_GROUP[op]
    for group, pattern in _KERNEL_RULES:
        if pattern.search(name):
            return group
    return "other"


def group_totals(items: Iterable[tuple[str, float, int]], top_other: int = 5) -> dict:
    """(name, duration, count) triples (a duration summed over the name's `count` calls) -> {"total", "count",
    "groups": {group: {"time", "count"}} for the groups present, in GROUPS order, "other": the `top_other` costliest
    names of "other" as (name, duration, count)}. The total is the sum of the group times, so they add up exactly."""
    groups: dict[str, dict] = {}
    others = []
    for name, duration, count in items:
        group = kernel_group(name)
        entry = groups.setdefault(group, {"time": 0.0, "count": 0})
        entry["time"] += duration
        entry["count"] += count
        if group == "other":
            others.append((name, duration, count))
    ordered = {group: groups[group] for group in GROUPS if group in groups}
    return {"total": sum(entry["time"] for entry in ordered.values()),
            "count": sum(entry["count"] for entry in ordered.values()), "groups": ordered,
            "other": sorted(others, key=lambda item: -item[1])[:top_other]}


def profile_decode(session: DecodeSession, token: torch.Tensor, steps: int, trace: str | None = None) -> dict:
    """`steps` decode steps (step + argmax, as timed) under torch.profiler, after one profiler warm-up step whose
    events are discarded (CUPTI's start-up stays out of the record) -> the per-step profile (``summarise``)."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    cuda = session.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, schedule=schedule(wait=0, warmup=1, active=steps, repeat=1)) as prof:
        for i in range(1 + steps):
            with record_function(ITERATION_LABEL):
                with record_function(STEP_LABEL):
                    logits = session.step(token)
                token = logits.argmax(dim=-1)
            if cuda and i in (0, steps):
                # the warm-up step's kernels finish before the record starts (none leak into it), and the last
                # step's before it stops (none are cut off); outside the iteration ranges, so not counted as syncs
                torch.cuda.synchronize()
            prof.step()
    if trace:
        prof.export_chrome_trace(trace)
    return summarise(prof.events(), steps, cuda=cuda, graph=session.cuda_graph)


def summarise(events, steps: int, cuda: bool, graph: bool) -> dict:
    """The profiler's events of `steps` steps -> per step: kernels (device kernels, memcpys and memsets; on a CPU,
    aten op calls) and their time in ms by group (device time; on a CPU, the ops' self CPU time), the top "other"
    names, the host's sync calls inside the iterations (None on a CPU) and the CPU ms of the step call."""
    labels = {STEP_LABEL, ITERATION_LABEL}

    def annotation(event) -> bool:  # record_function ranges (ours, ProfilerStep#n), on the host or the GPU timeline
        return (getattr(event, "is_user_annotation", False) or event.name in labels
                or event.name.startswith("ProfilerStep"))

    def host(event) -> bool:
        return event.device_type == torch.autograd.DeviceType.CPU

    iterations = [e.time_range for e in events if host(e) and e.name == ITERATION_LABEL]
    step_us = [e.time_range.elapsed_us() for e in events if host(e) and e.name == STEP_LABEL]

    def inside(event) -> bool:
        return any(r.start <= event.time_range.start <= r.end for r in iterations)

    per_name: dict[str, list] = {}  # name -> [duration ms, count]
    host_calls = [e for e in events if host(e) and not annotation(e)]
    if cuda:
        work = [(e.name, e.time_range.elapsed_us()) for e in events if not host(e) and not annotation(e)]
    else:  # self time: an op's children are ops of their own, so the self times partition the time inside ops
        work = [(e.name, e.self_cpu_time_total) for e in host_calls if not getattr(e, "is_python_function", False)]
    for name, us in work:
        entry = per_name.setdefault(name, [0.0, 0])
        entry[0] += us / 1e3
        entry[1] += 1
    totals = group_totals((name, ms, count) for name, (ms, count) in per_name.items())
    out = {
        "source": "device kernels" if cuda else "cpu ops (self time)",
        "steps": steps,
        "kernels_per_step": totals["count"] / steps,
        "groups": {g: {"ms_per_step": e["time"] / steps, "per_step": e["count"] / steps}
                   for g, e in totals["groups"].items()},
        "other_top": [{"name": name, "ms_per_step": ms / steps, "per_step": count / steps}
                      for name, ms, count in totals["other"]],
        "syncs_per_step": sum(e.name in SYNC_CALLS and inside(e) for e in host_calls) / steps if cuda else None,
        "cpu_ms_per_step": sum(step_us) / 1e3 / max(len(step_us), 1),
    }
    # the total as the sum of the per-step group times, so that they add up to it exactly
    out["ms_per_step"] = sum(entry["ms_per_step"] for entry in out["groups"].values())
    note = None
    if cuda and not work:
        note = "the profiler recorded no device kernels"
    elif cuda and graph:
        # each eager launch call puts one kernel/memcpy/memset on the device; more device events than those are the
        # graph's. None more (while the graph was launched) means CUPTI did not report the kernels inside the graph.
        eager = sum(bool(_EAGER_LAUNCH.match(e.name)) for e in host_calls)
        launches = sum(e.name in _GRAPH_LAUNCH for e in host_calls)
        out["graph_launches_per_step"] = launches / steps
        out["graph_kernels_visible"] = len(work) > eager
        if len(work) <= eager:
            note = "kernels inside the CUDA graph are not visible to the profiler"
    if note:
        out["note"] = note
    return out


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, nargs="+", help="default 1 8 (with --profile: 1)")
    p.add_argument("--lengths", type=int, nargs="+",
                   help="default 1024 2048 4096 8192 16384 (with --profile: 1024 8192 16384)")
    p.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    p.add_argument("--modes", nargs="*", choices=("eager", "graph"), default=["eager", "graph"])
    p.add_argument("--compile-lengths", type=int, nargs="*", default=[],
                   help="also the compiled step at batch 1 for these lengths (each shape compiles, ~1 min)")
    p.add_argument("--compile-mode", choices=COMPILE_MODES, default="default",
                   help="torch.compile's mode for the compiled step (max-autotune-no-cudagraphs: Triton GEMM "
                        "templates, autotuned, whose epilogues can fuse the small ops after them)")
    p.add_argument("--steps", type=int, default=64, help="timed steps per measurement")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--fpa-ckpt", help="a trained FPA checkpoint (110M shapes) for the fpa variants")
    p.add_argument("--json", help="also write every measurement here")
    p.add_argument("--profile", action="store_true",
                   help="also profile each measurement: kernels and device time per step by kernel group")
    p.add_argument("--profile-steps", type=int, default=20, help="profiled steps per measurement")
    p.add_argument("--trace-dir", help="with --profile: write a Chrome trace per measurement into this folder")
    p.add_argument("--decode-attention", choices=("auto", "naive", "fused"), default="auto",
                   help="the attention over the KV cache (DecodeSession's attention_impl; auto: fused on a GPU)")
    args = p.parse_args(argv)
    if args.batches is None:
        args.batches = [1] if args.profile else [1, 8]
    if args.lengths is None:
        args.lengths = [1024, 8192, 16384] if args.profile else [1024, 2048, 4096, 8192, 16384]
    if args.profile_steps < 1:
        p.error(f"--profile-steps must be >= 1, got {args.profile_steps}")
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shapes, dtype = (SHAPES_110M, torch.bfloat16) if cuda else (SHAPES_TINY, torch.float32)
    if not cuda:  # a check of the script on a CPU: tiny shapes, eager only
        args.lengths, args.modes, args.steps, args.compile_lengths = [32, 64], ["eager"], 4, []
        args.batches, args.profile_steps = ([1] if args.profile else [1, 2]), 4
        print("no CUDA: tiny shapes, eager mode only (a check that the benchmark runs, not a measurement)")
    machine = torch.cuda.get_device_name() if cuda else "cpu"
    print(f"decode benchmark {datetime.datetime.now():%Y-%m-%d %H:%M} on {machine}, torch {torch.__version__}, "
          f"shapes {shapes}, decode attention {args.decode_attention}")
    plan = [(b, t, mode) for mode in args.modes for b in args.batches for t in args.lengths]
    plan += [(1, length, "compile") for length in args.compile_lengths]
    if args.profile and args.trace_dir:
        os.makedirs(args.trace_dir, exist_ok=True)
    rows = []
    for name in args.variants:
        backend, threshold = VARIANTS[name]
        decoder = build(backend, shapes, device, dtype, args.fpa_ckpt)
        for batch, length, mode in plan:
            trace = os.path.join(args.trace_dir, f"{name}_B{batch}_T{length}_{mode}.json") if (
                args.profile and args.trace_dir) else None
            try:
                result = measure(decoder, threshold, batch, length, mode, args.steps, args.warmup,
                                 args.profile_steps if args.profile else 0, trace, args.decode_attention,
                                 args.compile_mode)
            except Exception as err:  # one failed measurement (e.g. out of memory) is reported, the rest still run
                result = {"error": f"{type(err).__name__}: {err}"[:300]}
            rows.append({"variant": name, "batch": batch, "length": length, "mode": mode, **result})
            print(json.dumps(rows[-1]), flush=True)
        del decoder
    report(rows)
    if args.profile:
        report_profile(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


def report(rows: list[dict]) -> None:
    """One table per mode: ms per step, the ratio to softmax at the same (batch, length), the kept fraction and
    the cache; then each variant's flatness (its slowest over its fastest length)."""
    ok = [r for r in rows if "error" not in r]
    softmax = {(r["batch"], r["length"], r["mode"]): r["ms_per_step"] for r in ok if r["variant"] == "softmax"}
    print(f"\n{'mode':8s} {'variant':13s} {'B':>2s} {'T':>6s} {'ms/step':>8s} {'ms/token':>8s} {'x softmax':>9s} "
          f"{'kept':>6s} {'cache MiB':>9s} {'state/KV':>8s}")
    for r in sorted(ok, key=lambda r: (r["mode"], r["variant"], r["batch"], r["length"])):
        ratio = r["ms_per_step"] / softmax[(r["batch"], r["length"], r["mode"])] if (
            r["batch"], r["length"], r["mode"]) in softmax else math.nan
        print(f"{r['mode']:8s} {r['variant']:13s} {r['batch']:2d} {r['length']:6d} {r['ms_per_step']:8.3f} "
              f"{r['ms_per_token']:8.3f} {ratio:9.3f} {r['kept_fraction']:6.3f} {r['cache_mib']:9.1f} "
              f"{100 * r['state_share']:7.2f}%")
    groups = {}
    for r in ok:
        groups.setdefault((r["mode"], r["variant"], r["batch"]), []).append(r["ms_per_step"])
    print("\nflatness (slowest / fastest length):")
    for (mode, variant, batch), times in sorted(groups.items()):
        if len(times) > 1:
            print(f"  {mode:8s} {variant:13s} B={batch}: {max(times) / min(times):.3f}")
    for r in rows:
        if "error" in r:
            print(f"FAILED {r['variant']} B={r['batch']} T={r['length']} {r['mode']}: {r['error']}")


def report_profile(rows: list[dict]) -> None:
    """The per-step profile: one row per (mode, variant, batch, length); a group's cell is "ms/kernels" per step.
    Then the costliest "other" names over all rows, to refine KERNEL_GROUPS with."""
    profiled = [r for r in rows if "profile" in r]
    if not profiled:
        return
    source = profiled[0]["profile"]["source"]
    groups = [g for g in GROUPS if any(g in r["profile"]["groups"] for r in profiled if "note" not in r["profile"])]
    width = max([12] + [len(g) for g in groups])
    print(f"\nprofile per step ({source}; a group's cell: ms/count; kern ms is summed durations, ms/step the timed "
          f"wall time; syncs: host sync calls; host ms: CPU time of the step call)")
    print(f"{'mode':8s} {'variant':13s} {'B':>2s} {'T':>6s} {'kernels':>8s} {'kern ms':>8s} {'ms/step':>8s} "
          f"{'syncs':>5s} {'host ms':>7s} " + " ".join(f"{g:>{width}s}" for g in groups))
    others: dict[str, float] = {}
    for r in sorted(profiled, key=lambda r: (r["mode"], r["variant"], r["batch"], r["length"])):
        prof = r["profile"]
        syncs = "n/a" if prof["syncs_per_step"] is None else f"{prof['syncs_per_step']:.1f}"
        head = f"{r['mode']:8s} {r['variant']:13s} {r['batch']:2d} {r['length']:6d} "
        host = f"{syncs:>5s} {prof['cpu_ms_per_step']:7.3f}"
        if "note" in prof:  # what the profiler did not see is no zero
            print(f"{head}{'':>8s} {'':>8s} {r['ms_per_step']:8.3f} {host} {prof['note']}")
            continue
        cells = []
        for g in groups:
            entry = prof["groups"].get(g)
            cells.append(f"{entry['ms_per_step']:.3f}/{entry['per_step']:.0f}" if entry else "-")
        print(f"{head}{prof['kernels_per_step']:8.1f} {prof['ms_per_step']:8.3f} {r['ms_per_step']:8.3f} {host} "
              + " ".join(f"{c:>{width}s}" for c in cells))
        for item in prof["other_top"]:
            others[item["name"]] = others.get(item["name"], 0.0) + item["ms_per_step"]
    if others:
        print("costliest \"other\" names (ms per step, summed over the rows):")
        for name, ms in sorted(others.items(), key=lambda item: -item[1])[:5]:
            print(f"  {ms:8.3f}  {name[:110]}")


if __name__ == "__main__":
    main()
