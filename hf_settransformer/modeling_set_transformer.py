"""Set Transformer (Lee et al. 2019): an encoder of ISABs (or SABs), PMA pooling to k seeds, SABs over the seeds.

Inputs are sets of continuous features (`input_features`, (b, n, input_size)) or of tokens (`input_ids`); there are
no positions, so per-element outputs are permutation equivariant and the pooled output is invariant. Padding
elements (`attention_mask` 0) are ignored by every block, ISAB and PMA included. A packed batch (S sets in one row,
`input_features` (1, total, input_size) with `cu_seq_lens_q`/`cu_seq_lens_k`, `set_packing.py`) computes each set as
if alone, on its real elements only. See `blocks.py` for where this
departs from the official code (head-dim scaling, pre-norm ScaleNorm, rFF inside PMA, masks).
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import GenerationMixin
from transformers.utils import ModelOutput, can_return_tuple
from transformers.utils.output_capturing import OutputRecorder

from .attention import AttentionMask
from .checks import checked
from .blocks import ISAB, MAB, PMA, SAB, masked_mean
from .configuration_set_transformer import SetTransformerConfig
from .heads import ForNextTokenPredictionMixin, ForSequenceClassificationMixin
from .layers import InputEmbeddings, make_norm
from .modeling_common import HfstPreTrainedModel, SetModelOutput, record_outputs
from .set_packing import check_packed_sets, sets_of


class SetTransformerPreTrainedModel(HfstPreTrainedModel):
    config_class = SetTransformerConfig


class SetTransformerModel(SetTransformerPreTrainedModel):
    """Encoder: `num_hidden_layers` ISAB_m (SAB when `num_inducing_points=0`) + norm -> `last_hidden_state`.
    Decoder: PMA_k, `num_decoder_layers` SABs + norm -> `pooler_output` (b, k, hidden).

    Recorded by transformers' hooks (`_can_record_outputs`): `hidden_states`, the embeddings and every encoder layer's
    output (the last one after the encoder norm, as `last_hidden_state`); `attentions`, every MAB's weights in the order
    they run (two per ISAB, then the PMA's, then the decoder's).

    A packed batch of S sets (`packing`): `last_hidden_state` (1, total, hidden), `pooler_output` (S, k, hidden)."""

    takes_packed_batches = True
    _can_record_outputs = {
        "hidden_states": [OutputRecorder(ISAB, index=0), OutputRecorder(SAB, index=0, layer_name="encoder_layers")],
        "attentions": MAB,
    }

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = InputEmbeddings(config)
        block = ISAB if config.num_inducing_points > 0 else SAB
        self.encoder_layers = nn.ModuleList([block(config) for _ in range(config.num_hidden_layers)])
        self.encoder_norm = make_norm(config)
        self.pma = PMA(config, num_seeds=config.num_seeds)
        self.decoder_layers = nn.ModuleList([SAB(config) for _ in range(config.num_decoder_layers)])
        self.decoder_norm = make_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    @checked
    @record_outputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        input_features=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        prefix_length=None,
        **kwargs,
    ):
        r"""prefix_length (`int`, *optional*): the many-target language model. The first `prefix_length` elements are
        a set (ISAB: summarised by the inducing points; SAB: bidirectional among themselves); every later element
        reads that summary and the later elements up to itself, and `pooler_output` has one PMA-pooled vector per later
        element (b, n - prefix_length, hidden), whose query is the seed plus that element's state and whose keys stop at
        it; the decoder SABs run causally over them."""
        causal = prefix_length is not None
        packing = kwargs.get("packing")
        if packing is not None:
            check_packed_sets(self.config, output_attentions, prefix_length)
        hidden_states, _, mask = self.embed_inputs(
            input_ids,
            input_features,
            inputs_embeds,
            attention_mask,
            causal=causal,
            prefix_length=prefix_length or 0,
            packing=packing,
        )
        masks = self.build_masks(mask, hidden_states.shape[:2], prefix_length, hidden_states.device, packing)

        induced = self.config.num_inducing_points > 0  # from the config: a wrapper (FSDP, checkpointing) hides the class
        for layer in self.encoder_layers:
            if induced:
                hidden_states, _ = layer(
                    hidden_states, masks["induce"], output_attentions, masks["broadcast"], keys_from=prefix_length
                )
            else:
                hidden_states, _, _ = layer(hidden_states, mask=masks["self"], output_attentions=output_attentions)
        hidden_states = self.encoder_norm(hidden_states)

        # causal: one pooled vector per target element (b, t, hidden), its query the seed plus the element's state
        queries = None if prefix_length is None else hidden_states[:, prefix_length:]
        pooled, _ = self.pma(hidden_states, masks["pool"], output_attentions, queries=queries)  # (b, k|t, hidden)
        for layer in self.decoder_layers:
            pooled, _, _ = layer(pooled, mask=masks["decoder"], output_attentions=output_attentions)
        return SetModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=self.decoder_norm(pooled),
        )

    def build_masks(self, mask, shape, prefix_length, device, packing=None):
        """Every mask of the forward, from `embed_inputs`' `mask`: {"induce", "broadcast"} for the ISABs, "self" for
        the encoder SABs, {"pool", "decoder"} for the PMA and the decoder SABs. With `prefix_length` p: the inducing
        points summarise the first p elements only; every element reads that summary, and each later element also the
        later elements up to itself (causal); each target's pooling query reads the elements up to it, the decoder is
        causal. A packed row of sets (`packing`): the `SetAttention` routes of `set_packing.py`; the decoder SABs run
        over the (S, k, hidden) pooled vectors, an ordinary batch."""
        if packing is not None:
            sets = sets_of(packing, device)
            pool = sets.route("pool")
            return {"induce": pool, "broadcast": sets.route("broadcast"), "self": sets.route("self"), "pool": pool,
                    "decoder": AttentionMask()}
        if prefix_length is None:
            return {"induce": mask, "broadcast": None, "self": mask, "pool": mask, "decoder": AttentionMask()}
        (b, n), m, key_mask = shape, self.config.num_inducing_points, mask.key_mask  # key_mask: (b, n) or None
        t = n - prefix_length
        in_prefix = (torch.arange(n, device=device) < prefix_length).expand(b, n)
        tail_keys = None
        if key_mask is not None:
            tail_keys = torch.cat([key_mask.new_ones(b, m), key_mask[:, prefix_length:]], dim=1)  # (b, m + t)
        return {
            "self": mask,
            "induce": AttentionMask.build(in_prefix if key_mask is None else in_prefix & key_mask),
            "broadcast": AttentionMask.build(tail_keys, causal=True, num_queries=n, num_keys=m + t,
                                             prefix_length=prefix_length),
            "pool": AttentionMask.build(key_mask, causal=True, num_queries=t, num_keys=n),
            "decoder": AttentionMask.build(None if key_mask is None else key_mask[:, prefix_length:], causal=True,
                                           num_queries=t, num_keys=t),
        }


class SetPooledHeadMixin:
    """Set heads read the model's own decoder output (its PMA), averaged over the k seeds, or a masked mean."""

    def make_head_pool(self, config):
        return None

    def pool_outputs(self, outputs, key_mask, packing=None):
        if self.config.pooling == "pma":
            return outputs.pooler_output.mean(dim=1)  # (b or S, hidden); the identity for k = 1
        return masked_mean(outputs.last_hidden_state, key_mask, sets_of(packing, outputs.last_hidden_state.device))


class SetTransformerForSequenceClassification(
    SetPooledHeadMixin, ForSequenceClassificationMixin, SetTransformerPreTrainedModel
):
    """Set classification/regression (e.g. the paper's point-cloud and counting tasks). A packed batch of S sets gives
    logits (S, num_labels) and takes labels (S,)."""

    takes_packed_batches = True
    base_model_class = SetTransformerModel


class SetTransformerForNextTokenPrediction(
    SetPooledHeadMixin, ForNextTokenPredictionMixin, SetTransformerPreTrainedModel, GenerationMixin
):
    """The last `context_length` tokens (no positions), the model's own PMA and decoder, vocabulary projection.
    `"many"`: the first tokens of the window are a set the inducing points summarise, each target reads that summary
    and the tokens up to itself (see `SetTransformerModel.forward`); `"window"`: the whole window as one set."""

    base_model_class = SetTransformerModel

    def target_states(self, outputs, num_targets, key_mask):
        return outputs.pooler_output  # (b, num_targets, hidden): the model's own per-target PMA and causal SABs


@dataclass
class MixtureOfGaussiansOutput(ModelOutput):
    """Output of [`SetTransformerForMixtureOfGaussians`].

    loss: minus the mean log-likelihood per real point (over the whole batch), when `return_loss`.
    log_likelihood: (b,) mean log-likelihood per real point of each set under its predicted mixture.
    mixture_logits: (b, k) unnormalised log mixture weights; means, stds: (b, k, input_size).
    hidden_states, attentions: the model's, when asked (see `SetModelOutput`).
    """

    loss: torch.FloatTensor | None = None
    log_likelihood: torch.FloatTensor | None = None
    mixture_logits: torch.FloatTensor | None = None
    means: torch.FloatTensor | None = None
    stds: torch.FloatTensor | None = None
    hidden_states: tuple[torch.FloatTensor, ...] | None = None
    attentions: tuple[torch.FloatTensor, ...] | None = None


def mixture_log_likelihood(points, mixture_logits, means, stds):
    """log sum_j pi_j N(x; mu_j, diag(std_j^2)) for every point: (b, n, d), (b, k), (b, k, d) x2 -> (b, n)."""
    z = (points[:, :, None, :] - means[:, None]) / stds[:, None]  # (b, n, k, d)
    log_normal = -0.5 * z.pow(2) - stds.log()[:, None] - 0.5 * math.log(2 * math.pi)
    log_joint = log_normal.sum(-1) + torch.log_softmax(mixture_logits, dim=-1)[:, None]  # (b, n, k)
    return torch.logsumexp(log_joint, dim=-1)


class SetTransformerForMixtureOfGaussians(SetTransformerPreTrainedModel):
    """Amortized clustering (Lee et al. 2019, sec. 5.3): the `num_seeds` pooled vectors of a set of points become
    the `num_seeds` components of a Gaussian mixture with diagonal covariances (a weight logit, a mean and a std per
    component: std = softplus + 1e-4), fitted to the same points: the loss is minus their mean log-likelihood, so no
    labels are needed (`return_loss=True`, the default, as the Trainer needs a loss). A packed batch of S sets (points
    (1, total, input_size)) gives one mixture per set, (S, k, ...), each point scored under its own set's."""

    takes_packed_batches = True
    main_input_name = "input_features"  # points only: generic code (Trainer, pipelines) reads the input's name here

    def __init__(self, config):
        super().__init__(config)
        self.model = SetTransformerModel(config)
        self.mixture_head = nn.Linear(config.hidden_size, 1 + 2 * config.input_size)
        self.post_init()

    @checked
    @can_return_tuple
    def forward(
        self,
        input_features=None,
        attention_mask=None,
        return_loss=True,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        packing = kwargs.get("packing")
        outputs = self.model(
            input_features=input_features,
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            packing=packing,
        )
        d = self.config.input_size
        params = self.mixture_head(outputs.pooler_output).float()  # (b or S, k, 1 + 2d)
        logits, means = params[..., 0], params[..., 1 : 1 + d]
        stds = F.softplus(params[..., 1 + d :]) + 1e-4
        if packing is not None:  # each point under its own set's mixture
            sets = sets_of(packing, input_features.device)
            points = input_features[0].float()[:, None]  # (total, 1, d)
            mixtures = (sets.per_element(x) for x in (logits, means, stds))  # (total, k), (total, k, d) x2
            per_point = mixture_log_likelihood(points, *mixtures)[:, 0]  # (total,)
            per_set = sets.sum_per_set(per_point) / sets.lengths.to(per_point.dtype)
            loss = -per_point.mean() if return_loss else None
        else:
            per_point = mixture_log_likelihood(input_features.float(), logits, means, stds)  # (b, n)
            mask = torch.ones_like(per_point) if attention_mask is None else attention_mask.to(per_point.dtype)
            per_set = (per_point * mask).sum(-1) / mask.sum(-1).clamp_min(1.0)
            loss = -(per_point * mask).sum() / mask.sum().clamp_min(1.0) if return_loss else None
        output = MixtureOfGaussiansOutput(
            loss=loss,
            log_likelihood=per_set,
            mixture_logits=logits,
            means=means,
            stds=stds,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
        )
        return output
