#!/usr/bin/env bash
# The training-methods search (docs/tuning.md): grid runs (scripts/wikitext2_grid.sh) with one method, or the
# combination, on top of the plain training (AdamW, cosine schedule, no average, untied adaptive layers: train_lm.py's
# defaults before the search, spelled out), each in a folder of its own, <root>/<method>/<run>.
#   bash scripts/wikitext2_methods.sh <root> <run> <method> [<method> ...]
#   methods: base (the plain training), muon, tied (tied adaptive input and output), wsd (warmup-stable-decay, the
#            last 20% of the planned steps decaying), average (the weights averaged over the last 20% of the planned
#            steps), context256 (--block_size 256), deep (8 layers instead of 4), combined (muon + tied + wsd +
#            average: train_lm.py's defaults since the search)
# One lane per core, one thread each, e.g. on a 2-core machine:
#   HFST_LAUNCH="taskset -c 0 env OMP_NUM_THREADS=1" bash scripts/wikitext2_methods.sh outputs/methods \
#       decoder-linear-elu-gated base muon tied &
# As the grid script: a killed run continues from its newest complete checkpoint when started again, a finished one is
# skipped; add --seed 1 with HFST_SEED=1 (folders <method>-seed1).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$1
run=$2
shift 2
seed=${HFST_SEED:-}
for method in "$@"; do
  optimizer=adamw schedule="cosine" average="none" tie=false extra="" overrides=""
  case "$method" in
    base) ;;
    muon) optimizer=muon ;;
    tied) tie=true ;;
    wsd) schedule="warmup_stable_decay --decay_fraction 0.2" ;;
    average) average="last --average_fraction 0.2" ;;
    context256) extra="--block_size 256" ;;
    deep) overrides=",num_hidden_layers=8" ;;
    combined) optimizer=muon tie=true schedule="warmup_stable_decay --decay_fraction 0.2" average="last" ;;
    *) echo "unknown method: $method (base, muon, tied, wsd, average, context256, deep, combined)" >&2; exit 2 ;;
  esac
  args="--optimizer $optimizer --lr_scheduler_type $schedule --average_weights $average \
--config_overrides tie_adaptive_weights=$tie$overrides $extra"
  folder=$method
  if [ -n "$seed" ]; then args="$args --seed $seed"; folder="$method-seed$seed"; fi
  HFST_GRID_ARGS="$args" bash scripts/wikitext2_grid.sh "$root/$folder" "$run"
done
