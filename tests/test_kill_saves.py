"""`kill -9` during a save (issue 47 item 3): a process that saves a lookup cache or a cost table again and again is
killed mid-save, and the file is always the old one or the new one, whole, never a torn one (models/store.py's
write_json_atomic: a temporary file beside it, flushed, renamed over it).

Half the kills land the moment the save's temporary file appears (the save is under way: its bytes are being
written), the others at a random moment; the torn temporary files left by the first kind show that the kills came
mid-write."""

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

# each child saves, then prints the round it saved, forever; its file is a few MB, so that a write takes a while
CORPUS_SAVER = """
import sys
from spectool.drafters.corpus import Corpus
corpus = Corpus(600_000, 1, 1)
for i in range(10**9):
    corpus.add([100_000 + i] + [123_456] * 100_000)
    assert corpus.save(sys.argv[1], "v") is None
    print(i, flush=True)
"""
COSTS_SAVER = """
import sys
from pathlib import Path
from spectool import cost_files
from spectool.core.costs import Costs
costs = Costs()
for b in range(1, 40_001):
    costs.observe_verify(b, 0.001 + b * 1e-6)
for i in range(10**9):
    costs.observe_verify(1, 0.001 + i * 1e-6)
    cost_files.save(Path(sys.argv[1]), costs, {"target": "t", "round": i})
    print(i, flush=True)
"""


def kill_mid_save(script: str, path: Path, at_once: bool, rng: random.Random) -> bool | None:
    """Start `script` saving to `path`, let it save once, then kill -9 it: the moment its next save's temporary file
    appears (`at_once`), or at a random moment. Whether the temporary file it left was torn (None: none left)."""
    p = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    tmp = path.with_name(f".{path.name}.{p.pid}.tmp")
    try:
        assert p.stdout.readline(), p.stderr.read()  # one save done: an old file to keep
        if at_once:
            deadline = time.monotonic() + 60
            while not tmp.exists() and time.monotonic() < deadline:
                time.sleep(0.0002)
        else:
            time.sleep(rng.uniform(0, 0.5))
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        p.kill()
        p.communicate()
    assert p.returncode == -signal.SIGKILL
    if not tmp.exists():
        return None
    try:
        json.loads(tmp.read_bytes())
        torn = False
    except ValueError:
        torn = True
    tmp.unlink()
    return torn


def test_kill_9_mid_save_leaves_the_old_lookup_cache_or_the_new_one(tmp_path):
    """The lookup cache (Corpus.save, `run --lookup-cache`): after each kill the file reads with no warning, and
    holds the newest documents of some round whole (its last one and the four before it)."""
    from spectool.drafters.corpus import read_cache

    path, rng, torn = tmp_path / "lookup.json", random.Random(47), []
    for k in range(10):
        torn.append(kill_mid_save(CORPUS_SAVER, path, k % 2 == 0, rng))
        cached = read_cache(path, "v", 600_000)
        assert cached.warning is None and cached.docs, cached.warning
        last = cached.docs[-1][0] - 100_000
        assert [d[0] for d in cached.docs] == [100_000 + i for i in range(max(0, last - 4), last + 1)]
        assert all(len(d) == 100_001 and d[1:] == [123_456] * 100_000 for d in cached.docs)
        path.unlink()
    assert any(torn), torn  # some kills came mid-write


def test_kill_9_mid_save_leaves_the_old_cost_table_or_the_new_one(tmp_path):
    """The cost table (cost_files.save, what run and serve keep between runs): after each kill it reads as `run`
    reads it, every one of its 40,000 sizes, nothing dropped."""
    from spectool import cost_files

    path, rng, torn = tmp_path / "costs.json", random.Random(48), []
    for k in range(10):
        torn.append(kill_mid_save(COSTS_SAVER, path, k % 2 == 0, rng))
        costs, warning = cost_files.load(path, max_batch=1 << 20)
        assert warning is None and costs is not None and costs.rejected == 0, warning
        assert sorted(costs.verify) == list(range(1, 40_001))
        assert json.loads(path.read_text())["about"]["target"] == "t"
        path.unlink()
    assert any(torn), torn
