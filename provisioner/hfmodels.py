"""`--model ORG/NAME`: a Hugging Face model id, resolved without the network.

In order: the catalog model whose `hf_id` it is (case-insensitive: `meta-llama/Llama-3.1-70B`
is `llama-3.1-70b`, with its measured tables and curated figures); a local folder holding a
config.json (a downloaded snapshot); the config.json of that id in the local Hugging Face
cache, as `huggingface-cli download ORG/NAME config.json` leaves it (HF_HUB_CACHE, else
HF_HOME/hub, else XDG_CACHE_HOME or ~/.cache, then huggingface/hub; the revision refs/main
names, else the most recent snapshot). Otherwise one line says how to get it. Sized from a
config.json, a model is read as `--model-config` reads it.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from hardware_catalog import Catalog, InputError, ModelSpec

REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def looks_like_hf_id(name: str) -> bool:
    """ORG/NAME, as the Hub spells repository ids (a catalog name has no slash)."""
    return bool(REPO_ID.match(name))


def hub_cache() -> Path:
    """The local Hugging Face hub cache folder, as huggingface_hub chooses it."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]) / "hub"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "huggingface" / "hub"


def cached_config(repo_id: str, cache: Path | None = None) -> Path | None:
    """The config.json of `repo_id` in the hub cache: refs/main's snapshot, else the most
    recently written one; None when there is none."""
    folder = (cache or hub_cache()) / ("models--" + repo_id.replace("/", "--"))
    ref = folder / "refs" / "main"
    if ref.is_file():
        config = folder / "snapshots" / ref.read_text().strip() / "config.json"
        if config.is_file():
            return config
    found = sorted((folder / "snapshots").glob("*/config.json"),
                   key=lambda p: (p.stat().st_mtime, p.parent.name))
    return found[-1] if found else None


def catalog_name(repo_id: str, catalog: Catalog) -> str | None:
    """The catalog model whose Hugging Face id this is."""
    wanted = repo_id.lower()
    for name, model in catalog.models.items():
        if model.hf_id and model.hf_id.lower() == wanted:
            return name
    return None


def resolve_hf_model(name: str, catalog: Catalog) -> ModelSpec:
    """The model `--model` names when it is a folder or a Hugging Face id (module doc)."""
    from hardware_catalog.hf_config import model_from_hf_config
    folder = Path(name)
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise InputError(f"{name} holds no config.json; give the folder of a model "
                             "snapshot, or --model-config FILE", field="model")
        return model_from_hf_config(folder / "config.json", folder.resolve().name.lower())
    known = catalog_name(name, catalog)
    if known is not None:
        return catalog.model(known)
    config = cached_config(name)
    if config is None:
        raise InputError(f"{name} is not a catalog model and its config.json is not in the "
                         f"local Hugging Face cache ({hub_cache()}); fetch it with "
                         f"`huggingface-cli download {name} config.json`, or give "
                         "--model-config FILE", field="model")
    return model_from_hf_config(config, name.split("/")[-1].lower())
