#!/usr/bin/env bash
# Every GPU measurement of the GPU path in one command (issue 21), for a machine set up as ../shared/gpu/README.md
# says: from the project root, `source .gpu/scripts/env.sh && bash benchmarks/gpu.sh`. At most 9.5 minutes (each part has its own time limit).
# Writes at most 9 files under $OUT (the device tool's folder) or benchmarks/results/gpu.
set -u
out=${OUT:-benchmarks/results/gpu}
mkdir -p "$out"
log=$out/log.txt
py=${PYTHON:-python3}
{ $py -m spectool info; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > "$out/info.txt" 2>&1
# the tests that load models, on a host with a local GPU
timeout 120 $py -m pytest -q -p no:cacheprovider tests/test_load_order.py tests/test_engine.py tests/test_graph_sampling.py \
  tests/test_rpc.py tests/test_realmodel.py > "$out/tests.txt" 2>&1
# host time per step, and a 9-token verification inside llama_decode, rows against ids
timeout 90 $py research/step_cost.py --out "$out" >> "$log" 2>&1
# the README's main command, default against --spec none, three times each on a fresh cost cache
timeout 90 $py - "$out/main.txt" <<'PY' 2>> "$log"
import json, os, re, shlex, subprocess, sys, tempfile
readme = open("README.md").read()
cmd = next(ln for block in re.findall(r"```[a-z]*\n(.*?)```", readme, re.S) for ln in block.splitlines()
           if "spectool run " in ln).split("&& ")[-1]
args = shlex.split(cmd)[1:]
with open(sys.argv[1], "w") as out:
    for i in range(3):
        for extra in ([], ["--spec", "none"]):
            d = tempfile.mkdtemp()
            subprocess.run([sys.executable, "-m", "spectool", *args, *extra, "-q", "--stats-json", f"{d}/s.json"],
                           env=dict(os.environ, SPECTOOL_CACHE=d), stdout=subprocess.DEVNULL, timeout=30)
            s = json.load(open(f"{d}/s.json"))
            out.write(f"{' '.join(extra) or 'default'}: {s['tokens_per_second']:.1f} tok/s, "
                      f"{s['offload']['target']['backend']}, {s['n_accepted']}/{s['n_drafted']} accepted\n")
PY
# spectool against llama.cpp's tools, every contender on the GPU, with draft trees (issue 59): a reduced run (the whole one
# takes hours on a CPU)
timeout 180 $py benchmarks/vs_llamacpp.py --models gemma-f16 --families qa,code,raw --prompts 2 --repeats 1 --trees 8 \
  --out "$out" >> "$log" 2>&1
# drafts as trees against chains at the GPU's own batch costs (issue 59's bound; on a CPU a row costs a sixth of a step)
timeout 60 $py research/tree_bound.py --prompts 4 --tokens 96 --samples 1 --shorter > "$out/tree_bound.md" 2>> "$log"
# what a tree of R rows costs against a chain of R rows, verified for real in one decode (eval_tree)
timeout 30 $py research/tree_cost.py --clock wall --reps 7 > "$out/tree_cost.md" 2>> "$log"
ls -la "$out"
