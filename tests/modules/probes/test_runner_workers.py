"""The probe runner's worker processes stop when the runner is killed or interrupted (modules/probes/runner.py).

SIGKILL (or SIGTERM, which Python does not catch by default) skips the pool's shutdown, so without the watch
(``_exit_without``) the spawned workers would go on training their rows for nobody. SIGINT to the runner alone (Ctrl-C
reaches the whole process group; `kill -INT` or `timeout -s INT` only the runner) raises KeyboardInterrupt there, and
the runner must stop its pool and exit (``_stop_pool``) instead of waiting for every queued row. Linux only: the
workers are found through /proc.
"""
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from _processes import state_and_parent

ROOT = Path(__file__).resolve().parents[3]

# A runner with two workers, each training a flip-flop row far longer than the test waits.
RUNNER = textwrap.dedent("""
    from modules.probes import runner
    from modules.probes.table import GROUPS
    from fpa_lightning.probes.train import Budget

    group = next(g for g in GROUPS if g.label == "flip-flop")
    jobs = [(group, "fpa", [seed], Budget(steps=10**7, batch=2), "cpu", []) for seed in (0, 1)]
    runner._run_in_pool([0, 1], jobs, 2, lambda *a: None, print)
""")


def alive(pid: int) -> bool:
    found = state_and_parent(pid)
    return found is not None and found[0] != "Z"  # a zombie has stopped; only its exit status waits for the reaper


def workers_of(pid: int) -> list[int]:
    """The live pool workers whose parent is `pid` (the spawn start method's processes, not its resource tracker)."""
    found = []
    for entry in Path("/proc").iterdir():
        stat = state_and_parent(entry.name) if entry.name.isdigit() else None
        if stat is None or stat[0] == "Z" or stat[1] != pid:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:  # the process ended while we looked
            continue
        if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
            found.append(int(entry.name))
    return found


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="finds the workers through /proc (Linux)")
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_the_workers_stop_when_the_runner_is_killed_or_interrupted(how):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    runner, workers = subprocess.Popen([sys.executable, "-c", RUNNER], cwd=ROOT, env=env), []
    try:
        deadline = time.monotonic() + 120
        while len(workers) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
            workers = workers_of(runner.pid)
        assert len(workers) == 2, f"the runner started {len(workers)} workers"
        time.sleep(1.0)  # past the initializer: the watch is running and the rows are training
        runner.send_signal(how)
        runner.wait(timeout=30)  # an interrupted runner exits too, without waiting for its pool's rows
        deadline = time.monotonic() + 30
        while any(alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(w) for w in workers), "a worker went on training after its runner was killed"
    finally:  # whatever failed, leave no process behind
        runner.kill()
        for worker in filter(alive, workers):
            os.kill(worker, signal.SIGKILL)
