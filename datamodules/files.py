"""Files the data layer keeps or finds: the user's cache folder, atomic writes into it, and data files shipped
inside installed packages (the tokenizer model, the offline corpus)."""

from __future__ import annotations

import os
import pathlib

from fpa_lightning.atomic import atomic_open


def cache_dir() -> pathlib.Path:
    """The user's cache folder: ``$FPA_CACHE_DIR`` or ``~/.cache/fpa_lightning``."""
    root = os.environ.get("FPA_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "fpa_lightning")
    return pathlib.Path(root)


def atomic_write_text(path: pathlib.Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically (``fpa_lightning.atomic``), so readers never see a partial file."""
    with atomic_open(path) as f:
        f.write(text)


def installed_package_file(module: str, relative: str, requirement: str) -> pathlib.Path:
    """A data file shipped inside an installed package, found without importing the package.

    ``import bible`` needs pkg_resources, which recent setuptools lacks; locating the package is enough.
    """
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"{requirement} is not installed (`pip install {requirement}`)")
    path = pathlib.Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the {requirement} install")
    return path
