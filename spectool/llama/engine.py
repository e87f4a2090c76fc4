"""The only module that touches llama_cpp: models, contexts, batches, logits, rollback, vocabulary facts.

`Model` owns one llama.cpp model, one context (one sequence) and one reusable batch. It remembers which tokens
sit in its KV cache (`tokens`), so callers can `sync` to a new token history: the common prefix is kept, the
rest is rolled back and the missing tokens are decoded. Logits are read as zero-copy numpy views that stay
valid only until the next decode.
"""

from __future__ import annotations

import codecs
import ctypes
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp's libraries before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.llama.devices import Device, resolve_gpu_layers
from spectool.llama.native import (  # noqa: F401 - the engine's errors and log, re-exported
    _RECENT_LOG, _STATE, DecodeError, DoesNotFit, EngineError, ModelLoadError, _lib, avoid_amx, backend_info,
    last_log_error, raise_pending_interrupt, set_verbose)

GGUF_MAGIC = b"GGUF"




def check_gguf_file(path: str | os.PathLike) -> Path:
    """Fail early, with a readable message, on a path that cannot be a GGUF model."""
    p = Path(path).expanduser()
    if not p.exists():
        raise ModelLoadError(f"model file not found: {p}")
    if p.is_dir():
        raise ModelLoadError(f"model path is a directory, not a .gguf file: {p}")
    try:
        with p.open("rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise ModelLoadError(f"cannot read model file {p}: {e.strerror}") from e
    if magic != GGUF_MAGIC:
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {p}")
    return p


# --------------------------------------------------------------------------------------------------------------
# Vocabulary facts


@dataclass(frozen=True)
class VocabInfo:
    type: int
    n_tokens: int
    bos: int
    eos: int
    add_bos: bool
    add_eos: bool
    texts: tuple[bytes, ...]


# --------------------------------------------------------------------------------------------------------------
# The model


class Model:
    """One llama.cpp model with one context holding one sequence (seq id 0)."""

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        n_ctx: int = 4096,  # mirrors options.CTX_SIZE (-c), which the engine layer does not import
        n_threads: int | None = None,
        n_gpu_layers: int | str = 0,
        local_only: bool = False,
        n_batch: int = 512,
        flash_attn: bool | None = None,
        graph_sampling: bool | None = None,
        load_mtp: bool = False,
        progress: Callable[[float], None] | None = None,
    ):
        """`progress(fraction)` hears how far loading the weights has come (llama.cpp's progress_callback).
        `n_gpu_layers`: a number, `auto` or `all` (resolve_gpu_layers); `local_only` keeps the layers off RPC
        workers (the draft's rule) unless no local GPU exists and a number was asked for. `graph_sampling`: whether
        decodes that ask for it are sampled inside llama.cpp's graph (see sample_on_backend); None: where the
        output layer runs on a GPU or a worker, not on the CPU."""
        self.path = check_gguf_file(path)
        lib = self.lib = _lib()
        self._model = self._ctx = self._batch = self._chain = None  # close() is safe on a half-built Model
        mparams = lib.llama_model_default_params()
        ngl, usable = resolve_gpu_layers(n_gpu_layers, local_only=local_only)
        mparams.n_gpu_layers = ngl
        mparams.load_mtp = load_mtp  # the NextN (MTP) blocks too, for an MtpContext
        if usable:  # exactly these devices (NULL-terminated); without a list llama.cpp would use every GPU and worker
            device_list = (ctypes.c_void_p * (len(usable) + 1))(*[d.handle for d in usable], None)
            mparams.devices = ctypes.cast(device_list, ctypes.c_void_p)
        if avoid_amx():
            mparams.use_extra_bufts = False
        interrupted = []
        if progress is not None:
            def on_progress(fraction: float, _user_data) -> bool:
                try:
                    progress(fraction)
                    return True
                except KeyboardInterrupt:  # cannot cross llama.cpp's frames: stop loading, raise below
                    interrupted.append(True)
                    return False

            callback = lib.llama_progress_callback(on_progress)
            mparams.progress_callback = callback
        _RECENT_LOG.clear()
        model = lib.llama_model_load_from_file(str(self.path).encode(), mparams)
        if interrupted or _STATE.get("sigint"):
            _STATE["sigint"] = False
            if model:
                lib.llama_model_free(model)
            raise KeyboardInterrupt
        if not model:
            why = last_log_error()
            if ngl and usable and any(w in " ".join(_RECENT_LOG).lower() for w in ("alloc", "out of memory")):
                raise DoesNotFit(self._does_not_fit(usable, ngl))
            raise ModelLoadError(
                f"llama.cpp could not load {self.path.name}: {why or 'truncated, corrupt or unsupported file'}"
            )
        self._model = model
        n_layer = lib.llama_model_n_layer(model)
        layers = 0 if not usable else (n_layer + 1 if ngl < 0 else min(ngl, n_layer + 1))
        # Sampling in the graph pays where the logits live on a device: a GPU's argmax is nearly free beside copying
        # 1 MiB rows to the host. On the CPU backend it costs more than it saves: ggml's argmax is a scalar loop on
        # one thread after a copy of the logits (ggml_pad), and a greedy 9-token verification of Gemma 3 270M took
        # 6-8 ms longer inside llama_decode than copying the rows out for numpy (benchmarks/step_cost.py).
        self.graph_sampling = bool(usable) and layers == n_layer + 1 if graph_sampling is None else graph_sampling
        # where the weights went, for the live panel and --stats-json (llama.cpp counts the output layer too)
        self.offload = {"backend": ", ".join(d.name for d in usable) if layers else "CPU",
                        "devices": [f"{d.name} ({d.description})" for d in usable] if layers else [],
                        "layers": layers, "of": n_layer + 1}
        self._vocab = lib.llama_model_get_vocab(model)
        self.n_vocab = lib.llama_vocab_n_tokens(self._vocab)
        self.can_rollback = not (lib.llama_model_is_recurrent(model) or lib.llama_model_is_hybrid(model))
        self.n_nextn = int(lib.llama_model_n_layer_nextn(model))  # MTP (NextN) heads the file carries

        n_train = lib.llama_model_n_ctx_train(model)
        n_ctx = n_ctx if n_ctx > 0 else n_train
        n_threads = n_threads or max(1, os.cpu_count() or 1)
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = cparams.n_ubatch = min(n_batch, n_ctx)
        cparams.n_outputs_max_per_seq = cparams.n_batch  # sampling in the graph for every row of a verification
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.no_perf = True
        if flash_attn is not None:  # None: llama.cpp decides (on for CPU); its kernel sums in batch-dependent order
            cparams.flash_attn_type = int(flash_attn)
        cparams.swa_full = True  # rollback inside the sliding window needs the full-size SWA cache
        _RECENT_LOG.clear()  # what the context's creation logs, for _no_context
        ctx = lib.llama_init_from_model(model, cparams)
        if ctx and _STATE.get("sigint"):
            lib.llama_free(ctx)
            ctx = None
            self.close()
            raise_pending_interrupt()
        if not ctx:
            self.close()
            raise self._no_context(n_ctx, usable if layers else [])
        self._ctx = ctx
        self._mem = lib.llama_get_memory(ctx)
        self.n_ctx = lib.llama_n_ctx(ctx)
        self.n_batch = lib.llama_n_batch(ctx)
        self._batch = b = lib.llama_batch_init(self.n_batch, 0, 1)
        # A decode writes the batch with slice assignments to ctypes arrays over its fields (a single token: two
        # stores), not a call per token and field. Every token belongs to sequence 0 (written once here), and
        # which outputs a batch asks for is written only when it changes (`_asked`).
        self._b_token = _array(b.token, ctypes.c_int32, self.n_batch)
        self._b_pos = _array(b.pos, ctypes.c_int32, self.n_batch)
        self._b_out = _array(b.logits, ctypes.c_int8, self.n_batch)
        self._asked: tuple = ()
        np.ctypeslib.as_array(b.n_seq_id, shape=(self.n_batch,))[:] = 1
        for i in range(self.n_batch):
            b.seq_id[i][0] = 0
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        self._n_out = 0
        self._rows: np.ndarray | None = None  # the last decode's logits rows, one view for all (see logits)
        self._view: tuple[int, np.ndarray] = (0, np.empty((0, 0), np.float32))  # (address, rows) of that view
        self._logits_address = lib.llama_cpp._lib["llama_get_logits"]  # a binding of our own: the bare address
        self._logits_address.restype, self._logits_address.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
        # the tokens sampled in the graph are read through a binding of our own with its arguments made once: the
        # call runs right after a decode, when the CPU's caches are cold, and ctypes' converters cost more than it
        self._sampled_token_ith = lib.llama_cpp._lib["llama_get_sampled_token_ith"]
        self._sampled_token_ith.restype, self._sampled_token_ith.argtypes = ctypes.c_int32, None
        self._ctx_arg = ctypes.c_void_p(self._ctx)
        self._out_args = [ctypes.c_int32(i) for i in range(-self.n_batch, 0)]  # output -n .. -1 of a decode
        self._chain = None  # the sampler chain llama.cpp runs inside the graph, if any (see sample_on_backend)
        self._chain_k: int | None = None  # ... and what it is: 0 greedy, k > 0 top-k, None none
        self.sampled: int | None = None  # how the last decode's outputs were sampled in the graph (None: rows)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        # hears (tokens, position of the first) after each decode: an MtpContext mirrors the target's batches
        self.on_decode: Callable[[Sequence[int], int], None] | None = None

    def _does_not_fit(self, usable: list[Device], ngl: int) -> str:
        """The one-line answer to an offload that ran out of device memory: how much was free, and a number of
        layers that should fit (the free share of the file, less a tenth for the context; fewer than failed)."""
        lib = self.lib
        mparams = lib.llama_model_default_params()
        mparams.vocab_only = True  # the metadata only
        model = lib.llama_model_load_from_file(str(self.path).encode(), mparams)
        n_layer = 0
        if model:
            n_layer = int(_meta(lib, model, f"{_meta(lib, model, 'general.architecture')}.block_count") or 0)
            lib.llama_model_free(model)
        free, size = sum(d.free for d in usable), self.path.stat().st_size
        tried = n_layer + 1 if ngl < 0 else ngl
        fit = max(0, min(tried - 1, int(0.9 * n_layer * free / size) if size else 0))
        where = ", ".join(d.name for d in usable)
        return (f"{self.path.name} ({size >> 20} MiB) does not fit {where} ({free >> 20} MiB free): "
                f"try -ngl {fit} (of its {n_layer} layers), or -ngl 0 for the CPU")

    def _no_context(self, n_ctx: int, usable: list[Device]) -> ModelLoadError:
        """Why llama.cpp made no context; where an allocation failed (a KV cache too large for -c), how much it
        wanted and how much memory was free, as _does_not_fit says for the weights."""
        log = " ".join(_RECENT_LOG)
        wanted = re.search(r"failed to allocate (?:\S+ )?buffer of size (\d+)", log)
        if not wanted:
            return ModelLoadError(f"llama.cpp could not create a context of {n_ctx} tokens for {self.path.name}: "
                                  f"{last_log_error() or 'out of memory?'}")
        what = "its KV cache" if "kv cache" in log.lower() else "its buffers"
        if usable:
            where, free = ", ".join(d.name for d in usable), sum(d.free for d in usable)
        else:
            where, free = "RAM", os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return DoesNotFit(f"a context of {n_ctx} tokens for {self.path.name} does not fit: {what} needs "
                          f"{int(wanted[1]) >> 20} MiB and {where} has {free >> 20} MiB free; try a smaller "
                          "-c/--ctx-size")

    # -- lifetime ------------------------------------------------------------------------------------------
    def close(self) -> None:
        lib = self.lib
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lib.llama_free(self._ctx)
            self._ctx = self._ctx_arg = None
            self._n_out, self.sampled = 0, None  # nothing to read any more
        if self._chain is not None:  # after the context that ran it
            lib.llama_sampler_free(self._chain)
            self._chain = None
        if self._model:
            lib.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a safety net; callers should use `with` or close()
        try:
            self.close()
        except Exception:
            pass

    # -- text ----------------------------------------------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 8
        buf = (self.lib.llama_token * n_max)()
        n = self.lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (self.lib.llama_token * n_max)()
            n = self.lib.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """The bytes of one token (special tokens render as nothing)."""
        p = self._pieces.get(token)
        if p is None:
            buf = ctypes.create_string_buffer(64)
            n = self.lib.llama_token_to_piece(self._vocab, token, buf, 64, 0, False)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = self.lib.llama_token_to_piece(self._vocab, token, buf, -n, 0, False)
            p = self._pieces[token] = buf.raw[:n]
        return p

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", errors="replace")

    def detokenizer(self) -> "Detokenizer":
        return Detokenizer(self.piece)

    def first_eog(self, tokens: Sequence[int]) -> int:
        """The index of the first end-of-generation token in `tokens` (len(tokens) if none)."""
        for i, token in enumerate(tokens):
            if self._eog.get(token) or (token not in self._eog and self.is_eog(token)):
                return i
        return len(tokens)

    def is_eog(self, token: int) -> bool:
        eog = self._eog.get(token)
        if eog is None:
            eog = self._eog[token] = bool(self.lib.llama_vocab_is_eog(self._vocab, token))
        return eog

    # -- facts ---------------------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        return _meta(self.lib, self._model, key)

    @property
    def architecture(self) -> str:
        return self.meta("general.architecture") or "?"

    def chat_template(self) -> str | None:
        t = self.lib.llama_model_chat_template(self._model, None)
        return t.decode("utf-8", errors="replace") if t else None

    def vocab_info(self) -> VocabInfo:
        lib, v = self.lib, self._vocab
        return VocabInfo(
            type=lib.llama_vocab_type(v),
            n_tokens=self.n_vocab,
            bos=lib.llama_vocab_bos(v),
            eos=lib.llama_vocab_eos(v),
            add_bos=bool(lib.llama_vocab_get_add_bos(v)),
            add_eos=bool(lib.llama_vocab_get_add_eos(v)),
            texts=tuple(lib.llama_vocab_get_text(v, i) or b"" for i in range(self.n_vocab)),
        )

    # -- decoding ------------------------------------------------------------------------------------------
    def eval(self, tokens: Sequence[int], *, logits: str = "last", sample: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> None:
        """Append `tokens` to the sequence. `logits`: "last" (only the final token), "all", or "none".

        Long inputs are decoded in chunks of n_batch, and `progress(done, total)` hears of each; the outputs of the
        final chunk are then available, i indexing its requested outputs: whole rows through `logits(i)`, or, with
        `sample` (see sample_on_backend), what llama.cpp sampled inside its graph through `sampled_token(i)` or
        `candidates(i)`."""
        n, pos0 = len(tokens), len(self.tokens)
        if pos0 + n > self.n_ctx:
            raise DecodeError(f"context full: {pos0} + {n} tokens > n_ctx {self.n_ctx}")
        if n > self.n_batch:  # in chunks of n_batch, outputs from the final one
            for start in range(0, n, self.n_batch):
                chunk = tokens[start : start + self.n_batch]
                self.eval(chunk, logits=logits if start + len(chunk) == n else "none", sample=sample)
                if progress is not None:
                    progress(start + len(chunk), n)
            return
        if not n:
            return
        # one batch: the usual path, kept to a few plain statements (a step's verification runs it)
        if logits != "none" and (sample if self.graph_sampling else None) != self._chain_k:
            self.sample_on_backend(sample if self.graph_sampling else None)
        if n == 1:
            self._b_token[0], self._b_pos[0] = tokens[0], pos0
        else:
            self._b_token[:n] = tokens
            self._b_pos[:n] = range(pos0, pos0 + n)
        if (n, logits) != self._asked:
            self._b_out[:n] = [logits == "all"] * (n - 1) + [logits != "none"]
            self._batch.n_tokens, self._asked = n, (n, logits)
        # what the outputs will be, said before the decode: see below
        self._n_out, self._rows = n if logits == "all" else int(logits == "last"), None
        self.sampled = self._chain_k
        rc = self.lib.llama_decode(self._ctx, self._batch)
        # what runs from here to the next decode finds the CPU's caches cold (the weights went through them):
        # on the usual path it is kept to a few plain statements
        if rc != 0:
            # the failed batch may be partly in the cache: drop it so `tokens` stays the truth
            self._n_out = 0
            self.lib.llama_memory_seq_rm(self._mem, 0, pos0, -1)
            raise DecodeError(f"llama_decode failed (code {rc}) at position {pos0}: {last_log_error()}")
        self.tokens += tokens
        if self.on_decode is not None:
            self.on_decode(tokens, pos0)
        if _STATE["sigint"]:  # a Ctrl-C inside llama_decode's log lines, raised with `tokens` the truth
            raise_pending_interrupt()
        if progress is not None:
            progress(n, n)

    def sample_on_backend(self, top_k: int | None) -> int | None:
        """Have llama.cpp sample inside its graph, where the logits are, so that a decode hands back a few numbers
        per output instead of a whole vocabulary row (1 MiB for Gemma's 262k tokens): `top_k` 0, the argmax's id
        (`sampled_token`); k > 0, the k best ids with their logits (`candidates`); None, whole rows (`logits`).
        A change takes effect at the next decode (llama.cpp then plans its graph anew). Returns what is in
        effect: None where llama.cpp cannot sample on this backend (it then hands back rows)."""
        if top_k == self._chain_k or (top_k is not None and not 0 <= top_k < self.n_vocab):
            return self._chain_k
        lib, old = self.lib, self._chain
        chain = None
        if top_k is not None:
            chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy() if top_k == 0
                                        else lib.llama_sampler_init_top_k(top_k))
        if not lib.llama_set_sampler(self._ctx, 0, chain) and chain is not None:
            lib.llama_sampler_free(chain)  # not offloadable here: llama.cpp keeps handing back rows
            lib.llama_set_sampler(self._ctx, 0, None)
            chain, top_k = None, None
        if old is not None:
            lib.llama_sampler_free(old)
        self._chain, self._chain_k = chain, top_k
        return top_k

    def _row(self, i: int, what: str) -> int:
        """llama.cpp's index of output `i` of the last decode (negative: from the end)."""
        if not -self._n_out <= i < self._n_out:
            raise IndexError(f"no {what} at output {i} (last decode produced {self._n_out})")
        return (i if i < 0 else i - self._n_out)

    def logits(self, i: int = -1) -> np.ndarray:
        """Zero-copy float32 view of the logits of output `i` of the last decoded chunk (valid until the next
        decode)."""
        if self.sampled is not None:
            raise DecodeError("the last decode was sampled inside llama.cpp's graph: it has no logits rows")
        j = self._n_out + self._row(i, "logits")
        if self._rows is None:  # one view of every output's row, kept while llama.cpp keeps its output buffer
            addr = self._logits_address(self._ctx)
            if not addr:
                raise DecodeError(f"llama.cpp returned no logits for output {i}")
            if addr != self._view[0] or self._n_out > len(self._view[1]):
                buf = (ctypes.c_float * (self._n_out * self.n_vocab)).from_address(addr)
                self._view = (addr, np.frombuffer(buf, np.float32).reshape(self._n_out, self.n_vocab))
            self._rows = self._view[1]
        return self._rows[j]

    def sampled_tokens(self) -> list[int]:
        """The tokens llama.cpp's greedy sampler picked inside the graph (sample=0), one per output of the last
        decode."""
        if self.sampled != 0:
            raise DecodeError("the last decode was not sampled greedily inside llama.cpp's graph")
        get, ctx, ids = self._sampled_token_ith, self._ctx_arg, []
        for i in self._out_args[-self._n_out :] if self._n_out else ():  # (a loop: cheaper cold than a comprehension)
            ids.append(get(ctx, i))
        return ids

    def sampled_token(self, i: int = -1) -> int:
        """The token llama.cpp's greedy sampler picked, inside the graph, for output `i` (sample=0)."""
        self._row(i, "sampled token")
        return self.sampled_tokens()[i]

    def candidates(self, i: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """(ids, logits) of the k best tokens of output `i`, as llama.cpp's top-k picked them inside the graph
        (sample=k), as zero-copy views valid until the next decode."""
        if not self.sampled:
            raise DecodeError("the last decode had no top-k sampled inside llama.cpp's graph")
        lib, ctx, r = self.lib, self._ctx, self._row(i, "candidates")
        n = lib.llama_get_sampled_candidates_count_ith(ctx, r)
        ids, z = lib.llama_get_sampled_candidates_ith(ctx, r), lib.llama_get_sampled_logits_ith(ctx, r)
        if not (n and ids and z):
            raise DecodeError(f"llama.cpp returned no candidates for output {i}")
        return np.ctypeslib.as_array(ids, shape=(n,)), np.ctypeslib.as_array(z, shape=(n,))

    def rollback(self, n: int) -> bool:
        """Keep the first `n` tokens of the sequence; False if this model cannot drop a partial sequence."""
        if n >= len(self.tokens):
            return True
        if not self.lib.llama_memory_seq_rm(self._mem, 0, n, -1):
            return False
        del self.tokens[n:]
        self._n_out = 0
        return True

    def reset(self) -> None:
        self.lib.llama_memory_clear(self._mem, True)
        self.tokens.clear()
        self._n_out = 0

    def sync(self, history: Sequence[int], *, logits: str = "last", sample: int | None = None,
             progress: Callable[[int, int], None] | None = None) -> int:
        """Make the cache hold `history` exactly, reusing the longest common prefix; returns how many tokens
        were decoded. Unless `logits` is "none", the final token is decoded again so its logits are there."""
        limit = min(len(self.tokens), len(history) - (logits != "none"))
        if self.tokens[:limit] == list(history[:limit]):
            common = limit  # the usual case: the cache holds a prefix of history
        else:
            common = 0
            while self.tokens[common] == history[common]:
                common += 1
        if not self.rollback(common):
            self.reset()
            common = 0
        self.eval(history[common:], logits=logits, sample=sample, progress=progress)
        return len(history) - common


def _array(pointer, ctype, n: int):
    """A ctypes array of n `ctype` over what `pointer` points to (no copy)."""
    return (ctype * n).from_address(ctypes.addressof(pointer.contents))


def _meta(lib, model, key: str) -> str | None:
    """A GGUF metadata value of a loaded model, as text (None when absent)."""
    buf = ctypes.create_string_buffer(1024)
    n = lib.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    if n < 0:
        return None
    if n >= len(buf):
        buf = ctypes.create_string_buffer(n + 1)
        lib.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", errors="replace")


class MtpContext:
    """The MTP (NextN) head of a target loaded with `load_mtp`, in a context of its own (llama.cpp's
    LLAMA_CONTEXT_TYPE_MTP, as common/speculative.cpp's draft-mtp makes it). Its input at position p is the token
    there with the target's hidden state at p - 1 (llama_get_embeddings_nextn); its output predicts the token at
    p + 1, and its own hidden state feeds its next position while it drafts. `mirror` keeps its cache in step with
    the target's decodes; `step` drafts one token."""

    def __init__(self, target: Model):
        lib = self.lib = target.lib
        if not target.n_nextn:
            raise ModelLoadError(f"{target.path.name} has no MTP heads (NextN layers)")
        self.target, self.n_vocab, self.n_ctx = target, target.n_vocab, target.n_ctx
        self.n_embd = int(lib.llama_model_n_embd(target._model))
        from llama_cpp import llama_cpp_ext

        self._ext = llama_cpp_ext
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = target.n_ctx
        cparams.n_batch = cparams.n_ubatch = target.n_batch
        cparams.n_threads = cparams.n_threads_batch = lib.llama_n_threads(target._ctx)
        cparams.no_perf = True
        cparams.ctx_type = lib.LLAMA_CONTEXT_TYPE_MTP
        cparams.ctx_other = target._ctx
        self._ctx = lib.llama_init_from_model(target._model, cparams)
        if not self._ctx:
            raise ModelLoadError(f"llama.cpp could not make an MTP context for {target.path.name}: "
                                 f"{last_log_error() or 'out of memory?'}")
        other = llama_cpp_ext.llama_get_ctx_other(self._ctx)
        if other and ctypes.cast(other, ctypes.c_void_p).value == ctypes.cast(target._ctx, ctypes.c_void_p).value:
            lib.llama_free(self._ctx)  # Gemma 4's assistants: all heads in one graph over the target's own cache
            raise ModelLoadError(f"{target.path.name}'s MTP heads share the target's cache: not supported yet")
        self._mem = lib.llama_get_memory(self._ctx)
        llama_cpp_ext.llama_set_embeddings_nextn(target._ctx, True, False)  # every row's hidden state
        llama_cpp_ext.llama_set_embeddings_nextn(self._ctx, True, True)  # the output rows' only
        n = self.n_batch = target.n_batch
        self._batch = b = lib.llama_batch_init(n, self.n_embd, 1)  # token ids and hidden states side by side
        self._tokens = (lib.llama_token * n)()
        b.token = self._tokens
        self._b_token = np.ctypeslib.as_array(self._tokens, shape=(n,))
        self._b_pos = np.ctypeslib.as_array(b.pos, shape=(n,))
        self._b_out = np.ctypeslib.as_array(b.logits, shape=(n,))
        self._b_h = np.ctypeslib.as_array(b.embd, shape=(n, self.n_embd))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        for i in range(n):
            b.seq_id[i][0] = 0
        self.h: dict[int, np.ndarray] = {}  # position -> the target's hidden state there (its latest decode)
        self.sampled = None  # rows are read on the host (verify.token_at / dist_at)
        self._last_h = np.zeros(self.n_embd, np.float32)
        target.on_decode = self.mirror  # from now on every target decode reaches the head
        self.covered = 0  # the target's first positions mirrored here without a gap

    def mirror(self, tokens: Sequence[int], pos0: int) -> None:
        """After the target decoded `tokens` from position pos0: the same tokens here, each with the target's
        hidden state at the position before it (the first with the one kept from an earlier decode, zeros at the
        start), and the target's states kept for drafting."""
        n = len(tokens)
        rows = np.ctypeslib.as_array(self._ext.llama_get_embeddings_nextn(self.target._ctx), shape=(n, self.n_embd))
        self.lib.llama_memory_seq_rm(self._mem, 0, pos0, -1)
        self._b_token[:n] = tokens
        self._b_pos[:n] = np.arange(pos0, pos0 + n, dtype=np.int32)
        self._b_out[:n] = 0
        self._b_h[0] = self.h.get(pos0 - 1, self._last_h) if pos0 else 0.0
        self._b_h[1:n] = rows[: n - 1]
        self._decode(n)
        self.h = {pos0 + i: rows[i].copy() for i in range(n)} | {p: v for p, v in self.h.items() if p < pos0}
        self._last_h = self.h[pos0 + n - 1]
        if pos0 <= self.covered:
            self.covered = pos0 + n

    def catch_up(self) -> int:
        """Mirror what the target's cache holds that this head has not seen (a target that decoded before the head
        was there): those tokens are decoded again by the target, whose hidden states are only there right after a
        decode. Returns how many."""
        target = self.target
        start = min(self.covered, len(target.tokens))
        missing = target.tokens[start:]
        if missing:
            target.rollback(start)
            target.eval(missing, logits="none")
        return len(missing)

    def step(self, token: int, pos: int, h: np.ndarray) -> np.ndarray:
        """The head on `token` at `pos` with hidden state `h` (the target's at pos - 1, or this head's own output
        for the token before): its logits row predicts the token at pos + 1; returns the head's hidden state."""
        self.lib.llama_memory_seq_rm(self._mem, 0, pos, -1)
        self._b_token[0], self._b_pos[0], self._b_out[0], self._b_h[0] = token, pos, 1, h
        self._decode(1)
        return np.ctypeslib.as_array(self._ext.llama_get_embeddings_nextn_ith(self._ctx, 0),
                                     shape=(self.n_embd,)).copy()

    def _decode(self, n: int) -> None:
        self._batch.n_tokens = n
        rc = self.lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            raise DecodeError(f"llama_decode failed in the MTP context (code {rc}): {last_log_error()}")

    def logits(self, i: int = -1) -> np.ndarray:
        ptr = self.lib.llama_get_logits_ith(self._ctx, i)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def close(self) -> None:
        if self._batch is not None:
            self._batch.token = ctypes.POINTER(self.lib.llama_token)()  # ours, not llama_batch_init's
            self.lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            self.target.on_decode = None
            self._ext.llama_set_embeddings_nextn(self.target._ctx, False, False) if self.target._ctx else None
            self.lib.llama_free(self._ctx)
            self._ctx = None


class Detokenizer:
    """Turns a stream of tokens into text without ever emitting half a UTF-8 character."""

    def __init__(self, piece):
        self._piece = piece
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, tokens: Iterable[int]) -> str:
        return self._dec.decode(b"".join(self._piece(t) for t in tokens))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)

