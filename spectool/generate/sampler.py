"""llama.cpp's own sampler chain drawing a sampled token from a decode's row on the host, as its
tools draw (common/sampling.cpp's chain: top-k -> top-p -> min-p -> temperature -> dist), with the
random numbers of a verify.Random: the same token that verify.py's chain draws from the row with
that number (tests/test_verify.py holds the two to each other), in a fraction of the host time
(the chain in C over the row, where numpy makes several passes over it: research/notes/
2026-12-07-sampled-bound.md).

Its `dist` sampler is seeded as the Random is and kept level with it: a number drawn on the host
by verify.py (a draft model's proposal, acceptance test or residual) is drawn here too before the
next token, and a token drawn here passes over the Random's number, so that the two draw one
stream of numbers."""

from __future__ import annotations

import ctypes
import weakref

from spectool.core.verify import Random, Sampling
from spectool.llama.native import bind, lib


class HostChain:
    """The chain for sampling settings `s` (no penalties: their history holds drafts), drawing with
    `rng`'s numbers."""

    def __init__(self, s: Sampling, rng: Random):
        assert not s.greedy and not s.window, "the host chain samples, without penalties"
        L, self.rng = lib(), rng
        self.chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        self._dist = L.llama_sampler_init_dist(rng.seed)
        for stage in (L.llama_sampler_init_top_k(s.top_k), L.llama_sampler_init_top_p(s.top_p, 1),
                      L.llama_sampler_init_min_p(s.min_p, 1), L.llama_sampler_init_temp(s.temp),
                      self._dist):
            L.llama_sampler_chain_add(self.chain, stage)
        self._finalizer = weakref.finalize(self, L.llama_sampler_free, self.chain)
        self.drawn = 0  # the numbers its `dist` has drawn
        # one candidate: `dist` applied to it draws one number and nothing else (llama-sampler.cpp),
        # through a binding of our own (a long chat's next turn catches up thousands of numbers)
        self._one = (L.llama_token_data * 1)()
        self._one_array = L.llama_token_data_array(data=self._one, size=1, selected=-1,
                                                   sorted=False)
        apply = bind("llama_sampler_apply", None, [ctypes.c_void_p, ctypes.c_void_p])
        dist, one = self._dist, ctypes.addressof(self._one_array)
        self._draw_one = lambda: apply(dist, one)

    def draw(self, rows, i: int) -> int:
        """The token drawn from output i of `rows` (a Model, or one sequence's rows of a batch)."""
        while self.drawn < self.rng.drawn:  # numbers the Random drew on its own
            self._draw_one()
            self.drawn += 1
        token = rows.draw(self.chain, i)
        self.drawn += 1
        self.rng.skip()
        return token
