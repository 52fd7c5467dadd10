"""examples/generate.py loaded as a module, for the decode-loop tests.

A plain helper module rather than a conftest in tests/integrations: pytest registers every
conftest.py under the one module name ``conftest``, so a second one would shadow
tests/tensor_parallel/conftest.py for ``from conftest import ...`` in a session that
collects both directories.
"""
import importlib.util
import pathlib

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "generate.py"


def load_generate_example():
    """The example as a module (it imports transformers and xgrammar only when used)."""
    spec = importlib.util.spec_from_file_location("fsdist_example_generate", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
