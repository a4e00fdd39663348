"""The CUDA tests (a package, so that its conftest does not shadow ``tests/conftest.py``:
the CPU suite's modules import ``tiny_lm`` from ``conftest``)."""
