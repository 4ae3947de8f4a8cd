"""A stand-in for the probe runner's process pool in tests (``monkeypatch.setattr(runner, "ProcessPoolExecutor",
InProcess)``)."""
from concurrent.futures import Future


class InProcess:
    """The worker pool's logic without spawning processes (threads would share torch's global seed): each job runs
    at submit, and its exception is kept in its future, as a process pool does."""

    def __init__(self, workers, mp_context=None, initializer=None, initargs=()):
        self._processes = {}  # what the runner's _stop_pool terminates: none here

    def shutdown(self, wait=True, *, cancel_futures=False):
        pass

    def submit(self, fn, *args):
        future = Future()
        try:
            future.set_result(fn(*args))
        except Exception as error:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(error)
        return future
