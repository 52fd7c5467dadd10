"""Fixtures for the integration tests.

The multi-rank ones (test_megatron.py) use tests/tensor_parallel's ``dist_ctx`` (torch.distributed
under ``mpirun ... --with-mpi`` or the launch scripts, a skip otherwise) and its hard per-test
timeout, loaded from that conftest by path so that there is one definition of each.
"""
import importlib.util
import pathlib

_path = pathlib.Path(__file__).resolve().parent.parent / "tensor_parallel" / "conftest.py"
_spec = importlib.util.spec_from_file_location("fsdist_tests_tensor_parallel_conftest", _path)
_tp = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tp)

dist_ctx = _tp.dist_ctx
hard_timeout = _tp.hard_timeout
_watchdog_stream = _tp._watchdog_stream
