#!/usr/bin/env bash
# The suite on a GPU machine, as one prepared command (README "GPU").
#
#   bash benchmarks/gpu_run.sh [SECONDS] [PYTEST ARGS...]
#
# Runs README's GPU command from the repository root of a checkout (no install): every built-in on cuda, the
# derandomized `ci` profile, -n auto (one worker per core), the 25 slowest durations, -v. The log, the JSON report
# and its page go to $OUT (or ./gpu-run), gzipped, so that they survive a time-out: pytest is stopped with SIGTERM
# after SECONDS (default 480: the complete run is estimated at about 454 s on 16 workers, docs/gpu.md), which still
# prints the summary and writes the report, marked incomplete.
# Python packages the machine lacks travel as wheels in .whl/: installed first if present.
# The items start longest first (--longest-first docs/gpu-runs/durations-cuda.json, when present), and the compile
# caches (JAX's persistent cache, torch inductor's, Triton's) are one directory shared by the workers and kept for
# the next run: $GPU_RUN_CACHE, default .attention-conformance/gpu-cache; each variable you set yourself wins.
# On 2026-11-27 (H200, 16 cores, commit 49f801d) the same run, with -n 16, reached 98 % of its items in 263 s; on an
# H100 (16 cores, commit 434a5e5) it completed, 5257 items, in 401 s (docs/gpu-runs/2026-11-27-h100). Where that
# time went, and what longest-first ordering makes of it: docs/gpu.md, benchmarks/gpu_run_profile.py.
set -u
limit="${1:-480}"
shift || true
out="${OUT:-gpu-run}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 | tee "$out/device.txt"
python3 -c "import torch, jax; print('torch', torch.__version__, 'jax', jax.__version__, jax.devices())" 2>&1 \
  | tail -1 | tee -a "$out/device.txt"
cache="${GPU_RUN_CACHE:-$PWD/.attention-conformance/gpu-cache}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$cache/jax}"
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="${JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS:-0}"  # every compile
export JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="${JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES:-0}"
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$cache/torchinductor}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$cache/triton}"
caches() {  # files and size of each compile cache
  for dir in "$JAX_COMPILATION_CACHE_DIR" "$TORCHINDUCTOR_CACHE_DIR" "$TRITON_CACHE_DIR"; do
    mkdir -p "$dir"
    printf '%s %s files %s; ' "$dir" "$(find "$dir" -type f | wc -l)" "$(du -sh "$dir" | cut -f1)"
  done
  echo
}
echo "compile caches before the run: $(caches)" | tee -a "$out/device.txt"
order=()
if [ -f docs/gpu-runs/durations-cuda.json ]; then
  order=(--longest-first docs/gpu-runs/durations-cuda.json)
fi
timeout -s TERM "$limit" python3 -m pytest --device cuda --hypothesis-profile ci --durations 25 -v \
  --conformance-report "$out/gpu.json" ${order[@]+"${order[@]}"} "$@" >"$out/gpu.log" 2>&1
status=$?
echo "compile caches after the run: $(caches)" | tee -a "$out/device.txt"
gzip -f "$out/gpu.json" "$out/gpu.html" 2>/dev/null
# Where the time went (docs/gpu.md), and the items' durations for the next run's --longest-first.
python3 benchmarks/gpu_run_profile.py "$out/gpu.log" --report "$out/gpu.json.gz" \
  --durations-out "$out/durations-cuda.json" >"$out/profile.txt" 2>&1
# What a reader needs first: the failures by name, then the conformance summary and pytest's last line.
grep -E "^\[gw[0-9]+\] \[ *[0-9]+%\] FAILED|^FAILED" "$out/gpu.log" | head -60
sed -n '/=== attention conformance ===/,$p' "$out/gpu.log" | tail -80
echo "pytest exit status $status (124: stopped at ${limit} s)"
exit "$status"
