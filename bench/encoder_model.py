"""A transformer encoder with random weights, saved as a SavedModel, for padding tests and
the bucketing benchmark: the demo text model (worker/demo_text.py), small and with its
per-token states, as a RoBERTa-like text model is served.

``masked=True``: it takes ``attention_mask`` (int32, 1 real, 0 padded), masks attention and
pools over real tokens only, so padding does not change its outputs. ``masked=False``: no
mask input, and its pooling averages every position: padding changes its outputs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from worker import demo_text


def save_encoder(path: Path, masked: bool = True, vocab: int = 1000, width: int = 32,
                 heads: int = 4, layers: int = 2, max_length: int = 512, seed: int = 0) -> None:
    demo_text.save(path, masked=masked, per_token=True, vocab=vocab, width=width, heads=heads,
                   layers=layers, max_length=max_length, seed=seed)


def token_ids(length: int, seed: int, vocab: int = 1000) -> np.ndarray:
    """One job's ids: a batch of one row of ``length`` tokens (never 0, the pad id)."""
    return np.random.default_rng(seed).integers(1, vocab, (1, length)).astype(np.int32)
