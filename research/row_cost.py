"""What a verification's rows cost on this CPU, by the weights' format: how far a draft can pay before it is
accepted at all.

    python research/row_cost.py [--rounds 7] [--threads 2]

A draft of k tokens is verified in one decode of k + 1 rows. For each model file, a one-token step's time, and a
decode of 2, 3, 5 and 9 rows over it, with every row's logits (a verification) and with the last row's only (what
the rows cost without the output layer's share), after one chat prompt, rolled back each time; the median of
--rounds rounds (the first builds the graphs), as the replays measure their cost tables
(spectool_lab.replay.batch_costs). The files: SmolLM2 135M Instruct as shipped (Q4_1, the benchmark's) and
re-quantized from it by llama.cpp's quantizer to Q4_0, Q8_0 and F16 (cached in ~/.cache/spectool-bench: other
weights, so other outputs; only their costs are compared), Gemma 3 270M F16 (derived from the shipped Q4_K_M) and
Q4_K_M. llama.cpp's CPU backend multiplies a batch of rows by a GEMM kernel for some formats only (llamafile's sgemm:
F32, F16, BF16, Q8_0, Q4_0, Q5_0, IQ4_NL; ggml-cpu/repack.cpp on AVX2: Q4_0, Q4_K, Q2_K, IQ4_NL and more), and for
the others (Q4_1 among them) one row after another. The last column, a row's cost in one-token steps ((t_9 - t_1) /
8 / t_1), is the least acceptance a drafted token needs for a draft to pay.
"""

from __future__ import annotations

import argparse

from spectool_lab import common, formats
from spectool_lab.replay import batch_costs

from spectool.llama import engine
from spectool.llama.quantize import quantize

SIZES = (1, 2, 3, 5, 9)


def files() -> dict[str, object]:
    """name -> model file: SmolLM2 as shipped and re-quantized, Gemma 3 270M F16 and Q4_K_M."""
    shipped = common.real_model("smollm2")
    out: dict[str, object] = {"SmolLM2 Q4_1 (shipped)": shipped}
    for ftype in ("Q4_0", "Q8_0", "F16"):
        path = common.CACHE / f"smollm2-135m-{ftype}-from-Q4_1.gguf"
        if not path.exists():
            common.CACHE.mkdir(parents=True, exist_ok=True)
            quantize(shipped, path, ftype)
        out[f"SmolLM2 {ftype} (re-quantized)"] = path
    out["Gemma 3 270M F16"] = common.real_model("gemma-f16")
    out["Gemma 3 270M Q4_K_M (shipped)"] = common.real_model("gemma-q4")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engine.set_verbose(False)
    print(f"{common.machine(args.threads)}; the median of {args.rounds} rounds\n")
    print("| model file | one-token step ms | " + " | ".join(f"{b} rows" for b in SIZES[1:])
          + " | 9 rows, last row's logits only | a row, in steps |")
    print("|---|---:|" + "---:|" * len(SIZES) + "---:|")
    for name, path in files().items():
        with common.load(path, args.threads) as target:
            chat = formats.ChatFormat.of(target)
            prompt = target.tokenize(formats.unseen("chat", 1, 5)[0].render(chat), parse_special=True)
            every, last = (batch_costs(target, prompt, SIZES[-1], args.rounds, logits=lg)
                           for lg in ("all", "last"))
        one = every[1]
        print(f"| {name} | {1000 * one:.2f} | " + " | ".join(f"{every[b] / one:.2f}" for b in SIZES[1:])
              + f" | {last[9] / one:.2f} | {(every[9] - one) / 8 / one:.2f} |", flush=True)


if __name__ == "__main__":
    main()
