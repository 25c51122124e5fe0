"""Pre-norm causal Transformer decoder (Vaswani et al. 2017) with ScaleNorm (Nguyen & Salazar 2019) and selectable
softmax or causal linear attention (Katharopoulos et al. 2020). Each block: causal self-attention, an optional
cross-attention to `encoder_hidden_states` (`add_cross_attention=True`, as BERT/GPT-2 do for
`EncoderDecoderModel`), a feed-forward; all pre-normalised, with a final norm after the stack.

Fast decoding: softmax attention takes transformers' `StaticCache` (`generate(cache_implementation="static")`), whose
decoding step has the same shapes at every step and reads nothing back to the host (positions and masks come from the
cache's counter, a tensor), so `torch.compile(model.forward, mode="reduce-overhead")` can CUDA-graph it. Linear
attention's recurrent state has a fixed size already: `LinearAttentionCache(static=True)` keeps it at fixed addresses
for a compiled step."""

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin
from transformers.cache_utils import DynamicCache, EncoderDecoderCache
from transformers.generation.configuration_utils import ALL_STATIC_CACHE_IMPLEMENTATIONS
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions, CausalLMOutputWithCrossAttentions
from transformers.utils import can_return_tuple
from transformers.utils.output_capturing import OutputRecorder

from .attention import AttentionMask, attention_kernel
from .blocks import MAB
from .cache import DecoderCache, static_cache_length
from .cache_checks import check_static_cache
from .checks import checked
from .label_checks import causal_lm_labels
from .configuration_decoder import TransformerDecoderConfig
from .heads import LMHeadMixin
from .layers import InputEmbeddings, make_norm
from .losses import causal_lm_loss, chunked_causal_lm_loss
from .modeling_common import HfstPreTrainedModel, record_outputs


class TransformerDecoderPreTrainedModel(HfstPreTrainedModel):
    config_class = TransformerDecoderConfig
    keeps_a_cache = True
    attends_causally = True
    takes_packed_batches = True


class TransformerDecoderModel(TransformerDecoderPreTrainedModel):
    """Embeddings -> `num_hidden_layers` causal blocks -> final norm. `hidden_states` (the embeddings, then every
    block's output, the last one after the final norm), `attentions` and `cross_attentions` are recorded by
    transformers' hooks (`_can_record_outputs`)."""

    _can_record_outputs = {
        "hidden_states": MAB,
        "attentions": MAB,
        "cross_attentions": OutputRecorder(MAB, index=2),  # None per block without `encoder_hidden_states`: no record
    }

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = InputEmbeddings(config)
        self.layers = nn.ModuleList(
            [
                MAB(config, causal=True, cross_attention=config.add_cross_attention, layer_idx=layer_idx)
                for layer_idx in range(config.num_hidden_layers)
            ]
        )
        self.final_norm = make_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    @checked
    @record_outputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""
        past_key_values (`Cache`, *optional*): what earlier calls saw: a `DynamicCache` of keys and values (softmax),
            a `LinearAttentionCache` of recurrent states (linear), or an `EncoderDecoderCache` holding one of those and
            the cross-attention keys and values. Created when `use_cache` and none is given; returned in the output.
            Softmax attention also takes a `StaticCache` (fixed-size keys and values, for a compiled step). The checks
            of the outermost call hand the forward its `DecoderCache` (what this forward knows of it) instead.
        attention_mask (`torch.Tensor` of shape (batch, past + length), *optional*): 1 for real tokens, 0 for padding,
            covering the cached tokens too (as `generate()` passes it); with a `StaticCache`, (batch, max_cache_len):
            one column per slot, 0 past the tokens given so far.
        """
        use_cache = self.config.use_cache if use_cache is None else use_cache
        if self.gradient_checkpointing and self.training:
            use_cache = False
        cache = past_key_values
        if not isinstance(cache, DecoderCache):  # none given, or a compiled call (no checks): read here
            kernel, crossed = attention_kernel(self.config), encoder_hidden_states is not None
            cache = DecoderCache.read(kernel, self.config, past_key_values, use_cache, crossed)
        hidden_states, _, mask = self.embed_inputs(
            input_ids,
            None,
            inputs_embeds,
            attention_mask,
            position_ids,
            causal=True,
            past_length=cache.past_length,
            cache_slots=cache.static_length,
            packing=kwargs.get("packing"),
        )
        cross_mask = None if encoder_hidden_states is None else AttentionMask.build(encoder_attention_mask)
        for layer in self.layers:
            hidden_states, _, _ = layer(
                hidden_states,
                mask=mask,
                cross_states=encoder_hidden_states,
                cross_mask=cross_mask,
                output_attentions=output_attentions,
                past_key_values=cache,
            )
        return BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=self.final_norm(hidden_states),
            past_key_values=cache.returned if use_cache else None,
        )


class TransformerDecoderForCausalLM(LMHeadMixin, TransformerDecoderPreTrainedModel, GenerationMixin):
    """Decoder with a (tied) vocabulary projection: logits at every position, transformers' causal-LM loss
    (`labels` = `input_ids`, shifted inside)."""

    objective = "causal_lm"  # the toolkit's OBJECTIVES row: how it is trained and scored
    check_labels = causal_lm_labels

    def __init__(self, config):
        super().__init__(config)
        self.model = TransformerDecoderModel(config)
        self.lm_head = self.make_lm_head(config)
        self.post_init()

    @checked
    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        use_cache=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        logits_to_keep=0,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor` (batch, length)): usually `input_ids`; -100 positions are ignored.
        logits_to_keep (`int` or `torch.Tensor`): an int computes logits for the last `logits_to_keep` positions only
            (0: all); a 1-D tensor of indices, for those positions (as Llama)."""
        if use_cache is None and labels is not None and self.training and past_key_values is None:
            use_cache = False  # a training step has no use for a cache: do not fill one
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            past_key_values=past_key_values,
            use_cache=use_cache,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            packing=kwargs.get("packing"),
        )
        hidden_states = outputs.last_hidden_state
        if torch.is_tensor(logits_to_keep):
            hidden_states = hidden_states[:, logits_to_keep]
        elif logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        chunk = self.config.lm_loss_chunk_size
        keep_all = not torch.is_tensor(logits_to_keep) and logits_to_keep == 0
        training_loss = labels is not None and self.training and torch.is_grad_enabled() and keep_all
        if training_loss and self.adaptive_output:
            # adaptive softmax: only the clusters the targets fall in are computed; no full log-probabilities
            shift_labels = kwargs.get("shift_labels")
            if shift_labels is None:
                shift_labels = F.pad(labels, (0, 1), value=-100)[..., 1:]
            divisor = kwargs.get("num_items_in_batch")
            logits, loss = None, self.lm_loss(hidden_states, shift_labels, divisor=divisor)
        elif chunk and training_loss:
            # output layer + cross-entropy in chunks of positions: no full logits (config.lm_loss_chunk_size)
            logits, loss = (
                None,
                chunked_causal_lm_loss(
                    hidden_states,
                    self.lm_head.weight,
                    labels,
                    chunk,
                    num_items_in_batch=kwargs.get("num_items_in_batch"),
                    shift_labels=kwargs.get("shift_labels"),
                ),
            )
        else:
            logits = self.lm_logits(hidden_states)  # (b, n, vocab); log-probabilities for an adaptive softmax
            loss = None
            if labels is not None:
                loss = causal_lm_loss(logits, labels, kwargs.get("num_items_in_batch"), kwargs.get("shift_labels"))
        output = CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cross_attentions=outputs.cross_attentions,
        )
        return output

    def _supports_default_dynamic_cache(self):
        # softmax: generate() makes transformers' DynamicCache; linear: the model makes its LinearAttentionCache
        return attention_kernel(self.config).cache_class is DynamicCache

    def _prepare_cache_for_generation(self, generation_config, *args, **kwargs):
        # transformers would only warn that `cache_implementation` is ignored where the model makes its own cache
        if generation_config.use_cache is not False and generation_config.cache_implementation in (
            ALL_STATIC_CACHE_IMPLEMENTATIONS
        ):
            check_static_cache(attention_kernel(self.config), self.config)
        return super()._prepare_cache_for_generation(generation_config, *args, **kwargs)

    def create_masks_for_generate(self, attention_mask=None, past_key_values=None, **_):
        """What `generate()` passes as `attention_mask` with a compileable cache (instead of transformers' 4-D masks,
        which this model does not take): the 2-D mask, padded with zeros to a static cache's slots, so every step
        gets a (batch, max_cache_len) mask, the same shape at each step; the masks themselves are built in
        `forward`, from the cache's counter."""
        if isinstance(past_key_values, EncoderDecoderCache):
            past_key_values = past_key_values.self_attention_cache
        slots = static_cache_length(past_key_values)
        if attention_mask is None or attention_mask.dim() != 2 or slots is None or attention_mask.shape[1] > slots:
            return attention_mask  # forward refuses a mask longer than the cache
        return F.pad(attention_mask, (0, slots - attention_mask.shape[1]))

