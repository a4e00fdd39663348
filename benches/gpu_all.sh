#!/usr/bin/env bash
# Every benches/gpu_*.py and tests/gpu within one 600 s device command (--total 580), one table (--tiny: the CPU dry run): benches/gpu_all.py.
exec "${PYTHON:-python}" "$(dirname "$0")/gpu_all.py" "$@"
