#!/usr/bin/env bash
# The GPU checks of issue 30 as one short script (about 5 minutes on one H100/H200):
#   1. bench_sim on every family (one system each: paged, odma, ellm, token-pd,
#      kunserve) at 1, 1,024 and 8,192 vmapped configs: config-iterations/s and the
#      one-config iteration time (items 4 and 6);
#   2. the main job (the README's fit command) from an empty compilation cache, then
#      again with the cache it filled: wall time of each (item 3).
# Each part runs under its own time limit, so the result files of the parts that
# finished come back even when one does not. Tested on CPU with QUICK=1 (small sizes).
#
# Usage (the device machine has the project's dependencies but no network, so the
# checkout runs from PYTHONPATH rather than a pip install):
#   OUT=/some/dir bash experiments/gpu_check.sh
# Writes under $OUT (8 files): bench_sim.json, bench_sim.md, fit_cold.log, fit_warm.log,
# policy_cold.json, policy_warm.json, times.txt, env.txt.
set -uo pipefail
out=${OUT:?set OUT to the folder for the results}
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
python3 -c "import jax; print(jax.__version__, jax.devices())" >"$out/env.txt" 2>&1
if [ "${QUICK:-0}" = 1 ]; then
  bench=(--quick --systems paged,odma)
  fit=(--n-requests 256 --budget 2)
else
  bench=(--steps 1024 --configs 1,1024,8192 --requests 10000
         --systems paged,odma,ellm,token-pd,kunserve)
  fit=()
fi
timeout 170 python3 -m experiments.bench_sim "${bench[@]}" --out "$out" \
  || echo "bench_sim: exit $? (timeout 170 s)" >>"$out/times.txt"
cache=$(mktemp -d)
for run in cold warm; do
  start=$(date +%s.%N)
  KVTUNE_JAX_CACHE=$cache timeout 100 python3 -m tuner.fit --export-anyway \
    --out "$out/policy_$run.json" --log "$out/fit_$run.log" "${fit[@]}" >/dev/null
  rc=$?
  rm -f "$out/policy_$run.dataset.jsonl"  # the replay dataset: not needed, over the limits
  secs=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")
  echo "main job ($run compilation cache): exit $rc, $secs s whole process" \
    >>"$out/times.txt"
done
cat "$out/times.txt"
