"""`spectool info`'s facts: spectool's version and folders beside what the llama layer says this
llama.cpp can do."""

from __future__ import annotations


def installation_info(rpc: str | None) -> dict:
    """Versions, CPU features, devices (with the RPC workers of `rpc` added), GPU offload, RPC
    support, threads (devices.installation_info) and the folders spectool uses."""
    from huggingface_hub import constants

    from spectool import __version__
    from spectool.llama.devices import installation_info as llama_info
    from spectool.models.store import cache_dir
    from spectool.models.registry import user_file

    return {"spectool": __version__, **llama_info(rpc),
            "paths": {"cache": str(cache_dir("")), "models_cache": constants.HF_HUB_CACHE,
                      "config": str(user_file())}}
