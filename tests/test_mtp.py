"""Models with MTP (NextN) heads: a generated tiny glm4moe model with one NextN block, in the real llama.cpp."""

from helpers import spectool


def test_check_reports_a_models_mtp_heads(mtp_path, tiny):
    """`spectool check MODEL` says what a file is, MTP heads included (llama_model_n_layer_nextn); with a draft it
    still says whether the draft can draft for the target."""
    r = spectool("check", mtp_path)
    assert r.returncode == 0 and "1 MTP head (NextN layers)" in r.stdout, r.stderr
    r = spectool("check", tiny["target"], tiny["draft"])
    assert r.returncode == 0 and r.stdout.count("no MTP heads") == 2 and "compatible" in r.stdout


def test_the_trunk_of_an_mtp_model_decodes_as_any_model(mtp_path):
    """The NextN block is not part of the trunk: loaded without it, the model has its trunk's layers and greedy
    speculation over it (prompt lookup) gives plain decoding's text."""
    from helpers import tokens_of

    from spectool.controller import Controller
    from spectool.drafters import PromptLookup
    from spectool.engine import Model
    from spectool.speculative import Generation

    with Model(mtp_path, n_ctx=512, n_threads=2) as m:
        assert m.architecture == "glm4moe" and m.n_nextn == 1 and m.offload["of"] == 3  # 2 blocks + output
        prompt = m.tokenize("The quick brown fox jumps over the lazy dog. The quick brown fox")
        plain = tokens_of(Generation(m, None, max_tokens=40), prompt)
        assert tokens_of(Generation(m, PromptLookup(), controller=Controller(k_max=8), max_tokens=40),
                         prompt) == plain
