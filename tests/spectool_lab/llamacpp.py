"""llama.cpp's own C++ tools as contenders: `llama-lookup` (its n-gram cache drafting), `llama-speculative-simple`
with its self-speculative n-gram drafters (`--spec-type ngram-simple | ngram-map-k | ngram-mod`),
`llama-completion` (plain decoding) and `llama-server` (Server: its /completion, for benchmarks/structured.py),
built once from the llama.cpp sources vendored in the llama-cpp-python sdist that spectool runs on, so both tools
run the same llama.cpp.

    python -m spectool_lab.llamacpp          # build (345 s on 2 cores, once; cached) and print the binaries

The build goes to ~/.cache/spectool-bench/llama.cpp-<version>/ (SPECTOOL_BENCH_CACHE moves it): the sdist is
fetched with pip, configured as a native Release build (as pip builds llama-cpp-python), and only these targets
are compiled (llama-server only when asked for: `build(targets=SERVER)`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from spectool.options import CTX_SIZE  # the context spectool runs at, for like-for-like runs

CACHE = Path(os.environ.get("SPECTOOL_BENCH_CACHE", Path.home() / ".cache" / "spectool-bench"))
TARGETS = ("llama-lookup", "llama-completion", "llama-speculative-simple")
SERVER = ("llama-server",)  # built only when asked for (benchmarks/structured.py), so TARGETS' build stays as it was


def llama_cpp_version() -> str:
    from importlib.metadata import version

    return version("llama-cpp-python")


def build(version: str | None = None, quiet: bool = False, targets: tuple[str, ...] = TARGETS) -> dict[str, Path]:
    """Paths of the built tools, building them first when the cache lacks them."""
    version = version or llama_cpp_version()
    root = CACHE / f"llama.cpp-{version}"
    bins = {t: root / "build" / "bin" / t for t in targets}
    if all(b.exists() for b in bins.values()):
        return bins
    src = root / "src"
    if not (src / "CMakeLists.txt").exists():
        with tempfile.TemporaryDirectory() as tmp:
            print(f"fetching the llama-cpp-python {version} sdist", file=sys.stderr, flush=True)
            # the sdist of llama-cpp-python alone: with --no-binary :all: pip would also build its build requirements
            # (CMake itself among them) from source to read the sdist's metadata
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-binary", "llama-cpp-python", "--no-deps",
                            "-d", tmp, f"llama-cpp-python=={version}"], check=True)
            (sdist,) = Path(tmp).glob("llama_cpp_python-*.tar.gz")
            with tarfile.open(sdist) as tar:
                tar.extractall(tmp, filter="data")
            vendored = next(Path(tmp).glob("llama_cpp_python-*/vendor/llama.cpp"))
            root.mkdir(parents=True, exist_ok=True)
            if src.exists():
                subprocess.run(["rm", "-rf", str(src)], check=True)
            vendored.rename(src)
    out = None if not quiet else subprocess.DEVNULL
    print(f"building {', '.join(targets)} from {src} (a few minutes, once)", file=sys.stderr, flush=True)
    # the server's targets exist only when configured in; its web UI is left out (no npm, no download)
    server = "ON" if "llama-server" in targets else "OFF"
    subprocess.run(["cmake", "-S", str(src), "-B", str(root / "build"), "-DCMAKE_BUILD_TYPE=Release",
                    "-DLLAMA_BUILD_TESTS=OFF", f"-DLLAMA_BUILD_SERVER={server}", "-DLLAMA_BUILD_UI=OFF",
                    "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_CURL=OFF",
                    "-DBUILD_SHARED_LIBS=OFF"], check=True, stdout=out)
    subprocess.run(["cmake", "--build", str(root / "build"), "--config", "Release", "-j", str(os.cpu_count() or 2),
                    "--target", *targets], check=True, stdout=out)
    return bins


@dataclass
class Run:
    text: str  # the generated text
    tokens: int  # new tokens counted in `seconds`
    seconds: float  # decode time, as the tool measures it (prompt processing excluded)
    drafted: int = 0
    accepted: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _repacked(repack: bool | None) -> list[str]:
    """`--no-repack` where the weights are not to be repacked: `repack` None loads them as spectool does, repacked
    unless llama.cpp is kept off AMX (native.avoid_amx: on such a machine the tools die repacking a quantized model,
    SIGSEGV after "threadpool init")."""
    from spectool.llama.native import avoid_amx

    return [] if (not avoid_amx() if repack is None else repack) else ["--no-repack"]


def _common(model: Path, prompt_file: Path, tokens: int, threads: int, ctx: int, repack: bool | None,
            gpu: bool = False, temp: float = 0.0, seed: int = 0, flash_attn: bool | None = None) -> list[str]:
    """The flags every tool gets: greedy (or sampled at `temp` by llama.cpp's default chain, seeded), the same
    context and threads, the weights' layout (_repacked); every layer on the GPU with `gpu`; flash attention on or
    off as `flash_attn` says (None: llama.cpp's default, -fa auto)."""
    args = ["-m", str(model), "-f", str(prompt_file), "-n", str(tokens), "-t", str(threads), "-c", str(ctx),
            "--temp", f"{temp:g}", "--seed", str(seed), "-ngl", "99" if gpu else "0"]
    return args + _repacked(repack) + ([] if flash_attn is None else ["-fa", "on" if flash_attn else "off"])


def _prompt_file(directory: str, prompt: str) -> Path:
    """llama.cpp's `-f` drops one trailing newline from the file: write one more, so it reads `prompt` as is."""
    path = Path(directory) / "prompt.txt"
    path.write_text(prompt + "\n" if prompt.endswith("\n") else prompt)
    return path


def lookup(binary: Path, model: Path, prompt: str, tokens: int, n_draft: int = 8, threads: int = 2,
           ctx: int = CTX_SIZE, repack: bool | None = None, first_decode: float = 0.0, gpu: bool = False,
           dynamic: Path | None = None, temp: float = 0.0, seed: int = 0, echo: str = "",
           flash_attn: bool | None = None) -> Run:
    """`llama-lookup`, greedy, drafting at most `n_draft` tokens from its n-gram caches, asked for `tokens` new
    tokens and timed as spectool is (see parse_lookup; `first_decode`: the seconds of one single-token decode at
    this prompt, such as llama-completion's eval time per token). Its `-n` counts the first token and it stops after
    the step that takes that count past `-n`: `-n tokens-1` ends with the step that brings token `tokens`.
    `dynamic`: its dynamic n-gram cache file (-lcd), read and written back, kept across runs (agentic.py). `temp`,
    `seed`: see _common; `echo`: see _generated."""
    with tempfile.TemporaryDirectory() as tmp:
        # by default the dynamic cache file (-lcd) stays empty per run: only the prompt and the output are drafted from
        args = [str(binary), *_common(model, _prompt_file(tmp, prompt), tokens - 1, threads, ctx, repack, gpu,
                                      temp, seed, flash_attn),
                "--spec-draft-n-max", str(n_draft), "-lcd", str(dynamic or Path(tmp) / "dynamic.bin")]
        p = _run("llama-lookup", args)
    return parse_lookup(_generated(p.stdout, prompt, echo), p.stdout + p.stderr, tokens, first_decode)


def parse_lookup(text: str, log: str, asked: int | None = None, first_decode: float = 0.0) -> Run:
    """llama-lookup's report (examples/lookup/lookup.cpp): `decoded N tokens in T seconds`, n_drafted, n_accept.

    spectool's decoding is timed from the end of the prompt's first n-1 tokens until the `asked` new tokens are
    out: its first step decodes the last prompt token with the first draft. llama-lookup decodes the last prompt
    token before its clock starts and samples its first token from it, then counts that token in N; its last step
    may run past `asked` (N is about 100 for 96 asked). Read alike: the `asked` tokens (N when fewer: the text
    ended) in T plus `first_decode`, the time of the decode T leaves out."""
    m = re.search(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds", log)
    drafted = int(re.search(r"n_drafted\s*=\s*(\d+)", log).group(1))
    accepted = int(re.search(r"n_accept\s*=\s*(\d+)", log).group(1))
    n = int(m.group(1))
    return Run(text, n if asked is None else min(n, asked), float(m.group(2)) + first_decode, drafted, accepted)


# llama.cpp's self-speculative n-gram drafters, sized for prompts of a few hundred tokens (their defaults, such as
# ngram-simple's 12-token lookup and ngram-mod's 24-token match, are made for long contexts and rarely fire here)
NGRAM = {
    "ngram-simple": ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "8"],
    "ngram-map-k": ["--spec-ngram-map-k-size-n", "3", "--spec-ngram-map-k-size-m", "8"],
    "ngram-mod": ["--spec-ngram-mod-n-match", "4", "--spec-ngram-mod-n-min", "1", "--spec-ngram-mod-n-max", "16"],
}


def speculative_ngram(binary: Path, model: Path, prompt: str, tokens: int, kind: str, threads: int = 2,
                      ctx: int = CTX_SIZE, repack: bool | None = None, gpu: bool = False,
                      sizes: list[str] | None = None, temp: float = 0.0, seed: int = 0, echo: str = "",
                      flash_attn: bool | None = None) -> Run:
    """`llama-speculative-simple --spec-type KIND` (examples/speculative-simple): drafts from the text so far, no
    draft model. Its clock starts, as spectool's does, after the prompt's first n-1 tokens (the last one is decoded
    with the first draft), and it counts every token it makes: with `-n tokens-1` it makes `tokens` (it stops
    once its count passes -n), read as parse_lookup reads llama-lookup. `sizes`: its size flags (NGRAM's by
    default; [] for llama.cpp's defaults)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [str(binary), *_common(model, _prompt_file(tmp, prompt), tokens - 1, threads, ctx, repack, gpu,
                                      temp, seed, flash_attn),
                "--spec-type", kind, *(NGRAM[kind] if sizes is None else sizes)]
        p = _run(f"llama-speculative-simple --spec-type {kind}", args)
    return parse_lookup(_generated(p.stdout, prompt, echo), p.stdout + p.stderr, tokens)


def completion(binary: Path, model: Path, prompt: str, tokens: int, threads: int = 2, ctx: int = CTX_SIZE,
               repack: bool | None = None, gpu: bool = False, temp: float = 0.0, seed: int = 0, echo: str = "",
               flash_attn: bool | None = None) -> Run:
    """`llama-completion`, greedy plain decoding; its decode time is the "eval time" of llama.cpp's perf report,
    with the sampling that goes with it (parse_completion)."""
    with tempfile.TemporaryDirectory() as tmp:
        args = [str(binary), *_common(model, _prompt_file(tmp, prompt), tokens, threads, ctx, repack, gpu, temp,
                                      seed, flash_attn), "-no-cnv", "--simple-io"]
        p = _run("llama-completion", args)
    return parse_completion(_generated(p.stdout, prompt, echo), p.stderr)


def parse_completion(text: str, log: str) -> Run:
    """The `eval time = T ms / N runs` line of llama.cpp's perf report (the one after `prompt eval time`): N
    single-token decodes, the first generated token coming from prompt processing; plus their share of the
    `sampling time` line (choosing each token: its sampler chain over the whole vocabulary) and of the
    `unaccounted time` line (the rest of its loop: each token's text made and written out), which the eval time
    leaves out and every other contender's clock holds (spectool's, llama-lookup's `decoded N tokens in T s`).
    (The unaccounted time also holds the prompt's tokenization, well under a millisecond beside a second of
    decoding.)"""
    m = re.search(r"eval time =\s*([\d.]+) ms /\s*(\d+) runs", log.split("prompt eval time")[-1])
    n, seconds = int(m.group(2)), float(m.group(1)) / 1000
    # common_perf_print's `sampling time = S ms` and `unaccounted time = U ms` (total less sampling, prompt eval and
    # eval): every token sampled and written out, the first one (after the prompt) too
    for line in ("sampling", "unaccounted"):
        s = re.search(line + r" time =\s*([\d.]+) ms", log)
        if s:
            seconds += float(s.group(1)) / 1000 * n / (n + 1)
    return Run(text, n, seconds)


def counted(tokens: int, ended: bool) -> int:
    """spectool's new tokens counted as llama.cpp's drafters count theirs: their `decoded N tokens` counts the
    end-of-generation token (examples/lookup/lookup.cpp and speculative-simple.cpp add it to n_predict before they
    stop on it), which took a decode like any other; llama-completion's eval runs are one decode a token alike, its
    first token coming from the prompt. So a spectool generation that `ended` on one counts it too: one that ends
    after 12 tokens spent 13 decodes, and read as 12 it would be 8% slow."""
    return tokens + int(ended)


def _run(tool: str, args: list[str]) -> subprocess.CompletedProcess[str]:
    """One of llama.cpp's tools run to its end, its output read as text. The tools write each token's bytes as it
    comes, so a text cut at the token budget can end inside a character (a sampled SmolLM2 chat, 2026-12-07): bytes
    that are no UTF-8 read as U+FFFD, where they would have stopped the benchmark. A tool that fails raises, naming
    `tool`."""
    p = subprocess.run(args, capture_output=True, text=True, errors="replace", stdin=subprocess.DEVNULL)
    if p.returncode:
        raise RuntimeError(f"{tool} failed ({p.returncode}): {p.stderr[-500:]}")
    return p


def _generated(stdout: str, prompt: str, echo: str = "") -> str:
    """The generated text: the tools echo the prompt first, some with its special tokens written out, some without
    (`echo`: the prompt as it reads without them, such as a chat template's turns). A character cut at its end (see
    _run) is left out, so that the text compares with another up to where both go."""
    for shown in (prompt, echo):
        i = stdout.find(shown) if shown else -1
        if i >= 0:
            return stdout[i + len(shown):].rstrip("\ufffd")
    return stdout.rstrip("\ufffd")


# the n-gram drafters llama-server has (`--spec-type`), sized as NGRAM sizes llama-speculative-simple's; ngram-cache
# (llama-lookup's caches inside the server) takes no sizes
SERVER_NGRAM = {**NGRAM, "ngram-map-k4v": ["--spec-ngram-map-k4v-size-n", "3", "--spec-ngram-map-k4v-size-m", "8"],
                "ngram-cache": []}


class Server:
    """A `llama-server` on a free local port, asked for greedy completions of token ids on /completion
    (tools/server/README.md). `extra`: more server flags, such as `--spec-type ngram-simple` and its sizes."""

    def __init__(self, binary: Path, model: Path, threads: int = 2, ctx: int = CTX_SIZE, repack: bool | None = None,
                 gpu: bool = False, extra: tuple[str, ...] | list[str] = (), ready_s: float = 180.0):
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.log = tempfile.TemporaryFile()
        args = [str(binary), "-m", str(model), "-t", str(threads), "-c", str(ctx), "-ngl", "99" if gpu else "0",
                "--host", "127.0.0.1", "--port", str(self.port), "--parallel", "1", "--no-webui", *extra]
        self.proc = subprocess.Popen(args + _repacked(repack), stdin=subprocess.DEVNULL,
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + ready_s
        while not self._healthy():  # /health answers 503 while the model loads
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"llama-server {' '.join(extra)} did not start: {self.tail()}")
            time.sleep(0.2)

    def _healthy(self) -> bool:
        import urllib.error
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def tail(self, n: int = 500) -> str:
        self.log.seek(0)
        return self.log.read().decode("utf-8", "replace")[-n:]

    def complete(self, prompt: list[int], tokens: int, json_schema: dict | None = None) -> Run:
        """Greedy completion of `prompt` (token ids: the server adds no BOS to them), at most `tokens` new ones,
        constrained to `json_schema`. Timed as llama-server times it (`timings`): predicted_ms runs from the end
        of prompt processing, whose last batch gives the first token, to the last token, so it covers
        predicted_n - 1 tokens (its predicted_per_second); no prompt cache, so every prompt is processed whole."""
        import json
        import urllib.error
        import urllib.request

        body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "seed": 0, "cache_prompt": False}
        if json_schema is not None:
            body["json_schema"] = json_schema
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}/completion", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=600) as r:
                out = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"llama-server answered {e.code}: {e.read()[:300].decode('utf-8', 'replace')}") from None
        except (urllib.error.URLError, OSError) as e:
            raise RuntimeError(f"llama-server failed ({e}): {self.tail()}") from None
        t = out["timings"]
        return Run(out["content"], max(0, t["predicted_n"] - 1), t["predicted_ms"] / 1000, t.get("draft_n", 0),
                   t.get("draft_n_accepted", 0))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self.log.close()


if __name__ == "__main__":
    for name, path in build().items():
        print(name, path)


@dataclass
class MtpStep:
    draft: list[int]  # the tokens the MTP head proposed
    accepted: int  # how many of them the target accepted
    last: int  # the target's own token after them: the step's output is draft[:accepted] + [last]


def draft_mtp(binary: Path, model: Path, prompt: str, tokens: int, n_draft: int = 3, threads: int = 2,
              ctx: int = 512) -> list[MtpStep]:
    """`llama-speculative-simple --spec-type draft-mtp` (common/speculative.cpp), greedy, step by step: each
    draft's tokens (its debug log's "draft candidate 0" at each draft position, the head's top token) and how many
    were accepted ("accepted A/B draft tokens")."""
    return _draft_steps(binary, model, prompt, tokens, ["--spec-type", "draft-mtp"], n_draft, threads, ctx)


def draft_eagle3(binary: Path, model: Path, head: Path, prompt: str, tokens: int, n_draft: int = 3,
                 threads: int = 2, ctx: int = 512) -> list[MtpStep]:
    """`llama-speculative-simple -md HEAD --spec-type draft-eagle3`, greedy, step by step, as draft_mtp reads it."""
    return _draft_steps(binary, model, prompt, tokens, ["-md", str(head), "--spec-type", "draft-eagle3"], n_draft,
                        threads, ctx)


def draft_dflash(binary: Path, model: Path, head: Path, prompt: str, tokens: int, n_draft: int = 3,
                 threads: int = 2, ctx: int = 512, p_min: float = 0.0) -> list[MtpStep]:
    """`llama-speculative-simple -md HEAD --spec-type draft-dflash`, greedy, step by step, as draft_mtp reads it (its
    log names each block position's top token, "draft candidate 0", before the `p_min` stop; a step's draft is cut
    to what it drafted, "accepted A/B")."""
    return _draft_steps(binary, model, prompt, tokens, ["-md", str(head), "--spec-type", "draft-dflash",
                                                        "--spec-draft-p-min", f"{p_min:g}"], n_draft, threads, ctx)


def _draft_steps(binary: Path, model: Path, prompt: str, tokens: int, spec: list[str], n_draft: int, threads: int,
                 ctx: int) -> list[MtpStep]:
    """The steps of a run whose log holds all `tokens`: on a busy machine llama.cpp's log thread can lose the last
    lines of a run at exit (seen with 2 busy cores: 25 of 36 steps, where the whole log had 36), so a log that
    ends short is read again from another run (five at most)."""
    for _ in range(5):
        steps = _draft_run(binary, model, prompt, tokens, spec, n_draft, threads, ctx)
        if sum(s.accepted + 1 for s in steps) >= tokens:
            break
    return steps


def _draft_run(binary: Path, model: Path, prompt: str, tokens: int, spec: list[str], n_draft: int, threads: int,
               ctx: int) -> list[MtpStep]:
    with tempfile.TemporaryDirectory() as tmp:
        args = [str(binary), *_common(model, _prompt_file(tmp, prompt), tokens, threads, ctx, None), *spec,
                "--spec-draft-n-max", str(n_draft), "-lv", "5"]
        p = subprocess.run(args, capture_output=True)
    if p.returncode != 0:
        raise RuntimeError(f"llama-speculative-simple {' '.join(spec)} failed ({p.returncode}): "
                           f"{p.stderr[-500:].decode(errors='replace')}")
    steps, draft = [], []
    for line in p.stderr.decode("utf-8", errors="replace").splitlines():
        m = re.search(r"draft candidate +0, pos +(\d+): +(\d+)", line)
        if m:
            draft = [] if int(m.group(1)) == 0 else draft
            draft.append(int(m.group(2)))
            continue
        m = re.search(r"accepted (\d+)/(\d+) draft tokens, the last target token is: \((\d+)\)", line)
        if m:  # a draft past the token budget is cut to it after the head drafted it (common_speculative_draft)
            steps.append(MtpStep(draft[: int(m.group(2))], int(m.group(1)), int(m.group(3))))
            draft = []
    return steps
