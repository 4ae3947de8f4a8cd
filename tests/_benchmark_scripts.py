"""Shared by the tests of benchmarks/ scripts (tests/ is on sys.path through tests/conftest.py): a script loaded as a
module by its path, since benchmarks/ is a folder of scripts, not a package."""
import importlib.util
import pathlib

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def load_benchmark(name: str):
    """benchmarks/<name>.py as a fresh module."""
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
