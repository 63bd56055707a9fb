"""`--model ORG/NAME` (issue 40): a Hugging Face id is a catalog model's (its `hf_id`), a
snapshot folder, or a config.json in the local Hugging Face cache; never the network, and
one line saying how to get it otherwise (`provisioner.hfmodels`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from hardware_catalog import InputError, load_catalog
from provisioner.hfmodels import cached_config, resolve_hf_model

REPO = Path(__file__).resolve().parents[1]
MISTRAL = REPO / "examples" / "models" / "mistral-7b-v0.1.json"


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty local hub cache, as huggingface_hub lays it out."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    return cache


def _download(cache: Path, repo_id: str, revision: str, config: dict, main: bool = True):
    folder = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = folder / "snapshots" / revision
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(config))
    if main:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / "main").write_text(revision)
    return snapshot


def test_a_catalog_models_id_is_that_model(hub):
    catalog = load_catalog()
    model = resolve_hf_model("Meta-Llama/llama-3.1-70b", catalog)
    assert model == catalog.model("llama-3.1-70b")


def test_an_id_in_the_local_cache_reads_its_config(hub):
    config = json.loads(MISTRAL.read_text())
    _download(hub, "mistralai/Mistral-7B-v0.1", "abc123", config)
    _download(hub, "mistralai/Mistral-7B-v0.1", "old999", {**config, "num_hidden_layers": 2},
              main=False)
    assert cached_config("mistralai/Mistral-7B-v0.1").parent.name == "abc123"  # refs/main
    model = resolve_hf_model("mistralai/Mistral-7B-v0.1", load_catalog())
    assert model.name == "mistral-7b-v0.1" and model.layers == config["num_hidden_layers"]


def test_a_snapshot_folder_reads_its_config(hub, tmp_path):
    folder = tmp_path / "My-Model"
    folder.mkdir()
    shutil.copy(MISTRAL, folder / "config.json")
    assert resolve_hf_model(str(folder), load_catalog()).name == "my-model"


def test_offline_and_unknown_says_how_to_get_it(hub, cli, bad_input):
    with pytest.raises(InputError, match="huggingface-cli download nobody/none-7b"):
        resolve_hf_model("nobody/none-7b", load_catalog())
    bad_input(cli(["search", "--model", "nobody/none-7b", "--designs", "baseline-h100"]),
              "model")


def test_a_search_by_id_is_the_search_by_name(cli, tmp_path):
    args = ["search", "--designs", "baseline-h100", "--rate", "5", "--duration", "20",
            "--verify-seeds", "1", "--no-cache", "-q"]
    by_id = cli([*args, "--model", "meta-llama/Llama-3.1-70B", "--out", tmp_path / "a"])
    by_name = cli([*args, "--model", "llama-3.1-70b", "--out", tmp_path / "b"])
    assert by_id.code == 0 and by_name.code == 0, by_id.stderr
    a, b = (json.loads((tmp_path / d / "report.json").read_text()) for d in ("a", "b"))
    assert a["designs"] == b["designs"]
    assert a["inputs"]["model"]["name"] == "llama-3.1-70b"
