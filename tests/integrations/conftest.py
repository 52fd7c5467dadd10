"""Fixtures of the integration tests."""
import importlib.util
import pathlib

import pytest

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "generate.py"


@pytest.fixture(scope="session")
def example():
    """examples/generate.py as a module (it imports transformers and xgrammar only when used)."""
    spec = importlib.util.spec_from_file_location("fsdist_example_generate", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
