#!/usr/bin/env bash
# One pass on an SM90 GPU machine: install, build every kernel in parallel, run the README's two
# commands (the demo and the whole test suite), run the benchmark. Logs and results go to
# $LOGDIR (default: ./gpu-logs).
#   WHEELS=.whl  - a folder of wheels to install first (e.g. nvidia-cutlass on a machine without network)
#   CODA_EXT_CACHE_DIR - the kernel cache (prebuilt entries are reused when nvcc/CUTLASS match)
#   CACHE_SEED=dir - a kernel cache built elsewhere (e.g. on a machine without a GPU) to start from;
#                    the prebuild line says how many kernels it supplied
#   LIBCODA=1    - also build libcoda and run its CTests and example
#   SANITIZE=0   - skip compute-sanitizer over the kernel families and the numerics table
#   XDIST=n      - test processes sharing the GPU where pytest-xdist is installed (default 3, one file each;
#                  0: one process)
#   FUZZ=0       - leave out tests/gpu/test_fuzz_gpu.py (its 129 kernels and its tests)
#   BENCH=0      - leave out the benchmark (bench_epilogue) and its kernels
set -uo pipefail
cd "$(dirname "$0")/.."
LOGDIR=${LOGDIR:-gpu-logs}
mkdir -p "$LOGDIR"
export PYTHONUNBUFFERED=1
if [ -n "${WHEELS:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir "$WHEELS"/*.whl || exit 1
fi
python3 -m pip install -q --no-build-isolation --no-deps -e . > "$LOGDIR/install.log" 2>&1 || { cat "$LOGDIR/install.log"; exit 1; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$LOGDIR/gpu.txt"
if [ -n "${LIBCODA:-}" ]; then   # build libcoda (all its kernels) alongside the JIT prebuild
  ( cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release -DCODA_BUILD_TESTS=ON -DPython3_EXECUTABLE="$(command -v python3)" \
      && cmake --build build-gpu -j 8 ) > "$LOGDIR/libcoda-build.log" 2>&1 &
  libcoda_pid=$!
fi
nvcc --version | tail -1
if [ -n "${CACHE_SEED:-}" ]; then
  mkdir -p "${CODA_EXT_CACHE_DIR:?set CODA_EXT_CACHE_DIR with CACHE_SEED}"
  cp -r "$CACHE_SEED"/. "$CODA_EXT_CACHE_DIR"/
fi
start=$(date +%s)
# every kernel of the GPU suite (each test file that builds kernels defines build_items()) and the benchmark
prebuild_files=(tests/gpu/cases.py tests/gpu/ops_cases.py $(grep -l "^def build_items" tests/gpu/test_*.py))
ignore=()
if [ "${FUZZ:-1}" = 0 ]; then
  kept=(); for f in "${prebuild_files[@]}"; do [ "$f" != tests/gpu/test_fuzz_gpu.py ] && kept+=("$f"); done
  prebuild_files=("${kept[@]}")
  ignore=(--ignore=tests/gpu/test_fuzz_gpu.py)
fi
[ "${BENCH:-1}" != 0 ] && prebuild_files+=(benchmarks/bench_epilogue.py)
[ "${SANITIZE:-1}" != 0 ] && prebuild_files+=(benchmarks/sanitize.py benchmarks/numerics_table.py)
python3 -m coda_ext prebuild "${prebuild_files[@]}" -j "$(nproc)" 2>&1 | tail -3 | tee "$LOGDIR/prebuild.log"
echo "prebuild took $(( $(date +%s) - start )) s"
python3 -m coda_ext demo 2>&1 | tee "$LOGDIR/demo.log" | tail -n 12
if [ "${SANITIZE:-1}" != 0 ]; then
  # memcheck, racecheck and initcheck over every kernel family, the initcheck/TMA-store probe; the
  # per-node-kind numerics table (results/sanitizer_<gpu>.{log,json}, results/numerics_<gpu>.json; <gpu>: h100, h200, …)
  python3 -m benchmarks.sanitize 2>&1 | tee "$LOGDIR/sanitize.log" | tail -n 15
  python3 -m benchmarks.numerics_table 2>&1 | tee "$LOGDIR/numerics.log" | tail -n 100
  cp benchmarks/results/sanitizer_*.log "$LOGDIR/" 2>/dev/null || true
fi
xdist=()
if [ "${XDIST:-3}" != 0 ] && python3 -c "import xdist" 2>/dev/null; then xdist=(-n "${XDIST:-3}" --dist loadfile); fi
python3 -m pytest tests -q -rs --durations=5 "${xdist[@]}" "${ignore[@]}" 2>&1 | tee "$LOGDIR/tests.log" | tail -n 120
if [ "${BENCH:-1}" != 0 ]; then
  python3 -m benchmarks.bench_epilogue ${BENCH_ARGS:-} 2>&1 | tee "$LOGDIR/bench.log" | tail -n 40
fi
cp benchmarks/results/*.json benchmarks/results/*.png "$LOGDIR/" 2>/dev/null || true
if [ -n "${LIBCODA:-}" ]; then
  wait "$libcoda_pid" || { echo "libcoda build failed:"; tail -30 "$LOGDIR/libcoda-build.log"; exit 1; }
  ctest --test-dir build-gpu --output-on-failure 2>&1 | tee "$LOGDIR/libcoda-ctest.log" | tail -25
  ./build-gpu/csrc/examples/coda_example 2>&1 | tee "$LOGDIR/libcoda-example.log" | tail -5
fi
