#!/usr/bin/env bash
# One call of the device tool on a lent GPU machine (docs/bench_notes.md, "GPU runs"):
# install the carried wheels (.whl: diffusers and peft, which the image lacks or has in another
# version; its own jax 0.11 / flax 0.12.10 are used), print versions and clocks, then run
# benchmark parts one after the other, each under its own time limit so that one slow part
# cannot lose the others' results.
#
#   bash tools/gpu_lease.sh 'NAME SECONDS [ENV=VALUE ...] -- BENCH ARGS' ['...' ...]
#
# Each part writes $OUT/NAME.json, NAME.md and NAME.log. A part whose first word is `sh:` runs
# the rest as a shell command instead (for one-off checks), its output in $OUT/NAME.log.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# the parts' random weights, drawn and converted once per lease instead of once per part (~40 s
# each for SD3.5-M; docs/bench_notes.md, "gpu 2026-11-28 H200")
export WFM_JAX_BENCH_WEIGHTS=${WFM_JAX_BENCH_WEIGHTS:-/tmp/wfm_jax_bench_weights}
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
python3 - <<'PY' 2>&1 | tee "$OUT/env.log"
import importlib, subprocess
for m in ("jax", "jaxlib", "flax", "optax", "torch", "diffusers", "peft", "transformers"):
    try:
        mod = importlib.import_module(m)
        print(m, getattr(mod, "__version__", "?"), getattr(mod, "__file__", ""))
    except Exception as e:
        print(m, "IMPORT FAILED", type(e).__name__, e)
import jax
print("jax devices", jax.devices())
import shutil
if shutil.which("nvidia-smi"):
  print(subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,clocks.sm,clocks.max.sm,"
                      "temperature.gpu,power.draw", "--format=csv"],
                       capture_output=True, text=True).stdout)
PY
for part in "$@"; do
  name=${part%% *}; rest=${part#* }
  secs=${rest%% *}; rest=${rest#* }
  start=$(date +%s)
  if [[ $rest == sh:* ]]; then
    timeout "$secs" bash -c "${rest#sh:}" >"$OUT/$name.log" 2>&1
  else
    rest=" $rest"; envs=${rest%% -- *}; args=${rest#* -- }
    # shellcheck disable=SC2086
    timeout "$secs" env $envs python3 -m wfm_jax.bench $args --out "$OUT/$name.json" \
      >"$OUT/$name.log" 2>&1
  fi
  rc=$?
  echo "== part $name: rc=$rc in $(( $(date +%s) - start )) s"
  tail -n 25 "$OUT/$name.log"
done
