"""The remote code of an export: the installed source of ``fpa_lightning.hf`` and of every core module it imports,
copied flat into the folder, so that ``AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True)`` works
where fpa-lightning is not installed (its dependencies torch, transformers and safetensors are; triton only for the
fused GPU kernels, which import it when they are launched, so a CPU-only torch loads the folder too).

The files are copied from the installed package each time a folder is written, never kept in the repository: they
cannot drift from the code that trained the model. transformers' loader wants one flat folder of modules that
import each other as ``from .name import ...``, so each module gets a flat file name (``fpa_lightning.ops.fpa.naive``
-> ``fpa_lightning_ops_fpa_naive.py``; the two entry points take transformers' names ``configuration_*.py`` and
``modeling_*.py``) and its ``fpa_lightning`` import statements are rewritten to those names; nothing else changes.
"""
from __future__ import annotations

import ast
import importlib.util
import json
import os
from pathlib import Path

from fpa_lightning import __version__
from fpa_lightning.atomic import atomic_open

PACKAGE = "fpa_lightning"
ENTRY_FILES = {"fpa_lightning.hf.config": "configuration_fpa_lightning",
               "fpa_lightning.hf.modeling": "modeling_fpa_lightning"}
AUTO_MAP = {"AutoConfig": "configuration_fpa_lightning.FPAConfig",
            "AutoModelForCausalLM": "modeling_fpa_lightning.FPAForCausalLM"}


def flat_name(module: str) -> str:
    """The file stem of a module in the flat folder."""
    return ENTRY_FILES.get(module, module.replace(".", "_"))


def source_path(module: str) -> Path:
    """The installed source file of a module of the package (a package's ``__init__.py``)."""
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        raise FileNotFoundError(f"no Python source for {module} in the installed {PACKAGE}")
    return Path(spec.origin)


def is_module(name: str) -> bool:
    """True when ``name`` (dotted) is a module of the package, not an attribute of one."""
    parent, _, _ = name.rpartition(".")
    return source_path(parent).name == "__init__.py" and importlib.util.find_spec(name) is not None


def package_imports(tree: ast.Module, module: str) -> list[ast.ImportFrom]:
    """The ``from fpa_lightning... import`` statements of a module (anywhere in it); other forms of importing the
    package cannot be rewritten and raise."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == PACKAGE for a in node.names):
            raise ValueError(f"{module}, line {node.lineno}: `import {PACKAGE}...` cannot be copied as remote code; "
                             f"use `from {PACKAGE}.x import name`")
        if isinstance(node, ast.ImportFrom) and node.level > 0:
            raise ValueError(f"{module}, line {node.lineno}: relative imports cannot be copied as remote code")
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == PACKAGE:
            found.append(node)
    return found


def imported_modules(node: ast.ImportFrom) -> list[str]:
    """The package's modules one import statement needs: the submodules it names, else the module it names."""
    submodules = [f"{node.module}.{a.name}" for a in node.names if is_module(f"{node.module}.{a.name}")]
    rest = len(submodules) < len(node.names)
    return submodules + ([node.module] if rest else [])


def rewritten(node: ast.ImportFrom, indent: str) -> list[str]:
    """The statement with flat relative names. A submodule (``from fpa_lightning.ops.fpa import kernels``) becomes
    ``from . import <flat> as kernels``, plus a ``from .<flat> import`` line: transformers copies a module into its
    cache only when some copied file names it in that form."""
    lines, names = [], []
    for alias in node.names:
        full = f"{node.module}.{alias.name}"
        if is_module(full):
            flat = flat_name(full)
            lines.append(f"{indent}from .{flat} import __name__ as _{flat}_name  # names {flat}.py for the loader")
            lines.append(f"{indent}from . import {flat} as {alias.asname or alias.name}")
        else:
            names.append(alias.name if alias.asname is None else f"{alias.name} as {alias.asname}")
    if names:
        lines.insert(0, f"{indent}from .{flat_name(node.module)} import {', '.join(names)}")
    return lines


def flattened_source(module: str) -> tuple[str, list[str]]:
    """A module's source with its package imports rewritten, and the package modules it imports."""
    path = source_path(module)
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    needed: list[str] = []
    for node in sorted(package_imports(ast.parse(text), module), key=lambda n: n.lineno, reverse=True):
        first, last = lines[node.lineno - 1], lines[node.end_lineno - 1]
        if first[: node.col_offset].strip() or last[node.end_col_offset:].split("#")[0].strip():
            raise ValueError(f"{path}, line {node.lineno}: an import must stand on lines of its own to be rewritten")
        lines[node.lineno - 1 : node.end_lineno] = rewritten(node, first[: node.col_offset])
        needed += imported_modules(node)
    relative = path.relative_to(source_path(PACKAGE).parent.parent).as_posix()
    header = [f"# Copied from {relative} (fpa-lightning {__version__}) when this folder was written, with its",
              f"# `{PACKAGE}` imports made flat and relative: remote code for trust_remote_code=True. Edit the source."]
    return "\n".join(header + lines) + "\n", needed


def remote_code_files() -> dict[str, str]:
    """{file name: source} of the flat folder: the two entry modules and everything they import, recursively."""
    files: dict[str, str] = {}
    owners: dict[str, str] = {}
    pending, seen = list(ENTRY_FILES), set(ENTRY_FILES)
    while pending:
        module = pending.pop()
        name = flat_name(module) + ".py"
        if owners.setdefault(name, module) != module:
            raise ValueError(f"{module} and {owners[name]} both flatten to {name}")
        files[name], needed = flattened_source(module)
        for dependency in needed:
            if dependency not in seen:
                seen.add(dependency)
                pending.append(dependency)
    return dict(sorted(files.items()))


def atomic_write(path: str, text: str) -> None:
    """Write ``text`` to ``path`` atomically (``fpa_lightning.atomic``): never a partial file."""
    with atomic_open(path) as f:
        f.write(text)


def write_remote_code(folder: str) -> list[str]:
    """Copy the remote code into a folder written by ``save_pretrained`` and name its classes in config.json's
    ``auto_map``; returns the paths written. The folder then loads with ``trust_remote_code=True`` alone."""
    written = []
    for name, text in remote_code_files().items():
        written.append(os.path.join(folder, name))
        atomic_write(written[-1], text)
    config_path = os.path.join(folder, "config.json")
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    config["auto_map"] = AUTO_MAP
    atomic_write(config_path, json.dumps(config, indent=2, sort_keys=True) + "\n")
    return written
