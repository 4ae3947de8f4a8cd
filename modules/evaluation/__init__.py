"""The evaluation application, ``eval.py``: its command line (``cli``: ``--task TASK``, the verb ``export``), one
module per task (``tasks/``), the estimate and progress bar a long task shows (``progress``), and the result files
(``report``: JSON, PNG figures, TensorBoard). The maths it runs is the library's: ``fpa_lightning.evaluation``."""
