"""hf_settransformer.toolkit.language_modeling: the word-level tokenizer, the training datasets and the evaluation protocol
(every token scored once, by causal LMs, many-target heads and one-target heads; fixed masked positions for masked
LMs), and the pieces that pick them for any head through its objective (toolkit.objectives): lm_training_dataset,
evaluate_stream, evaluate_perplexity, evaluation_protocol and the model card's fields."""

import math
from pathlib import Path

import pytest
import torch

import hf_settransformer as hfst
from hf_settransformer import toolkit
from hf_settransformer.toolkit import evaluate_stream
from hf_settransformer.toolkit.language_modeling import (
    BlockDataset,
    PackedLinesDataset,
    PackedRowsCollator,
    TargetWindowDataset,
    build_word_tokenizer,
    decoder_windows,
    masked_positions,
    target_windows,
    token_stream,
)

ROOT = Path(__file__).resolve().parents[2]


def test_word_tokenizer_vocabulary_and_eos():
    lines = [" the cat sat on the mat ", "", " = Heading = ", " the <unk> of the cat "]
    tokenizer = build_word_tokenizer(lines, model_max_length=64)
    words = {w for line in lines for w in line.split()}
    assert len(tokenizer) == len(words | {"<eos>", "<unk>", "<mask>"}) and tokenizer.model_max_length == 64
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 3]) == ["<unk>", "<eos>", "the", "cat"]  # by frequency
    assert tokenizer.eos_token == "<eos>" and tokenizer.unk_token == "<unk>" and tokenizer.pad_token == "<eos>"
    assert tokenizer.mask_token == "<mask>" and tokenizer.mask_token_id == len(tokenizer) - 1  # last: words keep ids
    stream = token_stream(["the dog", "", " of <unk> "], tokenizer, tokenizer.eos_token_id)
    eos, unk = tokenizer.eos_token_id, tokenizer.unk_token_id
    the, of = tokenizer.convert_tokens_to_ids(["the", "of"])
    assert stream.tolist() == [the, unk, eos, eos, of, unk, eos]  # unknown "dog" -> <unk>; an <eos> per line
    # decoding keeps word boundaries, also for a continuation decoded on its own (text-generation pipeline)
    assert tokenizer.decode([the, of]).strip() == "the of" and tokenizer.decode([of]) == " of"


def test_wikitext2_vocabulary_is_the_standard_33278():
    data = ROOT.parent / "shared" / "data" / "wikitext-2" / "wiki.train.tokens"
    if not data.is_file():
        pytest.skip("the shared WikiText-2 copy is not beside this checkout")
    lines = data.read_text(encoding="utf-8").split("\n")[:-1]
    tokenizer = build_word_tokenizer(lines)
    assert len(tokenizer) == 33278 + 1  # the standard 33,278 (words, <unk>, <eos>) and <mask>
    assert tokenizer.convert_ids_to_tokens([0, 1, 2, 33277, 33278]) == ["<unk>", "<eos>", "the", "gallinae", "<mask>"]
    assert len(token_stream(lines, tokenizer, tokenizer.eos_token_id)) == 2088628


def test_datasets_cover_the_stream():
    stream = torch.arange(40)
    blocks = BlockDataset(stream, 8)
    assert len(blocks) == 5 and torch.equal(blocks[1]["input_ids"], torch.arange(8, 16))
    windows = TargetWindowDataset(stream, context_length=10, target_length=5)
    # each window trains its last 4 labels (positions 6..9 predict tokens 7..10 of the window): consecutive windows
    # start 4 apart, so every token after the first prefix is a target once
    trained = [int(w["input_ids"][0]) + k for w in windows for k in range(6, 10)]
    assert trained == list(range(6, 6 + len(trained))) and trained[-1] >= 40 - 4
    with pytest.raises(ValueError, match="block_size >= 2"):
        BlockDataset(stream, 0)
    with pytest.raises(ValueError, match="2 <= target_length <= context_length"):
        TargetWindowDataset(stream, 10, 11)


# ------------------------------------------------------------------------------------------------ protocol



def test_packed_lines_fill_rows_with_each_line_a_sequence_of_its_own():
    eos = 0
    lines = [[5, 6, 7], [], [8], [9, 10, 11, 12, 13], [], [14, 15]]  # empty lines: an eos alone, left out
    stream = torch.tensor([t for line in lines for t in line + [eos]])
    data = PackedLinesDataset(stream, block_size=6, eos_id=eos)
    assert len(data) == 2  # 4 + 2 + 6 + 3 = 15 tokens in non-empty lines: two rows of 6
    first, second = data[0], data[1]
    assert first["input_ids"].tolist() == [5, 6, 7, 0, 8, 0]
    assert first["position_ids"].tolist() == [0, 1, 2, 3, 0, 1]
    assert first["labels"].tolist() == [-100, 6, 7, 0, -100, 0]
    # the third line does not fit the first row: its rest begins the second row as a sequence of its own
    assert second["input_ids"].tolist() == [9, 10, 11, 12, 13, 0]
    assert second["position_ids"].tolist() == [0, 1, 2, 3, 4, 5]
    assert second["labels"][0] == -100
    with pytest.raises(ValueError, match="packed row of 64 tokens"):
        PackedLinesDataset(stream, block_size=64, eos_id=eos)


def test_a_packed_batch_gives_the_loss_of_its_lines_trained_alone():
    """The packed rows' causal-LM loss sums exactly the losses of their sequences, each read alone; a block without
    positions (the periodic evaluation's) is one sequence."""
    torch.manual_seed(0)
    model = hfst.TransformerDecoderForCausalLM(hfst.TransformerDecoderConfig(
        vocab_size=20, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
        attention_type="linear", linear_attention_chunk_size=4)).eval()
    stream = torch.tensor([3, 4, 5, 0, 6, 7, 8, 9, 10, 0, 11, 12, 0, 13, 14, 15, 16, 0])
    data = PackedLinesDataset(stream, block_size=6, eos_id=0)
    batch = PackedRowsCollator()([data[0], data[1], {"input_ids": torch.tensor([1, 2, 3]),
                                                     "labels": torch.tensor([1, 2, 3])}])
    assert batch["input_ids"].shape == batch["labels"].shape == batch["position_ids"].shape == (1, 15)
    with torch.no_grad():
        packed = model(**batch).loss * (batch["labels"][0, 1:] != -100).sum()
        ids, starts = batch["input_ids"][0], (batch["position_ids"][0] == 0).nonzero().flatten().tolist() + [15]
        alone = sum(model(input_ids=ids[a:b][None], labels=ids[a:b][None]).loss * (b - a - 1)
                    for a, b in zip(starts, starts[1:]) if b - a > 1)
    torch.testing.assert_close(packed, alone)

def test_a_packed_masked_lm_row_is_masked_as_the_masked_lm_collator_masks():
    """With a masked LM's collator, the packed row's inputs and labels are its masking of the row (BERT's: labels at
    the chosen tokens only, -100 elsewhere); the positions still restart at every line."""
    from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast
    from tokenizers import Tokenizer, models

    vocab = {f"w{i}": i for i in range(20)} | {"[MASK]": 20, "[PAD]": 21}
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="w1")),
                                        mask_token="[MASK]", pad_token="[PAD]")
    stream = torch.tensor([3, 4, 5, 0, 6, 7, 8, 9, 10, 0, 11, 12, 0, 13, 14, 15, 16, 0] * 8)
    data = PackedLinesDataset(stream, block_size=12, eos_id=0)
    items = [data[i] for i in range(len(data))]
    masking = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.5)
    torch.manual_seed(0)
    batch = PackedRowsCollator(masking=masking)(items)
    torch.manual_seed(0)
    expected_ids, expected_labels = masking.torch_mask_tokens(torch.cat([x["input_ids"] for x in items])[None])
    assert torch.equal(batch["input_ids"], expected_ids) and torch.equal(batch["labels"], expected_labels)
    assert torch.equal(batch["position_ids"], torch.cat([x["position_ids"] for x in items])[None])
    chosen = batch["labels"] != -100
    original = torch.cat([x["input_ids"] for x in items])[None]
    assert 0 < int(chosen.sum()) < chosen.numel() and torch.equal(batch["labels"][chosen], original[chosen])
    assert (batch["input_ids"][chosen] == 20).any() and torch.equal(batch["input_ids"][~chosen], original[~chosen])


@pytest.mark.parametrize("stride", [1, 3, 7])
def test_decoder_windows_score_every_token_once_with_enough_context(stride):
    n, block = 23, 8
    scored = []
    for begin, end, count in decoder_windows(n, block, stride):
        assert end - begin <= block and 1 <= count <= end - begin - 1
        for position in range(end - count, end):
            scored.append(position)
            assert position - begin >= min(block - stride, position)  # full context, or everything before it
    assert scored == list(range(1, n + 1))  # positions of [eos] + stream: every token once, in order


def test_target_windows_score_every_token_once_with_enough_context():
    n, context, targets = 29, 8, 3
    scored = []
    for begin, end, count in target_windows(n, context, targets):
        assert end - begin <= context and 1 <= count <= targets
        for token in range(end - count + 1, end + 1):  # predicted by position token - 1 of the window
            scored.append(token)
            assert token - begin >= min(context - targets + 1, token)
    assert scored == list(range(1, n + 1))


@pytest.mark.parametrize("stride", [0, 8, 9, -3, True])
def test_strides_that_cannot_score_every_token_are_refused(stride):
    """A window predicts its positions after the first: a stride of a whole block would leave a token per window
    unscored (or, before the check, crash on mismatched shapes)."""
    with pytest.raises(ValueError, match=r"stride must be an integer in \[1, block_size - 1=7\]"):
        decoder_windows(20, 8, stride)


def head(family, mode="many", vocab=50, **fields):
    cls = {"decoder": hfst.TransformerDecoderForCausalLM, "encoder": hfst.TransformerEncoderForNextTokenPrediction}
    config_cls = {"decoder": hfst.TransformerDecoderConfig, "encoder": hfst.TransformerEncoderConfig}
    extra = {} if family == "decoder" else dict(context_length=6, target_length=3, next_token_mode=mode)
    torch.manual_seed(0)
    config = config_cls[family](
        vocab_size=vocab, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, tie_word_embeddings=False,
        **{**extra, **fields},
    )
    return cls[family](config).eval()


@pytest.mark.parametrize("family,mode", [("decoder", None), ("encoder", "many"), ("encoder", "window")])
def test_uniform_model_has_perplexity_equal_to_the_vocabulary(family, mode, capsys):
    vocab, n = 50, 37
    model = head(family, mode, vocab)
    torch.nn.init.zeros_(model.lm_head.weight)  # every next token equally likely
    stream = torch.randint(2, vocab, (n,))
    metrics = evaluate_stream(model, stream, batch_size=4, block_size=6, stride=4, eos_id=1, progress="test")
    assert metrics["tokens"] == n
    assert metrics["perplexity"] == pytest.approx(vocab, rel=1e-5)
    assert "test: 100%" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_protocol_equals_one_full_pass_when_the_window_covers_the_split(family):
    """Decoder: one window of 32 > split. Many-target encoder with target_length = context_length: no prefix, one
    causal pass predicts every token."""
    fields = {} if family == "decoder" else dict(context_length=32, target_length=32)
    model = head(family, vocab=30, **fields)
    stream = torch.randint(2, 30, (19,))
    metrics = evaluate_stream(model, stream, batch_size=4, block_size=32, stride=16, eos_id=1)
    full = torch.cat([torch.tensor([1]), stream])
    with torch.no_grad():
        logits = model(input_ids=full[None, :-1]).logits[0]
    nll = torch.nn.functional.cross_entropy(logits, full[1:], reduction="sum").item()
    assert metrics["tokens"] == 19
    assert metrics["perplexity"] == pytest.approx(math.exp(nll / 19), rel=1e-5)
    assert metrics["accuracy"] == pytest.approx((logits.argmax(-1) == full[1:]).float().mean().item())


def test_many_target_protocol_equals_scoring_each_token_with_its_own_window():
    """Each token is scored by the window that ends right before it, with the protocol's prefix."""
    model = head("encoder", context_length=6, target_length=3)
    stream = torch.randint(2, 50, (17,))
    metrics = evaluate_stream(model, stream, batch_size=3, eos_id=1)
    full = torch.cat([torch.tensor([1]), stream])
    nll = 0.0
    with torch.no_grad():
        for begin, end, count in target_windows(17, 6, 3):
            for token in range(end - count + 1, end + 1):
                window = full[begin:token]  # ends right before the token; same prefix as in the full window
                logits = model(input_ids=window[None], prefix_length=end - begin - count).logits[0, -1]
                nll -= torch.log_softmax(logits, -1)[full[token]].item()
    assert metrics["tokens"] == 17 and metrics["nll"] == pytest.approx(nll, rel=1e-5)


def test_masked_protocol_masks_the_same_non_special_positions_on_every_call():
    """evaluate_masked_stream: 15% of each block's non-special positions, drawn once per seed (the same on every
    call, so runs compare); a model whose output ignores its input scores log(vocab) per masked token."""
    vocab = 40
    config = hfst.TransformerEncoderConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, context_length=8, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = hfst.TransformerEncoderForMaskedLM(config)
    torch.nn.init.zeros_(model.lm_head.weight)
    stream = torch.randint(2, vocab - 1, (64,))
    stream[::5] = 1  # <eos>, special: never masked
    first = toolkit.evaluate_masked_stream(model, stream, 8, vocab - 1, special_ids=[1])
    assert first == toolkit.evaluate_masked_stream(model, stream, 8, vocab - 1, special_ids=[1])
    expected = sum(max(1, round(0.15 * int((block != 1).sum()))) for block in stream.view(-1, 8))
    assert first["tokens_scored"] == expected
    assert first["perplexity"] == pytest.approx(vocab, rel=1e-5)
    mask = masked_positions(20, 0.5, torch.Generator().manual_seed(1), torch.arange(20) < 10)
    assert mask.sum() == 5 and not mask[:10].any()


# ------------------------------------------------------------------------------------------------ any head


def masked_head(vocab=50):
    config = hfst.TransformerEncoderConfig(vocab_size=vocab, hidden_size=16, num_hidden_layers=1,
                                           num_attention_heads=2, context_length=6)
    torch.manual_seed(0)
    return hfst.TransformerEncoderForMaskedLM(config).eval()


def test_lm_training_dataset_is_the_one_each_head_trains_on():
    stream = torch.arange(60)
    blocks = toolkit.lm_training_dataset(head("decoder"), stream, block_size=8)
    assert isinstance(blocks, BlockDataset) and len(blocks) == 7 and torch.equal(blocks[0]["labels"], torch.arange(8))
    masked = toolkit.lm_training_dataset(masked_head(), stream)
    assert isinstance(masked, BlockDataset) and set(masked[0]) == {"input_ids"} and len(masked[0]["input_ids"]) == 6
    many = toolkit.lm_training_dataset(head("encoder", "many"), stream)
    assert isinstance(many, TargetWindowDataset) and many[0]["input_ids"].shape == (6,)
    one = toolkit.lm_training_dataset(head("encoder", "window"), stream, num_targets=10, seed=3)
    assert isinstance(one, toolkit.language_modeling.WindowDataset) and len(one) == 10 and one[0]["labels"].shape == ()
    assert torch.equal(one.positions, toolkit.language_modeling.WindowDataset(stream, 6, 10, seed=3).positions)
    example_length = toolkit.objectives.example_length
    assert example_length(head("encoder")) == 6 and example_length(head("decoder"), 8) == 8
    with pytest.raises(ValueError, match="pass block_size"):
        toolkit.objectives.example_length(head("decoder"))
    assert toolkit.objectives.is_masked_lm(masked_head()) and not toolkit.objectives.is_masked_lm(head("encoder"))


class SplitAccelerator:
    """What evaluate_perplexity asks of an `accelerate.Accelerator`: this process's rank; `reduce` hands the sums back
    unreduced, so the test can add the ranks' up itself."""

    device = torch.device("cpu")

    def __init__(self, rank, world_size):
        self.process_index, self.num_processes = rank, world_size

    def reduce(self, tensor, reduction="sum"):
        return tensor


@pytest.mark.parametrize("kind", ["decoder", "many", "window", "masked"])
def test_evaluate_perplexity_is_the_heads_protocol_and_splits_between_processes(kind):
    tokenizer = build_word_tokenizer([" ".join(f"w{i}" for i in range(45))])  # 48 ids: <unk>, <eos>, words, <mask>
    vocab = len(tokenizer)
    family = {"decoder": "decoder", "masked": None}.get(kind, "encoder")
    model = masked_head(vocab) if family is None else head(family, kind, vocab)
    stream = torch.randint(2, vocab - 1, (41,))
    whole = toolkit.evaluate_perplexity(model, stream, tokenizer, batch_size=4, block_size=6, stride=4)
    if kind == "masked":
        reference = toolkit.evaluate_masked_stream(model, stream, 6, tokenizer.mask_token_id, batch_size=4,
                                                special_ids=tokenizer.all_special_ids)
        assert whole["nll"] == pytest.approx(reference["loss_sum"])
        assert whole["tokens_scored"] == reference["tokens_scored"] == 6  # one of 6 positions in each of 6 blocks
    else:
        reference = evaluate_stream(model, stream, batch_size=4, block_size=6, stride=4,
                                    eos_id=tokenizer.eos_token_id)
        assert whole["nll"] == pytest.approx(reference["nll"]) and whole["tokens_scored"] == len(stream)
    assert whole["perplexity"] == pytest.approx(reference["perplexity"])
    assert whole["accuracy"] == pytest.approx(reference["accuracy"])
    parts = [toolkit.evaluate_perplexity(model, stream, tokenizer, batch_size=4, block_size=6, stride=4,
                                      accelerator=SplitAccelerator(rank, 2)) for rank in (0, 1)]
    assert parts[0]["tokens_scored"] > 0 and parts[1]["tokens_scored"] > 0
    assert sum(p["tokens_scored"] for p in parts) == whole["tokens_scored"]
    assert sum(p["nll"] for p in parts) == pytest.approx(whole["nll"])


def test_evaluation_protocol_names_the_windows():
    assert toolkit.evaluation_protocol(head("decoder"), block_size=8) == "sliding window 8, stride 4"
    assert toolkit.evaluation_protocol(head("decoder"), block_size=8, stride=3) == "sliding window 8, stride 3"
    assert toolkit.evaluation_protocol(head("encoder")) == "windows of 6, the last 3 positions scored"
    assert toolkit.evaluation_protocol(head("encoder", "window")) == "every position, up to 6 preceding tokens"
    assert toolkit.evaluation_protocol(masked_head()) == (
        "blocks of 6, 15% of each block's tokens masked (fixed positions) and predicted from the rest"
    )


RESULTS = dict(parameters=12345, validation_perplexity=101.234, test_perplexity=99.5, validation_accuracy=0.2,
               test_accuracy=0.25, train_tokens=4096, train_tokens_per_wall_second=512.0,
               train_tokens_per_cpu_second=None, wall_time_seconds=90.0,
               eval_protocol="the protocol", cpu_model="a CPU", threads_per_process=2, precision="bf16",
               train_cpu_minutes=None, train_steps=64, device="cpu x 1")


@pytest.mark.parametrize("kind", ["decoder", "many", "window", "masked"])
def test_the_model_card_fields_fill_every_field_of_the_templates(tmp_path, kind):
    model = masked_head() if kind == "masked" else head("decoder" if kind == "decoder" else "encoder", kind)
    fields = toolkit.cards.lm_model_card_fields(model, RESULTS, block_size=8)
    template = toolkit.cards.CARD_TEMPLATES / ("mlm_model_card.md" if kind == "masked" else "lm_model_card.md")
    card = toolkit.cards.write_model_card(tmp_path, template, **fields, repo_id="me/tiny", command="python train.py",
                                    data_note="", model_index="")
    text = card.read_text()
    assert "${" not in text.replace("$${", "")  # every field filled
    assert "me/tiny" in text and "101.23" in text and "12,345" in text and "python train.py" in text
    assert fields["family"] == ("decoder" if kind == "decoder" else "encoder")
    assert fields["cpu_minutes"] == "unknown" and fields["context"] == (8 if kind == "decoder" else 6)
    assert ("Causal LM" in fields["design"]) == (kind == "decoder")
    assert ("one prediction per window" in fields["design"]) == (kind == "window")
    assert ("kept as a baseline" in fields["design"]) == (kind == "window")  # the literal head says it is one
    assert ("Masked LM" in fields["design"]) == (kind == "masked")
    # without a CPU-minute record: this process's wall speed; without a checkpoint selection: the last step
    assert fields["training_speed"] == "512 tokens per wall second" and fields["weights"] == "the last step (64)"
    assert fields["wall_time"] == "1.5 min"


def test_the_model_card_says_which_weights_and_the_whole_runs_speed():
    """A resumed run with a best-checkpoint selection: the card names the selected step, the speed over the whole run
    in CPU-seconds (4,096 tokens in 0.5 CPU-minutes) and that the wall time is the last process's."""
    results = dict(RESULTS, train_cpu_minutes=0.5, train_tokens_per_cpu_second=4096 / 30, resumed_from_step=32,
                   selected_step=48, selected_by="best eval_loss")
    fields = toolkit.cards.lm_model_card_fields(head("decoder"), results, block_size=8)
    assert fields["training_speed"] == "137 tokens per CPU-second; 512 tokens per wall second"
    assert fields["weights"].startswith("step 48 of 64: the checkpoint with the lowest validation loss")
    assert fields["wall_time"] == "1.5 min (the last process: resumed at step 32)"
    last = dict(results, selected_by="last step", selected_step=64)
    fields = toolkit.cards.lm_model_card_fields(head("decoder"), last)
    assert fields["weights"] == "the last step (64)"


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
def test_lm_flops_per_token_is_six_n_plus_the_attention(tied, attention_type):
    """PaLM's count for the decoder: 6 x (parameters without the input embedding, the output layer counted whether or
    not it is tied to it) + 12 x layers x width x keys (the sequence for softmax, the head dimension for linear)."""
    config = hfst.TransformerDecoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                                           tie_word_embeddings=tied, attention_type=attention_type)
    model = hfst.TransformerDecoderForCausalLM(config)
    total = sum(p.numel() for p in model.parameters())
    n = total if tied else total - 50 * 16  # tied: the one 50 x 16 matrix is the output layer
    keys = 128 if attention_type == "softmax" else 8
    flops, words = toolkit.language_modeling.lm_flops_per_token(model, 128)
    assert flops == 6 * n + 12 * 2 * 16 * keys
    assert f"N={n:,} parameters" in words and "L=2 attention modules" in words and "d=16" in words


def test_the_model_card_reports_model_flops_and_mfu():
    """On a GPU: the FLOPs per token, the achieved TFLOP/s and the MFU against the GPU's peak, the GPU named beside the
    CPU, and the speed in tokens per wall second (CPU-seconds do not measure a GPU run). On a CPU: no MFU, and why."""
    flops = dict(model_flops_per_token=1e9, model_flops_formula="6N + 12LdK: the count")
    gpu = dict(RESULTS, gpu_name="NVIDIA H100 80GB HBM3", train_cpu_minutes=3.0, train_tokens_per_wall_second=4e5,
               **flops, **toolkit.measure.model_flops_utilization(4e5, 1e9, "NVIDIA H100 80GB HBM3", "bf16"))
    fields = toolkit.cards.lm_model_card_fields(head("decoder"), gpu, block_size=8)
    assert fields["model_flops"] == ("1,000.0 MFLOP per training token (6N + 12LdK: the count); 400 TFLOP per wall "
                                     "second, **MFU "
                                     "40.4%** of NVIDIA H100 80GB HBM3: 989.4 TFLOPS bf16 dense tensor-core peak "
                                     "(NVIDIA datasheet)")
    assert fields["hardware"] == "NVIDIA H100 80GB HBM3, CPU a CPU"
    assert fields["training_speed"] == "400,000 tokens per wall second"
    cpu = dict(RESULTS, **flops, **toolkit.measure.model_flops_utilization(512.0, 1e9, None, "bf16"))
    fields = toolkit.cards.lm_model_card_fields(head("decoder"), cpu, block_size=8)
    assert fields["model_flops"].endswith("; 0.512 TFLOP per wall second; MFU not measured: no peak table for CPUs")
    assert fields["hardware"] == "a CPU"
    fields = toolkit.cards.lm_model_card_fields(head("decoder"), RESULTS, block_size=8)
    assert fields["model_flops"].startswith("not recorded")


@pytest.mark.parametrize("count,world_size", [(0, 2), (1, 3), (5, 2), (6, 3), (7, 4)])
def test_every_process_makes_the_same_number_of_passes_and_scores_each_batch_once(count, world_size):
    """A sharded model needs every process in every forward: the evaluation's passes are as many on each process, and
    the scored ones cover the batches once."""
    from hf_settransformer.toolkit.language_modeling import _passes

    batches = list(range(count))
    passes = [_passes(batches, rank, world_size) for rank in range(world_size)]
    assert len({len(p) for p in passes}) == 1
    assert sorted(b for p in passes for b, scored in p if scored) == batches
