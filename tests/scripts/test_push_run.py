"""scripts/push_run.py and what every push publishes (`hf_settransformer.toolkit.hub`): the files of a model that loads
as its config.json claims, and nothing else of the folder, whatever its name; a folder whose model would not load is
refused naming the file, before the Hub is reached. The training scripts' `--hub_model_id` and `--push_to_hub` are
checked before training. Pushes go to `LocalHub` (tests/toolkit/hub_server.py)."""

import json
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from hf_settransformer.toolkit.hub import UnpublishableFolderError, publishable_files
from hf_settransformer.toolkit.run_lock import LOCK_FILE
from tests.helpers import (
    MODEL_CLASSES,
    ROOT,
    common_args,
    decoder,
    load_script,
    lm_refusal,
    make_model,
    tiny_config,
    word_tokenizer,
    write_corpus,
)
from tests.toolkit.hub_server import LocalHub

# what a saved decoder with its tokenizer, card and results publishes: the modeling code is the closure of
# modeling_decoder.py's and configuration_decoder.py's relative imports
MODEL_FILES = {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
               "README.md", "all_results.json"}


@pytest.fixture
def model_folder(tmp_path):
    """A tiny decoder saved as a run leaves it: weights, config with auto_map and code, tokenizer, card, results."""
    folder = tmp_path / "run"
    decoder("softmax", "elu").save_pretrained(folder)
    word_tokenizer().save_pretrained(folder)
    (folder / "README.md").write_text("# a card\n")
    (folder / "all_results.json").write_text(json.dumps({"validation_perplexity": 9.0}))
    return folder


def code_files(folder):
    return {path.name for path in folder.glob("*.py")}


def test_a_model_folder_publishes_its_model_files_and_leaves_the_rest_out_whatever_their_names(model_folder,
                                                                                                 tmp_path):
    folder = model_folder
    model_files = MODEL_FILES | code_files(folder)
    assert {"modeling_decoder.py", "configuration_decoder.py", "masks.py"} <= model_files
    (folder / "checkpoint-4").mkdir()
    (folder / "checkpoint-4" / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())
    (folder / ".git").mkdir()
    (tmp_path / "outside.txt").write_text("not the run's")
    strays = {"notes.txt": "x", "secrets.env": "HF_TOKEN=hf_x", "optimizer.pt": "x", "training_args.bin": "x",
              "vocab.txt": "a vocabulary the tokenizer does not use", "extra_module.py": "x = 1\n",
              "model.safetensors.bak": "x", "trainer_state.json.old": "{}", LOCK_FILE: "{}"}
    for name, text in strays.items():
        (folder / name).write_text(text)
    (folder / "linked.json").symlink_to(tmp_path / "outside.txt")
    upload, left_out = publishable_files(folder)
    assert set(upload) == model_files
    assert left_out == sorted([".git/", "checkpoint-4/", "extra_module.py", "linked.json (a link)",
                               "model.safetensors.bak", "notes.txt", "optimizer.pt", "secrets.env",
                               "trainer_state.json.old", "training_args.bin", "vocab.txt"])


def test_a_sharded_model_publishes_its_index_and_every_shard(tmp_path):
    folder = tmp_path / "sharded"
    decoder("softmax", "elu").save_pretrained(folder, max_shard_size="8KB")
    shards = sorted(path.name for path in folder.glob("model-*.safetensors"))
    assert len(shards) > 1
    upload, _ = publishable_files(folder)
    assert set(upload) == {"config.json", "generation_config.json", "model.safetensors.index.json", *shards,
                           *code_files(folder)}


def _edit_json(path, **fields):
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def _edit_weights(path, edit):
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _cut(path, size):
    path.write_bytes(path.read_bytes()[:size])


def _link_outside(folder, name):
    outside = folder.parent / f"outside-{name}"
    (folder / name).rename(outside)
    (folder / name).symlink_to(outside)


def _drop_first(tensors):
    tensors.pop(sorted(tensors)[0])


def _half_first(tensors):
    tensors[sorted(tensors)[0]] = tensors[sorted(tensors)[0]].half()


# a folder's damage -> what the refusal names (each loaded, or uploaded, before)
DAMAGES = {
    "weights cut to 300 bytes": (lambda f: _cut(f / "model.safetensors", 300),
                                 ["model.safetensors is not a whole safetensors file", "cut short"]),
    "weights missing their last bytes": (lambda f: _cut(f / "model.safetensors", -1),
                                         ["model.safetensors is not a whole safetensors file"]),
    "weights with bytes after their end": (
        lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes() + b"\0" * 8),
        ["model.safetensors is not a whole safetensors file"]),
    "weights of another shape than config.json": (
        lambda f: _edit_json(f / "config.json", intermediate_size=2 * json.loads((f / "config.json").read_text())[
            "intermediate_size"]),
        ["not those of the TransformerDecoderForCausalLM that config.json describes",
         "model.layers.0.ffn.fc_in.weight has the shape [", "] in model.safetensors, the config's model ["]),
    "a tensor stored in another dtype": (
        lambda f: _edit_weights(f / "model.safetensors", _half_first),
        ["model.embeddings.embed_tokens.weight is F16 in model.safetensors, the config's model F32"]),
    "a tensor holding NaN": (
        lambda f: _edit_weights(f / "model.safetensors", lambda t: t["model.final_norm.weight"].fill_(float("nan"))),
        ["the weights model.final_norm.weight hold NaN or infinite values"]),
    "a tensor missing": (lambda f: _edit_weights(f / "model.safetensors", _drop_first),
                         ["model.embeddings.embed_tokens.weight is missing"]),
    "an untied head without its weights": (lambda f: _edit_json(f / "config.json", tie_word_embeddings=False),
                                           ["lm_head.weight is missing"]),
    "a tensor the model does not have": (
        lambda f: _edit_weights(f / "model.safetensors", lambda t: t.update(extra=torch.zeros(2))),
        ["extra (model.safetensors) is not a tensor of the model"]),
    "weights that are a link out of the folder": (lambda f: _link_outside(f, "model.safetensors"),
                                                  ["model.safetensors (the weights) is a link to"]),
    "pickle weights only": (
        lambda f: ((f / "model.safetensors").unlink(), torch.save({}, f / "pytorch_model.bin")),
        ["has no model.safetensors", "pytorch_model.bin are pickles, which are never published"]),
    "the config's auto_map module missing": (lambda f: (f / "modeling_decoder.py").unlink(),
                                             ["modeling_decoder.py (modeling code config.json's auto_map imports) is "
                                              "missing"]),
    "a module the code imports missing": (lambda f: (f / "masks.py").unlink(), ["masks.py (modeling code", "is missing"]),
    "modeling code cut short": (lambda f: _cut(f / "modeling_decoder.py", 400),
                                ["modeling_decoder.py is not valid Python"]),
    "auto_map without the config's class": (
        lambda f: _edit_json(f / "config.json", auto_map={"AutoConfig": "configuration_decoder.TransformerDecoderConfig"}),
        ["auto_map names no module for TransformerDecoderForCausalLM"]),
    "an architecture of another library": (lambda f: _edit_json(f / "config.json", architectures=["GPT2LMHeadModel"]),
                                           ["names the architecture 'GPT2LMHeadModel', which is not an "
                                            "hf_settransformer model class"]),
    "a model_type of another family": (lambda f: _edit_json(f / "config.json", model_type="hfst_encoder"),
                                       ["model_type 'hfst_encoder', but TransformerDecoderForCausalLM is of model_type "
                                        "'hfst_decoder'"]),
    "a config value the model refuses": (lambda f: _edit_json(f / "config.json", attention_type="quadratic"),
                                         ["config.json does not load", "attention_type"]),
    "a tokenizer that does not load": (lambda f: (f / "tokenizer.json").write_text("{}"),
                                       ["The tokenizer of", "(tokenizer.json, tokenizer_config.json) does not load"]),
    "a tokenizer file that is a link": (lambda f: _link_outside(f, "tokenizer.json"),
                                        ["tokenizer.json (a tokenizer file) is a link to"]),
    "a generation config cut short": (lambda f: _cut(f / "generation_config.json", 20),
                                      ["generation_config.json does not load"]),
    "results cut short": (lambda f: _cut(f / "all_results.json", 10), ["all_results.json does not load"]),
    "a card that is not text": (lambda f: (f / "README.md").write_bytes(b"\xff\xfe card"), ["README.md does not load"]),
}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_folder_whose_model_would_not_load_is_refused_naming_the_file(model_folder, damage):
    make, words = DAMAGES[damage]
    make(model_folder)
    with pytest.raises(UnpublishableFolderError) as err:
        publishable_files(model_folder)
    for word in words:
        assert word in str(err.value), str(err.value)
    if damage == "weights of another shape than config.json":  # the tiny decoder's 48 wide feed-forward, now 96
        assert "fc_in.weight has the shape [48, 32] in model.safetensors, the config's model [96, 32]" in str(err.value)


def _misplace(folder, shards):
    index = folder / "model.safetensors.index.json"
    weight_map = json.loads(index.read_text())["weight_map"]
    key = next(key for key, shard in weight_map.items() if shard == shards[0])
    _edit_json(index, weight_map={**weight_map, key: shards[-1]})


SHARD_DAMAGES = {
    "a shard missing": (lambda f, shards: (f / shards[-1]).unlink(),
                        [" (weights model.safetensors.index.json names) is missing"]),
    "an index naming a file outside the folder": (
        lambda f, shards: _edit_json(f / "model.safetensors.index.json",
                                     weight_map={"model.final_norm.weight": "../elsewhere.safetensors"}),
        ["names shards that are not safetensors files of the folder: '../elsewhere.safetensors'"]),
    "an index that misplaces a tensor": (_misplace, ["model.safetensors.index.json says model-"]),
    "an index beside a single weights file": (
        lambda f, shards: shutil.copy(f / shards[0], f / "model.safetensors"),
        ["holds both model.safetensors and model.safetensors.index.json"]),
}


@pytest.mark.parametrize("damage", sorted(SHARD_DAMAGES))
def test_a_sharded_folder_whose_index_and_shards_disagree_is_refused(tmp_path, damage):
    folder = tmp_path / "sharded"
    decoder("softmax", "elu").save_pretrained(folder, max_shard_size="8KB")
    make, words = SHARD_DAMAGES[damage]
    make(folder, sorted(path.name for path in folder.glob("model-*.safetensors")))
    with pytest.raises(UnpublishableFolderError) as err:
        publishable_files(folder)
    for word in words:
        assert word in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------ the push itself


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A finished train_lm.py run (tiny decoder, two steps, a checkpoint kept): copied by each test that damages it."""
    root = tmp_path_factory.mktemp("push")
    corpus = write_corpus(root)
    out = root / "run"
    extra = ["--save_strategy", "steps", "--save_steps", 2]
    load_script("train_lm").main([str(a) for a in common_args(corpus, out, "decoder", steps=2, extra=extra)])
    return out


def push_run(hub, home, folder, repo_id):
    return subprocess.run([sys.executable, str(ROOT / "scripts" / "push_run.py"), str(folder), repo_id], cwd=ROOT,
                          env=hub.client_env(home), capture_output=True, text=True, timeout=300)


def pushed_files(hub, repo_id):
    repo = hub.repo("model", repo_id)
    return set(repo["commits"][repo["branches"]["main"]]["files"]) - {".gitattributes"}


@pytest.mark.slow
def test_push_run_uploads_the_model_alone_and_names_what_it_leaves_out(finished_run, tmp_path):
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    (folder / "secrets.env").write_text("HF_TOKEN=hf_not_for_the_hub\n")
    (folder / "notes.txt").write_text("private notes\n")
    with LocalHub(tmp_path / "hub") as hub:
        result = push_run(hub, tmp_path / "home", folder, "user/tiny")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        files = pushed_files(hub, "user/tiny")
    assert files == set(publishable_files(folder)[0])
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "modeling_decoder.py"} <= files
    assert not files & {"secrets.env", "notes.txt", "training_args.bin"} and not any("checkpoint" in f for f in files)
    assert ("left out (not part of the model): checkpoint-2/, notes.txt, secrets.env, training_args.bin"
            in result.stdout + result.stderr)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["weights cut to 300 bytes", "weights of another shape than config.json"])
def test_push_run_refuses_a_model_that_would_not_load_and_uploads_nothing(finished_run, tmp_path, damage):
    folder = tmp_path / "run"
    shutil.copytree(finished_run, folder)
    card = (folder / "README.md").read_text()
    make, words = DAMAGES[damage]
    make(folder)
    with LocalHub(tmp_path / "hub") as hub:
        result = push_run(hub, tmp_path / "home", folder, "user/tiny")
        assert not hub.repos and not any(method == "POST" for method, _ in hub.requests)  # not even created
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"Not publishing {folder}: " in result.stderr and all(word in result.stderr for word in words)
    assert (folder / "README.md").read_text() == card  # the card is written for a push only once it is checked


PUSH = """
import sys
from hf_settransformer.toolkit import push_folder_to_hub
info = push_folder_to_hub(sys.argv[1], "user/run", token="hf_test")
print("pushed", getattr(info, "commit_url", info))
"""


@pytest.mark.slow
def test_push_folder_to_hub_uploads_no_pickles_checkpoints_links_or_lock(model_folder, tmp_path):
    folder = model_folder
    (folder / "checkpoint-4").mkdir()
    for name in ("training_args.bin", "optimizer.pt", LOCK_FILE, "checkpoint-4/model.safetensors"):
        (folder / name).write_text("x")
    (folder / ".tmp-final-model").mkdir()
    outside = tmp_path / "outside"
    (outside / "inner").mkdir(parents=True)
    (outside / "secret.txt").write_text("not the run's")
    (outside / "inner" / "key.json").write_text("{}")
    (folder / "notes.txt").symlink_to(outside / "secret.txt")  # a link to a file outside the run
    (folder / "linked[1]").symlink_to(outside / "inner")  # a link to a folder, with fnmatch characters in its name
    with LocalHub(tmp_path / "hub") as hub:
        result = subprocess.run([sys.executable, "-c", PUSH, str(folder)], env=hub.client_env(tmp_path / "home"),
                                capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert result.returncode == 0 and "pushed" in result.stdout, result.stderr[-3000:]
        files = pushed_files(hub, "user/run")
    assert files == MODEL_FILES | code_files(folder)
    # a warning of the toolkit's logger: on stderr where the caller configured no logging
    assert ("left out (not part of the model): .tmp-final-model/, checkpoint-4/, linked[1] (a link), notes.txt (a "
            "link), optimizer.pt, training_args.bin") in result.stderr


# ------------------------------------------------------------------------ the training scripts' repository id


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--push_to_hub", "--hub_model_id", "../../escape"],
         ["--hub_model_id '../../escape' is not a valid Hub repository id: expected namespace/name"]),
        (["--hub_model_id", "user/a..b"], ["--hub_model_id 'user/a..b' is not a valid Hub repository id",
                                           "without '--' or '..'"]),
        (["--push_to_hub"], ["--hub_model_id is needed: the Hub repository, namespace/name"]),
        (["--push_to_hub", "--hub_model_id", "tiny"], ["--hub_model_id 'tiny' has no namespace"]),
        (["--push_to_hub", "--hub_model_id", "user/tiny", "--hub_strategy", "all_checkpoints"],
         ["--hub_strategy all_checkpoints: a push uploads the final model at the end of the run, never a checkpoint"]),
    ],
)
def test_train_lm_refuses_a_hub_repository_id_before_training(train_lm, tmp_path, texts, flags, words):
    message = lm_refusal(train_lm, tmp_path, texts, *flags)
    for word in words:
        assert word in message, message


@pytest.mark.parametrize(
    "flags,words",
    [
        (["--push_to_hub", "--hub_model_id", "../../escape"],
         ["--hub_model_id '../../escape' is not a valid Hub repository id"]),
        (["--push_to_hub", "--model", "deepsets_max", "--hub_model_id", "user/sets"],
         ["--push_to_hub publishes a Set Transformer: --model deepsets_max is a plain torch module"]),
    ],
)
def test_train_sets_refuses_a_push_it_could_not_make_before_training(train_sets, tmp_path, flags, words):
    with pytest.raises(SystemExit) as err:
        train_sets.main(["--output_dir", str(tmp_path / "out"), "--max_steps", "1", "--report_to", "none", *flags])
    assert not (tmp_path / "out").exists()
    for word in words:
        assert word in str(err.value.code), str(err.value.code)


@pytest.mark.slow
def test_train_sets_pushes_the_model_alone(tmp_path):
    """The Trainer's own push uploaded training_args.bin (a pickle), the run's lock and the model folder being moved
    into place at every save; train_sets.py now pushes the final model's files at the end, with a card."""
    out = tmp_path / "run"
    args = [sys.executable, str(ROOT / "scripts" / "train_sets.py"), "--output_dir", str(out), "--report_to", "none",
            "--disable_tqdm", "true", "--task", "max_regression", "--max_steps", "4", "--eval_sets", "16",
            "--hidden_size", "32", "--save_strategy", "steps", "--save_steps", "2", "--push_to_hub", "--hub_model_id",
            "user/sets"]
    with LocalHub(tmp_path / "hub") as hub:
        result = subprocess.run(args, cwd=ROOT, env=hub.client_env(tmp_path / "home"), capture_output=True, text=True,
                                timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        repo = hub.repo("model", "user/sets")
        uploaded = {name for commit in repo["commits"].values() for name in commit["files"]} - {".gitattributes"}
    assert uploaded == set(publishable_files(out)[0])
    assert {"model.safetensors", "config.json", "README.md", "modeling_set_transformer.py"} <= uploaded
    assert not any(name.endswith(".bin") or name.startswith((".", "checkpoint-")) for name in uploaded), uploaded
    assert "pushed to user/sets" in result.stdout


@pytest.mark.parametrize("repo_id,words", [
    ("../../escape", ["expected namespace/name", "must be in the form 'repo_name' or 'namespace/repo_name'"]),
    ("user/a..b", ["Cannot have -- or .."]),
    ("tiny", ["it has no namespace"]),
])
def test_push_run_names_a_repository_id_that_is_not_one_and_the_rule(tmp_path, repo_id, words):
    with pytest.raises(SystemExit) as err:
        load_script("push_run").main([str(tmp_path), repo_id])
    message = str(err.value.code)
    assert message.startswith(f"repo_id {repo_id!r} is not a valid Hub repository id: expected namespace/name")
    for word in words:
        assert word in message, message


@pytest.mark.parametrize("family,cls", MODEL_CLASSES, ids=[f"{f}-{c.__name__}" for f, c in MODEL_CLASSES])
def test_every_model_class_saved_by_save_pretrained_is_publishable(tmp_path, family, cls):
    """No model of the package is refused: tied weights, buffers and every family's parts load as their config says."""
    make_model(cls, tiny_config(family)).save_pretrained(tmp_path)
    upload, left_out = publishable_files(tmp_path)
    assert "model.safetensors" in upload and left_out == []


def test_a_model_saved_in_bfloat16_is_publishable_and_one_cast_behind_its_configs_back_is_not(tmp_path):
    model = decoder("softmax", "elu").to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    publishable_files(tmp_path)
    _edit_json(tmp_path / "config.json", dtype="float32")
    with pytest.raises(UnpublishableFolderError, match="is BF16 in model.safetensors, the config's model F32"):
        publishable_files(tmp_path)


TOKEN = "hf_" + "Ab1" * 11 + "x"  # the form of a Hub access token


def test_the_recorded_command_hides_the_hub_token():
    from hf_settransformer.toolkit.hub import without_secrets

    argv = ["--push_to_hub", "--hub_token", TOKEN, "--hub_tok", TOKEN, f"--hub_token={TOKEN}", "--hub_strategy", "end"]
    assert without_secrets(argv) == ["--push_to_hub", "--hub_token", "<HUB_TOKEN>", "--hub_tok", "<HUB_TOKEN>",
                                     "--hub_token=<HUB_TOKEN>", "--hub_strategy", "end"]


@pytest.mark.parametrize("name", ["all_results.json", "README.md", "modeling_decoder.py"])
def test_a_file_holding_a_hub_token_is_not_published(model_folder, name):
    path = model_folder / name
    path.write_text(path.read_text() + f"\n# python scripts/train_lm.py --hub_token {TOKEN}\n"
                    if name.endswith((".md", ".py")) else json.dumps({"command": f"x --hub_token {TOKEN}"}))
    with pytest.raises(UnpublishableFolderError) as err:
        publishable_files(model_folder)
    assert f"{path} holds a Hub access token" in str(err.value) and TOKEN not in str(err.value)


@pytest.mark.slow
def test_a_push_with_hub_token_on_the_command_line_does_not_publish_it(tmp_path):
    """train_lm.py records its command in all_results.json and the card, which a push uploads: `--hub_token`'s value
    is recorded as `<HUB_TOKEN>`, as transformers writes it in training_args.json."""
    corpus = write_corpus(tmp_path)
    out = tmp_path / "run"
    args = common_args(corpus, out, "decoder", steps=2, extra=["--push_to_hub", "--hub_model_id", "user/tok",
                                                              "--hub_token", TOKEN])
    with LocalHub(tmp_path / "hub") as hub:
        result = subprocess.run([sys.executable, str(ROOT / "scripts" / "train_lm.py"), *map(str, args)], cwd=ROOT,
                                env=hub.client_env(tmp_path / "home"), capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        repo = hub.repo("model", "user/tok")
        published = [hub.object_path(f["sha256"]).read_bytes() for f in repo["commits"][repo["branches"]["main"]][
            "files"].values()]
    assert published and not any(TOKEN.encode() in data for data in published)
    assert "--hub_token <HUB_TOKEN>" in (out / "README.md").read_text()
    assert TOKEN not in (out / "all_results.json").read_text()
