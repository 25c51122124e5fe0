#!/usr/bin/env bash
# The README's tuning sweep: short runs of train_lm.py at a fixed training-time budget, each changing one setting from
# the defaults, scored on the first 60,000 validation tokens with the protocol.
#   bash scripts/wikitext2_sweep.sh [minutes] [output root] [run name ...]    (default: 8, outputs/sweep, every run)
# Two cores: run the two halves side by side, one core and one thread each, e.g.
#   HFST_LAUNCH="taskset -c 0 env OMP_NUM_THREADS=1" bash scripts/wikitext2_sweep.sh 8 outputs/sweep dec-base dec-lr1e-3 ...
# Then: python scripts/lm_results.py outputs/sweep   (or read validation_perplexity in each all_results.json)
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-8}
root=${2:-outputs/sweep}
shift 2 || true
data=${WIKITEXT2_DIR:-../shared/data/wikitext-2}
declare -A RUNS=(
  [dec-base]="--family decoder"
  [dec-fp32]="--family decoder --precision fp32"
  [dec-lr1e-3]="--family decoder --learning_rate 1e-3"
  [dec-lr4e-3]="--family decoder --learning_rate 4e-3"
  [dec-batch32]="--family decoder --per_device_train_batch_size 32"
  [dec-batch8]="--family decoder --per_device_train_batch_size 8"
  [dec-dropout0]="--family decoder --config_overrides hidden_dropout_prob=0.0,attention_probs_dropout_prob=0.0"
  [dec-dropout0.2]="--family decoder --config_overrides hidden_dropout_prob=0.2,attention_probs_dropout_prob=0.2"
  [dec-block256]="--family decoder --block_size 256 --per_device_train_batch_size 8"
  [dec-block64]="--family decoder --block_size 64 --per_device_train_batch_size 32"
  [dec-width256]="--family decoder --config_overrides hidden_size=256,intermediate_size=1024"
  [dec-depth6]="--family decoder --config_overrides num_hidden_layers=6"
  [dec-full-softmax]="--family decoder --config_overrides adaptive_softmax_cutoffs=null,tie_word_embeddings=true"
  [dec-heads2]="--family decoder --config_overrides num_attention_heads=2"
  [dec-elu]="--family decoder --attention_type linear --feature_map elu"
  [dec-elu-heads2]="--family decoder --attention_type linear --feature_map elu --config_overrides num_attention_heads=2"
  [dec-elu-heads1]="--family decoder --attention_type linear --feature_map elu --config_overrides num_attention_heads=1"
  [enc-base]="--family encoder"
  [enc-targets32]="--family encoder --target_length 32"
  [enc-targets128]="--family encoder --target_length 128"
  [enc-window]="--family encoder --next_token_mode window --context_length 64"
  [set-base]="--family set_transformer"
  [per-base]="--family perceiver_io"
)
names=${*:-${!RUNS[@]}}
for name in $names; do
  out="$root/$name"
  if [ -f "$out/all_results.json" ]; then echo "done already: $out"; continue; fi
  # shellcheck disable=SC2086
  ${HFST_LAUNCH:-} python scripts/train_lm.py ${RUNS[$name]} --do_train --do_eval \
    --train_file "$data/wiki.train.tokens" --validation_file "$data/wiki.valid.tokens" \
    --output_dir "$out" --max_train_minutes "$minutes" --max_eval_tokens 60000 \
    --resume_from_checkpoint true --disable_tqdm true
done
# bf16 against fp32 on the same steps (README, Precision):
#   for p in bf16 fp32; do OMP_NUM_THREADS=1 python scripts/train_lm.py --family decoder --precision $p --do_train \
#     --do_eval --train_file $data/wiki.train.tokens --validation_file $data/wiki.valid.tokens \
#     --output_dir outputs/precision/decoder-$p --max_steps 300 --logging_steps 25 --eval_steps 100 \
#     --save_strategy no --max_eval_tokens 20000 --disable_tqdm true; done
