"""benchmarks/kernel_counters.py's reading of Nsight Compute's raw page: a header row, a units row, one row a launch;
times in whatever unit ncu chose come back in µs, stall reasons sorted largest first. Running ncu needs the GPU
machine and is not done here."""
import csv

from _benchmark_scripts import load_benchmark

kernel_counters = load_benchmark("kernel_counters")

HEADER = ["ID", "Kernel Name", "gpu__time_duration.sum", "launch__registers_per_thread",
          "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__warps_eligible.avg.per_cycle_active",
          "smsp__average_warps_issue_stalled_wait_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_selected_per_issue_active.ratio",
          "smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio",
          "smsp__pcsamp_warps_issue_stalled_wait"]
UNITS = ["", "", "ms", "register/thread", "%", "warp", "", "", "", "", ""]
LAUNCHES = [["0", "_fpa_bwd_dq_kernel", "3.046976", "255", "52.65", "0.7267", "0.839", "0.294", "1", "0", "1,234"],
            ["1", "void at::elementwise_kernel<128, 2>", "0.003680", "18", "19.2", "0.34", "n/a", "0.1", "1", "0", "5"]]


def write_raw(path, units=UNITS):
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([HEADER, units, *LAUNCHES])


def test_times_come_back_in_microseconds_whatever_the_unit(tmp_path):
    write_raw(tmp_path / "ms.csv")
    write_raw(tmp_path / "ns.csv", units=["", "", "nsecond", *UNITS[3:]])
    in_ms = kernel_counters.read_raw(tmp_path / "ms.csv")
    in_ns = kernel_counters.read_raw(tmp_path / "ns.csv")
    assert float(in_ms[0]["gpu__time_duration.sum"]) == 3046.976
    assert float(in_ns[0]["gpu__time_duration.sum"]) == 0.003046976
    assert in_ms[0]["launch__registers_per_thread"] == "255"  # not a time: left as written


def test_a_launchs_summary_keeps_known_metrics_and_sorts_its_stalls(tmp_path):
    write_raw(tmp_path / "fpa.csv")
    dq, glue = kernel_counters.summarize(tmp_path, ["fpa"])["fpa"]
    assert dq["kernel"] == "_fpa_bwd_dq_kernel"
    assert (dq["time_us"], dq["registers"], dq["issue_active_pct"]) == (3046.976, 255, 52.65)
    assert "tensor_pipe_pct" not in dq  # a metric this ncu did not report is left out, not made up
    # reasons under 0.05 cycles an instruction are dropped; the sampled counts are not stall ratios
    assert list(dq["stalls_per_issue"].items()) == [("selected", 1.0), ("wait", 0.839), ("barrier", 0.294)]
    assert glue["stalls_per_issue"] == {"selected": 1.0, "barrier": 0.1}  # "n/a" is no number
