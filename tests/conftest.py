"""Test setup: CUDA when there is a GPU, else Triton's interpreter on the CPU.

TRITON_INTERPRET must be set before triton is first imported, so this runs
before any test module imports fsdist.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

ON_GPU = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if ON_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def device():
    return torch.device("cuda") if ON_GPU else torch.device("cpu")
