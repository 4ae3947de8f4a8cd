"""The package layers (README, "Architecture"): the core library ``fpa_lightning`` never imports the Lightning
layer (``datamodules``, ``modules``, ``callbacks``) nor the entry points; the Lightning layer never imports the
entry points. Read from the source (every import statement, also inside functions), not from what happens to load."""
import ast
import pathlib

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
