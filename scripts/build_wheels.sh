#!/usr/bin/env bash
# Build the release artifacts into dist/ and test them as a user would install them:
#
#   scripts/build_wheels.sh
#
# 1. a build venv (.venv-build) with maturin, ziglang, auditwheel, abi3audit and twine;
# 2. the abi3 manylinux2014 x86_64 wheel (`maturin build --release --zig --compatibility
#    manylinux2014`, one wheel for every CPython >= 3.10) and the sdist (`maturin sdist`);
# 3. the checks: `auditwheel show` (the wheel's platform tag is what its symbols allow),
#    `abi3audit --strict` (the extension uses the stable ABI only), `twine check --strict`;
# 4. the wheel in a fresh venv whose PATH has no cargo or rustc, with only NumPy and the
#    test runner (pytest, hypothesis): the torch-free tests, run against the installed
#    wheel (a pytest plugin fails the session unless `comppo_core` is imported from the
#    venv's site-packages; tests needing torch, pyarrow, ... skip). The SIMD dispatch is
#    shown in that wheel: the CPU's AVX2/FMA flags, the AVX2 instructions in the extension
#    (ymm registers, vfmadd: baseline x86-64 has neither), the same kernel timed with
#    COMPPO_DISABLE_AVX2=0 and =1 (printed, not checked), and, in that test run,
#    tests/api/test_threads.py::test_avx2_and_baseline_builds_are_bit_identical (the two
#    paths give the same bits);
# 5. the sdist built into a wheel (with cargo, as pip does on a platform without a
#    wheel) in another fresh venv, and the same tests.
#
# Environment:
#   PYTHON=python3           the interpreter of the build venv and of the test venvs
#   TEST_PYTHONS="..."       the interpreters (>= 3.10) to test the wheel with, default $PYTHON;
#                            e.g. TEST_PYTHONS="python3 /root/.pyenv/versions/3.10.13/bin/python3.10"
#   SKIP_SDIST_TEST=1        skip step 5 (it compiles the crate again: minutes)
#   PYTEST_ARGS="..."        extra pytest arguments for every test run (e.g. "-m 'not slow'")
#
# Every test run goes on when one fails; the summary at the end has each run's closing
# pytest line, and the exit status is 1 if any run failed.
#
# Outputs dist/comppo_core-<version>-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
# and dist/comppo_core-<version>.tar.gz (maturin replaces files of the same name; nothing
# else in dist/ is touched). The test venvs live in a temporary directory, removed at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

PY=${PYTHON:-python3}
BUILD_VENV=$ROOT/.venv-build
VERSION=$(sed -n '/^\[package\]/,/^\[/s/^version *= *"\([^"]*\)"/\1/p' Cargo.toml)
# maturin writes a PEP 440 version (0.3.0-rc.1 in Cargo.toml becomes 0.3.0rc1)
PEP440=$("$PY" -c 'import re, sys; v = sys.argv[1]; print(re.sub(r"-?(alpha|beta|rc)\.?", lambda m: {"alpha": "a", "beta": "b"}.get(m[1], m[1]), v))' "$VERSION")
WHEEL=dist/comppo_core-$PEP440-cp310-abi3-manylinux2014_x86_64.manylinux_2_17_x86_64.whl
SDIST=dist/comppo_core-$PEP440.tar.gz
# the test runner only: what the torch-free tests import besides the package and NumPy
TEST_DEPS=("pytest>=8" "hypothesis>=6.100")
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

step() { printf '\n== [%s] %s\n' "$(date -u +%T)" "$*"; }

step "build venv ($BUILD_VENV)"
[ -x "$BUILD_VENV/bin/python" ] || "$PY" -m venv "$BUILD_VENV"
"$BUILD_VENV/bin/python" -m pip install --quiet --upgrade pip
"$BUILD_VENV/bin/python" -m pip install --quiet "maturin>=1.9.4,<2" ziglang auditwheel abi3audit twine
# maturin finds zig (ziglang's) on PATH
export PATH="$BUILD_VENV/bin:$PATH"

step "wheel: maturin build --release --zig --compatibility manylinux2014 -o dist"
start=$SECONDS
maturin build --release --zig --compatibility manylinux2014 -o dist
echo "built $WHEEL in $((SECONDS - start)) s, $(du -k "$WHEEL" | cut -f1) KiB ($(stat -c %s "$WHEEL") bytes)"

step "sdist: maturin sdist -o dist"
maturin sdist -o dist
echo "built $SDIST, $(du -k "$SDIST" | cut -f1) KiB"
# the sdist holds what git does not ignore: a stray venv or data file would ship to PyPI
if [ "$(stat -c %s "$SDIST")" -gt $((5 * 1024 * 1024)) ]; then
    echo "the sdist is over 5 MiB; its largest members:" >&2
    tar tzvf "$SDIST" | sort -k3 -n | tail -5 >&2
    exit 1
fi

step "auditwheel show"
auditwheel show "$WHEEL"
step "abi3audit --strict"
abi3audit --strict --report "$WHEEL"
step "twine check --strict"
twine check --strict "$WHEEL" "$SDIST"

# PATH without any directory that holds cargo or rustc (~/.cargo/bin, a system toolchain)
# nor the build venv (maturin)
NO_RUST_PATH=
IFS=: read -r -a dirs <<<"$PATH"
for dir in "${dirs[@]}"; do
    if [ -z "$dir" ] || [ "$dir" = "$BUILD_VENV/bin" ] || [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ]; then
        continue
    fi
    NO_RUST_PATH=${NO_RUST_PATH:+$NO_RUST_PATH:}$dir
done

# pytest plugin: the session fails unless comppo_core comes from the venv's site-packages
mkdir -p "$WORK/plugin"
cat >"$WORK/plugin/installed_wheel_check.py" <<'EOF'
import sysconfig
from pathlib import Path

import comppo_core


def pytest_sessionstart(session):
    site = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    where = Path(comppo_core.__file__).resolve()
    if not any(s in where.parents for s in site):
        raise SystemExit(f"comppo_core imported from {where}, not from site-packages {sorted(map(str, site))}")


def pytest_report_header(config):
    return f"comppo_core {comppo_core.__version__} from {Path(comppo_core.__file__).parent}"
EOF

# run_tests <label> <interpreter> <what to pip install>...: a fresh venv, the torch-free tests
run_tests() {
    local label=$1 python=$2
    shift 2
    local venv=$WORK/venv-$label
    LAST_VENV=$venv
    step "$label: fresh venv ($("$python" --version)), pip install $*"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet "$@" "${TEST_DEPS[@]}"
    step "$label: pytest against the installed package (no cargo or rustc on PATH)"
    if env PATH="$venv/bin:$NO_RUST_PATH" VIRTUAL_ENV="$venv" PYTHONPATH="$WORK/plugin" bash -c '
        set -euo pipefail
        if command -v cargo || command -v rustc; then echo "a Rust toolchain is on PATH" >&2; exit 1; fi
        python -c "import comppo_core, sys; print(\"comppo_core\", comppo_core.__version__, \"from\", comppo_core.__file__)"
        python -m pytest -q -p no:cacheprovider -p installed_wheel_check '"${PYTEST_ARGS:-}"'
    ' 2>&1 | tee "$WORK/pytest-$label.log"; then
        SUMMARY+=("$label ($("$python" --version)): $(tail -n 1 "$WORK/pytest-$label.log")")
    else
        SUMMARY+=("$label ($("$python" --version)): FAILED: $(tail -n 1 "$WORK/pytest-$label.log")")
        FAILED=1
    fi
}
SUMMARY=()
FAILED=0

step "SIMD dispatch"
if grep -q -w avx2 /proc/cpuinfo && grep -q -w fma /proc/cpuinfo; then
    echo "this CPU has AVX2 and FMA: the wheel's kernels take their AVX2 paths unless COMPPO_DISABLE_AVX2=1"
else
    echo "WARNING: this CPU lacks AVX2 or FMA: both runs of the AVX2-vs-baseline test take the baseline path"
fi
unzip -q -o "$WHEEL" 'comppo_core/_core*' -d "$WORK/unpacked"
SO=$(ls "$WORK"/unpacked/comppo_core/_core*.so)
# baseline x86-64 has no ymm register and no FMA: these are the AVX2 builds' instructions
echo "$(basename "$SO"): $(objdump -d --no-show-raw-insn "$SO" | grep -c ymm) instructions on ymm registers," \
    "$(objdump -d --no-show-raw-insn "$SO" | grep -c vfmadd) vfmadd"

for python in ${TEST_PYTHONS:-$PY}; do
    run_tests "wheel-$("$python" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')" "$python" "$WHEEL"
done

step "SIMD dispatch in the installed wheel: the same gates, AVX2 allowed and forced off (best of 15, ms)"
# evidence that the switch changes the code that runs (the test above shows the bits are
# equal); a timing, so it is printed, never checked
for disable in 0 1; do
    env PATH="$LAST_VENV/bin:$NO_RUST_PATH" COMPPO_DISABLE_AVX2=$disable python -c '
import os, time
import numpy as np
import comppo_core as cc
cc.set_num_threads(1)
rng = np.random.default_rng(0)
c = rng.random((256, 4096)).astype(np.float32)
m = rng.random((256, 4096)) < 0.9
times = []
for _ in range(15):
    t0 = time.perf_counter()
    cc.gates_from_concentration(c, mask=m)
    times.append(time.perf_counter() - t0)
flag = os.environ["COMPPO_DISABLE_AVX2"]
print(f"COMPPO_DISABLE_AVX2={flag}: {1e3 * min(times):.2f} ms")
'
done

if [ "${SKIP_SDIST_TEST:-0}" != 1 ]; then
    step "sdist: pip wheel (compiles the crate with cargo)"
    start=$SECONDS
    "$BUILD_VENV/bin/python" -m pip wheel --quiet --no-deps -w "$WORK/from-sdist" "$SDIST"
    echo "built $(basename "$WORK"/from-sdist/*.whl) from the sdist in $((SECONDS - start)) s"
    run_tests sdist "$PY" "$WORK"/from-sdist/*.whl
fi

step "summary: $WHEEL, $SDIST"
printf '%s\n' "${SUMMARY[@]}"
exit "$FAILED"
