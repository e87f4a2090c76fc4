"""Counters over a generation, in the `--stats-json` schema of the design notes."""

from __future__ import annotations

from dataclasses import dataclass, field

from spectool.core.evidence import Source


class Rates:
    """Acceptance, tokens per step and speed from a generation's counters: Stats keeps one
    generation's, bench.Result a contender's over its prompts; each says in `counters` which fields
    hold them."""

    def counters(self) -> tuple[int, int, int, int, int, float]:
        """(drafted, accepted, generated, steps, tokens timed, their seconds)."""
        raise NotImplementedError

    @property
    def acceptance_rate(self) -> float:
        drafted, accepted, *_ = self.counters()
        return accepted / drafted if drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens produced per target forward pass (accepted drafts + the target's own token)."""
        _, _, generated, steps, _, _ = self.counters()
        return generated / steps if steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        *_, tokens, seconds = self.counters()
        return tokens / seconds if seconds > 0 else 0.0


@dataclass
class Stats(Rates):
    mode: str = "none"
    target: str = ""
    draft: str | None = None
    n_prompt_tokens: int = 0
    n_prefilled: int = 0  # prompt tokens actually decoded (the rest was already in the KV cache)
    n_generated: int = 0
    n_steps: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    # steps with a draft, by how many tokens they drafted ...
    _drafted: list[int] = field(default_factory=list)
    _accepted: list[int] = field(default_factory=list)  # ... and by how many of them were accepted
    by_source: dict[str, int] = field(default_factory=dict)  # drafted tokens per source
    # of the tokens drafted from a request's prediction (by_source's "prediction"), those that
    # appeared in the output (accepted, and not cut by its end): OpenAI's accepted_prediction_tokens
    prediction_accepted: int = 0
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0
    finish_reason: str | None = None
    stop_string: str | None = None  # the stop string that ended the generation, where one did
    last_k: int = 0
    # draft trees (issue 59): steps that verified one, the siblings they verified beside their
    # chains, and the steps whose accepted path took a sibling
    tree_steps: int = 0
    tree_branches: int = 0
    tree_taken: int = 0
    offload: dict | None = None  # where the weights went (session.Session.offload)

    def add_step(self, step) -> None:
        self.n_steps += 1
        self.n_generated += len(step.tokens)
        self.n_drafted += step.drafted
        self.n_accepted += step.accepted
        self.last_k = step.drafted
        self.decode_seconds += step.draft_seconds + step.verify_seconds
        if step.branches:
            self.tree_steps += 1
            self.tree_branches += step.branches
            self.tree_taken += step.off_chain
        if step.drafted:
            for source, n in (("grammar", step.forced), (step.source, step.drafted - step.forced)):
                if n:
                    self.by_source[source] = self.by_source.get(source, 0) + n
            if step.source is Source.prediction:  # after the tokens a grammar forced
                self.prediction_accepted += max(0, min(step.accepted, len(step.tokens))
                                                - step.forced)
            for hist, n in ((self._drafted, step.drafted), (self._accepted, step.accepted)):
                if len(hist) <= n:
                    hist.extend([0] * (n + 1 - len(hist)))
                hist[n] += 1

    @classmethod
    def summed(cls, runs: list[Stats]) -> Stats:
        """The counters of several generations of one prompt added up (serve's `n` choices): the
        prompt as the first processed it, the rest summed."""
        total = cls(mode=runs[0].mode, n_prompt_tokens=runs[0].n_prompt_tokens,
                    n_prefilled=runs[0].n_prefilled,
                    prompt_seconds=runs[0].prompt_seconds, finish_reason=runs[-1].finish_reason)
        for s in runs:
            for name in ("n_generated", "n_steps", "n_drafted", "n_accepted", "decode_seconds",
                         "prediction_accepted", "tree_steps", "tree_branches", "tree_taken"):
                setattr(total, name, getattr(total, name) + getattr(s, name))
            for source, n in s.by_source.items():
                total.by_source[source] = total.by_source.get(source, 0) + n
        return total

    @property
    def tree(self) -> dict[str, int]:
        """The draft trees' counters: steps that verified one, the siblings they verified, the
        steps whose accepted path took one."""
        return {"steps": self.tree_steps, "branches": self.tree_branches,
                "taken": self.tree_taken}

    @property
    def prediction_rejected(self) -> int:
        """The tokens drafted from the prediction that did not appear in the output: OpenAI's
        rejected_prediction_tokens."""
        return self.by_source.get(Source.prediction, 0) - self.prediction_accepted

    @property
    def drafted_per_position(self) -> list[int]:
        """How many steps drafted a token at position i (i = 0: the first), by i."""
        return _at_least(self._drafted)

    @property
    def accepted_per_position(self) -> list[int]:
        """How many steps had their draft token at position i accepted, by i."""
        return _at_least(self._accepted)

    def counters(self) -> tuple[int, int, int, int, int, float]:
        """Speed is every generated token over the decode time (prompt processing apart)."""
        return (
            self.n_drafted,
            self.n_accepted,
            self.n_generated,
            self.n_steps,
            self.n_generated,
            self.decode_seconds,
        )

    def to_json(self) -> dict:
        return {
            "mode": self.mode,
            "target": self.target,
            "draft": self.draft,
            "n_prompt_tokens": self.n_prompt_tokens,
            "n_generated": self.n_generated,
            "n_steps": self.n_steps,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "acceptance_rate": round(self.acceptance_rate, 6),
            "mean_accepted_length": round(self.mean_accepted_length, 6),
            "accepted_per_position": list(self.accepted_per_position),
            "drafted_by_source": {str(source): n for source, n in self.by_source.items()},
            "accepted_prediction_tokens": self.prediction_accepted,
            "tree": self.tree,
            "rejected_prediction_tokens": self.prediction_rejected,
            "prompt_seconds": round(self.prompt_seconds, 6),
            "decode_seconds": round(self.decode_seconds, 6),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "finish_reason": self.finish_reason,
            "offload": self.offload,
        }


def _at_least(hist: list[int]) -> list[int]:
    """out[i] = how many counted at least i + 1, from hist[n] = how many counted exactly n."""
    out, total = [], 0
    for count in reversed(hist[1:]):
        total += count
        out.append(total)
    return out[::-1]
