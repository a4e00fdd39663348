#!/usr/bin/env bash
# Every benches/gpu_*.py and tests/gpu within 8 minutes, one table (--tiny: the CPU dry run): benches/gpu_all.py.
exec "${PYTHON:-python}" "$(dirname "$0")/gpu_all.py" "$@"
