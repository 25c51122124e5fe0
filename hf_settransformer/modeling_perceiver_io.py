"""Perceiver IO (Jaegle et al. 2022) with pre-norm ScaleNorm blocks and selectable attention.

Encode: `num_latents` learned latents cross-attend to the embedded inputs (`num_cross_attention_heads` heads), then a
block of `num_self_attends_per_block` latent self-attention layers is applied `num_blocks` times with shared weights
(as transformers' `PerceiverModel` does). Decode: output queries cross-attend to the latents. Queries are the embedded
inputs (`output_query_type="inputs"`, one per input position), their position embeddings only (`"positions"`), or
`num_output_queries` learned vectors (`"learned"`). Cost is linear in the input length for either attention type.
A packed batch (S sets in one row, `cu_seq_lens_q`/`cu_seq_lens_k`, `set_packing.py`) gives each set its own latents,
which read that set's inputs only.
"""

import torch
from torch import nn
from transformers import GenerationMixin
from transformers.utils.output_capturing import OutputRecorder

from .attention import AttentionMask
from .blocks import MAB
from .checks import checked
from .configuration_perceiver_io import PerceiverIOConfig
from .heads import ForMaskedLMMixin, ForNextTokenPredictionMixin, ForSequenceClassificationMixin
from .layers import InputEmbeddings, LearnedVectors, make_norm
from .modeling_common import HfstPreTrainedModel, PerceiverIOModelOutput, record_outputs
from .set_packing import check_packed_sets, sets_of


class PerceiverIOPreTrainedModel(HfstPreTrainedModel):
    config_class = PerceiverIOConfig


class PerceiverIOModel(PerceiverIOPreTrainedModel):
    """Embeddings -> latents cross-attending to them -> `num_blocks` x the latent self-attention layers -> latent norm
    -> output queries cross-attending to the latents -> final norm.

    Recorded by transformers' hooks (`_can_record_outputs`): `hidden_states`, the embedded inputs (the embeddings'
    output: they are no block's input), the latents after the cross-attention and after every self-attention layer,
    the last one before the latent norm (not tied to `last_hidden_state`, the decoded queries); `attentions`, the
    latent self-attentions'; `cross_attentions`, the encoder's then the decoder's cross-attention.

    A packed batch of S sets (`packing`): latents (S, num_latents, hidden); `last_hidden_state` (1, total, hidden) for
    per-position queries, (S, num_output_queries, hidden) for learned ones."""

    takes_packed_batches = True
    _can_record_outputs = {
        "hidden_states": [
            OutputRecorder(InputEmbeddings, capture_initial_hidden_state=False),
            OutputRecorder(MAB, index=0, layer_name="encoder_cross_attention", capture_initial_hidden_state=False),
            OutputRecorder(MAB, index=0, layer_name="latent_layers", capture_initial_hidden_state=False),
        ],
        "attentions": OutputRecorder(MAB, index=1, layer_name="latent_layers"),
        "cross_attentions": [
            OutputRecorder(MAB, index=1, layer_name="encoder_cross_attention"),
            OutputRecorder(MAB, index=1, layer_name="decoder_cross_attention"),
        ],
    }

    def __init__(self, config):
        super().__init__(config)
        heads = config.num_cross_attention_heads
        self.embeddings = InputEmbeddings(config)
        self.latents = LearnedVectors(config.num_latents, config.hidden_size)
        self.encoder_cross_attention = MAB(config, self_attention=False, num_heads=heads)
        self.latent_layers = nn.ModuleList([MAB(config) for _ in range(config.num_self_attends_per_block)])
        self.latent_norm = make_norm(config)
        self.output_queries = (
            LearnedVectors(config.num_output_queries, config.hidden_size)
            if config.output_query_type == "learned"
            else None
        )
        self.decoder_cross_attention = MAB(config, self_attention=False, num_heads=heads)
        self.final_norm = make_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    @checked
    @record_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        input_features=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        prefix_length=None,
        **kwargs,
    ):
        r"""prefix_length (`int`, *optional*): Perceiver AR (Hawthorne et al. 2022), for the many-target language model:
        the `t = n - prefix_length` inputs after the prefix, plus the first t learned latents, are the latents; latent
        i cross-attends to the inputs up to its own position, the latent self-attention and the decoder (the latents
        querying the latents) are causal, and `last_hidden_state` is (b, t, hidden), one state per target."""
        packing = kwargs.get("packing")
        if packing is not None:
            check_packed_sets(self.config, output_attentions, prefix_length)
        inputs, position_ids, mask = self.embed_inputs(
            input_ids, input_features, inputs_embeds, attention_mask, position_ids, packing=packing
        )  # (b, n, hidden)
        b, n = inputs.shape[:2]
        sets = sets_of(packing, inputs.device)
        latents, cross_mask, self_mask = self.initial_latents(inputs, mask, prefix_length, sets)
        latents, _, _ = self.encoder_cross_attention(
            latents, inputs, mask=cross_mask, output_attentions=output_attentions
        )  # (b, num_latents or t, hidden)
        for _ in range(self.config.num_blocks):  # the same weights every time
            for layer in self.latent_layers:
                latents, _, _ = layer(latents, mask=self_mask, output_attentions=output_attentions)
        latents = self.latent_norm(latents)
        # Perceiver AR: latent i decodes target i, reading the latents up to it
        queries = self.decoder_queries(inputs, position_ids, latents.shape[0], n) if prefix_length is None else latents
        # a packed row's per-position queries read their own set's latents; learned ones are an ordinary batch
        per_position = sets is not None and self.config.output_query_type != "learned"
        decoder_mask = sets.route("broadcast") if per_position else self_mask
        outputs, _, _ = self.decoder_cross_attention(
            queries, latents, mask=decoder_mask, output_attentions=output_attentions
        )  # (b, q or t, hidden); a packed row's per-position queries: (1, total, hidden)
        return PerceiverIOModelOutput(
            last_hidden_state=self.final_norm(outputs),
            latent_hidden_state=latents,
        )

    def initial_latents(self, inputs, mask, prefix_length, sets=None):
        """-> (latents (b, num_latents or t, hidden), the encoder cross-attention's mask, the latents' mask). Perceiver
        AR (`prefix_length`): latent i is target i's input plus the i-th learned latent; it reads the inputs and the
        latents up to its own position. A packed row of S sets (`sets`, a `set_packing.SetBlocks`): (S, num_latents,
        hidden) latents, each reading its own set's inputs (the "pool" route)."""
        b, n = inputs.shape[:2]
        if sets is not None:
            return self.latents(sets.num_sets), sets.route("pool"), AttentionMask()
        if prefix_length is None:
            return self.latents(b), mask, AttentionMask()
        t = n - prefix_length
        key_mask = mask.key_mask  # (b, n) or None
        cross_mask = AttentionMask.build(key_mask, causal=True, num_queries=t, num_keys=n)
        self_mask = AttentionMask.build(None if key_mask is None else key_mask[:, -t:], causal=True, num_queries=t,
                                        num_keys=t)
        if key_mask is None:
            return inputs[:, -t:] + self.latents(b)[:, :t], cross_mask, self_mask
        # the learned latents counted from each row's first real target: a left-padded row shorter than t gets the
        # latents it gets alone
        order = (key_mask[:, -t:].cumsum(-1) - 1).clamp_min(0)  # (b, t)
        return inputs[:, -t:] + self.latents.weight[order], cross_mask, self_mask

    def decoder_queries(self, inputs, position_ids, batch_size, length):
        kind = self.config.output_query_type
        if kind == "inputs":
            return inputs
        if kind == "learned":
            return self.output_queries(batch_size)
        if position_ids is None:
            position_ids = torch.arange(length, device=inputs.device).expand(batch_size, -1)
        return self.embeddings.positions(position_ids, inputs.dtype)


class PerceiverPooledHeadMixin:
    def pool_outputs(self, outputs, key_mask, packing=None):
        per_input = self.config.output_query_type != "learned"  # else (b or S, q, hidden): an ordinary batch
        return self.head_pool(outputs.last_hidden_state, *((key_mask, packing) if per_input else (None, None)))


class PerceiverIOForMaskedLM(ForMaskedLMMixin, PerceiverIOPreTrainedModel):
    """Perceiver IO with one output query per input position and a (tied) vocabulary projection; a packed row's
    sequences each get latents of their own."""

    takes_packed_batches = True
    base_model_class = PerceiverIOModel


class PerceiverIOForSequenceClassification(
    PerceiverPooledHeadMixin, ForSequenceClassificationMixin, PerceiverIOPreTrainedModel
):
    """Classification/regression of a sequence or set; a packed batch of S sets gives logits (S, num_labels)."""

    takes_packed_batches = True
    base_model_class = PerceiverIOModel


class PerceiverIOForNextTokenPrediction(
    PerceiverPooledHeadMixin, ForNextTokenPredictionMixin, PerceiverIOPreTrainedModel, GenerationMixin
):
    """`"many"`: Perceiver AR (see `PerceiverIOModel.forward`'s `prefix_length`), then one PMA query per target
    reading the decoded states up to it; `"window"`: Perceiver IO over the window, PMA pooling."""

    base_model_class = PerceiverIOModel
