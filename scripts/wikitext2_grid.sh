#!/usr/bin/env bash
# The README's WikiText-2 table: every family x {softmax, linear elu, linear exp} at the `small` preset with the
# same token budget (3,000,000 input tokens through the model), evaluated with the protocol of train_lm.py.
#   bash scripts/wikitext2_grid.sh [output root] [family ...]      (default: outputs/wikitext2, all families)
# HFST_LAUNCH prefixes each run, e.g. HFST_LAUNCH="taskset -c 0 env OMP_NUM_THREADS=1" pins the grid to one core.
# Then: python scripts/lm_results.py outputs/wikitext2   (table + validation-perplexity-vs-time plot)
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-outputs/wikitext2}
shift || true
families=${*:-decoder encoder set_transformer perceiver_io}
data=${WIKITEXT2_DIR:-../shared/data/wikitext-2}
for family in $families; do
  for attention in softmax linear-elu linear-exp; do
    type=${attention%%-*}
    map=elu; [ "$attention" = linear-exp ] && map=exp
    out="$root/$family-$attention"
    if [ -f "$out/all_results.json" ]; then echo "done already: $out"; continue; fi
    ${HFST_LAUNCH:-} python scripts/train_lm.py --family "$family" --attention_type "$type" --feature_map "$map" --preset small \
      --do_train --do_eval --do_predict \
      --train_file "$data/wiki.train.tokens" --validation_file "$data/wiki.valid.tokens" \
      --test_file "$data/wiki.test.tokens" --output_dir "$out" \
      --train_token_budget 3000000 --per_device_train_batch_size 32 --per_device_eval_batch_size 64 \
      --learning_rate 1e-3 --warmup_steps 0.05 --weight_decay 0.01 --lr_scheduler_type cosine \
      --eval_strategy steps --eval_steps 100 --logging_steps 50 --save_strategy steps --save_steps 500 \
      --save_total_limit 1 --resume_from_checkpoint true --report_to none --disable_tqdm true --seed 0
  done
done
