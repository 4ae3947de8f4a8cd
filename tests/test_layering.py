"""The package layers (README, "Architecture"): the core library ``fpa_lightning`` never imports the Lightning
layer (``datamodules``, ``modules``, ``callbacks``) nor the entry points; the Lightning layer never imports the
entry points. Read from the source (every import statement, also inside functions), not from what happens to load.
transformers (the optional hf extra) is imported only inside ``fpa_lightning/hf``, which loads when asked for."""
import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
LIGHTNING_LAYER = {"datamodules", "modules", "callbacks"}
ENTRY_POINTS = {"train", "eval"}
FORBIDDEN = {"fpa_lightning": LIGHTNING_LAYER | ENTRY_POINTS, **{pkg: ENTRY_POINTS for pkg in LIGHTNING_LAYER}}


def imported_top_levels(path: pathlib.Path) -> set[str]:
    """The top-level names of every absolute import in a file."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def upward_imports(package: str) -> list[str]:
    return [f"{path.relative_to(REPO)} imports {name}"
            for path in sorted((REPO / package).rglob("*.py"))
            for name in sorted(imported_top_levels(path) & FORBIDDEN[package])]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_import(package):
    assert upward_imports(package) == []


def test_the_check_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from datamodules import EvalCorpus\n    import callbacks.dashboard\n")
    assert imported_top_levels(bad) == {"datamodules", "callbacks"}


def test_only_the_hf_package_imports_transformers():
    outside = [f"{path.relative_to(REPO)}" for path in sorted((REPO / "fpa_lightning").rglob("*.py"))
               if "transformers" in imported_top_levels(path) and (REPO / "fpa_lightning" / "hf") not in path.parents]
    assert outside == []


def test_importing_the_core_does_not_load_transformers():
    """Importing the library, its evaluation command line and its generation does not load transformers (seconds of
    start-up, and an optional dependency)."""
    code = ("import sys, fpa_lightning, fpa_lightning.export, fpa_lightning.generation, fpa_lightning.evaluation.cli; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'transformers'))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "[]"
