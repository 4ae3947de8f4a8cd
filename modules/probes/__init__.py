"""The probe application, ``eval.py --task probes``: the paper's table as groups of rows (``table``), the runner that
trains them, in worker processes if asked, resumable and mergeable, sweeping step counts and learning rates
(``runner``), the report beside the paper's numbers (``report``), and the summary of the paper's rows against the
committed results with Holm-adjusted verdicts that opens docs/probes.md (``verdicts``). The probes, the probe model
and the training of one row are the library's: ``fpa_lightning.probes``."""
