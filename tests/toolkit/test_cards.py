"""hf_settransformer.toolkit.cards: the model card a run's folder and its Hub repository carry. A Hub reader must be
able to act on it: the configuration it shows is the one that bears on the model, it links nowhere that does not
exist, and its training command loads the data by its `datasets` name where the run read WikiText-2's own files."""

import json
import re

import pytest
import torch

import hf_settransformer as hfst
from hf_settransformer import toolkit

RESULTS = dict(family=None, parameters=12345, validation_perplexity=101.234, test_perplexity=99.5,
               validation_accuracy=0.2, test_accuracy=0.25, train_tokens=4096, train_tokens_per_wall_second=512.0,
               train_tokens_per_cpu_second=None, wall_time_seconds=90.0, eval_protocol="the protocol", cpu_model="a CPU",
               threads_per_process=2, precision="bf16", train_cpu_minutes=None, train_steps=64, device="cpu x 1")
WIKITEXT2 = {split: {"path": f"data/wiki.{name}.tokens", "sha256": digest}
             for (split, digest), name in zip(toolkit.cards.WIKITEXT2_SHA256.items(), ("train", "valid", "test"))}
COMMAND = ("python scripts/train_lm.py --family decoder --do_train --do_eval --do_predict --train_file "
           "data/wiki.train.tokens --validation_file=data/wiki.valid.tokens --test-file data/wiki.test.tokens "
           "--output_dir out")
# config fields of the windowed next-token heads, and of linear attention only
WINDOW_FIELDS = {"pooling", "context_length", "next_token_mode", "target_length"}
LINEAR_FIELDS = {"feature_map", "linear_attention_chunk_size"}


def model(family, head="next_token", attention_type="softmax", **fields):
    config_class = hfst.FAMILIES[family].config_class()
    extra = {"set_transformer": dict(num_hidden_layers=1, num_inducing_points=2),
             "perceiver_io": dict(num_latents=4, num_self_attends_per_block=1)}.get(family, dict(num_hidden_layers=1))
    config = config_class(vocab_size=50, hidden_size=16, num_attention_heads=2,
                          attention_type=attention_type, **({} if family == "decoder" else {"context_length": 6}),
                          **extra, **fields)
    auto = {"masked": "AutoModelForMaskedLM"}.get(head, "AutoModelForCausalLM")
    torch.manual_seed(0)
    return hfst.FAMILIES[family].model_classes()[auto](config)


def card(tmp_path, lm, results=RESULTS, command="python scripts/train_lm.py --do_train", repo_id="me/tiny"):
    results = dict(results, family=results["family"] or lm.config.model_type.removeprefix("hfst_"))
    return toolkit.write_lm_model_card(tmp_path, lm, results, 8, repo_id, command).read_text()


def card_json(text):
    return json.loads(re.search(r"```json\n(.*?)\n```", text, flags=re.S).group(1))


@pytest.mark.parametrize("family,head,attention,fields,absent", [
    ("decoder", "causal", "softmax", {}, WINDOW_FIELDS | LINEAR_FIELDS | {"input_size", "adaptive_softmax_div_value"}),
    ("decoder", "causal", "linear", {}, WINDOW_FIELDS),
    ("encoder", "many", "softmax", {}, LINEAR_FIELDS),
    ("encoder", "window", "linear", {"next_token_mode": "window"}, {"target_length"}),
    ("encoder", "masked", "softmax", {}, WINDOW_FIELDS - {"context_length"}),
    ("set_transformer", "many", "softmax", {"adaptive_softmax_cutoffs": [10]}, LINEAR_FIELDS),
    ("perceiver_io", "masked", "linear", {}, WINDOW_FIELDS - {"context_length"} | {"num_output_queries"}),
])
def test_the_card_shows_the_config_fields_that_apply_to_the_model(tmp_path, family, head, attention, fields, absent):
    """No `pooling` or `target_length` on the decoder, no linear attention's fields under softmax, no width
    divisor of an adaptive layer that is off; what does apply stays, with config.json's values."""
    lm = model(family, "masked" if head == "masked" else head, attention, **fields)
    shown = card_json(card(tmp_path, lm))
    assert shown == toolkit.cards.card_config(lm)
    assert not absent & set(shown), absent & set(shown)
    saved = {k: v for k, v in json.loads(lm.config.to_json_string()).items() if k in shown}
    assert shown == saved  # the values config.json holds
    assert {"hidden_size", "num_attention_heads", "attention_type", "vocab_size", "model_type"} <= set(shown)
    if attention == "linear":
        assert LINEAR_FIELDS <= set(shown)
    if head == "many":
        assert WINDOW_FIELDS <= set(shown)
    if head in ("window", "masked"):
        assert "context_length" in shown
    if fields.get("adaptive_softmax_cutoffs"):
        assert "adaptive_softmax_div_value" in shown


@pytest.mark.parametrize("family,head", [("decoder", "causal"), ("encoder", "masked")])
def test_the_card_links_nowhere_that_does_not_exist_and_names_the_package(tmp_path, family, head):
    """No PyPI page (there is none), no link at all; the package's name, and loading needs only remote code."""
    text = card(tmp_path, model(family, head))
    assert "pypi.org" not in text and not re.search(r"\]\((?!#)", text), re.findall(r"\[[^\]]*\]\([^)]*\)", text)
    assert "`hf-settransformer`" in text and "trust_remote_code=True" in text
    assert "hf_settransformer.evaluate" not in text  # the evaluation functions are the toolkit's
    for name in re.findall(r"`hf_settransformer\.toolkit\.(\w+)`", text):
        assert hasattr(toolkit, name), name


def test_a_run_on_wikitext2_files_gets_the_datasets_command(tmp_path):
    """The recipe a Hub reader can run. Local files byte-identical to WikiText-2's (by SHA-256) become
    `--dataset_name wikitext --dataset_config_name wikitext-2-v1`, in every spelling of the file flags; the card says
    what the run read."""
    text = card(tmp_path, model("decoder", "causal"), dict(RESULTS, data_files=WIKITEXT2), COMMAND)
    command = re.search(r"```bash\n(.*?)\n```", text, flags=re.S).group(1)
    assert command == ("python scripts/train_lm.py --family decoder --do_train --do_eval --do_predict --output_dir out "
                       "--dataset_name wikitext --dataset_config_name wikitext-2-v1")
    assert "local copies of WikiText-2's files" in text and "wiki.train.tokens" not in text


@pytest.mark.parametrize("data_files,note", [
    (None, ""),  # loaded through `datasets`: the command is runnable as it is
    ({**WIKITEXT2, "train": {"path": "mine/train.txt", "sha256": "0" * 64}}, "(`train.txt`, `wiki.valid.tokens`"),
    ({"train": WIKITEXT2["train"]}, "(`wiki.train.tokens`)"),  # no validation file: `datasets` would add one
])
def test_other_local_data_keeps_its_command_and_the_card_says_so(data_files, note):
    command = "python scripts/train_lm.py --dataset_name wikitext --output_dir out"
    if data_files:
        command = "python scripts/train_lm.py " + " ".join(
            f"--{'validation' if s == 'validation' else s}_file {r['path']}" for s, r in data_files.items())
    written, sentence = toolkit.cards.hub_training_command(command, data_files)
    assert written == command
    assert (note in sentence and "not published with this model" in sentence) if note else sentence == ""


@pytest.mark.parametrize("flag", ["--output_dir /home/me/runs/decoder-softmax", "--output_dir=/home/me/runs/decoder-softmax",
                                  "--output-dir /home/me/runs/decoder-softmax"])
@pytest.mark.parametrize("data_files", [None, WIKITEXT2])
def test_the_card_command_names_the_run_folder_not_the_training_machines_path(flag, data_files):
    """An absolute `--output_dir` is a folder of the machine that trained: the card's command keeps its name only, a
    relative one stays as it was run."""
    command = f"python scripts/train_lm.py --family decoder {flag} --seed 1"
    written, _ = toolkit.cards.hub_training_command(command, data_files)
    assert "/home/me" not in written and "decoder-softmax --seed 1" in written
    kept = "python scripts/train_lm.py --output_dir outputs/decoder-softmax"
    assert toolkit.cards.hub_training_command(kept)[0] == kept


@pytest.mark.parametrize("fast,words", [(True, "(a CPU with a bf16 kernel (AVX512-BF16 or AMX), 2 thread(s), bf16)"),
                                         (False, "(a CPU without a bf16 kernel, 2 thread(s), bf16)"),
                                         (None, "(a CPU, 2 thread(s), bf16)")])  # results from before the record
def test_the_card_names_the_cpu_kind_a_cpu_figure_depends_on(tmp_path, fast, words):
    """A bf16 run is about 300x slower on a CPU without a bf16 kernel: the card's hardware says which kind ran it."""
    results = dict(RESULTS, train_tokens_per_cpu_second=500.0, **({} if fast is None else {"cpu_fast_bf16": fast}))
    assert words in card(tmp_path, model("decoder"), results)


def test_data_file_record_holds_each_files_sha256(tmp_path):
    (tmp_path / "train.txt").write_text(" the cat \n")
    record = toolkit.cards.data_file_record({"train": tmp_path / "train.txt"})
    import hashlib

    assert record == {"train": {"path": str(tmp_path / "train.txt"),
                                "sha256": hashlib.sha256(b" the cat \n").hexdigest()}}


@pytest.mark.parametrize("unmeasured,kept", [
    (("test_perplexity", "test_accuracy"), "| validation perplexity |"),  # no --do_predict
    (("validation_perplexity", "validation_accuracy"), "| test perplexity |"),  # no --do_eval
    (("validation_perplexity", "validation_accuracy", "test_perplexity", "test_accuracy"), None),
    (("train_tokens", "train_tokens_per_wall_second", "train_tokens_per_cpu_second", "train_steps", "train_cpu_minutes"),
     "| test perplexity |"),
])
@pytest.mark.parametrize("head", ["causal", "masked"])
def test_what_a_run_did_not_measure_is_left_out_of_its_card(tmp_path, unmeasured, kept, head):
    """Every pushed model has a card, and a card shows only what the run measured: a split not evaluated
    has no row and no model-index entry (none at all without evaluation), a run that did not train has no training
    rows; nothing reads "None" or "nan". A NaN in the results counts as not measured."""
    lm = model("decoder", "causal") if head == "causal" else model("encoder", "masked")
    results = {k: v for k, v in RESULTS.items() if k not in unmeasured}
    if "train_tokens" not in unmeasured:
        results["train_tokens_per_wall_second"] = float("nan")  # trained, but no step timed in this process
    text = card(tmp_path, lm, results)
    head_text = text.split("```json")[0]
    assert "None" not in head_text and "nan" not in text.lower() and "${" not in text
    evaluated = [split for split in ("validation", "test") if f"{split}_perplexity" in results]
    assert re.findall(r"split: (\w+)", text) == evaluated
    assert ("model-index:" in text) == bool(evaluated)
    assert text.startswith("---\n") and text.count("\n---\n") == 1  # the metadata block stays closed
    for split in ("validation", "test"):
        assert (f"| {split} " in text) == (split in evaluated)
    assert ("| training tokens |" in text) == ("train_tokens" in results)
    assert ("| training budget |" in text) == ("train_steps" in results)
    assert "| training speed |" not in text  # unmeasured, or NaN
    if kept:
        assert kept.replace("perplexity", "masked-token perplexity") in text if head == "masked" else kept in text


@pytest.mark.parametrize("head", ["causal", "masked"])
def test_the_card_says_how_many_of_each_splits_tokens_were_scored(tmp_path, head):
    """A run evaluated with --max_eval_tokens scored the first N tokens of each split: its card says how many of how
    many, and does not claim the whole split; a run that scored the whole split says so."""
    lm = model("decoder", "causal") if head == "causal" else model("encoder", "masked")
    words = "masked tokens" if head == "masked" else "tokens"
    scored = 3_000 if head == "masked" else 20_000
    cut = dict(RESULTS, validation_tokens_scored=scored, validation_tokens_evaluated=20_000,
               validation_split_tokens=217_646, test_tokens_scored=scored, test_tokens_evaluated=20_000,
               test_split_tokens=245_569)
    text = card(tmp_path, lm, cut)
    assert f"{scored:,} {words} of the first 20,000 of the split's 217,646 (`--max_eval_tokens`)" in text
    assert f"{scored:,} {words} of the first 20,000 of the split's 245,569 (`--max_eval_tokens`)" in text
    assert "whole split" not in text.split("## Use")[0]
    whole = dict(cut, validation_tokens_evaluated=217_646, validation_tokens_scored=217_646,
                 test_tokens_evaluated=245_569, test_tokens_scored=245_569)
    text = card(tmp_path, lm, whole)
    expected = ("217,646 masked tokens of the split's 217,646" if head == "masked"
                else "217,646 tokens: the whole split")
    assert expected in text and "max_eval_tokens`)" not in text.split("## Use")[0]
    # a run that recorded only how many it scored: its command tells whether the split was cut
    older = {k: v for k, v in cut.items() if not k.endswith(("_tokens_evaluated", "_split_tokens"))}
    text = card(tmp_path, lm, dict(older, command="python scripts/train_lm.py --do_eval --max_eval_tokens 20000"))
    assert f"{scored:,} {words} from the first tokens of the split only (`--max_eval_tokens`)" in text


RELEASED_RUN = "results/wikitext2-90min-v2/decoder-softmax"  # a results folder as make_model_cards.py reads it


@pytest.mark.parametrize(
    "damage,words",
    [
        (lambda text: text[:300], ["is not valid JSON", "cut short or damaged"]),
        (lambda text: "[1, 2]", ["holds a JSON list, not an object"]),
        (lambda text: re.sub(r'"test_perplexity": ([0-9.]+)', r'"test_perplexity": "\1"', text),
         ["test_perplexity is '", "', not a number"]),
        (lambda text: re.sub(r'"parameters": (\d+)', r'"parameters": true', text), ["parameters is True, not an integer"]),
        (lambda text: re.sub(r'"cpu_model": "[^"]*"', '"cpu_model": null', text), ["no cpu_model"]),
        (lambda text: re.sub(r'"hyperparameters": \{', '"hyperparameters": "none", "was": {', text),
         ["hyperparameters is 'none', not a JSON object"]),
    ],
    ids=["cut short", "a list", "a perplexity as a string", "a count as a boolean", "no CPU", "a string for a dict"],
)
def test_a_damaged_all_results_json_is_named_with_its_key(tmp_path, damage, words):
    """refresh_model_card (make_model_cards.py, push_run.py) on a damaged all_results.json: a ValueError naming the file
    and the key, not a JSONDecodeError or a format error from inside the card."""
    from tests.helpers import ROOT

    text = (ROOT / RELEASED_RUN / "all_results.json").read_text()
    toolkit.refresh_model_card(ROOT / RELEASED_RUN, card_path=tmp_path / "whole.md")  # the file as released: a card
    (tmp_path / "all_results.json").write_text(damage(text))
    with pytest.raises(ValueError) as err:
        toolkit.refresh_model_card(tmp_path, card_path=tmp_path / "README.md")
    assert str(err.value).startswith(f"{tmp_path / 'all_results.json'}")
    for word in words:
        assert word in str(err.value), str(err.value)
    assert not (tmp_path / "README.md").exists()
