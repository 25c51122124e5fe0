#!/usr/bin/env bash
# The README's WikiText-2 table: every family x {softmax, linear elu, linear exp} with train_lm.py's defaults (the tuned
# `small` preset, adaptive input and softmax, many targets per window for the heads, bf16 where the CPU has it), each trained for
# the same time budget (default 90 minutes on one thread: 90 CPU-minutes), evaluated on the full validation and test
# splits; plus the design document's literal one-target head (encoder, softmax) as the baseline.
#   bash scripts/wikitext2_grid.sh [output root] [run ...]     (default: outputs/wikitext2-90min, every run)
#   runs: decoder-softmax decoder-linear-elu decoder-linear-exp encoder-... set_transformer-... perceiver_io-...
#         encoder-window-softmax; a decayed linear run ends in -fixed or -gated (decoder-linear-elu-gated: not in the
#         default list)
# One run per core, one thread each, e.g. on a 2-core machine:
#   HFST_LAUNCH="taskset -c 0 env OMP_NUM_THREADS=1" bash scripts/wikitext2_grid.sh outputs/wikitext2-90min decoder-softmax ... &
#   HFST_LAUNCH="taskset -c 1 env OMP_NUM_THREADS=1" bash scripts/wikitext2_grid.sh outputs/wikitext2-90min encoder-softmax ... &
# A killed run continues from its newest complete checkpoint when started again (--resume_from_checkpoint true; the
# step count of its budget is kept in time_budget.json); a finished one (all_results.json) is skipped.
# A variant of the defaults for every run (the budget-length tuning runs): HFST_GRID_ARGS="--config_overrides k=v,...".
# Then: python scripts/lm_results.py outputs/wikitext2-90min --unigram ../shared/data/wikitext-2 \
#           --copy_to results/wikitext2-90min-v2 --plot results/wikitext2-90min-v2.png
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-outputs/wikitext2-90min}
shift || true
minutes=${HFST_MINUTES:-90}
data=${WIKITEXT2_DIR:-../shared/data/wikitext-2}
all=""
for family in decoder encoder set_transformer perceiver_io; do
  for attention in softmax linear-elu linear-exp; do all="$all $family-$attention"; done
done
runs=${*:-$all encoder-window-softmax}
for run in $runs; do
  family=${run%%-*}
  attention=${run#*-}
  mode=many
  decay=none
  case "$attention" in linear-*-fixed | linear-*-gated) decay=${attention##*-}; attention=${attention%-*} ;; esac
  case "$attention" in window-*) mode=window; attention=${attention#window-} ;; esac
  type=${attention%%-*}
  map=elu; [ "$attention" = linear-exp ] && map=exp
  extra=()
  [ "$mode" = window ] && extra=(--next_token_mode window --context_length 64)
  out="$root/$run"
  if [ -f "$out/all_results.json" ]; then echo "done already: $out"; continue; fi
  # shellcheck disable=SC2086  # HFST_LAUNCH and HFST_GRID_ARGS are word lists
  ${HFST_LAUNCH:-} python scripts/train_lm.py --family "$family" --attention_type "$type" --feature_map "$map" \
    --linear_attention_decay "$decay" \
    "${extra[@]}" --do_train --do_eval --do_predict \
    --train_file "$data/wiki.train.tokens" --validation_file "$data/wiki.valid.tokens" \
    --test_file "$data/wiki.test.tokens" --output_dir "$out" --max_train_minutes "$minutes" \
    --save_steps 250 --resume_from_checkpoint true --disable_tqdm true ${HFST_GRID_ARGS:-}
done
