"""OpenAI's Predicted Outputs through `spectool serve`: the same edit request with the file as its `prediction` and
without one, interleaved in one run; the bar is 1.5x the decode speed without (issue 46).

    pip install -e ".[test,bench]"
    python benchmarks/prediction.py --prompts 6       # a few minutes on 2 cores

The workload is the held-out code-editing set (spectool_lab.common): a HumanEval function, then a request to
write it again (unchanged, its docstring fixed, or renamed), drawn afresh from the prompts not on the tuning list
(the seed printed). The function is the request's `prediction`, as an editor sends the file it asks to rewrite.
One `spectool serve` process serves F16 Gemma 3 270M on 127.0.0.1 (`--no-lookup-corpus`, so that neither request
drafts from the other's output), greedy; the official `openai` client sends each prompt to /v1/completions without
and with the prediction (which goes first alternates), so drift hits both alike. Without a prediction the request
drafts by prompt lookup, which already copies the function from the prompt: the ratio is what the prediction adds
over that. Speed is completion tokens over the server's decode seconds (`usage.speculative`); the outputs must be
identical, and the prediction's accepted and rejected tokens must add up to the tokens drafted from it.
"""

from __future__ import annotations

import argparse
import sys

from spectool_lab import common
from spectool_lab.common import machine, models, split

from serve_bench import start

BAR = 1.5


def ask(client, model: str, prompt: str, tokens: int, prediction: str | None) -> dict:
    """One greedy completion: its text, tokens, decode seconds and the prediction's counts."""
    extra = {"prediction": {"type": "content", "content": prediction}} if prediction is not None else None
    r = client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0, extra_body=extra)
    spec, details = r.usage.model_extra["speculative"], r.usage.completion_tokens_details
    return {"text": r.choices[0].text, "tokens": r.usage.completion_tokens, "decode": spec["decode_seconds"],
            "drafted": spec["by_source"].get("prediction", 0),
            "accepted": details.accepted_prediction_tokens if details else 0,
            "rejected": details.rejected_prediction_tokens if details else 0}


def measure(url: str, prompts: list[str], tokens: int) -> list[dict[bool, dict]]:
    """Each prompt's answer without (False) and with (True) its prediction, the order alternating."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=900)
    model = client.models.list().data[0].id
    client.completions.create(model=model, prompt="warm up", max_tokens=4)
    rows = []
    for i, prompt in enumerate(prompts):
        row = {}
        for predicted in ((False, True) if i % 2 == 0 else (True, False)):
            row[predicted] = ask(client, model, prompt, tokens, split(prompt) if predicted else None)
        rows.append(row)
        a, b = row[False], row[True]
        print(f"  prompt {i + 1}: {a['tokens'] / a['decode']:.1f} -> {b['tokens'] / b['decode']:.1f} tok/s, "
              f"prediction accepted {b['accepted']}, rejected {b['rejected']}, "
              f"identical: {a['text'] == b['text']}", flush=True)
    return rows


def report(rows: list[dict[bool, dict]], args, seed: int) -> bool:
    """The table; whether the bar is met with every output identical and every count adding up."""
    speed = {p: sum(r[p]["tokens"] for r in rows) / sum(r[p]["decode"] for r in rows) for p in (False, True)}
    ratios = sorted((r[True]["tokens"] / r[True]["decode"]) / (r[False]["tokens"] / r[False]["decode"])
                    for r in rows)
    same = sum(r[False]["text"] == r[True]["text"] for r in rows)
    counted = all(r[True]["accepted"] + r[True]["rejected"] == r[True]["drafted"] for r in rows)
    accepted, rejected = (sum(r[True][k] for r in rows) for k in ("accepted", "rejected"))
    drawn = "the tuning list" if args.tuning else f"unseen, --seed {seed}"
    print(f"\n{machine(args.threads)}\nF16 Gemma 3 270M, code editing (HumanEval), {len(rows)} prompts ({drawn}), "
          f"{args.tokens} tokens, greedy, /v1/completions through the openai client\n")
    print("| request | decode tok/s | ratio | per prompt | prediction accepted | rejected |\n"
          "|---|---:|---:|---:|---:|---:|")
    print(f"| without a prediction (prompt lookup) | {speed[False]:.1f} | 1.00x | | | |")
    print(f"| with the function as its prediction | {speed[True]:.1f} | {speed[True] / speed[False]:.2f}x | "
          f"{ratios[0]:.2f}-{ratios[-1]:.2f}x | {accepted} | {rejected} |")
    print(f"\noutputs identical: {same} of {len(rows)}; accepted + rejected = drafted from the prediction: {counted}")
    ok = speed[True] / speed[False] >= BAR and same == len(rows) and counted
    print(f"bar {BAR}x: {'met' if ok else 'NOT met'}")
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    common.sample_options(ap)
    args = ap.parse_args()
    seed = common.fresh_seed(args.seed)
    prompts = common.chosen(next(iter(common.SETS)), args.prompts, args, seed)
    print(f"seed {seed}", flush=True)
    proc, url = start(models()["F16"], "lookup", args.threads, "--no-lookup-corpus", "-c", "4096")
    try:
        rows = measure(url, prompts, args.tokens)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    sys.exit(0 if report(rows, args, seed) else 1)


if __name__ == "__main__":
    main()
