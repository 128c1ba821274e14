"""Checks of model.name_or_path that read no weights: one ModelLoadError line before anything slow.

A local folder must hold a readable config.json and complete weights (every safetensors file as long as
its own header says); a hub name must be in the local cache when the hub is offline, else its config must
download. The tiny model's shape must be one Llama can build.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from exgrpo_core.models.load import SMOLLM2, TINY, TINY_SFT, ModelLoadError

WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
SHARDS = "model"  # run.checkpoint_weights=sharded: the weights are a DCP folder (checkpoint.has_weight_shards)


def check_tiny_shape(tiny: dict) -> None:
    hidden, heads = tiny.get("hidden_size", 64), tiny.get("num_heads", 4)
    if heads >= 1 and hidden % heads:
        raise ModelLoadError(f"model.tiny.hidden_size ({hidden}) must be a multiple of model.tiny.num_heads ({heads})")
    if heads >= 1 and (hidden // heads) % 2:
        raise ModelLoadError(f"model.tiny.hidden_size / model.tiny.num_heads ({hidden} / {heads} = {hidden // heads}) "
                             "must be even (rotary position embeddings)")


def check_model_source(name_or_path: str, tiny: dict | None = None) -> None:
    """One ModelLoadError naming the problem with the model `name_or_path` names, or None."""
    if name_or_path in (TINY, TINY_SFT):
        return check_tiny_shape(tiny or {})
    if name_or_path == SMOLLM2:
        return None
    path = Path(name_or_path).expanduser()
    if name_or_path.startswith((".", "/", "~")) or path.exists():
        return check_folder(path, name_or_path)
    return check_hub_name(name_or_path)


def check_folder(path: Path, name: str) -> None:
    if not path.exists():
        raise ModelLoadError(f"model.name_or_path {name} does not exist (a local model folder; a Hugging Face "
                             "name looks like org/name)")
    if not path.is_dir():
        raise ModelLoadError(f"model.name_or_path {name} is a file, not a model folder (config.json, weights, "
                             "tokenizer files)")
    if not any(path.iterdir()):
        raise ModelLoadError(f"model folder {name} is empty (it needs config.json, weights and tokenizer files)")
    config = path / "config.json"
    if not config.is_file():
        raise ModelLoadError(f"model folder {name} has no config.json: not a Hugging Face model folder "
                             "(`exgrpo export` writes one from a checkpoint)")
    try:
        json.loads(config.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ModelLoadError(f"model folder {name}: config.json is not readable JSON ({_short(err)})") from None
    if (path / SHARDS).is_dir():
        return
    found = [w for w in WEIGHTS if (path / w).is_file()]
    if not found:
        raise ModelLoadError(f"model folder {name} has no weights (none of {', '.join(WEIGHTS)})")
    for w in found:
        files = [path / w]
        if w.endswith(".index.json"):
            try:
                files = [path / f for f in sorted(set(json.loads((path / w).read_text())["weight_map"].values()))]
            except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
                raise ModelLoadError(f"model folder {name}: {w} is not a readable weight index ({_short(err)})") from None
        for f in files:
            if not f.is_file():
                raise ModelLoadError(f"model folder {name}: weight file {f.name} (listed in {w}) is missing")
            if f.suffix == ".safetensors":
                _check_safetensors(f, name)
            elif f.stat().st_size == 0:
                raise ModelLoadError(f"model folder {name}: weight file {f.name} is empty")


def _check_safetensors(file: Path, name: str) -> None:
    """The file is as long as its header says (a truncated copy or download is one line)."""
    size = file.stat().st_size
    try:
        with open(file, "rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else None
            header = json.loads(f.read(n)) if n is not None and 8 + n <= size else None
        ends = [t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"] if header else []
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, struct.error):
        header, ends = None, []
    if header is None:
        raise ModelLoadError(f"model folder {name}: weight file {file.name} is not a safetensors file "
                             f"({size} bytes; truncated or damaged?)")
    need = 8 + n + max(ends, default=0)
    if size < need:
        raise ModelLoadError(f"model folder {name}: weight file {file.name} is truncated ({size} of {need} bytes)")


def _offline() -> bool:
    from huggingface_hub import constants

    flags = (os.environ.get("HF_HUB_OFFLINE"), os.environ.get("TRANSFORMERS_OFFLINE"))
    return bool(constants.HF_HUB_OFFLINE) or any(str(v).lower() in ("1", "true", "yes", "on") for v in flags)


def check_hub_name(name: str) -> None:
    """Offline, the model must be in the local cache; online, its config must download."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(name, "config.json")
    if isinstance(cached, str):
        return
    if _offline():
        raise ModelLoadError(f"model {name!r} is not in the local Hugging Face cache and the hub is offline "
                             "(HF_HUB_OFFLINE): download it first, or pass a local folder as model.name_or_path")
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not read model {name!r} from the Hugging Face hub ({_short(err)}); if the hub "
                             "is unreachable, download the model elsewhere and pass its folder as "
                             "model.name_or_path") from None


def _short(err: BaseException) -> str:
    return " ".join(str(err).split())[:300]
