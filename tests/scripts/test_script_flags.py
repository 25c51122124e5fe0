"""Every flag of train_lm.py and train_sets.py: a flag the chosen family, objective, mode or task cannot use
is refused by name when given; a JSON file of flags is typed as the command line is; data files and tokenizer folders
that cannot be read say which flag, which path and why; extreme numeric values are refused naming the valid range, or
give the correct result. Most cases stop in the flag checks, before any data or model is made."""

import json
import os

import pytest

from hf_settransformer import toolkit
from hf_settransformer.toolkit import cli, lm_arguments
from tests.helpers import lm_refusal, load_script


@pytest.fixture(scope="module")
def texts(tmp_path_factory):
    """train.txt, 200 lines of 12 words in a fixed pattern (this file's own: conftest.py's has files no run can use)."""
    folder = tmp_path_factory.mktemp("flag-texts")
    words = [f"w{i}" for i in range(40)]
    lines = [" ".join(words[(7 * i + 3 * j) % 40] for j in range(12)) for i in range(200)]
    (folder / "train.txt").write_text("\n".join(lines) + "\n")
    return folder


# ------------------------------------------------------------------------------------ flags that cannot apply

NOT_APPLYING = [
    # (flags, words of the refusal)
    (["--family", "encoder", "--eval_stride", "3"], ["--eval_stride cannot apply", "decoder"]),
    (["--family", "encoder", "--block_size", "32"], ["--block_size cannot apply"]),
    (["--family", "encoder", "--next_token_mode", "window", "--target_length", "4"], ["--target_length cannot apply"]),
    (["--family", "encoder", "--objective", "mlm", "--target_length", "4"], ["--target_length cannot apply"]),
    (["--family", "encoder", "--objective", "mlm", "--next_token_mode", "many"], ["--next_token_mode cannot apply"]),
    (["--family", "encoder", "--targets_per_epoch", "10"], ["--targets_per_epoch cannot apply", "window"]),
    (["--targets_per_epoch", "10"], ["--targets_per_epoch cannot apply"]),
    (["--attention_type", "softmax", "--feature_map", "exp"], ["--feature_map cannot apply", "softmax"]),
    (["--feature_map", "exp"], ["--feature_map cannot apply", "--attention_type linear"]),
    (["--mlm_probability", "0.2"], ["--mlm_probability cannot apply", "--objective mlm"]),
    (["--budget_clock", "wall"], ["--budget_clock cannot apply", "--max_train_minutes"]),
    (["--dataset_name", "wikitext"], ["--dataset_name cannot apply", "local files"]),
    (["--trust_remote_code", "true"], ["--trust_remote_code cannot apply", "--model_name_or_path"]),
    (["--precision", "fp32", "--bf16", "true", "--use_cpu", "true"], ["--precision cannot apply", "--bf16"]),
    (["--eval_strategy", "no", "--periodic_eval_targets", "100"], ["--periodic_eval_targets cannot apply"]),
    # the training methods
    (["--lr_scheduler_type", "cosine", "--decay_fraction", "0.2"],
     ["--decay_fraction cannot apply", "warmup_stable_decay", "cosine"]),
    (["--lr_scheduler_type", "warmup_stable_decay", "--decay_fraction", "0"], ["--decay_fraction must be in (0, 1]"]),
    (["--lr_scheduler_type", "warmup_stable_decay", "--decay_fraction", "0.2", "--lr_scheduler_kwargs",
      '{"num_decay_steps": 5}'], ["pass it or --lr_scheduler_kwargs num_decay_steps"]),
    (["--average_weights", "none", "--average_fraction", "0.2"],
     ["--average_fraction cannot apply", "--average_weights is none"]),
    (["--average_weights", "none", "--ema_decay", "0.999"], ["--ema_decay cannot apply"]),  # at its default: refused
    (["--ema_decay", "0.99"], ["--ema_decay cannot apply", "--average_weights ema"]),  # auto averages the last steps
    (["--average_weights", "last", "--ema_decay", "0.99"], ["--ema_decay cannot apply", "--average_weights ema"]),
    (["--average_weights", "ema", "--ema_decay", "1"], ["--ema_decay must be in (0, 1)"]),
    (["--average_weights", "last", "--average_fraction", "1.5"], ["--average_fraction must be in (0, 1]"]),
    (["--average_weights", "last", "--load_best_model_at_end", "true", "--eval_strategy", "steps", "--save_steps",
      "250"], ["--average_weights ends the run with the averaged weights", "--load_best_model_at_end"]),
    (["--optimizer", "muon", "--optim", "adafactor"], ["--optim must be adamw_torch or adamw_torch_fused"]),
    (["--optimizer", "muon", "--fsdp", "full_shard"], ["--optimizer muon cannot run with --fsdp"]),
    (["--average_weights", "ema", "--fsdp", "full_shard"], ["--average_weights cannot run with --fsdp"]),
]


@pytest.mark.parametrize("flags,words", NOT_APPLYING, ids=[" ".join(c[0]) for c in NOT_APPLYING])
def test_train_lm_refuses_a_flag_that_cannot_apply(tmp_path, texts, train_lm, flags, words):
    message = lm_refusal(train_lm, tmp_path, texts, *flags)
    for word in words:
        assert word in message, message


def test_training_method_defaults_fill_in_where_the_flags_are_silent():
    def checked(*flags):
        model_args, data_args, training_args, _ = lm_arguments.parse_arguments(
            ["--do_train", "--preset", "tiny", "--output_dir", "unused", "--report_to", "none", *flags])
        lm_arguments.check_arguments(model_args, data_args, training_args)
        return data_args, training_args

    data_args, training_args = checked()  # docs/tuning.md's choice: Muon, WSD with 20% decay, the last 20% averaged
    assert (data_args.optimizer, data_args.decay_fraction, data_args.average_weights) == ("muon", 0.2, "last")
    assert training_args.lr_scheduler_type == "warmup_stable_decay" and data_args.average_fraction == 0.2
    assert not training_args.load_best_model_at_end and data_args.methods_fallback == []
    data_args, training_args = checked("--optimizer", "adamw", "--lr_scheduler_type", "cosine", "--average_weights",
                                       "none")  # the defaults before the search
    assert (data_args.decay_fraction, data_args.average_fraction) == (None, None)
    assert training_args.load_best_model_at_end
    data_args, training_args = checked("--lr_scheduler_type", "warmup_stable_decay", "--average_weights", "ema")
    assert data_args.decay_fraction == 0.2 and data_args.average_fraction == 0.2  # the decay phase is averaged
    assert not training_args.load_best_model_at_end  # the run ends with the average
    data_args, _ = checked("--lr_scheduler_type", "warmup_stable_decay", "--lr_scheduler_kwargs",
                           '{"num_decay_steps": 5}')
    assert data_args.decay_fraction is None  # transformers' own steps
    data_args, _ = checked("--lr_scheduler_type", "warmup_stable_decay", "--decay_fraction", "0.3",
                           "--average_weights", "last", "--average_fraction", "0.1")
    assert (data_args.decay_fraction, data_args.average_fraction) == (0.3, 0.1)


@pytest.mark.parametrize("flags,methods,said", [
    (["--fsdp", "full_shard"], ("adamw", "none"), ["--optimizer auto is adamw (--fsdp",
                                                   "--average_weights auto is none (--fsdp"]),
    ([{"ACCELERATE_USE_FSDP": "true"}], ("adamw", "none"), ["adamw (accelerate's FSDP", "none (accelerate's FSDP"]),
    ([{"ACCELERATE_USE_DEEPSPEED": "true"}], ("adamw", "none"), ["adamw (accelerate's DeepSpeed",
                                                                "none (accelerate's DeepSpeed"]),
    (["--optim", "adafactor"], ("adamw", "last"), ["--optimizer auto is adamw (--optim adafactor"]),
    (["--load_best_model_at_end", "true"], ("muon", "none"), ["--average_weights auto is none (--load_best_model_at_end"]),
    (["--load_best_model_at_end", "false"], ("muon", "last"), []),
    (["--optimizer", "adamw", "--fsdp", "full_shard", "--average_weights", "none"], ("adamw", "none"), []),
])
def test_auto_training_methods_fall_back_where_they_cannot_run_and_say_so(train_lm, monkeypatch, flags, methods, said):
    """--optimizer auto and --average_weights auto (the defaults) take Muon and the average, except with the flags
    (or the accelerate config, a dict: its environment) they cannot run with: then AdamW and no average, and the
    run's start line says which flag made it so."""
    for name, value in (flags[0] if flags and isinstance(flags[0], dict) else {}).items():
        monkeypatch.setenv(name, value)
        flags = flags[1:]
    model_args, data_args, training_args, _ = lm_arguments.parse_arguments(
        ["--do_train", "--preset", "tiny", "--output_dir", "unused", "--report_to", "none", *flags])
    lm_arguments.check_arguments(model_args, data_args, training_args)
    assert (data_args.optimizer, data_args.average_weights) == methods
    assert len(data_args.methods_fallback) == len(said)
    assert all(words in note for words, note in zip(said, data_args.methods_fallback)), data_args.methods_fallback
    line = train_lm.training_methods(data_args, training_args)
    assert all(note in line for note in data_args.methods_fallback)
    assert ("Muon for the hidden weight matrices" in line) == (methods[0] == "muon")


def test_train_lm_refuses_training_flags_without_do_train(tmp_path, texts, train_lm):
    argv = ["--do_eval", "--validation_file", str(texts / "train.txt"), "--train_file", str(texts / "train.txt"),
            "--preset", "tiny", "--output_dir", str(tmp_path / "out"), "--report_to", "none",
            "--train_token_budget", "100", "--max_train_tokens", "50"]
    with pytest.raises(SystemExit) as err:
        train_lm.main(argv)
    assert "--train_token_budget, --max_train_tokens cannot apply" in str(err.value.code)
    assert "no --do_train" in str(err.value.code)


def test_train_lm_refuses_architecture_flags_with_a_checkpoint(tmp_path, texts, train_lm):
    """--model_name_or_path: its config fixes the model, so a flag that sets the new model's design is refused (and
    --config_overrides before the data is read, not after)."""
    model = tmp_path / "model"
    model.mkdir()
    message = lm_refusal(train_lm, tmp_path, texts, "--model_name_or_path", str(model), "--attention_type", "linear",
                         "--config_overrides", "hidden_size=64")
    assert "--attention_type, --config_overrides cannot apply" in message and "--model_name_or_path" in message


def test_flags_given_at_their_default_value_still_count_as_given(tmp_path, texts, train_lm):
    """A flag is refused when the command gave it, even at its default (--mlm_probability 0.15)."""
    message = lm_refusal(train_lm, tmp_path, texts, "--mlm_probability", "0.15")
    assert "--mlm_probability cannot apply" in message


SETS_NOT_APPLYING = [
    (["--task", "point_clouds", "--value_scale", "10"], ["--value_scale cannot apply to --task point_clouds"]),
    (["--task", "mixture_of_gaussians", "--max_values", "real"], ["--max_values cannot apply"]),
    (["--feature_map", "exp"], ["--feature_map cannot apply", "softmax"]),
    (["--attention_type", "softmax", "--feature_map", "exp"], ["--feature_map cannot apply"]),
    (["--model", "deepsets_max", "--initializer_range", "0.05"], ["--initializer_range cannot apply"]),
    (["--model_name_or_path", ""], ["--model_name_or_path is an empty string"]),
]


def assert_sets_refused(tmp_path, train_sets, flags, words):
    """train_sets.py with `flags` ends with a SystemExit whose message holds each of `words`."""
    with pytest.raises(SystemExit) as err:
        train_sets.main(["--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--report_to", "none", *flags])
    for word in words:
        assert word in str(err.value.code), err.value.code


@pytest.mark.parametrize("flags,words", SETS_NOT_APPLYING, ids=[" ".join(c[0]) for c in SETS_NOT_APPLYING])
def test_train_sets_refuses_a_flag_that_cannot_apply(tmp_path, train_sets, flags, words):
    assert_sets_refused(tmp_path, train_sets, flags, words)
    assert not (tmp_path / "out").exists()


def test_train_sets_feature_map_is_refused_with_softmax_only(train_sets):
    """--feature_map exp with the default (softmax) attention is refused; with --attention_type linear it passes."""
    parser = train_sets.HfArgumentParser((train_sets.SetArguments, train_sets.CheckedTrainingArguments))
    for attention, refused in (("linear", False), ("softmax", True)):
        args, _ = parser.parse_args_into_dataclasses(args=["--output_dir", "x", "--attention_type", attention,
                                                           "--feature_map", "exp"])
        if refused:
            with pytest.raises(SystemExit, match="--feature_map cannot apply"):
                train_sets.check_arguments(args)
        else:
            train_sets.check_arguments(args)


# ---------------------------------------------------------------------------- --linear_attention_decay

DECAY_FLAG_REFUSALS = [
    (["--attention_type", "softmax", "--linear_attention_decay", "fixed"],
     ["--linear_attention_decay cannot apply", "--attention_type linear"]),
    (["--family", "encoder", "--objective", "mlm", "--attention_type", "linear", "--linear_attention_decay", "gated"],
     ["--linear_attention_decay cannot apply", "bidirectionally"]),
    (["--family", "set_transformer", "--next_token_mode", "window", "--attention_type", "linear",
      "--linear_attention_decay", "fixed"], ["--linear_attention_decay cannot apply", "bidirectionally"]),
]


@pytest.mark.parametrize("flags,words", DECAY_FLAG_REFUSALS, ids=[" ".join(c[0][:4]) for c in DECAY_FLAG_REFUSALS])
def test_train_lm_refuses_a_decay_that_cannot_apply(tmp_path, texts, train_lm, flags, words):
    message = lm_refusal(train_lm, tmp_path, texts, *flags)
    for word in words:
        assert word in message, message


def test_train_lm_refuses_an_unknown_decay_naming_the_choices(tmp_path, texts, train_lm, capsys):
    lm_refusal(train_lm, tmp_path, texts, "--attention_type", "linear", "--linear_attention_decay", "bogus")
    err = capsys.readouterr().err
    assert "--linear_attention_decay" in err and "invalid choice: 'bogus'" in err and "'fixed', 'gated'" in err


# ------------------------------------------------------------------------------------ a JSON file of flags

def json_run(train_lm, tmp_path, texts, **values):
    flags = {"do_train": True, "train_file": str(texts / "train.txt"), "preset": "tiny",
             "output_dir": str(tmp_path / "out"), "report_to": "none", "max_steps": 1, **values}
    path = tmp_path / "flags.json"
    path.write_text(json.dumps(flags))
    return lm_arguments.parse_arguments([str(path)])


def test_json_flag_strings_are_typed_as_on_the_command_line(tmp_path, texts, train_lm):
    model_args, data_args, training_args, _ = json_run(
        train_lm, tmp_path, texts, max_steps="2", learning_rate="1e-3", do_eval="true", use_cpu=1, block_size="8",
        weight_decay=0, per_device_train_batch_size=4.0)
    assert training_args.max_steps == 2 and training_args.learning_rate == 1e-3 and training_args.do_eval is True
    assert training_args.use_cpu is True and data_args.block_size == 8 and training_args.weight_decay == 0.0
    assert isinstance(training_args.weight_decay, float) and training_args.per_device_train_batch_size == 4
    train_lm.check_arguments(model_args, data_args, training_args)  # no TypeError inside the checker


JSON_BAD = [
    (dict(max_steps=2.5), ["'max_steps' must be an integer", "2.5"]),
    (dict(max_steps=True), ["'max_steps' must be an integer", "true"]),
    (dict(max_steps="two"), ["'max_steps' must be an integer", '"two"']),
    (dict(learning_rate="fast"), ["'learning_rate' must be a number"]),
    (dict(do_train="maybe"), ["'do_train' must be true or false"]),
    (dict(family="lstm"), ["'family' must be one of", "decoder"]),
    (dict(block_size=[8]), ["'block_size' must be an integer"]),
]


@pytest.mark.parametrize("values,words", JSON_BAD, ids=[json.dumps(c[0]) for c in JSON_BAD])
def test_a_json_flag_of_the_wrong_type_is_refused_naming_it(tmp_path, texts, train_lm, values, words):
    with pytest.raises(SystemExit) as err:
        json_run(train_lm, tmp_path, texts, **values)
    assert "flags.json" in str(err.value.code)
    for word in words:
        assert word in str(err.value.code), err.value.code


@pytest.mark.parametrize("text,words", [(None, ["cannot read this flags file"]), ("{not json", ["not a JSON file"]),
                                        ('["--do_train"]', ["holds one object", "not a list"])])
def test_a_flags_file_that_is_missing_or_not_an_object_is_named(tmp_path, train_lm, text, words):
    path = tmp_path / "flags.json"
    if text is not None:
        path.write_text(text)
    with pytest.raises(SystemExit) as err:
        lm_arguments.parse_arguments([str(path)])
    for word in [str(path), *words]:
        assert word in str(err.value.code), err.value.code


# ------------------------------------------------------------------------------------ data files

def special_files(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    return {"devnull": "/dev/null", "fifo": str(fifo)}


DATA_FILE_CASES = [
    ("devnull", ["--train_file", "/dev/null is a device, not a regular file"]),
    ("fifo", ["--train_file", "pipe is a named pipe (FIFO), not a regular file"]),
    ("", ["--train_file is an empty string"]),
]


@pytest.mark.parametrize("name,words", DATA_FILE_CASES, ids=[c[0] or "empty string" for c in DATA_FILE_CASES])
def test_a_train_file_that_is_no_regular_file_says_what_it_is(tmp_path, texts, train_lm, name, words):
    path = special_files(tmp_path).get(name, name)
    message = lm_refusal(train_lm, tmp_path, texts, "--train_file", path)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("flag", ["--validation_file", "--test_file", "--tokenizer_name", "--model_name_or_path"])
def test_an_empty_string_path_is_refused_naming_the_flag(tmp_path, texts, train_lm, flag):
    """An empty path was read as "not given": the run trained on WikiText-2 from the Hub, or a new model."""
    message = lm_refusal(train_lm, tmp_path, texts, "--do_eval", "--do_predict", flag, "")
    assert f"{flag} is an empty string" in message, message


@pytest.mark.parametrize("encoding,mark", [("utf-16", "ff fe"), ("utf-16-be", "fe ff"), ("utf-32", "ff fe 00 00")])
def test_utf16_and_utf32_text_is_named_as_such(tmp_path, texts, train_lm, encoding, mark):
    path = tmp_path / "wide.txt"
    text = "w1 w2\nw3 w4\n"
    path.write_bytes(text.encode(encoding) if encoding != "utf-16-be" else b"\xfe\xff" + text.encode(encoding))
    message = lm_refusal(train_lm, tmp_path, texts, "--validation_file", str(path))
    assert f"--validation_file: {path} is UTF-" in message and mark in message and "iconv" in message, message


def test_a_utf8_byte_order_mark_crlf_and_no_last_newline_read_as_plain_lines(tmp_path, train_lm):
    """A BOM is no part of the first word; CRLF line ends and a missing last newline give the same lines."""
    plain, odd = tmp_path / "plain.txt", tmp_path / "odd.txt"
    plain.write_text("w1 w2\nw3 w1\n")
    odd.write_bytes(b"\xef\xbb\xbfw1 w2\r\nw3 w1")
    cli.check_data_file("--train_file", str(odd))
    lines = [train_lm.load_splits(type("D", (), dict(train_file=str(p), validation_file=None, test_file=None))())
             for p in (plain, odd)]
    assert lines[0] == lines[1] == {"train": ["w1 w2", "w3 w1"]}


def test_latin1_after_a_byte_order_mark_names_the_offset_in_the_file(tmp_path):
    path = tmp_path / "bom-latin1.txt"
    path.write_bytes(b"\xef\xbb\xbfw1\ncaf\xe9\n")
    with pytest.raises(SystemExit, match=r"0xe9 at offset 9 \(line 2\)"):
        cli.check_data_file("--train_file", str(path))


# ------------------------------------------------------------------------------------ tokenizer folders

def test_a_tokenizer_folder_without_tokenizer_files_names_them(tmp_path, texts, train_lm):
    folder = tmp_path / "no-tokenizer"
    folder.mkdir()
    (folder / "notes.txt").write_text("nothing here")
    message = lm_refusal(train_lm, tmp_path, texts, "--tokenizer_name", str(folder))
    assert f"--tokenizer_name {folder}: this folder holds no tokenizer" in message
    assert "tokenizer.json" in message and "leave out --tokenizer_name" in message


def test_a_model_folder_without_a_tokenizer_asks_for_tokenizer_name(tmp_path, texts, train_lm):
    from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM

    folder = tmp_path / "model-only"  # a saved model (weights and config), no tokenizer files
    TransformerDecoderForCausalLM(TransformerDecoderConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                           num_attention_heads=2, intermediate_size=32)
                                  ).save_pretrained(folder)
    message = lm_refusal(train_lm, tmp_path, texts, "--model_name_or_path", str(folder))
    assert f"--model_name_or_path {folder}: this folder holds no tokenizer" in message
    assert "pass --tokenizer_name" in message


# ------------------------------------------------------------------------------------ extreme values

SETS_EXTREMES = [
    (["--train_sets", str(10**24)], ["--train_sets must be a positive integer up to 2**60"]),
    (["--eval_sets", str(2**61)], ["--eval_sets must be a positive integer up to 2**60"]),
    (["--max_size", str(10**24)], ["--max_size must be a positive integer up to 10,000,000"]),
    (["--num_inducing_points", str(10**11)], ["--num_inducing_points 100000000000", "GiB", "pass smaller sizes"]),
    (["--hidden_size", str(10**14)], ["--hidden_size", "GiB to train"]),
    (["--num_hidden_layers", str(10**9)], ["--num_hidden_layers 1000000000", "GiB to train"]),
    (["--seed", str(2**32)], ["--seed must be an integer in [0, 2**32)"]),
    (["--seed", "-1"], ["--seed must be an integer in [0, 2**32)"]),
    # ended in "mae": NaN (1e-300), or a MAE of 1e297 (1e300)
    *[(["--value_scale", value], ["--value_scale must be between 0.01 and 10,000, got", "MAE is NaN"])
      for value in ("1e-300", "1e300", "0.001", "nan", "-1")],
    # tracebacks from torch's optimizer, sampler or dataloader, or a division by zero, once training started
    (["--learning_rate", "nan"], ["--learning_rate must be a finite number, not negative", "got nan"]),
    (["--learning_rate", "-1"], ["--learning_rate must be a finite number, not negative", "got -1.0"]),
    (["--per_device_train_batch_size", "0"], ["--per_device_train_batch_size must be a positive integer, got 0"]),
    (["--per_device_eval_batch_size", "0"], ["--per_device_eval_batch_size must be a positive integer, got 0"]),
    (["--gradient_accumulation_steps", "0"], ["--gradient_accumulation_steps must be a positive integer, got 0"]),
    (["--dataloader_num_workers", "-1"], ["--dataloader_num_workers must be a non-negative integer"]),
    (["--neftune_noise_alpha", "-1"], ["--neftune_noise_alpha must be a positive finite number"]),
]


@pytest.mark.parametrize("flags,words", SETS_EXTREMES, ids=[" ".join(c[0]) for c in SETS_EXTREMES])
def test_train_sets_extreme_values_are_refused_naming_the_range(tmp_path, train_sets, flags, words):
    assert_sets_refused(tmp_path, train_sets, flags, words)


def test_train_lm_seed_outside_numpys_range_is_refused(tmp_path, texts, train_lm):
    assert "--seed must be an integer in [0, 2**32)" in lm_refusal(train_lm, tmp_path, texts, "--seed", str(2**40))


def test_mixture_sets_of_one_fixed_size(train_sets):
    """--min_size equal to --max_size: every mixture set has that many points (torch.randint(5, 5) failed)."""
    dataset = toolkit.make_set_task("mixture_of_gaussians", 3, 0, min_size=5, max_size=5)
    assert [dataset[i]["input_features"].shape[0] for i in range(3)] == [5, 5, 5]


def test_train_lm_negative_warmup_is_refused_naming_the_flag(tmp_path, texts, train_lm):
    """transformers' own message ("Got warmup_steps = -5.0") named no flag."""
    message = lm_refusal(train_lm, tmp_path, texts, "--warmup_steps", "-5")
    assert "--warmup_steps must be a finite number, not negative" in message and "got -5.0" in message


def test_a_time_budget_on_data_of_fewer_batches_than_the_timing_probe_trains(tmp_path, texts, train_lm):
    """--max_train_minutes times 16 steps first; an epoch of fewer batches (small data) ran out of them
    (StopIteration from the probe). The probe now goes round the epoch again."""
    results = train_lm.main(["--do_train", "--train_file", str(texts / "train.txt"), "--preset", "tiny",
                             "--output_dir", str(tmp_path / "out"), "--report_to", "none", "--disable_tqdm", "true",
                             "--max_train_minutes", "0.02", "--save_strategy", "no", "--eval_strategy", "no",
                             "--per_device_train_batch_size", "64"])
    assert results["train_steps"] >= 1


def test_do_eval_from_a_json_file_without_a_validation_split_is_refused(tmp_path, texts, train_lm):
    """An explicit do_eval with no validation split is an error; from a JSON file it was turned off silently (the
    check looked for "--do_eval" in the command's words)."""
    path = tmp_path / "flags.json"
    path.write_text(json.dumps({"do_train": True, "do_eval": True, "train_file": str(texts / "train.txt"),
                                "preset": "tiny", "output_dir": str(tmp_path / "out"), "report_to": "none",
                                "max_steps": 1}))
    with pytest.raises(SystemExit, match="--do_eval needs a validation split"):
        train_lm.main([str(path)])


@pytest.mark.parametrize("script", ["train_lm", "train_sets"])
def test_a_yaml_flags_file_is_refused_saying_json(tmp_path, script):
    path = tmp_path / "flags.yaml"
    path.write_text("max_steps: 2\n")
    with pytest.raises(SystemExit, match=r"flags.yaml: the scripts read their flags .* not YAML"):
        load_script(script).main([str(path)])


def test_train_sets_reads_a_json_file_of_flags_typed(tmp_path, train_sets):
    path = tmp_path / "flags.json"
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out"), "max_steps": "1", "report_to": "none",
                                "eval_sets": "4", "hidden_size": 8, "num_attention_heads": "2",
                                "per_device_train_batch_size": 4, "disable_tqdm": "true"}))
    results = train_sets.main([str(path)])
    assert results["steps"] == 1 and results["hidden_size"] == 8
    path.write_text(json.dumps({"output_dir": str(tmp_path / "out2"), "eval_sets": 2.5}))
    with pytest.raises(SystemExit, match="'eval_sets' must be an integer, got 2.5"):
        train_sets.main([str(path)])


BEFORE_THE_DATA = [
    (["--config_overrides", "hiden_size=8"], "--config_overrides: TransformerDecoderConfig has no field 'hiden_size' "
                                             "(did you mean 'hidden_size'?)"),
    (["--family", "encoder", "--config_overrides", "poling=mean"], "has no field 'poling' (did you mean 'pooling'?)"),
    (["--config_overrides", "hidden_size"], '--config_overrides: expected "key=value"'),
    (["--do_eval"], "--do_eval needs a validation split"),
    (["--do_predict"], "--do_predict needs a test split"),
]


@pytest.mark.parametrize("flags,words", BEFORE_THE_DATA, ids=[" ".join(c[0]) for c in BEFORE_THE_DATA])
def test_checks_that_need_no_data_are_made_before_the_data_is_read(tmp_path, texts, train_lm, monkeypatch, flags,
                                                                   words):
    """A misspelt --config_overrides key was refused only once the data was read and tokenized (minutes on a large
    file), and so was an evaluation whose split file was not given."""

    def read(data_args):
        raise AssertionError("the data was read before the flags were checked")

    monkeypatch.setattr(train_lm, "load_splits", read)
    assert words in lm_refusal(train_lm, tmp_path, texts, *flags)
