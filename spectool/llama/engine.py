"""`Model`: one llama.cpp model, one context (one sequence) and one reusable batch.

A Model remembers which tokens sit in its KV cache (`tokens`), so callers can `sync` to a new token
history: the common prefix is kept, the rest is rolled back and the missing tokens are decoded. A
decode's outputs (outputs.py) are read as zero-copy views that stay valid only until the next
decode: whole logits rows, or what llama.cpp sampled inside its graph. Code that needs more of
llama.cpp than a decode's outputs (the MTP head, drafters/mtp.py) listens to the decodes
(`add_decode_listener`) and builds its own context over the raw handles (`llama_model`,
`llama_context`).
"""

from __future__ import annotations

import copy
import ctypes
import os
from typing import Any, Callable, Sequence

from spectool.llama import native  # noqa: F401, I001 - llama.cpp before numpy (native.py)
import numpy as np  # noqa: E402

from spectool.llama.devices import resolve_gpu_layers
from spectool.llama.memory import (check_kv_fits, context_that_fits, no_context,
                                   ran_out_of_memory, weights_do_not_fit)
# the engine's errors and backend facts, re-exported
from spectool.llama.native import (  # noqa: F401
    DecodeError, DoesNotFit, EngineError, Interrupt, ModelLoadError, avoid_amx, backend_info, bind,
    clear_log, last_log_error, lib as llama_lib, raise_pending_interrupt, set_verbose,
    take_interrupt,
)
from spectool.llama.outputs import IDS, ROWS, Kind, Logits, Output
from spectool.llama.vocab import Facts, VocabInfo, check_gguf_file  # noqa: F401 - VocabInfo too

# (the tokens decoded, the position of the first)
DecodeListener = Callable[[Sequence[int], int], None]


class Model(Facts):
    """One llama.cpp model with one context holding one sequence (seq id 0); what its file says
    (tokenize, pieces, end-of-generation, metadata) comes from Facts (vocab.py)."""
    _owner = True  # of the weights (which close frees): not a Model made `beside` another

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
        n_seq_max: int = 1, kv_unified: bool | None = None, ctx_seqs: int | None = None,
    ):
        """`progress(fraction)` hears how far loading the weights has come (llama.cpp's
        progress_callback). `n_gpu_layers`: a number, `auto` or `all` (resolve_gpu_layers);
        `local_only` keeps the layers off RPC workers (the draft's rule) unless no local GPU exists
        and a number was asked for. `graph_sampling`: whether decodes that ask for it are sampled
        inside llama.cpp's graph (see sample_on_backend); None: where the output layer runs on a GPU
        or a worker, not on the CPU (research/notes/2026-12-02-lab.md, Reading a decode's outputs).
        `load_mtp`: load the NextN (MTP) blocks too, for drafters/mtp.py's MtpContext.
        `n_seq_max`, `kv_unified`: the sequences the context holds (parallel.py); `ctx_seqs`: how
        many -c 0 and the memory check size it for (None: all; a tree's leaves share one's)."""
        self.path = check_gguf_file(path)
        self.lib = llama_lib()
        # close() is safe on a half-built Model: the handles are None until made
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._chain: Any = None
        self._ctx_arg: Any = None
        ngl, usable = resolve_gpu_layers(n_gpu_layers, local_only=local_only)
        check_kv_fits(self.path, n_ctx, ctx_seqs or n_seq_max, usable, ngl)  # (before the load)
        self._model = self._load(ngl, usable, load_mtp, progress)
        lib, model = self.lib, self._model
        self._note_offload(ngl, usable, graph_sampling)
        Facts.__init__(self, lib, model)
        self.n_embd = int(lib.llama_model_n_embd(model))
        self.can_rollback = not (lib.llama_model_is_recurrent(model)
                                 or lib.llama_model_is_hybrid(model))
        self.n_nextn = int(lib.llama_model_n_layer_nextn(model))  # the file's MTP (NextN) heads
        self.n_threads = n_threads or max(1, os.cpu_count() or 1)
        self._ctx = self._make_context(n_ctx, n_batch, flash_attn, n_seq_max, kv_unified,
                                       ctx_seqs or n_seq_max)
        self._mem = lib.llama_get_memory(self._ctx)
        self.n_ctx = lib.llama_n_ctx(self._ctx)
        self.n_batch = lib.llama_n_batch(self._ctx)
        self._make_batch()
        self._init_outputs()

    def _init_outputs(self) -> None:
        """What the KV cache holds and how the outputs of a decode are read."""
        self.n_ctx_seq = self.lib.llama_n_ctx_seq(self._ctx)  # what one sequence may hold
        self.n_seq_max = self.lib.llama_n_seq_max(self._ctx)
        self.tokens: list[int] = []  # what the KV cache holds, position by position
        # what each sequence holds (seqs[0] is `tokens`)
        self.seqs = [self.tokens] + [[] for _ in range(1, self.n_seq_max)]
        self._n_out = 0  # the outputs of the last decode
        # the last decode's logits rows, one view for all (see logits)
        self._rows: np.ndarray | None = None
        # (address, rows) of that view
        self._view: tuple[int, np.ndarray] = (0, np.empty((0, 0), np.float32))
        # the bare address
        self._logits_address = bind("llama_get_logits", ctypes.c_void_p, [ctypes.c_void_p])
        # read right after a decode, with arguments made once (ctypes' converters cost more than the
        # call)
        self._sampled_token_ith = bind("llama_get_sampled_token_ith", ctypes.c_int32, None)
        self._sample = bind("llama_sampler_sample", ctypes.c_int32,
                            [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32])
        self._ctx_arg = ctypes.c_void_p(self._ctx)
        # output -n_batch .. -1
        self._out_args = [ctypes.c_int32(i) for i in range(-self.n_batch, 0)]
        # what the sampler chain in the graph gives (ROWS: no chain; sample_on_backend)
        self._chain_output = ROWS
        self._output_asked: Output | None = None  # the output the last decode asked for (eval)
        self.output = ROWS  # what the last decode's outputs are
        self._listeners: tuple[DecodeListener, ...] = ()

    def _load(self, ngl: int, usable: list, load_mtp: bool,
              progress: Callable[[float], None] | None):
        """llama.cpp's model, its layers offloaded as resolve_gpu_layers said; a Ctrl-C stops
        loading."""
        lib = self.lib
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = ngl
        mparams.load_mtp = load_mtp
        # exactly these devices (NULL-terminated); without a list llama.cpp would use every GPU and
        # worker
        if usable:
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
                # cannot cross llama.cpp's frames: stop loading, raise below
                except KeyboardInterrupt:
                    interrupted.append(True)
                    return False

            callback = lib.llama_progress_callback(on_progress)
            mparams.progress_callback = callback
        clear_log()
        model = lib.llama_model_load_from_file(str(self.path).encode(), mparams)
        if take_interrupt() or interrupted:
            if model:
                lib.llama_model_free(model)
            raise KeyboardInterrupt
        if not model:
            if ngl and usable and ran_out_of_memory():
                raise weights_do_not_fit(self.path, usable, ngl)
            why = last_log_error()
            raise ModelLoadError(
                f"llama.cpp could not load {self.path.name}: "
                f"{why or 'truncated, corrupt or unsupported file'}"
            )
        return model

    def _note_offload(self, ngl: int, usable: list, graph_sampling: bool | None) -> None:
        """Where the weights went (llama.cpp counts the output layer as one more offloadable
        layer)."""
        n_layer = self.lib.llama_model_n_layer(self._model)
        self.n_offloadable = n_layer + 1
        self.n_offloaded = 0 if not usable else (n_layer + 1 if ngl < 0 else min(ngl, n_layer + 1))
        self.offload_devices = list(usable) if self.n_offloaded else []  # none: the CPU
        on_devices = bool(usable) and self.n_offloaded == n_layer + 1
        self._graph_sampling = on_devices if graph_sampling is None else graph_sampling

    def _make_context(self, n_ctx: int, n_batch: int, flash_attn: bool | None, n_seq_max: int,
                      kv_unified: bool | None, ctx_seqs: int):
        lib = self.lib
        cparams = lib.llama_context_default_params()
        n_ctx = n_ctx if n_ctx > 0 else context_that_fits(lib, self._model, self.offload_devices,
                                                          ctx_seqs)
        cparams.n_ctx, cparams.n_seq_max = n_ctx, n_seq_max
        if kv_unified is not None:
            cparams.kv_unified = kv_unified
        cparams.n_batch = cparams.n_ubatch = min(n_batch, n_ctx)
        # sampling in the graph for every row of a verification
        cparams.n_outputs_max_per_seq = cparams.n_batch
        cparams.n_threads = cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        # None: llama.cpp decides (on for CPU); its kernel sums in batch-dependent order
        self.flash_attn = flash_attn  # as asked (spectool/attention.py)
        if flash_attn is not None:
            cparams.flash_attn_type = int(flash_attn)
        cparams.swa_full = True  # rollback inside the sliding window needs the full-size SWA cache
        clear_log()  # what the context's creation logs, for no_context
        ctx = lib.llama_init_from_model(self._model, cparams)
        if ctx and take_interrupt():
            lib.llama_free(ctx)
            self.close()
            raise KeyboardInterrupt
        if not ctx:
            self.close()
            raise no_context(self.path, n_ctx, self.offload_devices)
        return ctx

    def _make_batch(self) -> None:
        """The batch every decode reuses, with ctypes arrays over its fields for slice stores
        (_write_batch). Every token belongs to sequence 0, written once here (room for a token in
        every sequence: a draft tree's, parallel.py)."""
        n = self.n_batch
        self._batch = b = self.lib.llama_batch_init(n, 0, self.lib.llama_n_seq_max(self._ctx))
        self._b_token = _array(b.token, ctypes.c_int32, n)
        self._b_pos = _array(b.pos, ctypes.c_int32, n)
        self._b_out = _array(b.logits, ctypes.c_int8, n)
        self._asked: tuple = ()  # (size, logits) the batch's output flags were written for
        np.ctypeslib.as_array(b.n_seq_id, shape=(n,))[:] = 1
        for i in range(n):
            b.seq_id[i][0] = 0

    # -- lifetime ------------------------------------------------------------------------------
    def offload(self) -> dict:
        """Where the weights went, for the live panel, --stats-json and the cost tables' names: the
        backend (the devices, or CPU), the devices, how many of the offloadable layers went there,
        and flash attention as asked (None: llama.cpp's choice; a batch's price depends on it)."""
        devices = self.offload_devices
        return {"backend": ", ".join(d.name for d in devices) if devices else "CPU",
                "devices": [f"{d.name} ({d.description})" for d in devices],
                "layers": self.n_offloaded, "of": self.n_offloadable, "flash_attn": self.flash_attn}

    def close(self) -> None:
        lib = self.lib
        if self._batch is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            lib.llama_free(self._ctx)
            self._ctx = self._ctx_arg = None
            self._n_out, self.output = 0, ROWS  # nothing to read any more
        if self._chain is not None:  # after the context that ran it
            lib.llama_sampler_free(self._chain)
            self._chain = None
        if self._model and self._owner:  # (a Model beside this one's weights leaves them)
            lib.llama_model_free(self._model)
        self._model = None

    @property
    def closed(self) -> bool:
        """Whether close() has freed the model, its context and its batch."""
        return self._model is None and self._ctx is None and self._batch is None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):  # a safety net; callers should use `with` or close()
        try:
            self.close()
        except Exception:
            pass

    # -- for code that builds on this model (drafters/mtp.py, attention.py) ---------------------
    @property
    def llama_model(self):
        """llama.cpp's `llama_model *`, for a context of one's own over the same weights."""
        return self._model

    @property
    def llama_context(self):
        """llama.cpp's `llama_context *` (valid until close), for a context that reads from it."""
        return self._ctx

    def beside(self, flash_attn: bool | None) -> "Model":
        """A second Model on these weights (nothing loaded again), its own context as large, flash
        attention as asked: two kernels timed side by side (attention.py). Close it first."""
        other = copy.copy(self)
        other._owner, other._ctx, other._chain, other._batch = False, None, None, None  # (its own)
        other._ctx = other._make_context(self.n_ctx, self.n_batch, flash_attn, 1, None, 1)
        other._mem = self.lib.llama_get_memory(other._ctx)
        other._make_batch()
        other._init_outputs()
        return other

    def add_decode_listener(self, listener: DecodeListener) -> None:
        """Have `listener(tokens, pos0)` hear of every successful decode, right after it, while what
        the decode left in the context (outputs, hidden states) is there."""
        self._listeners += (listener,)

    def remove_decode_listener(self, listener: DecodeListener) -> None:
        self._listeners = tuple(f for f in self._listeners if f != listener)

    @property
    def listened(self) -> bool:
        """Whether anything follows its decodes (a head's context: add_decode_listener)."""
        return bool(self._listeners)

    # -- decoding ------------------------------------------------------------------------------
    @property
    def graph_sampling(self) -> bool:
        """Whether decodes that ask for ids or top-k candidates have llama.cpp sample them inside
        its graph; when not, every decode hands back rows."""
        return self._graph_sampling

    @graph_sampling.setter
    def graph_sampling(self, on: bool) -> None:
        self._graph_sampling, self._output_asked = on, None  # the next decode sets the chain anew

    def eval(self, tokens: Sequence[int], *, logits: Logits = "last", output: Output = ROWS,
             progress: Callable[[int, int], None] | None = None) -> None:
        """Append `tokens` to the sequence. `logits`: the outputs wanted, of the final token only,
        of all, or none.

        Long inputs are decoded in chunks of n_batch, and `progress(done, total)` hears of each; the
        outputs of the final chunk are then available, i indexing its requested outputs. What they
        are is `output`, where llama.cpp can sample inside its graph (sample_on_backend;
        `self.output` says what came): whole rows through `logits(i)`, the argmax's ids through
        `sampled_tokens()`, the top-k through `candidates(i)`."""
        n, pos0 = len(tokens), len(self.tokens)
        if pos0 + n > self.n_ctx:
            raise DecodeError(f"context full: {pos0} + {n} tokens > n_ctx {self.n_ctx}")
        if n > self.n_batch:
            self._eval_in_chunks(tokens, logits, output, progress)
            return
        if not n:
            return
        # one batch: a step's verification, so kept to a few plain statements
        if logits != "none" and output is not self._output_asked:
            self._output_asked = output
            self.sample_on_backend(output if self._graph_sampling else ROWS)
        if n == 1:  # tokens and positions: slice stores into ctypes arrays over the batch's fields
            self._b_token[0], self._b_pos[0] = tokens[0], pos0
        else:
            self._b_token[:n] = tokens
            self._b_pos[:n] = range(pos0, pos0 + n)
        # the output flags, written only when the batch's shape changes
        if (n, logits) != self._asked:
            self._b_out[:n] = [logits == "all"] * (n - 1) + [logits != "none"]
            self._batch.n_tokens, self._asked = n, (n, logits)
        # what the decode will hand back, said before it: after it, the CPU's caches are cold
        # (research/notes/2026-12-02-lab.md)
        self._n_out, self._rows = n if logits == "all" else int(logits == "last"), None
        self.output = self._chain_output
        rc = self.lib.llama_decode(self._ctx, self._batch)
        if rc != 0:
            # the failed batch may be partly in the cache: drop it so `tokens` stays the truth
            self._n_out = 0
            self.lib.llama_memory_seq_rm(self._mem, 0, pos0, -1)
            raise DecodeError(f"llama_decode failed (code {rc}) at position {pos0}: "
                              f"{last_log_error()}")
        self.tokens += tokens
        for listener in self._listeners:
            listener(tokens, pos0)
        # a Ctrl-C inside llama_decode's log lines, raised with `tokens` the truth
        if Interrupt.pending:
            raise_pending_interrupt()
        if progress is not None:
            progress(n, n)

    def _eval_in_chunks(self, tokens: Sequence[int], logits: Logits, output: Output,
                        progress: Callable[[int, int], None] | None) -> None:
        n = len(tokens)
        for start in range(0, n, self.n_batch):
            chunk = tokens[start : start + self.n_batch]
            self.eval(chunk, logits=logits if start + len(chunk) == n else "none", output=output)
            if progress is not None:
                progress(start + len(chunk), n)

    def sample_on_backend(self, output: Output) -> Output:
        """Have llama.cpp sample inside its graph, where the logits are, so that a decode hands back
        a few numbers per output instead of a whole vocabulary row: IDS, the argmax's id
        (`sampled_tokens`); top-k, the k best ids with their logits (`candidates`); ROWS, whole rows
        (`logits`). A change takes effect at the next decode (llama.cpp then plans its graph anew).
        Returns what is in effect: ROWS where llama.cpp cannot sample on this backend (it then hands
        back rows), the old output for a k past the vocabulary."""
        if output == self._chain_output or (output.kind is Kind.TOP_K and output.k >= self.n_vocab):
            return self._chain_output
        output = output.canonical()
        lib, old = self.lib, self._chain
        chain = None
        if output.kind is not Kind.ROWS:
            chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy()
                                        if output.kind is Kind.IDS
                                        else lib.llama_sampler_init_top_k(output.k))
        if not lib.llama_set_sampler(self._ctx, 0, chain) and chain is not None:
            lib.llama_sampler_free(chain)  # not offloadable here: llama.cpp keeps handing back rows
            lib.llama_set_sampler(self._ctx, 0, None)
            chain, output = None, ROWS
        if old is not None:
            lib.llama_sampler_free(old)
        self._chain, self._chain_output = chain, output
        return output

    def _row(self, i: int, what: str) -> int:
        """llama.cpp's index of output `i` of the last decode (negative: from the end)."""
        if not -self._n_out <= i < self._n_out:
            raise IndexError(f"no {what} at output {i} (last decode produced {self._n_out})")
        return (i if i < 0 else i - self._n_out)

    def logits(self, i: int = -1) -> np.ndarray:
        """Zero-copy float32 view of the logits of output `i` of the last decoded chunk (valid until
        the next decode)."""
        if self.output is not ROWS:
            raise DecodeError("the last decode was sampled inside llama.cpp's graph: it has no "
                              "logits rows")
        j = self._n_out + self._row(i, "logits")
        # one view of every output's row, kept while llama.cpp keeps its output buffer
        if self._rows is None:
            addr = self._logits_address(self._ctx)
            if not addr:
                raise DecodeError(f"llama.cpp returned no logits for output {i}")
            if addr != self._view[0] or self._n_out > len(self._view[1]):
                buf = (ctypes.c_float * (self._n_out * self.n_vocab)).from_address(addr)
                self._view = (addr,
                              np.frombuffer(buf, np.float32).reshape(self._n_out, self.n_vocab))
            self._rows = self._view[1]
        return self._rows[j]

    def draw(self, chain, i: int = -1) -> int:
        """The token llama.cpp's sampler `chain` (generate/sampler.py) draws from output i's row of
        the last decode, on the host as llama.cpp's tools draw (whole rows only)."""
        if self.output is not ROWS:
            raise DecodeError("the last decode was sampled in llama.cpp's graph: no row to draw")
        return self._sample(chain, self._ctx_arg, self._row(i, "row"))

    def sampled_tokens(self) -> list[int]:
        """The tokens llama.cpp's greedy sampler picked inside the graph (output IDS), one per
        output of the last decode."""
        if self.output is not IDS:
            raise DecodeError("the last decode was not sampled greedily inside llama.cpp's graph")
        get, ctx, ids = self._sampled_token_ith, self._ctx_arg, []
        # a loop, not a comprehension (research/notes/2026-12-02-lab.md)
        for i in self._out_args[self.n_batch - self._n_out :]:
            ids.append(get(ctx, i))
        return ids

    def sampled_token(self, i: int = -1) -> int:
        """The token llama.cpp's greedy sampler picked inside the graph for output `i` (IDS)."""
        self._row(i, "sampled token")
        return self.sampled_tokens()[i]

    def candidates(self, i: int = -1) -> tuple[np.ndarray, np.ndarray]:
        """(ids, logits) of the k best tokens of output `i`, as llama.cpp's top-k picked them inside
        the graph (a top-k output), as zero-copy views valid until the next decode."""
        if self.output.kind is not Kind.TOP_K:
            raise DecodeError("the last decode had no top-k sampled inside llama.cpp's graph")
        lib, ctx, r = self.lib, self._ctx, self._row(i, "candidates")
        n = lib.llama_get_sampled_candidates_count_ith(ctx, r)
        ids = lib.llama_get_sampled_candidates_ith(ctx, r)
        z = lib.llama_get_sampled_logits_ith(ctx, r)
        if not (n and ids and z):
            raise DecodeError(f"llama.cpp returned no candidates for output {i}")
        return np.ctypeslib.as_array(ids, shape=(n,)), np.ctypeslib.as_array(z, shape=(n,))

    def rollback(self, n: int, seq: int = 0) -> bool:
        """Keep the first `n` tokens of sequence `seq`; False if it cannot drop a partial one."""
        held = self.seqs[seq]
        if n >= len(held):
            return True
        if not self.lib.llama_memory_seq_rm(self._mem, seq, n, -1):
            return False
        del held[n:]
        self._n_out = 0
        return True

    def reset(self) -> None:
        """Every sequence emptied."""
        self.lib.llama_memory_clear(self._mem, True)
        for held in self.seqs:
            held.clear()
        self._n_out = 0

    def sync(self, history: Sequence[int], *, logits: Logits = "last", output: Output = ROWS,
             progress: Callable[[int, int], None] | None = None) -> int:
        """Make the cache hold `history` exactly, reusing the longest common prefix; returns how
        many tokens were decoded. Unless `logits` is "none", the final token is decoded again so its
        outputs are there."""
        common = shared_prefix(self.tokens, history[: len(history) - (logits != "none")])
        if not self.rollback(common):
            self.reset()
            common = 0
        self.eval(history[common:], logits=logits, output=output, progress=progress)
        return len(history) - common


def shared_prefix(held: Sequence[int], prompt: Sequence[int]) -> int:
    """How many first tokens `held` (a sequence's cache) and `prompt` share."""
    n = min(len(held), len(prompt))
    if list(held[:n]) == list(prompt[:n]):
        return n  # the usual case: one holds a prefix of the other
    i = 0
    while held[i] == prompt[i]:
        i += 1
    return i


def _array(pointer, ctype, n: int):
    """A ctypes array of n `ctype` over what `pointer` points to (no copy)."""
    return (ctype * n).from_address(ctypes.addressof(pointer.contents))
