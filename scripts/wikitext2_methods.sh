#!/usr/bin/env bash
# The training-methods search (docs/tuning.md): grid runs (scripts/wikitext2_grid.sh) with one method, or the
# combination, on top of train_lm.py's defaults, each in a folder of its own, <root>/<method>/<run>.
#   bash scripts/wikitext2_methods.sh <root> <run> <method> [<method> ...]
#   methods: base (the defaults), muon, tied (tied adaptive input and output), wsd (warmup-stable-decay, the last 20%
#            of the planned steps decaying), average (the weights averaged over the last 20% of the planned steps),
#            context256 (--block_size 256), deep (8 layers instead of 4), combined (muon + tied + wsd + average)
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
  case "$method" in
    base) args="" ;;
    muon) args="--optimizer muon" ;;
    tied) args="--config_overrides tie_adaptive_weights=true" ;;
    wsd) args="--lr_scheduler_type warmup_stable_decay --decay_fraction 0.2" ;;
    average) args="--average_weights last --average_fraction 0.2" ;;
    context256) args="--block_size 256" ;;
    deep) args="--config_overrides num_hidden_layers=8" ;;
    combined) args="--optimizer muon --config_overrides tie_adaptive_weights=true --lr_scheduler_type \
warmup_stable_decay --decay_fraction 0.2 --average_weights last" ;;
    *) echo "unknown method: $method (base, muon, tied, wsd, average, context256, deep, combined)" >&2; exit 2 ;;
  esac
  folder=$method
  if [ -n "$seed" ]; then args="$args --seed $seed"; folder="$method-seed$seed"; fi
  HFST_GRID_ARGS="$args" bash scripts/wikitext2_grid.sh "$root/$folder" "$run"
done
