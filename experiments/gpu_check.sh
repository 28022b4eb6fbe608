#!/usr/bin/env bash
# The GPU checks of issue 30 as one short script (under 9 minutes: 540 s of
# time limits, on one H100/H200):
#   1. bench_sim on every family (one system each: paged, odma, ellm, token-pd,
#      kunserve) at 1, 1,024 and 8,192 vmapped configs: config-iterations/s and the
#      one-config iteration time (items 4 and 6); a sweep whose projected run is over
#      $MAX_RUN_S (default 25 s) is reported as skipped, not run;
#   2. profile_sim on the two slowest families (token-pd, kunserve) at 1,024 configs:
#      GPU time by kernel and by kind of operation (item 4);
#   3. the main job (the README's fit command) from an empty compilation cache, then
#      again with the cache it filled: wall time of each (item 3).
# Each part runs under its own time limit, so what the parts that finished wrote is kept
# when one does not finish. Tested on CPU with QUICK=1 (small sizes).
#
# Usage (the device machine has the project's dependencies but no network and no
# ../shared, so the checkout runs from PYTHONPATH and the traces travel in .gpu/: bench_sim's
# Azure table and the main job's ShareGPT lengths):
#   echo /.gpu/ >>.git/info/exclude; mkdir -p .gpu/traces
#   cp ../shared/traces/{azure-llm-2023-conv,sharegpt-8k-lengths}.csv .gpu/traces/
#   OUT=/some/dir bash experiments/gpu_check.sh        # (device: carry .gpu)
# SYSTEMS (comma-separated) and PROFILE_SYSTEMS (space-separated) narrow parts 1 and 2;
# FIT_RUNS (cold warm host) and FIT_LIMIT_S (140) set part 3; warm runs only when cold
# finished inside its limit (a warm run cannot finish where the cold one did not).
# Writes $OUT/times.txt and $OUT/gpu_check.tgz (every result file: bench_sim.json/.md,
# profile_<system>.json/.md, fit_{cold,warm}.log/.err, policy_{cold,warm}.json, env.txt,
# gpu_check.json/.md: the parts' wall times and exit statuses, stamped).
set -uo pipefail
out=${OUT:?set OUT to the folder for the results}
res=$out/gpu_check
mkdir -p "$res"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$(pwd) PYTHONUNBUFFERED=1
[ -d .gpu/traces ] && export KVTUNE_TRACES=$(pwd)/.gpu/traces
{ python3 -c "import jax; print(jax.__version__, jax.devices())"; nvidia-smi -L; } \
  >"$res/env.txt" 2>&1
note() { echo "$*" | tee -a "$out/times.txt"; }
if [ "${QUICK:-0}" = 1 ]; then
  bench=(--quick --systems paged,token-pd)
  prof=(--quick)
  fit=(--n-requests 256 --budget 2)
else
  bench=(--steps 1024 --configs 1024,8192 --requests 10000
         --systems "${SYSTEMS:-paged,odma,ellm,token-pd,kunserve}")
  prof=(--configs 1024 --steps 256)
  fit=()
fi
start=$(date +%s)
timeout 170 python3 -m experiments.bench_sim "${bench[@]}" --max-run-s "${MAX_RUN_S:-25}" \
  --no-memory-scaling --out "$res" || note "bench_sim: exit $? (timeout 170 s)"
note "bench_sim: $(( $(date +%s) - start )) s"
for sys in ${PROFILE_SYSTEMS:-token-pd kunserve}; do
  start=$(date +%s)
  timeout 45 python3 -m experiments.profile_sim --system "$sys" "${prof[@]}" --out "$res" \
    | tail -n 25 || note "profile_sim $sys: exit $? (timeout 45 s)"
  note "profile_sim $sys: $(( $(date +%s) - start )) s"
done
cache=$(mktemp -d)
# FIT_RUNS: cold (empty compilation cache), warm (the cache cold filled), host (the
# machine's CPUs, JAX_PLATFORMS=cpu, own empty cache): which main-job runs to time
for run in ${FIT_RUNS:-cold warm}; do
  if [ "$run" = warm ] && [ "${cold_rc:-0}" != 0 ]; then
    note "main job (GPU, warm compilation cache): skipped (the cold run exited $cold_rc)"
    continue
  fi
  start=$(date +%s.%N)
  case $run in
    host) envs=(JAX_PLATFORMS=cpu KVTUNE_JAX_CACHE=$(mktemp -d)); what="host CPUs, cold cache" ;;
    *) envs=(KVTUNE_JAX_CACHE=$cache); what="GPU, $run compilation cache" ;;
  esac
  env "${envs[@]}" timeout "${FIT_LIMIT_S:-140}" python3 -m tuner.fit --export-anyway \
    --out "$res/policy_$run.json" --log "$res/fit_$run.log" "${fit[@]}" \
    >/dev/null 2>"$res/fit_$run.err"
  rc=$?
  [ "$run" = cold ] && cold_rc=$rc
  rm -f "$res/policy_$run.dataset.jsonl"  # the replay dataset: not needed, large
  secs=$(python3 -c "print(round($(date +%s.%N) - $start, 1))")
  note "main job ($what): exit $rc, $secs s whole process"
done
python3 -m experiments.gpu_summary --times "$out/times.txt" --env "$res/env.txt" \
  --out "$res" >/dev/null
tar -czf "$out/gpu_check.tgz" -C "$out" gpu_check && rm -rf "$res"
cat "$out/times.txt"
