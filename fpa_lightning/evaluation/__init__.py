"""The evaluation library: loading a trained Decoder from a checkpoint (``checkpoint``), the data contract the tasks
read through (``data``), scoring (per-token losses, position buckets, the run-time settings: ``scoring``), interval
estimates and paired tests (``stats``), the prompt items of the pass-key, RULER- and BABILong-style tasks and their
answers (``passkey``, ``ruler``, ``babilong``, ``answers``), the recall of synthetic retrieval documents' facts
(``recall``), and the lm-evaluation-harness adapter (``harness``).

The evaluation application built on it, ``eval.py``'s command line, tasks, progress and reports, is
``modules/evaluation``."""
