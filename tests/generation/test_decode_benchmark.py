"""benchmarks/decode.py runs on a CPU (tiny shapes, eager): every variant measured, ratios printed; its --profile
groups kernel (and aten op) names and adds the groups up to the total."""
import json
import math

import pytest
import torch
from _benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("decode")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is the real benchmark")
def test_decode_benchmark_runs_on_a_cpu(capsys, bench):
    rows = bench.main(["--variants", "softmax", "fpa-prune-10"])
    assert len(rows) == 8 and not any("error" in r for r in rows)
    assert {r["variant"] for r in rows} == {"softmax", "fpa-prune-10"}
    assert {r["decode_attention"] for r in rows} == {"naive"}  # auto on a CPU
    assert not any("profile" in r for r in rows)  # only with --profile
    out = capsys.readouterr().out
    assert "x softmax" in out and "flatness" in out


# realistic names (H100/H200 cuBLAS, nvjet, flash, torch's own kernels, the project's and inductor's Triton kernels)
KERNELS = {
    "ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_stages_32x6_tn": "matmul",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x"
    "_cublas": "matmul",
    "nvjet_tst_64x8_64x16_4x1_v_bz_TNT": "matmul",
    "void cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_32x32_128x1_tn_align8>(Params)": "matmul",
    "void gemv2T_kernel_val<int, int, __nv_bfloat16, __nv_bfloat16, float, 128, 16, 4, 4, false, false>(...)": "matmul",
    "void splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __nv_bfloat16, true, false, false>(...)":
        "matmul",
    "triton_tem_fused_mm_0": "matmul",
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    "at::native::binary_internal::MulFunctor<float> >, std::array<char*, 3ul> >(int, ...)": "elementwise",
    "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, std::array<char*, 1ul> >(...)":
        "elementwise",
    "triton_poi_fused__to_copy_add_mul_0": "elementwise",
    "_fwd_kernel": "attention",
    "_decode_attn_partial_kernel": "attention",
    "_decode_attn_combine_kernel": "attention",
    "_step_attn_partial_kernel": "attention",
    "_add_rms_norm_kernel": "norm",
    "_store_token_kernel": "cache write",
    "_silu_mul_kernel": "elementwise",
    "_fpa_fwd_kernel": "attention",
    "flash_fwd_splitkv_kernel": "attention",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, cutlass::bfloat16_t, "
    "Flash_kernel_traits<64, 128, 64, 4, cutlass::bfloat16_t> >, false, true, false>(...)": "attention",
    "fmha_cutlassF_bf16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<...>::Params)": "attention",
    "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
    "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)": "softmax/reduce",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, "
    "float>, unsigned int, float, 4, 4> >(...)": "softmax/reduce",
    "triton_red_fused_sum_0": "softmax/reduce",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
    "long, 4, 4> >(...)": "sampling",
    "Memcpy DtoD (Device -> Device)": "index/copy",
    "Memset (Device)": "index/copy",
    "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_impl<"
    "at::native::OpaqueType<2> >(at::TensorIteratorBase&, c10::ArrayRef<long>, c10::ArrayRef<long>)::{lambda(char*, "
    "char const*, long)#1}>(...)::{lambda(int)#1}>(long, ...)": "index/copy",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::"
    "{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::{lambda(float)#1}, ...>(...)": "index/copy",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<...>(...)": "index/copy",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16, float>(...)": "norm",
    "void at::native::vectorized_elementwise_kernel<4, at::native::rsqrt_kernel_cuda(at::TensorIteratorBase&)"
    "::{lambda()#2}::operator()() const::{lambda()#1}::operator()() const::{lambda(float)#1}, ...>(...)": "norm",
    "some_unknown_kernel": "other",
}
ATEN_OPS = {
    "aten::mm": "matmul", "aten::addmm": "matmul", "aten::matmul": "matmul", "aten::linear": "matmul",
    "aten::bmm": "matmul", "aten::einsum": "matmul", "aten::scaled_dot_product_attention": "attention",
    "aten::_scaled_dot_product_flash_attention_for_cpu": "attention", "aten::softmax": "softmax/reduce",
    "aten::_softmax": "softmax/reduce", "aten::sum": "softmax/reduce", "aten::cummax": "softmax/reduce",
    "aten::add": "elementwise", "aten::add_": "elementwise", "aten::masked_fill_": "elementwise",
    "aten::__and__": "elementwise", "aten::rsqrt": "norm", "aten::_fused_rms_norm": "norm",
    "aten::copy_": "index/copy", "aten::to": "index/copy", "aten::index_put_": "index/copy",
    "aten::embedding": "index/copy", "aten::searchsorted": "index/copy", "aten::argmax": "sampling",
    "aten::view": "view/alloc", "aten::t": "view/alloc", "aten::empty_strided": "view/alloc",
    "aten::something_new": "other",
}


@pytest.mark.parametrize("names", [KERNELS, ATEN_OPS], ids=["kernels", "aten-ops"])
def test_kernel_group(bench, names):
    assert {name: bench.kernel_group(name) for name in names} == names
    assert set(names.values()) <= set(bench.GROUPS)
    # a group the table has no column for would drop out of the totals (it once did: "cache write")
    assert {group for group, _ in bench.KERNEL_GROUPS} <= set(bench.GROUPS)


def test_group_totals_add_up(bench):
    names = list(KERNELS) + list(ATEN_OPS)
    items = [(name, 0.1 * (i + 1) / 3, i % 4 + 1) for i, name in enumerate(names)]
    totals = bench.group_totals(items)
    assert sum(entry["time"] for entry in totals["groups"].values()) == totals["total"]  # exactly, by construction
    assert totals["total"] == pytest.approx(sum(duration for _, duration, _ in items), rel=1e-12)
    assert sum(entry["count"] for entry in totals["groups"].values()) == totals["count"]
    assert totals["count"] == sum(count for _, _, count in items)
    assert list(totals["groups"]) == [g for g in bench.GROUPS if g in totals["groups"]]  # the table's order
    for group, entry in totals["groups"].items():
        members = [(d, c) for name, d, c in items if bench.kernel_group(name) == group]
        assert entry["time"] == pytest.approx(sum(d for d, _ in members))
        assert entry["count"] == sum(c for _, c in members)
    # the costliest "other" names, costliest first, at most 5
    other = [(name, d, c) for name, d, c in items if bench.kernel_group(name) == "other"]
    assert totals["other"] == sorted(other, key=lambda item: -item[1])[:5]
    many = bench.group_totals([(f"unknown_{i}", float(i), 1) for i in range(8)])
    assert [name for name, _, _ in many["other"]] == [f"unknown_{i}" for i in (7, 6, 5, 4, 3)]
    assert bench.group_totals([]) == {"total": 0, "count": 0, "groups": {}, "other": []}


@pytest.mark.skipif(torch.cuda.is_available(), reason="the GPU run is the real benchmark")
def test_decode_benchmark_profile_on_a_cpu(capsys, tmp_path, bench):
    out_json = tmp_path / "rows.json"
    rows = bench.main(["--profile", "--lengths", "32", "--json", str(out_json), "--trace-dir", str(tmp_path / "tr")])
    assert not any("error" in r for r in rows)
    assert {r["variant"] for r in rows} == set(bench.VARIANTS) and {r["batch"] for r in rows} == {1}
    for r in rows:
        prof = r["profile"]
        assert prof["steps"] == 4 and prof["kernels_per_step"] > 0 and prof["ms_per_step"] > 0
        assert "note" not in prof and prof["syncs_per_step"] is None  # no CUDA: no sync calls to count
        assert math.isclose(sum(g["ms_per_step"] for g in prof["groups"].values()), prof["ms_per_step"],
                            rel_tol=1e-9)
        assert sum(g["per_step"] for g in prof["groups"].values()) == pytest.approx(prof["kernels_per_step"])
        # the sampling argmax, and with eviction one argmax per layer: the first free slot of the new key
        slot_searches = bench.SHAPES_TINY["n_layer"] if "prune" in r["variant"] else 0
        assert prof["groups"]["matmul"]["per_step"] > 0 and prof["groups"]["sampling"]["per_step"] == 1 + slot_searches
        assert prof["cpu_ms_per_step"] > 0
        assert (tmp_path / "tr" / f"{r['variant']}_B1_T32_eager.json").stat().st_size > 0
    assert [r["profile"] for r in json.loads(out_json.read_text())] == [r["profile"] for r in rows]
    out = capsys.readouterr().out
    assert "profile per step" in out and "kern ms" in out


def fake_cuda_events(graph_kernels_seen: bool, steps: int = 2) -> list:
    """What torch.profiler reports for `steps` graph-mode steps: per iteration the input copy and the argmax
    (eager launches), one graph launch, one .item()-like sync; the graph's kernels when CUPTI reports them."""
    from types import SimpleNamespace

    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import Interval

    def event(name, device, start, end):
        return SimpleNamespace(name=name, device_type=device, time_range=Interval(start, end), is_user_annotation=False)

    cpu, gpu = DeviceType.CPU, DeviceType.CUDA
    events = []
    for t in range(0, 100 * steps, 100):
        events += [event("decode iteration", cpu, t, t + 50), event("DecodeSession.step", cpu, t, t + 30),
                   event("cudaLaunchKernel", cpu, t + 1, t + 2), event("cudaGraphLaunch", cpu, t + 5, t + 10),
                   event("cudaLaunchKernel", cpu, t + 31, t + 32), event("cudaStreamSynchronize", cpu, t + 40, t + 41),
                   event("decode iteration", gpu, t + 3, t + 62),  # a GPU-timeline annotation: no kernel
                   event("Memcpy DtoD (Device -> Device)", gpu, t + 3, t + 4),
                   event("void at::native::reduce_kernel<512, 1, ReduceOp<float, ArgMaxOps<float>>>", gpu, t + 60,
                         t + 61)]
        if graph_kernels_seen:
            events += [event("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", gpu, t + 11, t + 15),
                       event("cunn_SoftMaxForward", gpu, t + 15, t + 16), event("mystery", gpu, t + 16, t + 18)]
    return events + [event("cudaDeviceSynchronize", cpu, 1000, 1010)]  # the profiler's closing sync: not a step's


def test_summarise_cuda_events(bench, capsys):
    seen = bench.summarise(fake_cuda_events(True), 2, cuda=True, graph=True)
    assert seen["graph_kernels_visible"] and "note" not in seen
    assert seen["kernels_per_step"] == 5 and seen["syncs_per_step"] == 1  # the closing sync is no step's
    assert seen["cpu_ms_per_step"] == pytest.approx(0.03)
    assert {g: e["per_step"] for g, e in seen["groups"].items()} == {
        "matmul": 1, "softmax/reduce": 1, "index/copy": 1, "sampling": 1, "other": 1}
    assert seen["ms_per_step"] == pytest.approx(0.009) and seen["other_top"][0]["name"] == "mystery"
    hidden = bench.summarise(fake_cuda_events(False), 2, cuda=True, graph=True)
    assert not hidden["graph_kernels_visible"]
    assert hidden["note"] == "kernels inside the CUDA graph are not visible to the profiler"
    row = {"variant": "fpa", "batch": 1, "length": 1024, "ms_per_step": 0.5}
    bench.report_profile([{**row, "mode": "eager", "profile": seen}, {**row, "mode": "graph", "profile": hidden}])
    out = capsys.readouterr().out
    assert "not visible to the profiler" in out and "0.004/1" in out and "mystery" in out
