"""llama-server's `GET /props` and `GET /slots`, which editors' plugins read, in its shapes
(tools/server/server-context.cpp: get_res_props, server_slot::to_json and task_params::to_json):
the settings requests default to, and each slot's state, as functions of the server's state: a
slot for each sequence --parallel decodes together (Server.tasks: what each slot runs, or ran
last), with its task's drafted and accepted tokens in the names of llama-server's timings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from spectool.server.errors import ApiError

LLAMA_DEFAULT_SEED = 0xFFFFFFFF  # llama.cpp's seed that means "a random one"
# llama.cpp's sampler chain as spectool runs it (core/verify.py), in llama-server's names
SAMPLERS = ["penalties", "top_k", "top_p", "min_p", "temperature"]


# llama-server's task_params as /props and /slots give them (`params`)
PARAMS = ("seed", "temperature", "dynatemp_range", "dynatemp_exponent", "top_k", "top_p", "min_p",
          "top_n_sigma", "xtc_probability", "xtc_threshold", "typical_p", "repeat_last_n",
          "repeat_penalty", "presence_penalty", "frequency_penalty", "dry_multiplier", "dry_base",
          "dry_allowed_length", "dry_penalty_last_n", "mirostat", "mirostat_tau", "mirostat_eta",
          "max_tokens", "n_predict", "n_keep", "n_discard", "ignore_eos", "n_probs", "min_keep",
          "samplers", "speculative.types", "speculative.n_max", "speculative.n_min",
          "timings_per_token", "post_sampling_probs", "backend_sampling", "lora")
# What each endpoint about the server, not about one's own request, may show anyone who holds the
# key (anyone, without one): the paths of its JSON's keys ("a/b": b in a's object, or in each of
# a's list's), and /metrics' names and labels. Counts, settings, the model's own facts and the
# operator's default grammar (/props): never a prompt, an answer, or a grammar, schema, tool or
# field name that a client chose (tests/test_serve_web.py checks each answer against it).
SHOWN = {
    "/health": {"status"},
    "/v1/models": {"object", "data", "data/id", "data/object", "data/created", "data/owned_by"},
    "/props": {"default_generation_settings", "default_generation_settings/n_ctx",
               "default_generation_settings/params", "default_generation_settings/params/grammar",
               *(f"default_generation_settings/params/{p}" for p in PARAMS), "total_slots",
               "model_alias", "model_path", "modalities", "modalities/vision", "modalities/video",
               "modalities/audio", "endpoint_slots", "endpoint_props", "endpoint_metrics",
               "chat_template", "chat_template_caps", "bos_token", "eos_token", "build_info",
               "is_sleeping", "backend"},
    "/slots": {"id", "n_ctx", "speculative", "is_processing", "id_task", "n_prompt_tokens",
               "draft_n", "draft_n_accepted", "n_prompt_tokens_processed", "n_prompt_tokens_cache",
               "draft_tree", "draft_tree/steps", "draft_tree/branches", "draft_tree/taken",
               "params", *(f"params/{p}" for p in PARAMS), "next_token", "next_token/n_remain",
               "next_token/has_next_token", "next_token/has_new_line", "next_token/n_decoded"},
    # names without their _total, and each label's values: fields.label's names, a slot's number
    "/metrics": {"spectool_requests", "spectool_requests_rejected", "spectool_requests_cancelled",
                 "spectool_prompt_tokens", "spectool_completion_tokens", "spectool_decode_seconds",
                 "spectool_drafted_tokens", "spectool_accepted_tokens", "spectool_tree_steps",
                 "spectool_tree_branches", "spectool_tree_taken", "spectool_slots",
                 "spectool_slots_busy", "spectool_slot_busy", "spectool_slot_completion_tokens",
                 "spectool_slot_drafted_tokens", "spectool_slot_accepted_tokens",
                 "spectool_batch_steps", "spectool_batch_rows", "spectool_batch_sequences",
                 "spectool_lookup_corpus_tokens", "spectool_lookup_corpus_disputes",
                 "spectool_lookup_corpus_outranks", "spectool_ignored_fields",
                 "api", "field", "slot", "result"},
}


@dataclass
class Task:
    """The generation a slot runs, or ran last: its number (the queue's ticket), its settings, its
    prompt's length and its Stats as they grow."""

    id: int
    gen: Any  # its GenerationConfig
    n_prompt: int
    stats: Any
    processing: bool = True


def params(gen, session, grammar: bool = False) -> dict:
    """A generation's settings as llama-server's task_params (the short form /props and /slots
    give): spectool's chain, and llama-server's other samplers at the values that turn them off;
    with `grammar`, its grammar (/props: the server's default, never a request's)."""
    s = gen.sampling
    shown = {"grammar": "" if gen.grammar is None else gen.grammar.source} if grammar else {}
    return shown | {
        "seed": LLAMA_DEFAULT_SEED if gen.seed is None else gen.seed, "temperature": s.temp,
        "dynatemp_range": 0.0, "dynatemp_exponent": 1.0, "top_k": s.top_k, "top_p": s.top_p,
        "min_p": s.min_p, "top_n_sigma": -1.0, "xtc_probability": 0.0, "xtc_threshold": 0.1,
        "typical_p": 1.0, "repeat_last_n": s.repeat_last_n, "repeat_penalty": s.repeat_penalty,
        "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
        "dry_multiplier": 0.0, "dry_base": 1.75, "dry_allowed_length": 2,
        "dry_penalty_last_n": gen.target.n_ctx, "mirostat": 0, "mirostat_tau": 5.0,
        "mirostat_eta": 0.1, "max_tokens": gen.max_tokens, "n_predict": gen.max_tokens,
        "n_keep": 0, "n_discard": 0, "ignore_eos": False, "n_probs": gen.logprobs or 0,
        "min_keep": 0, "samplers": SAMPLERS, "speculative.types": str(session.mode),
        "speculative.n_max": session.k_max if gen.draft_max is None else gen.draft_max,
        "speculative.n_min": session.k_min,
        "timings_per_token": False, "post_sampling_probs": False, "backend_sampling": False,
        "lora": [],
    }


def slot(server, index: int) -> dict:
    """One slot as llama-server's server_slot::to_json (without the prompt's text and the output's,
    as llama-server gives them unless --slots-debug): its last task's counts and settings."""
    task: Task | None = server.tasks[index]
    drafts = server.session.mode != "none" and (task is None or task.gen.draft_max != 0)
    out: dict[str, Any] = {"id": index, "n_ctx": server.session.gen.target.n_ctx,
                           "speculative": drafts,
                           "is_processing": task is not None and task.processing}
    if task is None:
        return out
    stats = task.stats
    return out | {
        "id_task": task.id, "n_prompt_tokens": task.n_prompt,
        "draft_n": stats.n_drafted, "draft_n_accepted": stats.n_accepted, "draft_tree": stats.tree,
        "n_prompt_tokens_processed": stats.n_prefilled,
        "n_prompt_tokens_cache": max(0, task.n_prompt - stats.n_prefilled),
        "params": params(task.gen, server.session),
        "next_token": [{"has_next_token": task.processing, "has_new_line": False,
                        "n_remain": task.gen.max_tokens - stats.n_generated,
                        "n_decoded": stats.n_generated}]}


def slots(server, fail_on_no_slot: bool = False) -> list[dict]:
    """GET /slots: every slot; with `?fail_on_no_slot=1`, a 503 when none is idle."""
    out = [slot(server, i) for i in range(len(server.tasks))]
    if fail_on_no_slot and all(s["is_processing"] for s in out):
        raise ApiError(503, "no slot available", "unavailable_error", "no_slot")
    return out


def props(server) -> dict:
    """GET /props: the settings requests default to, the slots, the model and its template."""
    from spectool import __version__
    from spectool.llama.devices import devices, versions

    target = server.session.gen.target
    info = target.vocab_info()

    def text(token: int) -> str:
        return target.piece(token, special=True).decode("utf-8", "replace") if token >= 0 else ""

    return {
        "default_generation_settings": {"params": params(server.session.gen, server.session, True),
                                        "n_ctx": target.n_ctx},
        "total_slots": len(server.tasks), "model_alias": server.model_id,
        "model_path": str(target.path),
        "modalities": {"vision": False, "video": False, "audio": False},
        "endpoint_slots": True, "endpoint_props": False, "endpoint_metrics": True,
        "chat_template": target.chat_template() or "", "chat_template_caps": {},
        "bos_token": text(info.bos), "eos_token": text(info.eos),
        "build_info": f"spectool {__version__} (llama.cpp {versions()['llama_cpp']})",
        "is_sleeping": False,
        # spectool's own: where the model runs, as `spectool info` names its devices' backends
        "backend": ", ".join(dict.fromkeys(d.backend for d in devices() if d.offloads)) or "CPU",
    }
