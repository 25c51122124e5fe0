"""transformers' own common model tests (`ModelTesterMixin`) run against every family and attention type.

The mixin lives in the `tests/` folder of transformers' source distribution, not in the wheel. This module builds that
folder the first time it runs (`scripts/get_transformers_tests.sh`: a `pip download` of the installed version's sdist,
about 30 s) into a cache folder of this package's own, `$XDG_CACHE_HOME/hf_settransformer/transformers-tests-<version>`
(`~/.cache/...` by default), and reuses it afterwards. `HFST_TRANSFORMERS_TESTS=<folder>` points it at a tree built
elsewhere (for example one with transformers' exporters/ and generation/ tests copied in); where the sdist cannot be
downloaded (offline), the module fails with the command that builds the tree.

One test class per family x attention type (softmax, linear elu, linear exp), each with a small model tester as
transformers' own model tests have. Every exclusion below says why the test does not apply to these models; the
regressions the mixin found are also guarded by ordinary tests (test_output_recording.py, test_empty_rows.py).
"""

import copy
import importlib
import os
import pathlib
import subprocess
import sys
import types
import unittest

import filelock
import pytest
import torch
import transformers

pytestmark = pytest.mark.slow
REPOSITORY = pathlib.Path(__file__).resolve().parents[2]


def transformers_tests_tree():
    """The folder holding the installed transformers' sdist `tests/`, built on first use."""
    if os.environ.get("HFST_TRANSFORMERS_TESTS"):
        return pathlib.Path(os.environ["HFST_TRANSFORMERS_TESTS"])
    cache = pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache")
    tree = cache / "hf_settransformer" / f"transformers-tests-{transformers.__version__}"
    tree.parent.mkdir(parents=True, exist_ok=True)
    # every pytest-xdist worker imports this module: the first builds the tree, the others wait for it
    with filelock.FileLock(f"{tree}.lock"):
        if not (tree / "test_modeling_common.py").is_file():
            script = REPOSITORY / "scripts" / "get_transformers_tests.sh"
            done = subprocess.run(["bash", str(script), str(tree)], capture_output=True, text=True,
                                  env={**os.environ, "PYTHON": sys.executable})
            if done.returncode or not (tree / "test_modeling_common.py").is_file():
                raise RuntimeError(
                    f"Could not build transformers' tests tree in {tree} ({script} failed: "
                    f"{done.stderr.strip()[-500:]}). Build it where PyPI is reachable with `{script} <folder>` and "
                    f"set HFST_TRANSFORMERS_TESTS=<folder>."
                )
    return tree


TESTS_TREE = transformers_tests_tree()

from tests.helpers import ATTENTION_IDS, ATTENTIONS, VOCAB, tiny_config
from transformers.models.auto import modeling_auto

import hf_settransformer as hfst

# The folder is imported as the package `transformers_tests` (this repository has its own `tests`), so its relative
# imports (`from .exporters.test_export import ...`) resolve inside it.
if "transformers_tests" not in sys.modules:
    _package = types.ModuleType("transformers_tests")
    _package.__path__ = [str(TESTS_TREE.resolve())]
    sys.modules["transformers_tests"] = _package
common = importlib.import_module("transformers_tests.test_modeling_common")
ModelTesterMixin = common.ModelTesterMixin

# The mixin tells a base model from a head, and builds `labels`, by looking class names up in transformers' auto
# mapping tables. A model inside transformers is listed there; ours are registered with the Auto classes at import
# instead, so the test module's own view of those tables gets our names added (transformers' tables are untouched).
_TABLES = {
    "AutoModel": "MODEL_MAPPING_NAMES",
    "AutoModelForCausalLM": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "AutoModelForMaskedLM": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "AutoModelForSequenceClassification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
}
for _auto, _table in _TABLES.items():
    _names = dict(getattr(modeling_auto, _table))
    for _family in hfst.FAMILIES.values():
        if _auto in _family.models:
            _names[_family.model_type] = _family.models[_auto].split(".")[-1]
    setattr(common, _table, _names)


class HfstModelTester:
    """Tiny configs and inputs for one family and attention type (hidden 32, 2 layers, 4 heads)."""

    def __init__(self, parent, family, attention_type, feature_map, continuous=False):
        self.parent = parent
        self.family = family
        self.attention_type = attention_type
        self.feature_map = feature_map
        self.continuous = continuous
        self.batch_size = 3
        self.seq_length = 7
        self.vocab_size = VOCAB
        self.input_size = 3
        self.hidden_size = 32
        self.num_attention_heads = 4
        self.num_hidden_layers = 2
        self.is_training = True
        if family == "set_transformer":
            self.num_inducing_points = 3
            self.num_seeds = 1
            self.num_decoder_layers = 1
        if family == "perceiver_io":
            self.num_latents = 5
            self.num_blocks = 1
            self.num_self_attends_per_block = 2
            self.num_cross_attention_heads = 2
            # the embedded inputs, the latents after the cross-attention, then after every latent self-attention
            self.expected_num_hidden_layers = 2 + self.num_blocks * self.num_self_attends_per_block

    def get_config(self):
        overrides = {}
        if self.family == "perceiver_io":
            overrides = {"num_blocks": self.num_blocks, "num_self_attends_per_block": self.num_self_attends_per_block}
        if self.continuous:
            overrides.update(vocab_size=None, input_size=self.input_size)
        return tiny_config(self.family, self.attention_type, self.feature_map, **overrides)

    def prepare_config_and_inputs_for_common(self):
        config = self.get_config()
        b, n = self.batch_size, self.seq_length
        if self.continuous:
            inputs = {"input_features": common.floats_tensor([b, n, self.input_size])}
        else:
            inputs = {"input_ids": common.ids_tensor([b, n], self.vocab_size)}
        inputs["attention_mask"] = common.random_attention_mask([b, n])
        return config, inputs


class HfstModelTest(ModelTesterMixin):
    family = None
    attention = ("softmax", "elu")
    continuous = False

    # hf_settransformer models are not generated by transformers' model templates: no `generate` tests here
    # (tests/models/test_generation.py covers ours); the issue asks for `ModelTesterMixin` only.
    all_generative_model_classes = ()
    # linear attention never forms an attention matrix, so it has no weights to return
    has_attentions = property(lambda self: self.attention[0] == "softmax")
    # the mixin runs its `_init_weights` coverage test only for models it dates after 2022 from a copyright line in
    # the configuration file; ours have none, so it would be skipped: run it
    test_can_init_all_missing_weights_before_2023 = True

    def setUp(self):
        self.model_tester = HfstModelTester(self, self.family, *self.attention, continuous=self.continuous)

    def _prepare_for_class(self, inputs_dict, model_class, return_labels=False):
        inputs_dict = super()._prepare_for_class(inputs_dict, model_class, return_labels=return_labels)
        if return_labels and model_class is hfst.SetTransformerForMixtureOfGaussians:
            inputs_dict["return_loss"] = True  # its loss is the likelihood of its own inputs: no labels
        return inputs_dict


def _make_test_classes(family, model_classes, continuous=False, **attributes):
    """One `unittest.TestCase` per attention type, named like `EncoderSoftmaxModelTest`."""
    prefix = "".join(part.capitalize() for part in family.split("_")) + ("Continuous" if continuous else "")
    for attention, attention_id in zip(ATTENTIONS, ATTENTION_IDS):
        name = f"{prefix}{''.join(p.capitalize() for p in attention_id.split('-'))}ModelTest"
        namespace = dict(
            family=family, attention=attention, continuous=continuous, all_model_classes=model_classes, **attributes
        )
        globals()[name] = type(name, (HfstModelTest, unittest.TestCase), namespace)


def _set_attention_outputs(self):
    """Set Transformer: an ISAB has two attentions (inducing points <- set, set <- inducing points), then PMA and the
    decoder SABs attend over the pooled seeds, so the mixin's one-attention-per-layer count does not apply. Checks the
    same property for this structure: the weights come back, through the argument and the config, in order and shape."""
    if not self.has_attentions:
        self.skipTest(reason="linear attention has no attention weights")
    t = self.model_tester
    config, inputs_dict = t.prepare_config_and_inputs_for_common()
    n, m, k, h = t.seq_length, t.num_inducing_points, t.num_seeds, t.num_attention_heads
    for model_class in self.all_model_classes:
        if model_class is hfst.SetTransformerForNextTokenPrediction:
            # the many-target LM: the last t elements are targets, each reading the inducing points' summary of the
            # prefix and the targets up to itself, and pooled once per target
            tt = min(config.target_length, n)
            expected = [(h, m, n), (h, n, m + tt)] * t.num_hidden_layers + [(h, tt, n)] + [(h, tt, tt)]
        else:
            expected = [(h, m, n), (h, n, m)] * t.num_hidden_layers + [(h, k, n)] + [(h, k, k)]
        for via_config in (False, True):
            model_config = copy.deepcopy(config)
            inputs = self._prepare_for_class(inputs_dict, model_class)
            if via_config:
                model_config.output_attentions = True
            else:
                inputs["output_attentions"] = True
            model = model_class(model_config).eval()
            with torch.no_grad():
                attentions = model(**inputs).attentions
            self.assertEqual([tuple(a.shape) for a in attentions], [(t.batch_size, *s) for s in expected])


def _perceiver_attention_outputs(self):
    """Perceiver IO: the latent self-attentions are `attentions`, and the encoder's cross-attention (latents <- inputs)
    and the decoder's (queries <- latents) are `cross_attentions`, as transformers' Perceiver returns them; the mixin
    reads every attention as (seq, seq) of the input length, which latents do not have. Checks this structure."""
    if not self.has_attentions:
        self.skipTest(reason="linear attention has no attention weights")
    t = self.model_tester
    config, inputs_dict = t.prepare_config_and_inputs_for_common()
    b, n = t.batch_size, t.seq_length
    for model_class in self.all_model_classes:
        # the many-target LM is Perceiver AR: one latent per target
        m = min(config.target_length, n) if model_class is hfst.PerceiverIOForNextTokenPrediction else t.num_latents
        for via_config in (False, True):
            model_config = copy.deepcopy(config)
            inputs = self._prepare_for_class(inputs_dict, model_class)
            if via_config:
                model_config.output_attentions = True
            else:
                inputs["output_attentions"] = True
            model = model_class(model_config).eval()
            with torch.no_grad():
                outputs = model(**inputs)
            self.assertEqual(
                [tuple(a.shape) for a in outputs.attentions], [(b, t.num_attention_heads, m, m)] * t.num_hidden_layers
            )
            if model_class is hfst.PerceiverIOModel:
                cross = [tuple(a.shape) for a in outputs.cross_attentions]
                heads = t.num_cross_attention_heads
                self.assertEqual(cross, [(b, heads, m, n), (b, heads, n, m)])


def _features_get_set_embeddings(self):
    """Continuous sets have no token embedding: their input embedding is the feature projection (a Linear), as a vision
    model's is its patch embedding. Checks getting and setting it, as the mixin does for a token embedding."""
    config, _ = self.model_tester.prepare_config_and_inputs_for_common()
    for model_class in self.all_model_classes:
        model = model_class(copy.deepcopy(config))
        self.assertIsInstance(model.get_input_embeddings(), torch.nn.Linear)
        new_projection = torch.nn.Linear(config.input_size, config.hidden_size)
        model.set_input_embeddings(new_projection)
        self.assertIs(model.get_input_embeddings(), new_projection)
        output_embeddings = model.get_output_embeddings()
        self.assertTrue(output_embeddings is None or isinstance(output_embeddings, torch.nn.Linear))


def _features_inputs_embeds(self):
    """Continuous sets have no `input_ids` for the mixin to embed: `inputs_embeds` is checked against `input_features`
    instead: `model(inputs_embeds=model.get_input_embeddings()(features))` equals `model(input_features=features)`."""
    config, inputs_dict = self.model_tester.prepare_config_and_inputs_for_common()
    for model_class in self.all_model_classes:
        if model_class is hfst.SetTransformerForMixtureOfGaussians:
            continue  # it fits a mixture to the points themselves, so it takes `input_features` only
        model = model_class(copy.deepcopy(config)).eval()
        inputs = self._prepare_for_class(inputs_dict, model_class)
        features = inputs.pop("input_features")
        with torch.no_grad():
            expected = model(input_features=features, **inputs)[0]
            embedded = model(inputs_embeds=model.get_input_embeddings()(features), **inputs)[0]
        torch.testing.assert_close(embedded, expected)


def _no_vocabulary_mismatch(self):
    """The mixin provokes a size mismatch by changing `vocab_size`; continuous sets have no vocabulary. The classifier's
    size mismatch (`num_labels`) is checked by `test_can_load_ignoring_mismatched_shapes`."""


_make_test_classes("decoder", (hfst.TransformerDecoderModel, hfst.TransformerDecoderForCausalLM))
_make_test_classes(
    "encoder",
    (
        hfst.TransformerEncoderModel,
        hfst.TransformerEncoderForMaskedLM,
        hfst.TransformerEncoderForSequenceClassification,
        hfst.TransformerEncoderForNextTokenPrediction,
    ),
)
_make_test_classes(
    "set_transformer",
    (
        hfst.SetTransformerModel,
        hfst.SetTransformerForSequenceClassification,
        hfst.SetTransformerForNextTokenPrediction,
    ),
    test_attention_outputs=_set_attention_outputs,
)
_make_test_classes(
    "set_transformer",
    (hfst.SetTransformerModel, hfst.SetTransformerForSequenceClassification, hfst.SetTransformerForMixtureOfGaussians),
    continuous=True,
    test_attention_outputs=_set_attention_outputs,
    test_resize_embeddings=False,  # no vocabulary to resize: the inputs are points
    test_model_get_set_embeddings=_features_get_set_embeddings,
    test_inputs_embeds=_features_inputs_embeds,
    test_inputs_embeds_matches_input_ids=_features_inputs_embeds,
    test_load_with_mismatched_shapes=_no_vocabulary_mismatch,
)
_make_test_classes(
    "perceiver_io",
    (
        hfst.PerceiverIOModel,
        hfst.PerceiverIOForMaskedLM,
        hfst.PerceiverIOForSequenceClassification,
        hfst.PerceiverIOForNextTokenPrediction,
    ),
    test_attention_outputs=_perceiver_attention_outputs,
)
