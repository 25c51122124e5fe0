"""Synthetic set tasks of the Set Transformer paper (Lee et al. 2019), generated on the fly (no download), and the
pooling baselines it compares with, beside `DataCollatorForSets` for your own scripts (scripts/train_sets.py uses
them). torch only; the modeling files never import this module.

Every dataset is map-style and deterministic: item i is drawn from a generator seeded with (seed, i), so a run is
reproducible and resumable, and a "fresh set every step" is item i of a large index range.
"""

import math

import torch
from torch import nn


def _generator(seed, index):
    return torch.Generator().manual_seed(seed * 1_000_003 + index)


class MaxRegression(torch.utils.data.Dataset):
    """Paper sec. 5.1 / supp. 2.1: a set of n ~ U{1..10} numbers from [0, 100]; the label is their maximum.

    `values="real"` draws reals (the paper's Table 1), `"integer"` integers 0..99 (the official notebook). Features
    and label are divided by `scale` (targets of order 1 train much faster; errors are reported times `scale`)."""

    def __init__(self, size, seed=0, min_size=1, max_size=10, values="real", scale=1.0):
        self.size, self.seed, self.min_size, self.max_size, self.values = size, seed, min_size, max_size, values
        self.scale = scale

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = _generator(self.seed, i)
        n = int(torch.randint(self.min_size, self.max_size + 1, (1,), generator=g))
        if self.values == "integer":
            x = torch.randint(0, 100, (n, 1), generator=g).float()
        else:
            x = 100 * torch.rand(n, 1, generator=g)
        x = x / self.scale
        return {"input_features": x, "labels": x.max()}


class MixtureOfGaussians(torch.utils.data.Dataset):
    """Paper sec. 5.3 / supp. 2.3.1: 2-D points from a mixture of 4 Gaussians with means ~ U(-4, 4)^2, std 0.3,
    weights ~ Dirichlet(1, 1, 1, 1); n ~ U{min_size..max_size} points per set (300-600 as in the official code)."""

    def __init__(self, size, seed=0, min_size=300, max_size=600, components=4, dims=2, std=0.3):
        self.size, self.seed = size, seed
        self.min_size, self.max_size, self.components, self.dims, self.std = min_size, max_size, components, dims, std

    def __len__(self):
        return self.size

    def parameters(self, i):
        """The true mixture of item i: (weights (k,), means (k, d), stds (k, d)) and the generator, advanced."""
        g = _generator(self.seed, i)
        weights = -torch.rand(self.components, generator=g).log()  # Exp(1) draws normalised: Dirichlet(1, ..., 1)
        weights = weights / weights.sum()
        means = -4 + 8 * torch.rand(self.components, self.dims, generator=g)
        stds = torch.full((self.components, self.dims), self.std)
        return weights, means, stds, g

    def __getitem__(self, i):
        weights, means, stds, g = self.parameters(i)
        n = int(torch.randint(self.min_size, self.max_size, (1,), generator=g))
        z = torch.multinomial(weights, n, replacement=True, generator=g)
        x = means[z] + stds[z] * torch.randn(n, self.dims, generator=g)
        return {"input_features": x}


SHAPES = ["sphere", "cube", "cylinder", "cone", "torus", "ellipsoid", "pyramid", "disk"]


def sample_shape(shape, n, g):
    """n points on the surface of a unit-sized shape, (n, 3)."""
    u, v = torch.rand(n, generator=g), torch.rand(n, generator=g)
    if shape in ("sphere", "ellipsoid"):
        p = torch.randn(n, 3, generator=g)
        p = p / p.norm(dim=1, keepdim=True)
        return p * (torch.tensor([1.0, 0.6, 0.35]) if shape == "ellipsoid" else 1.0)
    if shape == "cube":
        p = 2 * torch.rand(n, 3, generator=g) - 1
        face = torch.randint(0, 3, (n,), generator=g)
        p[torch.arange(n), face] = torch.where(torch.rand(n, generator=g) < 0.5, -1.0, 1.0)
        return p
    if shape == "cylinder":
        a = 2 * math.pi * u
        return torch.stack([a.cos(), a.sin(), 2 * v - 1], dim=1)
    if shape == "cone":
        a, h = 2 * math.pi * u, v.sqrt()  # uniform on the lateral surface
        return torch.stack([h * a.cos(), h * a.sin(), 1 - 2 * h], dim=1)
    if shape == "torus":
        a, b = 2 * math.pi * u, 2 * math.pi * v
        return torch.stack([(1 + 0.35 * b.cos()) * a.cos(), (1 + 0.35 * b.cos()) * a.sin(), 0.35 * b.sin()], dim=1)
    if shape == "pyramid":  # square base [-1, 1]^2 at z = -1, apex (0, 0, 1): points on the four sides
        side = torch.randint(0, 4, (n,), generator=g)
        h = 1 - v.sqrt()  # height fraction, density proportional to the side's width (1 - h)
        xy = torch.stack([(2 * u - 1) * (1 - h), -(1 - h)], dim=1)  # the side facing -y
        quarter = torch.tensor([[[1.0, 0], [0, 1]], [[0, -1.0], [1, 0]], [[-1.0, 0], [0, -1]], [[0, 1.0], [-1, 0]]])
        xy = torch.einsum("nij,nj->ni", quarter[side], xy)
        return torch.cat([xy, (2 * h - 1)[:, None]], dim=1)
    if shape == "disk":
        r, a = u.sqrt(), 2 * math.pi * v
        return torch.stack([r * a.cos(), r * a.sin(), torch.zeros(n)], dim=1)
    raise ValueError(f"unknown shape {shape!r}")


def random_rotation(g):
    q = torch.randn(4, generator=g)
    q = q / q.norm()
    w, x, y, z = q.tolist()
    return torch.tensor(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


class PointClouds(torch.utils.data.Dataset):
    """Point-cloud-like classification at scale: n ~ U{min_size..max_size} points sampled on one of 8 shapes,
    randomly rotated, scaled by U(0.7, 1.3) (isotropically: a sphere stays a sphere) and jittered (std 0.02); the
    label is the shape."""

    def __init__(self, size, seed=0, min_size=1000, max_size=4000, noise=0.02):
        self.size, self.seed, self.min_size, self.max_size, self.noise = size, seed, min_size, max_size, noise

    def __len__(self):
        return self.size

    def __getitem__(self, i):
        g = _generator(self.seed, i)
        label = int(torch.randint(0, len(SHAPES), (1,), generator=g))
        n = int(torch.randint(self.min_size, self.max_size + 1, (1,), generator=g))
        p = sample_shape(SHAPES[label], n, g)
        p = p * (0.7 + 0.6 * torch.rand(1, generator=g))
        p = p @ random_rotation(g).T + self.noise * torch.randn(n, 3, generator=g)
        return {"input_features": p, "labels": label}


class DeepSetsBaseline(nn.Module):
    """The paper's rFF + pooling baseline (supp. 2.1): FC(64, ReLU) x 3, FC(64) -> mean/sum/max over the set ->
    FC(64, ReLU) -> FC(out). Masked pooling; L1 loss for regression (`labels` float), cross-entropy otherwise."""

    def __init__(self, input_size=1, hidden=64, out=1, pooling="max"):
        super().__init__()
        self.pooling = pooling
        self.phi = nn.Sequential(
            nn.Linear(input_size, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
        )
        self.rho = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out))

    def forward(self, input_features, attention_mask=None, labels=None):
        h = self.phi(input_features)
        mask = torch.ones(h.shape[:2], device=h.device) if attention_mask is None else attention_mask.float()
        if self.pooling == "max":
            pooled = h.masked_fill(mask[..., None] == 0, float("-inf")).amax(1)
        elif self.pooling == "sum":
            pooled = (h * mask[..., None]).sum(1)
        else:
            pooled = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True).clamp_min(1)
        logits = self.rho(pooled)
        loss = None
        if labels is not None:
            if labels.is_floating_point():
                loss = (logits.squeeze(-1) - labels).abs().mean()
            else:
                loss = nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}
