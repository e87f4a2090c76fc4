"""Tiny deterministic GGUF models for the tests, written with the `gguf` package in well under a second.

- `target`: llama architecture, F32, 3 layers, an SPM vocabulary with byte fallback whose multi-character
  tokens are learnt by BPE merges on a small English + Python corpus, so ordinary text round-trips.
- `draft`: the target's first two layers only, with a little noise: smaller, same vocabulary, correlated outputs.
- `foreign`: like the target but with its ordinary tokens shuffled: another vocabulary.

Layers add small updates to the residual stream and the output layer is scaled up, so next-token
distributions are peaked and mostly a function of the last few tokens: the draft agrees with the target often,
but not always, and greedy text falls into loops that prompt lookup can predict.
"""

from __future__ import annotations

import collections
from pathlib import Path

import numpy as np

CORPUS = """\
The quick brown fox jumps over the lazy dog. The dog sleeps in the sun and the fox runs into the woods.
Speculative decoding lets a small draft model propose tokens that a large target model checks in one pass.
When the draft is right, the target accepts several tokens at once, and generation becomes faster.
def add(a, b):
    return a + b

def greet(name):
    print("Hello, " + name + "!")
    return name

for i in range(10):
    total = add(total, i)
Summaries, answers and code edits often repeat the text of the prompt, so looking up n-grams in the prompt
finds good drafts without any draft model at all. This is the prompt lookup idea, and it is simple.
"""

SPECIALS = ["<unk>", "<s>", "</s>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'user' %}<|user|>{{ m['content'] }}"
    "{% elif m['role'] == 'system' %}<|user|>[system] {{ m['content'] }}"
    "{% else %}<|assistant|>{{ m['content'] }}</s>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

N_EMBD, N_HEAD, N_HEAD_KV, N_FF, N_CTX = 64, 4, 2, 128, 2048


def _bpe_vocab(text: str, n_merges: int) -> list[str]:
    """Characters of printable ASCII and the corpus, then BPE merges in the order they were learnt."""
    text = text.replace(" ", "\u2581")
    chars = sorted(set(text) | {chr(c) for c in range(33, 127)} | {"\u2581"})
    chars.remove("\n")  # newline goes through byte fallback, like in real SPM vocabularies
    words = collections.Counter()
    for line in text.split("\n"):
        for w in line.replace("\u2581", "\n\u2581").split("\n"):
            if w:
                words[tuple(w)] += 1
    merges: list[str] = []
    for _ in range(n_merges):
        pairs = collections.Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[a, b] += c
        if not pairs:
            break
        (a, b), _ = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        merges.append(a + b)
        new = collections.Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] += c
        words = new
    return chars + merges


def vocabulary(shuffle_seed: int | None = None) -> tuple[list[str], list[float], list[int]]:
    normal = _bpe_vocab(CORPUS, 300)
    if shuffle_seed is not None:
        rng = np.random.default_rng(shuffle_seed)
        normal = [normal[i] for i in rng.permutation(len(normal))]
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    tokens = SPECIALS + byte_tokens + normal
    # SPM merges prefer the higher score: later BPE merges get lower scores, single characters the lowest
    scores = [0.0] * (len(SPECIALS) + 256) + [
        -1000.0 if len(t) == 1 else -float(i) for i, t in enumerate(normal)
    ]
    # token types: 1 normal, 2 unknown, 3 control, 6 byte
    types = [2, 3, 3, 3, 3] + [6] * 256 + [1] * len(normal)
    return tokens, scores, types


def _weights(rng: np.random.Generator, n_vocab: int, n_layer: int, last_scale: float = 1.0) -> dict[str, np.ndarray]:
    d, hd = N_EMBD, N_EMBD // N_HEAD
    kv = hd * N_HEAD_KV

    def normal(shape, std):
        return rng.normal(0.0, std, shape).astype(np.float32)

    w = {
        "token_embd.weight": normal((n_vocab, d), 1.0),
        "output_norm.weight": np.ones(d, np.float32),
        "output.weight": normal((n_vocab, d), 5.0 / np.sqrt(d)),
    }
    for i in range(n_layer):
        out = 0.5 * (last_scale if i == n_layer - 1 else 1.0)  # how much each layer writes to the residual
        w |= {
            f"blk.{i}.attn_norm.weight": np.ones(d, np.float32),
            f"blk.{i}.attn_q.weight": normal((d, d), 1 / np.sqrt(d)),
            f"blk.{i}.attn_k.weight": normal((kv, d), 1 / np.sqrt(d)),
            f"blk.{i}.attn_v.weight": normal((kv, d), 1 / np.sqrt(d)),
            f"blk.{i}.attn_output.weight": normal((d, d), out / np.sqrt(d)),
            f"blk.{i}.ffn_norm.weight": np.ones(d, np.float32),
            f"blk.{i}.ffn_gate.weight": normal((N_FF, d), 1 / np.sqrt(d)),
            f"blk.{i}.ffn_up.weight": normal((N_FF, d), 1 / np.sqrt(d)),
            f"blk.{i}.ffn_down.weight": normal((d, N_FF), out / np.sqrt(N_FF)),
        }
    return w


def _write(path: Path, weights: dict[str, np.ndarray], n_layer: int, vocab, name: str, split: int = 0,
           template: str | None = CHAT_TEMPLATE, ids: dict[str, int] | None = None, rope_base: float = 0.0,
           n_ctx: int = N_CTX, dims: tuple[int, int, int, int] = (N_EMBD, N_HEAD, N_HEAD_KV, N_FF)) -> Path:
    """Write a model; split > 0 writes shards of that many tensors (NAME-00001-of-0000N.gguf, ...). `template`:
    its chat template (None: none); `ids`: more token ids by their GGUF keys (the end of turn, the FIM tokens);
    `rope_base`: RoPE's freq_base (0: llama.cpp's default); `n_ctx`: the trained context; `dims`: the width, heads,
    key-value heads and FFN width."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "llama", split_max_tensors=split)
    w.add_name(name)
    w.add_context_length(n_ctx)
    w.add_embedding_length(dims[0])
    w.add_block_count(n_layer)
    if rope_base:
        w.add_rope_freq_base(rope_base)
    w.add_feed_forward_length(dims[3])
    w.add_head_count(dims[1])
    w.add_head_count_kv(dims[2])
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(dims[0] // dims[1])
    if template is not None:
        w.add_chat_template(template)
    for key, token in (ids or {}).items():
        w.add_uint32(key, token)
    _finish(w, vocab, weights)
    return path


def _finish(w, vocab, weights: dict[str, np.ndarray]) -> None:
    """The vocabulary (SPM, BOS 1, EOS 2) and the F32 tensors of every tiny model, then the file."""
    tokens, scores, types = vocab
    w.add_vocab_size(len(tokens))
    w.add_file_type(0)  # all F32
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(False)
    for k, v in weights.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_models(folder: Path) -> dict[str, Path]:
    """Write target.gguf, draft.gguf and foreign.gguf into `folder` (deterministic) and return their paths."""
    folder = Path(folder)
    vocab = vocabulary()
    n_vocab = len(vocab[0])
    target = _weights(np.random.default_rng(1234), n_vocab, 3, last_scale=0.4)
    noise = np.random.default_rng(99)
    draft = {
        k: v + noise.normal(0.0, 0.05 * (float(v.std()) or 1.0), v.shape).astype(np.float32)
        if not k.endswith("norm.weight")
        else v
        for k, v in target.items()
        if not k.startswith("blk.2.")
    }
    fewer, more = _vocab_variants(draft, vocab)
    foreign_vocab = vocabulary(shuffle_seed=7)
    foreign = _weights(np.random.default_rng(4321), len(foreign_vocab[0]), 2)
    return {
        "target": _write(folder / "target.gguf", target, 3, vocab, "tiny-target"),
        "draft": _write(folder / "draft.gguf", draft, 2, vocab, "tiny-draft"),
        "foreign": _write(folder / "foreign.gguf", foreign, 2, foreign_vocab, "tiny-foreign"),
        "draft_fewer": _write(folder / "draft-fewer.gguf", fewer[0], 2, fewer[1], "tiny-draft-fewer"),
        "draft_more": _write(folder / "draft-more.gguf", more[0], 2, more[1], "tiny-draft-more"),
    }


N_VOCAB_DIFFERENCE = 5


def _vocab_variants(draft: dict[str, np.ndarray], vocab):
    """The draft with the target's last N_VOCAB_DIFFERENCE tokens missing, and with that many tokens more: sizes
    that differ as llama.cpp allows (within 128), like Qwen2.5 7B (152064) and 0.5B (151936). The extra tokens'
    output rows copy, a little louder, those of the tokens the draft proposes most, so that a draft which is
    not kept from them proposes them often."""
    n = N_VOCAB_DIFFERENCE
    tokens, scores, types = vocab
    fewer = {k: v[:-n] if k in ("token_embd.weight", "output.weight") else v for k, v in draft.items()}
    loud = np.argsort(-np.linalg.norm(draft["output.weight"], axis=1))[:n]
    more = dict(draft)
    more["output.weight"] = np.concatenate([draft["output.weight"], 1.3 * draft["output.weight"][loud]])
    more["token_embd.weight"] = np.concatenate([draft["token_embd.weight"], draft["token_embd.weight"][loud]])
    extra = [f"<extra_{i}>" for i in range(n)]
    return ((fewer, (tokens[:-n], scores[:-n], types[:-n])),
            (more, (tokens + extra, scores + [-5000.0] * n, types + [1] * n)))


def write_split_target(folder: Path) -> list[Path]:
    """The target model again, as a split GGUF in three shards; returns the shard paths in order."""
    folder = Path(folder)
    target = _weights(np.random.default_rng(1234), len(vocabulary()[0]), 3, last_scale=0.4)
    _write(folder / "tiny-split.gguf", target, 3, vocabulary(), "tiny-target", split=12)
    return sorted(folder.glob("tiny-split-*-of-*.gguf"))


if __name__ == "__main__":
    import sys

    for k, p in write_models(Path(sys.argv[1] if len(sys.argv) > 1 else "tiny-models")).items():
        print(k, p, p.stat().st_size)


N_EXPERT, N_FF_EXP = 2, 32


def _mtp_weights(rng: np.random.Generator, n_vocab: int, n_trunk: int) -> dict[str, np.ndarray]:
    """GLM-4.5's layout (llama.cpp's glm4moe), tiny: dense trunk blocks (GLM-4.5 has MoE ones after its first;
    here the trunk stays dense, so that no expert routing can flip between a batched and a single-token decode of
    the target), and one NextN (MTP) block after the trunk, an MoE block as llama.cpp requires (two experts, one
    used, one shared), that predicts the token after next from the trunk's last hidden state and the next token's
    embedding."""
    d, hd = N_EMBD, N_EMBD // N_HEAD
    kv = hd * N_HEAD_KV

    def normal(shape, std):
        return rng.normal(0.0, std, shape).astype(np.float32)

    w = {"token_embd.weight": normal((n_vocab, d), 1.0), "output_norm.weight": np.ones(d, np.float32),
         "output.weight": normal((n_vocab, d), 5.0 / np.sqrt(d))}
    for i in range(n_trunk + 1):
        w |= {
            f"blk.{i}.attn_norm.weight": np.ones(d, np.float32),
            f"blk.{i}.attn_q.weight": normal((d, d), 1 / np.sqrt(d)),
            f"blk.{i}.attn_k.weight": normal((kv, d), 1 / np.sqrt(d)),
            f"blk.{i}.attn_v.weight": normal((kv, d), 1 / np.sqrt(d)),
            f"blk.{i}.attn_output.weight": normal((d, d), 0.5 / np.sqrt(d)),
            f"blk.{i}.post_attention_norm.weight": np.ones(d, np.float32),
        }
        if i < n_trunk:  # the leading dense blocks
            w |= {f"blk.{i}.ffn_gate.weight": normal((N_FF, d), 1 / np.sqrt(d)),
                  f"blk.{i}.ffn_up.weight": normal((N_FF, d), 1 / np.sqrt(d)),
                  f"blk.{i}.ffn_down.weight": normal((d, N_FF), 0.5 / np.sqrt(N_FF))}
        else:
            w |= {f"blk.{i}.ffn_gate_inp.weight": normal((N_EXPERT, d), 1 / np.sqrt(d)),
                  f"blk.{i}.exp_probs_b.bias": np.zeros(N_EXPERT, np.float32),
                  f"blk.{i}.ffn_gate_exps.weight": normal((N_EXPERT, N_FF_EXP, d), 1 / np.sqrt(d)),
                  f"blk.{i}.ffn_up_exps.weight": normal((N_EXPERT, N_FF_EXP, d), 1 / np.sqrt(d)),
                  f"blk.{i}.ffn_down_exps.weight": normal((N_EXPERT, d, N_FF_EXP), 0.5 / np.sqrt(N_FF_EXP)),
                  f"blk.{i}.ffn_gate_shexp.weight": normal((N_FF_EXP, d), 1 / np.sqrt(d)),
                  f"blk.{i}.ffn_up_shexp.weight": normal((N_FF_EXP, d), 1 / np.sqrt(d)),
                  f"blk.{i}.ffn_down_shexp.weight": normal((d, N_FF_EXP), 0.5 / np.sqrt(N_FF_EXP))}
    m = n_trunk  # the NextN block: it mostly passes the next token's embedding on to the output layer (eh_proj
    # about [I, 0], its own attention and experts writing little), so it predicts the token after next much as the
    # trunk, whose layers also write little, predicts the next: it agrees with the target often, not always
    for k in (f"blk.{m}.attn_output.weight", f"blk.{m}.ffn_down_exps.weight", f"blk.{m}.ffn_down_shexp.weight"):
        w[k] *= 0.2
    eh = normal((d, 2 * d), 0.3 / np.sqrt(2 * d))
    eh[:, :d] += np.eye(d, dtype=np.float32)
    w |= {f"blk.{m}.nextn.eh_proj.weight": eh,
          f"blk.{m}.nextn.enorm.weight": np.ones(d, np.float32),
          f"blk.{m}.nextn.hnorm.weight": np.ones(d, np.float32),
          f"blk.{m}.nextn.shared_head_norm.weight": np.ones(d, np.float32)}
    return w


def write_mtp_model(folder: Path) -> Path:
    """mtp.gguf: a tiny glm4moe model with two trunk blocks and one NextN (MTP) block (block_count 3,
    nextn_predict_layers 1), as `convert_hf_to_gguf.py --mtp` writes GLM-4.5's."""
    import gguf

    vocab = vocabulary()
    n_trunk = 2
    path = Path(folder) / "mtp.gguf"
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "glm4moe")
    w.add_name("tiny-mtp")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(n_trunk + 1)
    w.add_uint32("glm4moe.nextn_predict_layers", 1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD // 2)  # GLM rotates half of each head
    w.add_expert_count(N_EXPERT)
    w.add_expert_used_count(1)
    w.add_expert_shared_count(1)
    w.add_leading_dense_block_count(n_trunk)
    w.add_expert_feed_forward_length(N_FF_EXP)
    _finish(w, vocab, _mtp_weights(np.random.default_rng(2024), len(vocab[0]), n_trunk))
    return path


def _eagle3_weights(rng: np.random.Generator, embd: np.ndarray) -> dict[str, np.ndarray]:
    """One EAGLE-3 decoder block over the tiny target (llama.cpp's eagle3: fc over the target's features, then
    attention over [token embedding, g]), borrowing the target's token embeddings (`embd`) as the Llama 3.1 8B head
    does, with an output layer of its own. It is an induction head: g at p is mostly the target's first layer input
    (the embedding of the token at p), so the query (the embedding of the token at p + 1) finds the cells whose token
    before it was that token, and copies the embedding of the token after, which its output layer (the normalised
    embeddings) reads back as that token. So it drafts well where the text repeats (the target's greedy loops) and
    poorly elsewhere; the noise on the other layers' features and the FFN make its drafts depend on all of g."""
    d, n_tgt = N_EMBD, embd.shape[1]

    def normal(shape, std):
        return rng.normal(0.0, std, shape).astype(np.float32)

    def pair(token: float, g: float) -> np.ndarray:  # token * I over the embedding half, g * I over g's, noise
        m = normal((d, 2 * d), 0.1 / np.sqrt(2 * d))
        m[:, :d] += token * np.eye(d, dtype=np.float32)
        m[:, d:] += g * np.eye(d, dtype=np.float32)
        return m

    fc = normal((d, 3 * n_tgt), 0.2 / np.sqrt(3 * n_tgt))
    fc[:, :n_tgt] += np.eye(d, n_tgt, dtype=np.float32)
    unit = embd / np.sqrt((embd**2).mean(axis=1, keepdims=True))
    # the copied embedding is written rotated (and read back so), so that a drafted position's state, its g, does
    # not match the query of the token drafted from it
    turn = np.linalg.qr(rng.normal(size=(d, d)))[0].astype(np.float32)
    v = pair(0.0, 0.0)
    v[:, :d] += 3.0 * turn
    return {"fc.weight": fc, "output_norm.weight": np.ones(d, np.float32), "output.weight": unit @ turn.T,
            "blk.0.attn_norm.weight": np.ones(d, np.float32),
            "blk.0.attn_norm_2.weight": np.ones(d, np.float32),
            "blk.0.attn_q.weight": pair(2.0, 0.0), "blk.0.attn_k.weight": pair(0.0, 2.0),
            "blk.0.attn_v.weight": v,
            "blk.0.attn_output.weight": np.eye(d, dtype=np.float32) + normal((d, d), 0.1 / np.sqrt(d)),
            "blk.0.ffn_norm.weight": np.ones(d, np.float32),
            "blk.0.ffn_gate.weight": normal((N_FF, d), 1 / np.sqrt(d)),
            "blk.0.ffn_up.weight": normal((N_FF, d), 1 / np.sqrt(d)),
            "blk.0.ffn_down.weight": normal((d, N_FF), 0.3 / np.sqrt(N_FF))}


EAGLE3_LAYERS = (0, 1, 2)  # the tiny target's layers (all three) whose inputs the head reads


def write_eagle3_head(folder: Path, layers: tuple[int, int, int] = EAGLE3_LAYERS, variant: bool = False) -> Path:
    """eagle3.gguf: a tiny EAGLE-3 head for write_models' target (3 layers, width N_EMBD), as llama.cpp's
    convert_hf_to_gguf.py writes one: architecture eagle3, one decoder block, `eagle3.target_layers` (the target
    layers whose inputs it fuses) and `eagle3.target_hidden_size`, the target's vocabulary. `variant`
    (eagle3-variant.gguf): the options published heads carry besides (`_variant`)."""
    import gguf

    path = Path(folder) / ("eagle3-variant.gguf" if variant else "eagle3.gguf")
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "eagle3")
    w.add_name("tiny-eagle3")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(2)  # RoPE on one pair of each head's 16 dimensions: the induction's match is the rest's
    # the residual takes normalised g (RedHat's speculators' heads set this): a drafted token's state, fed back
    # as the next position's g, does not outweigh what the next position's attention copies
    w.add_bool("eagle3.norm_before_residual", True)
    w.add_array("eagle3.target_layers", list(layers))
    w.add_uint32("eagle3.target_hidden_size", N_EMBD)
    vocab = vocabulary()
    embd = _weights(np.random.default_rng(1234), len(vocab[0]), 3)["token_embd.weight"]  # write_models' target's
    weights = _eagle3_weights(np.random.default_rng(3003), embd)
    if variant:
        w.add_bool("eagle3.norm_before_fc", True)
        weights = _variant(weights, embd)
    _finish(w, vocab, weights)
    return path


def _variant(weights: dict[str, np.ndarray], embd: np.ndarray) -> dict[str, np.ndarray]:
    """The head's weights with what published heads carry besides (llama.cpp's eagle3.cpp reads each): token
    embeddings of its own (Llama 3.3 70B's head: here the target's, scaled), an RMSNorm over the fused features
    before fc (`norm_before_fc`, EAGLE-3.1: its weight `enc.output_norm`), and a draft vocabulary smaller than the
    target's (the d2t map, each draft row's target id: here every token but each fifth, in reverse order)."""
    n_vocab = embd.shape[0]
    d2t = np.array([t for t in range(n_vocab - 1, -1, -1) if t % 5], np.int64)
    n_in = weights["fc.weight"].shape[1]
    return {**weights, "token_embd.weight": 1.5 * embd, "enc.output_norm.weight": np.ones(n_in, np.float32),
            "output.weight": weights["output.weight"][d2t], "d2t": d2t}


DFLASH_LAYERS = (0, 1, 2)  # the tiny target's layers whose inputs the DFlash head reads
DFLASH_BLOCK, DFLASH_MASK = 6, 3  # its block (the last token and 5 masks) and mask token (<|user|>)
DFLASH_BLOCKS = 3  # its decoder blocks: the block fills two positions a block (_dflash_weights)


DFLASH_CONTENT, DFLASH_FLAG = 56, 56  # the head's residual: a token's code in dims 0-55, a flag dim (56) for positions


def _dflash_rope(n_pair: int = 8, period: int = 15) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(query, key, rope_freqs) of one attention head of the tiny DFlash head, whose score peaks two positions back
    and is low everywhere else within `period`: RoPE pairs 0-6 turn at 2 pi j / period (rope_freqs sets the
    frequencies), their sum a Dirichlet kernel (7 there, -1/2 elsewhere), pair 7 nearly still, a constant that
    centres it (NEOX pairs dims i and i + 8)."""
    hd = 2 * n_pair
    theta = 2 * np.pi * np.arange(1, n_pair) / period
    q, k = np.zeros(hd, np.float32), np.zeros(hd, np.float32)
    q[:n_pair] = 1.0
    k[: n_pair - 1], k[n_pair: 2 * n_pair - 1] = np.cos(2 * theta), np.sin(2 * theta)
    k[n_pair - 1] = -3.25
    base = 10000.0 ** (-np.arange(n_pair) / n_pair)  # llama.cpp's frequencies before rope_freqs divides them
    freqs = np.concatenate([base[:-1] / theta, [base[-1] * 1e12]]).astype(np.float32)
    return q, k, freqs


def _dflash_weights(rng: np.random.Generator, embd: np.ndarray, n_layers: int, n_block: int,
                    mask: int, sure: float = 10.0) -> dict[str, np.ndarray]:
    """`n_block` DFlash decoder blocks over the tiny target (llama.cpp's dflash: fc and a norm over the target's
    features, whose K and V each block injects into the cache; the noise block attends to them and to itself) that
    draft a text's two-token loop. A token's code is fc over the target's first layer input (its embedding), what g
    carries and what the head's own token embeddings and output layer hold; the mask token has no code. Every
    attention head's query and key read the flag dim alone, which the block's tokens have and g has not: g's keys are
    zero (score 0), and a block position's score (RoPE, _dflash_rope) is high for the position two back and low for
    all else. With a sliding window of 3, the block's first mask sees one injected position (the one before the
    last token) beside the block's low ones and copies its code; each other mask copies the block position two back,
    which the block fills one layer after another: the block drafts t[n-1], t[n], t[n-1], ... after t[n]. `sure`
    scales the output layer: how sure of its tokens the head is."""
    d, hd = N_EMBD, N_EMBD // N_HEAD
    code_of = np.linalg.qr(rng.normal(size=(d, d)))[0][:DFLASH_CONTENT].astype(np.float32)
    fc = np.zeros((d, n_layers * d), np.float32)
    fc[:DFLASH_CONTENT, :d] = code_of
    fc[:DFLASH_CONTENT, d:] = rng.normal(0.0, 0.1 / np.sqrt(d), (DFLASH_CONTENT, (n_layers - 1) * d))
    codes = embd @ code_of.T
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    tok = np.zeros((len(embd), d), np.float32)
    tok[:, :DFLASH_CONTENT] = 4.0 * codes
    tok[:, DFLASH_FLAG] = 4.0
    tok[mask, :DFLASH_CONTENT] = 0.0
    out = np.zeros((len(embd), d), np.float32)
    out[:, :DFLASH_CONTENT] = sure * codes
    q, k, freqs = _dflash_rope()
    flag = np.zeros(d, np.float32)
    flag[DFLASH_FLAG] = 1.0
    copy = np.eye(d, dtype=np.float32)
    copy[DFLASH_CONTENT:] = 0.0  # V and the output carry codes only: the flag stays as it is
    w = {"fc.weight": fc, "enc.output_norm.weight": np.ones(d, np.float32), "token_embd.weight": tok,
         "output.weight": out, "output_norm.weight": np.ones(d, np.float32), "rope_freqs.weight": freqs}
    for i in range(n_block):
        w |= {f"blk.{i}.attn_norm.weight": np.ones(d, np.float32),
              f"blk.{i}.attn_q.weight": np.tile(np.outer(q, flag), (N_HEAD, 1)),
              f"blk.{i}.attn_k.weight": np.tile(np.outer(k, flag), (N_HEAD, 1)),
              f"blk.{i}.attn_v.weight": copy, f"blk.{i}.attn_output.weight": copy,
              f"blk.{i}.attn_q_norm.weight": np.ones(hd, np.float32),
              f"blk.{i}.attn_k_norm.weight": np.full(hd, 4.0, np.float32),
              f"blk.{i}.ffn_norm.weight": np.ones(d, np.float32),
              f"blk.{i}.ffn_gate.weight": np.zeros((N_FF, d), np.float32),
              f"blk.{i}.ffn_up.weight": np.zeros((N_FF, d), np.float32),
              f"blk.{i}.ffn_down.weight": np.zeros((d, N_FF), np.float32)}
    return w


def write_dflash_head(folder: Path, layers: tuple[int, ...] = DFLASH_LAYERS, block_size: int = DFLASH_BLOCK,
                      mask: int | None = DFLASH_MASK, name: str = "dflash.gguf", markov: bool = False,
                      sure: float = 10.0) -> Path:
    """dflash.gguf: a tiny DFlash head for write_models' target (3 layers, width N_EMBD), as llama.cpp's
    conversion/qwen.py writes one: architecture dflash, `dflash.target_layers` (the target layers whose inputs it
    fuses), `dflash.block_size`, the target's vocabulary with its mask token (`tokenizer.ggml.mask_token_id`, None:
    none), non-causal attention over the block; `markov`: a DSpark head's Markov tensor too (markov_w1); `sure`: how
    sure of its tokens the head is (_dflash_weights)."""
    import gguf

    path = Path(folder) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), "dflash")
    w.add_name("tiny-dflash")
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_block_count(DFLASH_BLOCKS)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(N_EMBD // N_HEAD)
    w.add_sliding_window(3)
    w.add_sliding_window_pattern([True] * DFLASH_BLOCKS)
    w.add_uint32("dflash.block_size", block_size)
    w.add_array("dflash.target_layers", list(layers))
    if mask is not None:
        w.add_uint32("tokenizer.ggml.mask_token_id", mask)
    vocab = vocabulary()
    embd = _weights(np.random.default_rng(1234), len(vocab[0]), 3)["token_embd.weight"]  # write_models' target's
    weights = _dflash_weights(np.random.default_rng(5005), embd, len(layers), DFLASH_BLOCKS,
                              DFLASH_MASK if mask is None else mask, sure)
    if markov:
        weights["markov_w1.weight"] = np.zeros((len(embd), 4), np.float32)
    _finish(w, vocab, weights)
    return path


# -- tool calls (h1): models with Qwen2.5's (Hermes <tool_call>) and Llama 3.1's chat templates, their text as the
# models' own tokenizer_config.json has it (data), and each template's special tokens as control tokens
QWEN25_TEMPLATE = '{%- if tools %}\n    {{- \'<|im_start|>system\\n\' }}\n    {%- if messages[0][\'role\'] == \'system\' %}\n        {{- messages[0][\'content\'] }}\n    {%- else %}\n        {{- \'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.\' }}\n    {%- endif %}\n    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}\n    {%- for tool in tools %}\n        {{- "\\n" }}\n        {{- tool | tojson }}\n    {%- endfor %}\n    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}\n{%- else %}\n    {%- if messages[0][\'role\'] == \'system\' %}\n        {{- \'<|im_start|>system\\n\' + messages[0][\'content\'] + \'<|im_end|>\\n\' }}\n    {%- else %}\n        {{- \'<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n\' }}\n    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}\n        {{- \'<|im_start|>\' + message.role + \'\\n\' + message.content + \'<|im_end|>\' + \'\\n\' }}\n    {%- elif message.role == "assistant" %}\n        {{- \'<|im_start|>\' + message.role }}\n        {%- if message.content %}\n            {{- \'\\n\' + message.content }}\n        {%- endif %}\n        {%- for tool_call in message.tool_calls %}\n            {%- if tool_call.function is defined %}\n                {%- set tool_call = tool_call.function %}\n            {%- endif %}\n            {{- \'\\n<tool_call>\\n{"name": "\' }}\n            {{- tool_call.name }}\n            {{- \'", "arguments": \' }}\n            {{- tool_call.arguments | tojson }}\n            {{- \'}\\n</tool_call>\' }}\n        {%- endfor %}\n        {{- \'<|im_end|>\\n\' }}\n    {%- elif message.role == "tool" %}\n        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}\n            {{- \'<|im_start|>user\' }}\n        {%- endif %}\n        {{- \'\\n<tool_response>\\n\' }}\n        {{- message.content }}\n        {{- \'\\n</tool_response>\' }}\n        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}\n            {{- \'<|im_end|>\\n\' }}\n        {%- endif %}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- \'<|im_start|>assistant\\n\' }}\n{%- endif %}\n'

LLAMA31_TEMPLATE = '{{- bos_token }}\n{%- if custom_tools is defined %}\n    {%- set tools = custom_tools %}\n{%- endif %}\n{%- if not tools_in_user_message is defined %}\n    {%- set tools_in_user_message = true %}\n{%- endif %}\n{%- if not date_string is defined %}\n    {%- set date_string = "26 Jul 2024" %}\n{%- endif %}\n{%- if not tools is defined %}\n    {%- set tools = none %}\n{%- endif %}\n\n{#- This block extracts the system message, so we can slot it into the right place. #}\n{%- if messages[0][\'role\'] == \'system\' %}\n    {%- set system_message = messages[0][\'content\']|trim %}\n    {%- set messages = messages[1:] %}\n{%- else %}\n    {%- set system_message = "" %}\n{%- endif %}\n\n{#- System message + builtin tools #}\n{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}\n{%- if builtin_tools is defined or tools is not none %}\n    {{- "Environment: ipython\\n" }}\n{%- endif %}\n{%- if builtin_tools is defined %}\n    {{- "Tools: " + builtin_tools | reject(\'equalto\', \'code_interpreter\') | join(", ") + "\\n\\n"}}\n{%- endif %}\n{{- "Cutting Knowledge Date: December 2023\\n" }}\n{{- "Today Date: " + date_string + "\\n\\n" }}\n{%- if tools is not none and not tools_in_user_message %}\n    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}\n    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n    {{- "Do not use variables.\\n\\n" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- "\\n\\n" }}\n    {%- endfor %}\n{%- endif %}\n{{- system_message }}\n{{- "<|eot_id|>" }}\n\n{#- Custom tools are passed in a user message with some extra guidance #}\n{%- if tools_in_user_message and not tools is none %}\n    {#- Extract the first user message so we can plug it in here #}\n    {%- if messages | length != 0 %}\n        {%- set first_user_message = messages[0][\'content\']|trim %}\n        {%- set messages = messages[1:] %}\n    {%- else %}\n        {{- raise_exception("Cannot put tools in the first user message when there\'s no first user message!") }}\n{%- endif %}\n    {{- \'<|start_header_id|>user<|end_header_id|>\\n\\n\' -}}\n    {{- "Given the following functions, please respond with a JSON for a function call " }}\n    {{- "with its proper arguments that best answers the given prompt.\\n\\n" }}\n    {{- \'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.\' }}\n    {{- "Do not use variables.\\n\\n" }}\n    {%- for t in tools %}\n        {{- t | tojson(indent=4) }}\n        {{- "\\n\\n" }}\n    {%- endfor %}\n    {{- first_user_message + "<|eot_id|>"}}\n{%- endif %}\n\n{%- for message in messages %}\n    {%- if not (message.role == \'ipython\' or message.role == \'tool\' or \'tool_calls\' in message) %}\n        {{- \'<|start_header_id|>\' + message[\'role\'] + \'<|end_header_id|>\\n\\n\'+ message[\'content\'] | trim + \'<|eot_id|>\' }}\n    {%- elif \'tool_calls\' in message %}\n        {%- if not message.tool_calls|length == 1 %}\n            {{- raise_exception("This model only supports single tool-calls at once!") }}\n        {%- endif %}\n        {%- set tool_call = message.tool_calls[0].function %}\n        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}\n            {{- \'<|start_header_id|>assistant<|end_header_id|>\\n\\n\' -}}\n            {{- "<|python_tag|>" + tool_call.name + ".call(" }}\n            {%- for arg_name, arg_val in tool_call.arguments | items %}\n                {{- arg_name + \'="\' + arg_val + \'"\' }}\n                {%- if not loop.last %}\n                    {{- ", " }}\n                {%- endif %}\n                {%- endfor %}\n            {{- ")" }}\n        {%- else  %}\n            {{- \'<|start_header_id|>assistant<|end_header_id|>\\n\\n\' -}}\n            {{- \'{"name": "\' + tool_call.name + \'", \' }}\n            {{- \'"parameters": \' }}\n            {{- tool_call.arguments | tojson }}\n            {{- "}" }}\n        {%- endif %}\n        {%- if builtin_tools is defined %}\n            {#- This means we\'re in ipython mode #}\n            {{- "<|eom_id|>" }}\n        {%- else %}\n            {{- "<|eot_id|>" }}\n        {%- endif %}\n    {%- elif message.role == "tool" or message.role == "ipython" %}\n        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}\n        {%- if message.content is mapping or message.content is iterable %}\n            {{- message.content | tojson }}\n        {%- else %}\n            {{- message.content }}\n        {%- endif %}\n        {{- "<|eot_id|>" }}\n    {%- endif %}\n{%- endfor %}\n{%- if add_generation_prompt %}\n    {{- \'<|start_header_id|>assistant<|end_header_id|>\\n\\n\' }}\n{%- endif %}\n'

TOOL_TEMPLATES = {  # name: (template, its special tokens, the end-of-turn token among them)
    "hermes": (QWEN25_TEMPLATE, ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    "llama3": (LLAMA31_TEMPLATE, ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                                  "<|python_tag|>"], "<|eot_id|>"),
}


def write_tool_models(folder: Path) -> dict[str, Path]:
    """hermes.gguf and llama3.gguf: the target's architecture and vocabulary, plus the template's special tokens
    (control tokens, its end of turn the end-of-turn token), with the real family's chat template."""
    out = {}
    for name, (template, specials, eot) in TOOL_TEMPLATES.items():
        tokens, scores, types = vocabulary()
        vocab = (tokens + specials, scores + [0.0] * len(specials), types + [3] * len(specials))
        weights = _weights(np.random.default_rng(1234), len(vocab[0]), 3, last_scale=0.4)
        out[name] = _write(Path(folder) / f"{name}.gguf", weights, 3, vocab, f"tiny-{name}", template=template,
                           ids={"tokenizer.ggml.eot_token_id": vocab[0].index(eot)})
    return out


# -- fill-in-the-middle (serve's /infill and `suffix`): a model whose vocabulary has FIM tokens ------------------

FIM_SPECIALS = {"pre": "<|fim_prefix|>", "suf": "<|fim_suffix|>", "mid": "<|fim_middle|>", "pad": "<|fim_pad|>",
                "rep": "<|repo_name|>", "sep": "<|file_sep|>"}  # Qwen2.5-Coder's


def write_fim_model(folder: Path) -> Path:
    """fim.gguf: the target's architecture and vocabulary with Qwen2.5-Coder's six FIM tokens appended (control
    tokens), named by the GGUF keys llama.cpp reads (tokenizer.ggml.fim_pre_token_id, ...); its attention is
    almost silent (below)."""
    tokens, scores, types = vocabulary()
    ids = {name: len(tokens) + i for i, name in enumerate(FIM_SPECIALS)}
    vocab = (tokens + list(FIM_SPECIALS.values()), scores + [0.0] * len(ids), types + [3] * len(ids))
    weights = _weights(np.random.default_rng(1234), len(vocab[0]), 3, last_scale=0.4)
    for k in weights:  # attention that writes almost nothing: each token's successor is mostly a function of the
        if k.endswith("attn_output.weight"):  # token alone, so text the model wrote once it writes again, and
            weights[k] *= 0.02  # prompt lookup's drafts of it from the suffix are accepted
    return _write(Path(folder) / "fim.gguf", weights, 3, vocab, "tiny-fim", template=None,
                  ids={f"tokenizer.ggml.fim_{name}_token_id": token for name, token in ids.items()})


# -- a scripted model (the agent clients' tests): greedy output a tool call until a tool's result is in the prompt,
# then a plain answer; Qwen2.5's template, so the server reads its <tool_call>s as hermes calls
HERMES_MARKERS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]  # Qwen2.5's user-defined


def _script_vocab(call: str, answer: str):
    """The vocabulary (base, Qwen2.5's specials and markers, the scripts' new pieces) and the two scripts as
    ids: the call (`<tool_call>`, "\\n" + call + "\\n", `</tool_call>`), the answer's words, each then <|im_end|>."""
    tokens, scores, types = vocabulary()
    tokens, scores = tokens + ["<|im_start|>", "<|im_end|>"] + HERMES_MARKERS, scores + [0.0] * 6
    types = types + [3, 3] + [4] * len(HERMES_MARKERS)  # control; user-defined, as Qwen2.5's GGUF has them
    words = [w.replace(" ", "\u2581") for w in answer.replace(" ", "\n ").split("\n")]
    pieces = ["<tool_call>", ("\n" + call + "\n").replace(" ", "\u2581"), "</tool_call>"]
    for piece in pieces + words:
        if piece not in tokens:
            tokens, scores, types = tokens + [piece], scores + [-5000.0], types + [1]
    end = tokens.index("<|im_end|>")
    scripts = [[tokens.index(p) for p in pieces] + [end], [tokens.index(p) for p in words] + [end]]
    if len({*scripts[0][:-1], *scripts[1][:-1]}) != len(scripts[0]) + len(scripts[1]) - 2:
        raise ValueError("the scripts' pieces must be unique")
    return (tokens, scores, types), scripts


def write_script_model(folder: Path, call: str, answer: str, name: str = "script") -> Path:
    """NAME.gguf: greedy output `<tool_call>\\n{call}\\n</tool_call>` while the prompt holds no `<tool_response>`,
    `answer` once it does, each then end of turn. One layer, 16 wide, one head (an agent's prompt of 60k tokens is
    prefilled in seconds): each token's embedding is a direction (dims 0-11; the scripts' tokens orthogonal) and
    -2 on a switch dimension (15); the head attends only to `<tool_response>` (its flag, dim 12) and turns the
    switch to +2; the FFN writes nothing. The output layer's row of each script token is its predecessor's
    direction and the switch's sign, so the next token is the script's successor of the current one (after the
    prompt's last "\\n": the first piece). RoPE is made negligible on the head's dimensions (freq_base 1e30), so
    the marker counts at any distance. Where a grammar masks the script (a client's JSON schema), a constant
    dimension (13) ranks the rest: `"`, `}`, `]`, the end and `:` first (in that order), so JSON closes at once
    (`{"title":""}`)."""
    vocab, scripts = _script_vocab(call, answer)
    n, d = len(vocab[0]), 16
    rng = np.random.default_rng(46)
    emb = np.zeros((n, d), np.float32)
    emb[:, :12] = rng.normal(0.0, 1.0, (n, 12))
    before = list(dict.fromkeys([vocab[0].index("<0x0A>")] + scripts[0][:-1] + scripts[1][:-1]))
    if len(before) > 12:
        raise ValueError("at most 11 pieces in the two scripts")
    emb[before, :12] = np.linalg.qr(rng.normal(0.0, 1.0, (12, len(before))))[0].T
    emb[:, :12] *= np.sqrt(12) / np.linalg.norm(emb[:, :12], axis=1, keepdims=True)
    emb[:, 13], emb[:, 15] = 1.0, -2.0
    marker = vocab[0].index("<tool_response>")
    emb[marker, 12] = 4.0
    flag = 4.0 / np.sqrt(np.mean(emb[marker] ** 2))  # the marker's flag after the attention's norm
    blk = {k: np.zeros((d, d), np.float32) for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate",
                                                      "ffn_up", "ffn_down")}
    blk["attn_q"][14, 15] = -5.0 * np.sqrt(17 / 16)  # query 10 (the switch is -2 on every token), in RoPE's
    blk["attn_k"][14, 12] = 16.0 / flag  # slowest pair; key 16 on the marker only: score 10 * 16 / sqrt(16) = 40
    blk["attn_v"][0, 12] = 1.0 / flag  # value 1 on the marker only
    blk["attn_output"][15, 0] = 4.0  # the switch: -2 to +2
    out = np.zeros((n, d), np.float32)
    for sign, script in zip((-1.0, 1.0), scripts):
        for prev, token in zip([vocab[0].index("<0x0A>")] + script, script):
            out[token, :12] += 100.0 * emb[prev, :12] / 12.0
            out[token, 15] = 15.0 * sign if token != script[-1] else 0.0
    for rank, piece in enumerate([":", "<|im_end|>", "]", "}", '"']):
        out[vocab[0].index(piece), 13] = 40.0 + rank  # above the switch term (30), below a successor (130)
    weights = {"token_embd.weight": emb, "output_norm.weight": np.ones(d, np.float32), "output.weight": out}
    weights |= {f"blk.0.{k}.weight": v for k, v in blk.items()}
    weights |= {f"blk.0.{k}.weight": np.ones(d, np.float32) for k in ("attn_norm", "ffn_norm")}
    return _write(Path(folder) / f"{name}.gguf", weights, 1, vocab, f"tiny-{name}", template=QWEN25_TEMPLATE,
                  ids={"tokenizer.ggml.eot_token_id": vocab[0].index("<|im_end|>")}, rope_base=1e30,
                  n_ctx=131072, dims=(d, 1, 1, d))
