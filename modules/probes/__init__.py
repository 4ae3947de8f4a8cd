"""The probe application, ``eval.py --task probes``: the paper's table as groups of rows (``table``), the runner that
trains them, in worker processes if asked, resumable and mergeable (``runner``), and the report beside the paper's
numbers (``report``). The probes, the probe model and the training of one row are the library's:
``fpa_lightning.probes``."""
