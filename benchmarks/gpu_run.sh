#!/usr/bin/env bash
# The suite on a GPU machine, as one prepared command (README "GPU").
#
#   bash benchmarks/gpu_run.sh [SECONDS] [PYTEST ARGS...]
#
# Runs README's GPU command from the repository root of a checkout (no install): every built-in on cuda, the
# derandomized `ci` profile, -n auto (one worker per core), the 25 slowest durations, -v. The log, the JSON report
# and its page go to $OUT (or ./gpu-run), gzipped, so that they survive a time-out: pytest is stopped with SIGTERM
# after SECONDS (default 420), which still prints the summary and writes the report, marked incomplete.
# Python packages the machine lacks travel as wheels in .whl/: installed first if present.
# On 2026-11-27 (H200, 16 cores, commit 49f801d) the same run, with -n 16, reached 98 % of its items in 263 s; on an
# H100 (16 cores, commit 434a5e5) it completed, 5257 items, in 401 s (docs/gpu-runs/2026-11-27-h100).
set -u
limit="${1:-420}"
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
timeout -s TERM "$limit" python3 -m pytest --device cuda --hypothesis-profile ci --durations 25 -v \
  --conformance-report "$out/gpu.json" "$@" >"$out/gpu.log" 2>&1
status=$?
gzip -f "$out/gpu.json" "$out/gpu.html" 2>/dev/null
# What a reader needs first: the failures by name, then the conformance summary and pytest's last line.
grep -E "^\[gw[0-9]+\] \[ *[0-9]+%\] FAILED|^FAILED" "$out/gpu.log" | head -60
sed -n '/=== attention conformance ===/,$p' "$out/gpu.log" | tail -80
echo "pytest exit status $status (124: stopped at ${limit} s)"
exit "$status"
