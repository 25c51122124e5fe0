"""Building blocks shared by every family: ScaleNorm, the position-wise feed-forward, input embeddings."""

import math

import torch
from torch import nn
from transformers.activations import ACT2FN


class ScaleNorm(nn.Module):
    """ScaleNorm (Nguyen & Salazar 2019, eq. 4): `g * x / max(||x||, eps)`, one learnable scalar g = sqrt(hidden)."""

    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        self.weight = nn.Parameter(torch.full((1,), math.sqrt(hidden_size)))

    def forward(self, x):
        xf = x.float()  # fp32 sum of squares whatever the input dtype
        norm = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).clamp_min(self.eps)
        return (xf * (self.weight / norm)).to(x.dtype)

    def extra_repr(self):
        return f"{self.hidden_size}, eps={self.eps}"


class LearnedVectors(nn.Module):
    """k learned vectors shared by every example: inducing points, PMA seeds, latents, output queries."""

    def __init__(self, num_vectors, hidden_size):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_vectors, hidden_size))

    def forward(self, batch_size):
        return self.weight.unsqueeze(0).expand(batch_size, -1, -1)  # (b, k, hidden)


class FeatureProjection(nn.Linear):
    """Continuous set elements (`input_features`, a few O(1) coordinates) -> hidden. Initialised with fan-in std
    `1 / sqrt(input_size)` (LeCun normal), not `initializer_range`: each embedded coordinate is then O(1), the scale
    of a ScaleNorm output. At std 0.02 the embedded points are ~50x smaller than what every residual sublayer adds at
    initialisation, so after the first blocks all elements of a set look alike and a PMA pooling learns nothing
    (point-cloud classification with PMA stayed at chance, ln 8, for 400 steps; with this init it learns)."""


class ScaledEmbedding(nn.Embedding):
    """Token embedding multiplied by `scale` (sqrt(hidden_size), Vaswani et al. 2017 sec. 3.4) inside the module, as
    transformers' BART does: `model(inputs_embeds=model.get_input_embeddings()(ids))` then equals
    `model(input_ids=ids)`, for PEFT prompt tuning, `generate(inputs_embeds=...)` and hand-made embeddings. The weight
    (and its checkpoint key) is the plain embedding's, so tying and `resize_token_embeddings` work unchanged."""

    def __init__(self, num_embeddings, embedding_dim, scale=1.0):
        super().__init__(num_embeddings, embedding_dim)
        self.scale = scale

    def forward(self, input_ids):
        return super().forward(input_ids) * self.scale

    def extra_repr(self):
        return f"{super().extra_repr()}, scale={self.scale:g}"


class AdaptiveProjection(nn.Linear):
    """An adaptive input cluster's projection to `hidden_size`. Initialised with fan-in std `1 / sqrt(width)`, so a
    projected vector has the per-dimension scale of the cluster's embedding entries (`initializer_range`), as the
    full-width first cluster has; at std `initializer_range` rare tokens would start ~10x-100x smaller."""


class AdaptiveEmbedding(nn.Module):
    """Adaptive input (Baevski & Auli 2019): the vocabulary, ordered by decreasing frequency, is cut at `cutoffs` into
    clusters; cluster i embeds its ids in `hidden_size // div_value**i` dimensions and projects them to `hidden_size`
    (the first cluster, at full width, needs no projection). Output times `scale`, as `ScaledEmbedding`.

    Every cluster embeds every position (ids outside it clamped) and `torch.where` keeps the right one: no
    data-dependent shapes, so it compiles as one graph, and the extra work is a few narrow projections per token."""

    def __init__(self, vocab_size, hidden_size, cutoffs, div_value=4.0, scale=1.0):
        super().__init__()
        self.vocab_size, self.hidden_size, self.scale = vocab_size, hidden_size, scale
        self.bounds = [0, *cutoffs, vocab_size]
        self.widths = [max(1, int(hidden_size // div_value**i)) for i in range(len(self.bounds) - 1)]
        self.embeddings = nn.ModuleList(
            nn.Embedding(high - low, width) for low, high, width in zip(self.bounds, self.bounds[1:], self.widths)
        )
        self.projections = nn.ModuleList(
            nn.Identity() if width == hidden_size else AdaptiveProjection(width, hidden_size, bias=False)
            for width in self.widths
        )

    @property
    def num_embeddings(self):
        return self.vocab_size

    @property
    def embedding_dim(self):
        return self.hidden_size

    @property
    def weight(self):
        """The (vocab_size, hidden_size) matrix this layer is equivalent to (`weight[ids] * scale == self(ids)`),
        computed on access: for generic code that reads an input embedding's `.weight` (run_clm.py reads its
        shape, PEFT its dtype and device). Not a parameter: training changes the cluster tables, not this."""
        pairs = zip(self.embeddings, self.projections)
        return torch.cat([projection(embedding.weight) for embedding, projection in pairs])

    def forward(self, input_ids):
        out = None
        for low, high, embedding, projection in zip(self.bounds, self.bounds[1:], self.embeddings, self.projections):
            vectors = projection(embedding((input_ids - low).clamp(0, high - low - 1)))
            if out is None:  # cluster 0: ids >= its end are replaced by the later clusters below
                out = vectors
            else:
                out = torch.where((input_ids >= low)[..., None], vectors, out)
        return out * self.scale

    def extra_repr(self):
        cutoffs = self.bounds[1:-1]
        return f"{self.vocab_size}, {self.hidden_size}, cutoffs={cutoffs}, widths={self.widths}, scale={self.scale:g}"


class TransposedProjection(AdaptiveProjection):
    """An adaptive softmax cluster's projection hidden -> width that reads a (hidden, width) weight transposed: the
    layout of the adaptive input cluster's `AdaptiveProjection`, so the two can share one tensor (fairseq's
    `TiedLinear(transpose=True)`). Initialised as that projection is."""

    def forward(self, x):
        return x @ self.weight  # (..., hidden) -> (..., width)


class AdaptiveSoftmaxHead(nn.Module):
    """The head of a tied adaptive softmax: the shortlist's word matrix `words` (shortlist, hidden), shared with the
    adaptive input's first cluster, and the cluster logits' own `clusters` (n_clusters, hidden); one
    (..., shortlist + n_clusters) output, as `nn.AdaptiveLogSoftmaxWithLoss`'s single `head` gives."""

    def __init__(self, hidden_size, shortlist_size, n_clusters):
        super().__init__()
        self.words = nn.Linear(hidden_size, shortlist_size, bias=False)
        self.clusters = nn.Linear(hidden_size, n_clusters, bias=False)

    def reset_parameters(self):
        self.words.reset_parameters()
        self.clusters.reset_parameters()

    def forward(self, x):
        return torch.cat([self.words(x), self.clusters(x)], dim=-1)  # (..., shortlist + n_clusters)


class TiedAdaptiveLogSoftmax(nn.AdaptiveLogSoftmaxWithLoss):
    """An adaptive softmax whose word matrices (and, with `tie_projections`, cluster projections) an `AdaptiveEmbedding`
    of the same cutoffs and widths shares (Baevski & Auli 2019): head words <-> cluster 0's table, `tail[i][1]` <->
    cluster i+1's table, `tail[i][0]` <-> cluster i+1's projection, transposed. The sharing itself is transformers'
    weight tying (`tied_keys` lists the pairs), so saving stores each tensor once and loading ties them again."""

    def __init__(self, in_features, n_classes, cutoffs, div_value=4.0, tie_projections=True):
        super().__init__(in_features, n_classes, cutoffs, div_value=div_value)
        self.head = AdaptiveSoftmaxHead(in_features, self.shortlist_size, self.n_clusters)
        for cluster in self.tail:
            width = cluster[0].out_features
            if tie_projections and width != in_features:  # a full-width input cluster has no projection to share
                cluster[0] = TransposedProjection(width, in_features, bias=False)

    def tied_keys(self, prefix, input_prefix):
        """{this layer's parameter: the `AdaptiveEmbedding`'s it shares}, named under `prefix` and `input_prefix`."""
        keys = {f"{prefix}.head.words.weight": f"{input_prefix}.embeddings.0.weight"}
        for i, (projection, _) in enumerate(self.tail):
            keys[f"{prefix}.tail.{i}.1.weight"] = f"{input_prefix}.embeddings.{i + 1}.weight"
            if isinstance(projection, TransposedProjection):
                keys[f"{prefix}.tail.{i}.0.weight"] = f"{input_prefix}.projections.{i + 1}.weight"
        return keys


def make_norm(config):
    if config.norm_type == "layernorm":
        return nn.LayerNorm(config.hidden_size, eps=config.norm_eps)
    return ScaleNorm(config.hidden_size, eps=config.norm_eps)


class FeedForward(nn.Module):
    """Position-wise feed-forward (Vaswani et al. 2017, eq. 2; the rFF of Lee et al. 2019)."""

    def __init__(self, config):
        super().__init__()
        self.fc_in = nn.Linear(config.hidden_size, config.intermediate_size)
        self.act = ACT2FN[config.hidden_act]
        self.fc_out = nn.Linear(config.intermediate_size, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, x):
        return self.fc_out(self.dropout(self.act(self.fc_in(x))))


def sinusoidal_positions(position_ids, hidden_size, dtype):
    """Vaswani et al. 2017, sec. 3.5: (b, n) positions -> (b, n, hidden) [sin(p w_i), cos(p w_i)], w_i = 1e4^(-2i/h)."""
    half = (hidden_size + 1) // 2
    inv_freq = torch.exp(
        torch.arange(half, device=position_ids.device, dtype=torch.float32) * (-2.0 * math.log(10000.0) / hidden_size)
    )
    angles = position_ids.float()[..., None] * inv_freq  # (b, n, half)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)[..., :hidden_size].to(dtype)


def position_ids_from_mask(attention_mask, length):
    """Positions that skip padding (left or right): (b, total) mask -> (b, length) ids of the last `length` tokens."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.clamp_min(0)[:, -length:]


class InputEmbeddings(nn.Module):
    """Tokens (`input_ids`), continuous features (`input_features`) or ready vectors (`inputs_embeds`) -> (b, n, hidden),
    plus position embeddings when the config asks for them."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.hidden_size = config.hidden_size
        scale = math.sqrt(config.hidden_size) if config.scale_embedding else 1.0
        if not config.vocab_size:
            self.embed_tokens = None
        elif config.adaptive_input_cutoffs:
            self.embed_tokens = AdaptiveEmbedding(
                config.vocab_size, config.hidden_size, config.adaptive_input_cutoffs,
                float(config.adaptive_input_div_value), scale,
            )
        else:
            self.embed_tokens = ScaledEmbedding(config.vocab_size, config.hidden_size, scale)
        self.feature_projection = (
            FeatureProjection(config.input_size, config.hidden_size) if config.input_size else None
        )
        self.position_embeddings = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if config.position_embedding_type == "learned"
            else None
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def embed(self, input_ids=None, input_features=None, inputs_embeds=None):
        """The one input given, embedded without positions: -> (b, n, hidden) (checked by `checks.check_embeddable`)."""
        if input_ids is not None:
            return self.embed_tokens(input_ids)
        if input_features is not None:
            return self.feature_projection(input_features.to(self.feature_projection.weight.dtype))
        return inputs_embeds

    def positions(self, position_ids, dtype):
        """(b, n) ids -> (b, n, hidden), or None without position embeddings."""
        kind = self.config.position_embedding_type
        if kind == "none":
            return None
        if kind == "sinusoidal":
            return sinusoidal_positions(position_ids, self.hidden_size, dtype)
        return self.position_embeddings(position_ids)

    def forward(self, input_ids=None, input_features=None, inputs_embeds=None, position_ids=None, padding=None):
        """-> (b, n, hidden). `padding` (b, n) bool, True at padding: those vectors are zeroed by selection, not
        multiplication (NaN x 0 = NaN), so whatever values padding holds (NaN, inf) cannot reach a real element's
        output through any later sum."""
        x = self.embed(input_ids, input_features, inputs_embeds)
        if self.config.position_embedding_type != "none":
            if position_ids is None:
                position_ids = torch.arange(x.shape[1], device=x.device).expand(x.shape[0], -1)
            x = x + self.positions(position_ids, x.dtype)
        x = self.dropout(x)
        return x if padding is None else x.masked_fill(padding[..., None], 0.0)
