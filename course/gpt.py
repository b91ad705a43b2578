"""A small decoder-only transformer (GPT) and the real text it trains on (lesson 09).

Read it top to bottom: the data (the Python standard library's own ``.py`` files, as bytes), then
the model, which is four classes long:

- :class:`GPTConfig` holds the sizes; :data:`CONFIGS` names two of them, ``"cpu"`` (trains visibly
  on a laptop CPU in seconds) and ``"gpu"`` (about 100M parameters, enough to keep a large GPU
  busy).
- :class:`CausalSelfAttention`: one linear layer makes queries, keys and values for every head,
  ``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True)`` lets each position
  attend to itself and the positions before it, and a linear layer mixes the heads.
- :class:`Block`: pre-norm residual block, ``x + attn(ln(x))`` then ``x + mlp(ln(x))``.
- :class:`GPT`: token and position embeddings, the blocks, a final LayerNorm and an output head
  whose weight *is* the token embedding (tied), so the logits are ``h @ embedding.T``.

Every linear layer is bias-free, so the matrix multiplies are the whole arithmetic that counts.
The vocabulary is the 256 byte values: no tokenizer, nothing to download.
"""

from __future__ import annotations

import random
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

# --------------------------------------------------------------------------------------------
# Data: the standard library's source as a byte stream, split into train and validation by file.
# --------------------------------------------------------------------------------------------


def stdlib_files() -> list[Path]:
    """The standard library's ``.py`` files, sorted, without ``site-packages`` (lesson 09)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts)


def stdlib_corpus(
    max_bytes: int = 2_000_000, val_fraction: float = 0.1, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Train and validation byte streams (``uint8`` tensors) from the standard library (lesson 09).

    The files are shuffled with ``seed``; whole files go to validation until it holds
    ``val_fraction`` of ``max_bytes``, then whole files to training until the total reaches
    ``max_bytes``. Splitting by file keeps any file's text out of both sets at once.
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must lie strictly between 0 and 1, got {val_fraction}")
    files = stdlib_files()
    if not files:
        raise RuntimeError(f"no .py files under {sysconfig.get_paths()['stdlib']}")
    random.Random(seed).shuffle(files)
    val_target = int(max_bytes * val_fraction)
    val: list[bytes] = []
    train: list[bytes] = []
    n_val = n_train = 0
    for path in files:
        try:
            data = path.read_bytes()
        except OSError:
            continue
        if n_val < val_target:
            val.append(data)
            n_val += len(data)
        elif n_train < max_bytes - val_target:
            train.append(data)
            n_train += len(data)
        else:
            break

    def as_tensor(chunks: list[bytes]) -> torch.Tensor:
        return torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8).clone()

    return as_tensor(train), as_tensor(val)


def random_batches(
    tokens: torch.Tensor,
    batch_size: int,
    block_size: int,
    seed: int,
    device: torch.device | str = "cpu",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless ``(x, y)`` batches of random windows of ``tokens`` (lesson 09).

    ``x`` is ``(batch_size, block_size)`` byte ids (int64), ``y`` the same windows shifted by one:
    the next byte at every position. The window starts come from a ``torch.Generator`` seeded
    with ``seed``, so the same seed gives the same batches in the same order on every device.
    """
    if len(tokens) <= block_size:
        raise ValueError(f"need more than {block_size} tokens, got {len(tokens)}")
    gen = torch.Generator().manual_seed(seed)
    offsets = torch.arange(block_size + 1)
    while True:
        starts = torch.randint(0, len(tokens) - block_size, (batch_size,), generator=gen)
        windows = tokens[starts[:, None] + offsets].long()
        yield windows[:, :-1].to(device), windows[:, 1:].to(device)


def val_batch(
    tokens: torch.Tensor,
    block_size: int,
    max_windows: int | None = 64,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The validation set as one batch: the first ``max_windows`` non-overlapping windows of
    ``tokens`` (all of them when None: the whole held-out text) as ``(x, y)``, ``y`` shifted
    by one (lesson 09)."""
    n = (len(tokens) - 1) // block_size
    if max_windows is not None:
        n = min(max_windows, n)
    if n < 1:
        raise ValueError(f"need more than {block_size} tokens, got {len(tokens)}")
    x = tokens[: n * block_size].view(n, block_size).long()
    y = tokens[1 : n * block_size + 1].view(n, block_size).long()
    return x.to(device), y.to(device)


# --------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a :class:`GPT` (lesson 09).

    ``block_size`` is the context length (the longest sequence the position embedding covers),
    ``d_model`` the width of the residual stream, ``d_ff`` the MLP's hidden width, ``init_std``
    the standard deviation of the initial weights (GPT-2's 0.02; a tiny one makes float16
    gradients underflow without a loss scaler, which lesson 09's grader uses), ``dropout`` the
    probability of the dropout after each block's attention and MLP (0: none, and no random
    numbers drawn; above 0 a training run depends on the RNG state, which a checkpoint keeps).
    """

    vocab_size: int = 256
    block_size: int = 64
    n_layer: int = 2
    n_head: int = 4
    d_model: int = 128
    d_ff: int = 512
    init_std: float = 0.02
    dropout: float = 0.0

    def __post_init__(self) -> None:
        if self.d_model % self.n_head:
            raise ValueError(f"d_model {self.d_model} is not a multiple of n_head {self.n_head}")


#: The lesson's two sizes: ``cpu`` (about 0.4M parameters) and ``gpu`` (about 102M).
CONFIGS: dict[str, GPTConfig] = {
    "cpu": GPTConfig(vocab_size=256, block_size=64, n_layer=2, n_head=4, d_model=128, d_ff=512),
    "gpu": GPTConfig(vocab_size=256, block_size=1024, n_layer=8, n_head=8, d_model=1024, d_ff=4096),
}


class CausalSelfAttention(nn.Module):
    """Multi-head self-attention in which each position sees only itself and earlier ones."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head = config.n_head
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model, bias=False)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, width = x.shape
        q, k, v = self.qkv(x).split(width, dim=2)
        # (batch, seq, width) -> (batch, heads, seq, head width)
        q, k, v = (t.view(batch, seq, self.n_head, -1).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, width))


class Block(nn.Module):
    """One transformer block: attention and an MLP, each behind a LayerNorm and a residual."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(config.d_model, config.d_ff, bias=False),
            nn.GELU(),
            nn.Linear(config.d_ff, config.d_model, bias=False),
        )
        self.drop = nn.Dropout(config.dropout) if config.dropout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class GPT(nn.Module):
    """A decoder-only transformer over bytes: ``forward(idx)`` returns next-byte logits (lesson 09).

    ``idx`` is ``(batch, seq)`` int64 with ``seq <= config.block_size``; the logits are
    ``(batch, seq, vocab_size)``. Weights start as GPT-2's do: normal with std
    ``config.init_std`` (0.02), except the two projections that write into the residual stream
    in each block (attention's output projection and the MLP's second layer), whose std is
    divided by ``sqrt(2 * n_layer)`` so that the stream's variance does not grow with depth;
    LayerNorm gains at 1, biases (LayerNorm's only) at 0.
    """

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        self.tok_emb = nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = nn.Embedding(config.block_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight  # tied: one matrix, two uses
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=config.init_std)
        residual_std = config.init_std / (2 * config.n_layer) ** 0.5
        for block in self.blocks:
            nn.init.normal_(block.attn.proj.weight, std=residual_std)
            nn.init.normal_(block.mlp[2].weight, std=residual_std)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


#: The target id that no loss counts (padding past a document's end): cross-entropy's default.
IGNORE = -100


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    """Cross-entropy of next-byte ``logits`` ``(batch, seq, vocab)`` against ``targets``
    ``(batch, seq)``, targets equal to :data:`IGNORE` left out: their mean (or ``"sum"``) over
    the counted targets (lesson 09)."""
    return F.cross_entropy(
        logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE, reduction=reduction
    )


def count_parameters(model: nn.Module) -> int:
    """Parameters of ``model``, a tied weight counted once (lesson 09)."""
    return sum(p.numel() for p in model.parameters())


def build_gpt(config: GPTConfig | str = "cpu") -> GPT:
    """A :class:`GPT` of ``config`` or of the named size in :data:`CONFIGS` (lesson 09)."""
    if isinstance(config, str):
        if config not in CONFIGS:
            raise ValueError(f"unknown GPT size {config!r}: choose from {sorted(CONFIGS)}")
        config = CONFIGS[config]
    return GPT(config)
