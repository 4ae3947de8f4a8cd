"""The package layers (README, "Architecture"): the core library ``fpa_lightning`` never imports the layers above it
(``datamodules``, the data; ``callbacks``; ``modules``, the applications: training, evaluation, probes) nor the entry
points; those never import the entry points. Read from the source (every import statement, also inside functions),
not from what happens to load. Inside the core library, its packages and top-level modules form layers
(``LIBRARY_LAYERS``): a module imports only from layers below its own. The library is no application: it parses no
command line, draws no figure, prints nothing and shows no progress bar (``APPLICATION_ONLY``, no ``print``, no
``sys.stdout``/``sys.stderr``). transformers (the optional hf extra) is imported only inside ``fpa_lightning/hf``,
which loads when asked for."""
import ast
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
ABOVE_THE_LIBRARY = {"datamodules", "modules", "callbacks"}
ENTRY_POINTS = {"train", "eval"}
FORBIDDEN = {"fpa_lightning": ABOVE_THE_LIBRARY | ENTRY_POINTS, **{pkg: ENTRY_POINTS for pkg in ABOVE_THE_LIBRARY}}
APPLICATION_ONLY = {"argparse", "matplotlib", "tqdm"}
"""What only an application imports: command lines, figures, progress bars."""


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


# The core library's layers, lowest first: the packages and top-level modules of fpa_lightning ("__init__": the
# package face). A module imports only from layers strictly below its own; the units of one layer import nothing of
# each other. Every unit of the library has a layer, so a new package has to be placed here.
LIBRARY_LAYERS = (
    ("ops", "atomic"),                     # the inner attention ops; atomic file writes
    ("attention",),                        # backends, their registry and AttentionConfig, the layer
    ("config",),                           # ModelConfig (holds an AttentionConfig)
    ("model",),                            # the Decoder
    ("__init__", "export", "generation"),  # the package face; export folders; KV cache and decoding
    ("analysis",),                         # maths shared by callbacks, probes, evaluation (survival, pruning, binomial)
    ("probes", "hf"),                      # the synthetic probes, their model and training; the transformers classes
    ("evaluation",),                       # checkpoints, scoring, statistics, prompt items, the harness adapter
)


def library_units(root: pathlib.Path) -> set[str]:
    """The top-level modules and packages of a library at root (``__init__`` for its own __init__.py)."""
    return ({path.stem for path in root.glob("*.py")}
            | {path.parent.name for path in root.glob("*/__init__.py")})


def imported_modules(path: pathlib.Path, package: str) -> set[str]:
    """The dotted names a file imports, also inside functions and ``if TYPE_CHECKING:``; relative imports resolved
    against `package` (the file's own package); ``from a import b`` gives ``a.b`` (b may be a submodule)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) + 1 - node.level]) if node.level else ""
            module = ".".join(part for part in (base, node.module) if part)
            names.update(f"{module}.{alias.name}" for alias in node.names)
    return names


def layer_violations(root: pathlib.Path, layers=LIBRARY_LAYERS) -> list[str]:
    """Imports inside the library at root that do not go to a lower layer, and units without a layer."""
    layer_of = {unit: i for i, units in enumerate(layers) for unit in units}
    library, units = root.name, library_units(root)
    found = [f"{root.name}/{unit} has no layer in LIBRARY_LAYERS" for unit in sorted(units - set(layer_of))]

    def unit_of(module: str) -> str | None:
        parts = module.split(".")
        if parts[0] != library:
            return None
        return parts[1] if len(parts) > 1 and parts[1] in units else "__init__"

    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root.parent).with_suffix("")
        own = relative.parts[1] if len(relative.parts) > 1 else "__init__"
        package = ".".join(relative.parts[:-1])  # of fpa_lightning/a/b.py and fpa_lightning/a/__init__.py: a
        for target in sorted({unit_of(m) for m in imported_modules(path, package)} - {None, own}):
            if target in layer_of and own in layer_of and layer_of[target] >= layer_of[own]:
                found.append(f"{path.relative_to(root.parent)} imports {library}.{target}, which is not below it")
    return found


def test_the_library_imports_only_downward():
    assert layer_violations(REPO / "fpa_lightning") == []


def test_the_layer_check_sees_the_old_upward_arrows(tmp_path):
    """The two arrows that ran back up before AttentionConfig moved into attention and the shared statistics into
    analysis: attention -> config (an import under TYPE_CHECKING) and probes -> evaluation; and a unit without a
    layer."""
    library = tmp_path / "fpa_lightning"
    files = {
        "__init__.py": "from fpa_lightning.config import ModelConfig\n",
        "config.py": "from fpa_lightning.attention.config import AttentionConfig\n",  # downward
        "attention/__init__.py": "",
        "attention/layer.py": "from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from fpa_lightning.config import ModelConfig\n",
        "analysis/__init__.py": "",
        "evaluation/__init__.py": "",
        "evaluation/stats.py": "from ..analysis.binomial import binomial_cdf\n",  # downward, relative
        "probes/__init__.py": "",
        "probes/stats.py": "def sign_test():\n    from fpa_lightning.evaluation.stats import binomial_at_least\n",
        "unplaced.py": "",
    }
    for name, text in files.items():
        (library / name).parent.mkdir(parents=True, exist_ok=True)
        (library / name).write_text(text)
    assert layer_violations(library) == [
        "fpa_lightning/unplaced has no layer in LIBRARY_LAYERS",
        "fpa_lightning/attention/layer.py imports fpa_lightning.config, which is not below it",
        "fpa_lightning/probes/stats.py imports fpa_lightning.evaluation, which is not below it",
    ]


def application_code(path: pathlib.Path) -> list[str]:
    """What in a file belongs to an application: imports of APPLICATION_ONLY, print calls, sys.stdout / sys.stderr."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = [f"imports {name}" for name in sorted(imported_top_levels(path) & APPLICATION_ONLY)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
            found.append(f"line {node.lineno}: print")
        elif (isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr")
              and isinstance(node.value, ast.Name) and node.value.id == "sys"):
            found.append(f"line {node.lineno}: sys.{node.attr}")
    return found


def test_the_library_parses_no_command_line_draws_nothing_and_prints_nothing():
    found = [f"{path.relative_to(REPO)} {what}" for path in sorted((REPO / "fpa_lightning").rglob("*.py"))
             for what in application_code(path)]
    assert found == []


def test_the_check_sees_application_code(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import argparse\nimport sys\n\ndef f(log=print):\n    from matplotlib import pyplot\n"
                   "    print('x', file=sys.stderr)\n    sys.stdout.write('y')\n    log('fine: a callable passed in')\n")
    assert application_code(bad) == ["imports argparse", "imports matplotlib", "line 6: print", "line 6: sys.stderr",
                                      "line 7: sys.stdout"]


def test_only_the_hf_package_imports_transformers():
    outside = [f"{path.relative_to(REPO)}" for path in sorted((REPO / "fpa_lightning").rglob("*.py"))
               if "transformers" in imported_top_levels(path) and (REPO / "fpa_lightning" / "hf") not in path.parents]
    assert outside == []


def loaded_after(*steps: tuple[str, tuple[str, ...]]) -> list[str]:
    """One fresh interpreter runs ``import {imports}`` for each (imports, packages) step in turn and, after each step,
    lists the modules of `packages` it has loaded so far (one interpreter for every step: its start-up, torch and
    lightning included, costs seconds; a later step sees the modules of the earlier ones too, so it checks no less
    than a fresh interpreter of its own would)."""
    code = "import sys\n" + "".join(
        f"import {imports}; print(sorted(m for m in sys.modules "
        f"if any(m == p or m.startswith(p + '.') for p in {packages!r})))\n" for imports, packages in steps)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()


def test_importing_the_core_does_not_load_transformers():
    """Importing the library (but its hf package and the harness adapter) does not load transformers (seconds of
    start-up, and an optional dependency); the evaluation application imports fpa_lightning.hf and lm_eval only when
    the export or the lm_eval task runs."""
    library = ("fpa_lightning, fpa_lightning.export, fpa_lightning.generation, fpa_lightning.analysis.survival, "
               "fpa_lightning.evaluation.checkpoint, fpa_lightning.evaluation.ruler, fpa_lightning.evaluation.babilong, "
               "fpa_lightning.probes, fpa_lightning.probes.train, fpa_lightning.probes.theory")
    assert loaded_after((library, ("transformers",)), ("modules.evaluation.cli", ("fpa_lightning.hf", "lm_eval"))) == [
        "[]", "[]"]
