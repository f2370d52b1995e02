"""The zoo's tokens: an order-1 Markov source over `vocab` tokens (a peaked transition table, so
that the loss falls within a few steps), the same global batch for every layout.

Each sequence's first k labels are ignored (-100, k uniform in [0, T/2), like an SFT prompt), so
microbatches and dp ranks hold different numbers of trained tokens: normalising by anything but
the step's count shows.
"""
import numpy as np
import torch

IGNORE = -100


class MarkovSource:
    def __init__(self, vocab, table_seed=7, alpha=0.05):
        rng = np.random.default_rng(table_seed)
        self.vocab = vocab
        self.cdf = np.cumsum(rng.dirichlet(np.full(vocab, alpha), size=vocab), axis=1)

    def batch(self, seed, step, batch, seq):
        """The step's global batch: inputs (B,T) and labels (B,T), int64."""
        rng = np.random.default_rng([seed, step])
        toks = np.empty((batch, seq + 1), dtype=np.int64)
        toks[:, 0] = rng.integers(0, self.vocab, batch)
        for t in range(seq):
            u = rng.random(batch)
            nxt = (self.cdf[toks[:, t]] < u[:, None]).sum(axis=1)
            toks[:, t + 1] = np.minimum(nxt, self.vocab - 1)
        labels = toks[:, 1:].copy()
        for b, k in enumerate(rng.integers(0, seq // 2, batch)):
            labels[b, :k] = IGNORE
        return torch.from_numpy(toks[:, :-1].copy()), torch.from_numpy(labels)
