"""Evaluate checkpoints: ``python eval.py --task TASK --ckpt PATH [--compare CKPT_B] [--data ...] [--out DIR]``.

Tasks: pg19_long, passkey, test_loss, cache_prune (``--help`` lists them and every option);
the implementation lives in ``fpa_lightning/evaluation/``.
"""
from fpa_lightning.evaluation.cli import main

if __name__ == "__main__":
    main()
