"""The evaluation tasks, one module each; this registry is what ``eval.py --task`` accepts.

A task module defines ``TASK`` (a ``Task``: description, the options it reads, its runner) and the function that
does the work on loaded checkpoints. A new task is a new module plus one line here (docs/evaluation.md).
"""
from modules.evaluation.tasks import (babilong, cache_prune, generate, heldout_loss, lm_eval, passkey, pg19_long,
                                      probes, retrieval_recall, ruler)
from modules.evaluation.tasks.common import Task, TaskOutput

TASKS: dict[str, Task] = {
    "pg19_long": pg19_long.TASK,
    "passkey": passkey.TASK,
    "test_loss": heldout_loss.TASK,  # the loss on the test split
    "cache_prune": cache_prune.TASK,
    "generate": generate.TASK,
    "ruler": ruler.TASK,
    "babilong": babilong.TASK,
    "lm_eval": lm_eval.TASK,
    "probes": probes.TASK,
    "retrieval_recall": retrieval_recall.TASK,  # the train mixture's synthetic retrieval documents, held out
}

__all__ = ["TASKS", "Task", "TaskOutput"]
