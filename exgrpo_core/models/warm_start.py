"""Supervised warm start of the tiny model on the generated arithmetic task, cached on disk (issue 15).

`model.name_or_path: tiny-sft` loads a tiny Llama-style model (model.tiny's shape) that was first
trained by next-token cross-entropy on worked answers of the task's `sft` split (exgrpo_core/data/arith.py;
questions disjoint from the RL `train` and held-out `test` splits). How far it is trained
(model.warm_start.steps, lr, batch_size, seed) sets where RL starts: a short warm start leaves a
policy that solves some questions some of the time. The result is saved once under
$EXGRPO_CACHE/tiny-sft-<hash of the settings> (default ~/.cache/exgrpo) and reused by every run and
seed with the same settings; the run's own seed plays no part in it.

Trained weights depend on the CPU (BLAS kernels and vector widths sum in different orders), so the
arith-fast and arith3 presets' warm starts ship in the repository (`datasets/tiny-sft-<hash>.safetensors`, with
its SHA-256 in `datasets/tiny-sft-<hash>.json`): every machine starts from the same weights, and
paired comparisons archived on one machine can be continued on another. Other settings are trained.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch

from exgrpo_core.data import arith, arith3
from exgrpo_core.models import build

TINY_SFT = "tiny-sft"
FORMAT_VERSION = 1  # bump when the task, the prompt or the training rule changes: old caches stop matching


def canonical(warm: dict) -> dict:
    """The warm-start settings as keyed and recorded: the default task (arith) left out, so keys and shipped
    records from before the task setting stay valid."""
    return {k: v for k, v in warm.items() if not (k == "task" and v == "arith")}


def settings_key(tiny: dict, warm: dict) -> str:
    """A short stable hash of everything that determines the warm-started weights."""
    warm = canonical(warm)
    blob = json.dumps({"tiny": tiny, "warm": warm, "version": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha1(blob.encode()).hexdigest()[:12]


SHIPPED = Path(__file__).resolve().parents[1] / "data" / "datasets"


def shipped_weights(tiny: dict, warm: dict) -> Path | None:
    """The repository's copy of the warm-started weights for these settings, or None."""
    p = SHIPPED / f"{TINY_SFT}-{settings_key(tiny, warm)}.safetensors"
    return p if p.is_file() else None


def ship(tiny: dict, warm: dict, dest: Path = SHIPPED) -> Path:
    """Copy the (cached or newly trained) warm start's weights into `dest` with their SHA-256 and
    settings: `warm_started` then uses them instead of training."""
    folder = warm_started(tiny, warm)
    key = settings_key(tiny, warm)
    out = Path(dest) / f"{TINY_SFT}-{key}.safetensors"
    shutil.copyfile(folder / "model.safetensors", out)
    (Path(dest) / f"{TINY_SFT}-{key}.json").write_text(json.dumps(
        {"tiny": tiny, "warm": canonical(warm), "version": FORMAT_VERSION, "sha256": weights_sha256(folder),
         "trained_on": _cpu_name()}, indent=1) + "\n")
    return out


def _cpu_name() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return next(x.split(":", 1)[1].strip() for x in lines if x.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def cache_dir(tiny: dict, warm: dict) -> Path:
    root = Path(os.environ.get("EXGRPO_CACHE", "~/.cache/exgrpo")).expanduser()
    return root / f"{TINY_SFT}-{settings_key(tiny, warm)}"


TASKS = {"arith": arith, "arith3": arith3}
"""model.warm_start.task -> the generated task whose `sft` split it trains on."""


def examples(tokenizer, split: str = "sft", task: str = "arith") -> list[tuple[list[int], list[list[int]]]]:
    """Per question: its chat prompt ids (as rollouts see them, data.prompt_token_ids with no
    instruction) and the ids of each worked answer followed by EOS."""
    out = []
    gen = TASKS[task]
    for op, a, b in gen.split(split):
        messages = [{"role": "user", "content": gen.question_text(op, a, b)}]
        prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        answers = [tokenizer(s, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                   for s in gen.solutions(op, a, b)]
        out.append((p_ids, answers))
    return out


def batch_tensors(pairs: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    """Right-padded input ids, attention mask and labels (-100 on prompt and padding) for (prompt, answer) pairs."""
    width = max(len(p) + len(a) for p, a in pairs)
    ids = torch.full((len(pairs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(pairs), width), dtype=torch.long)
    labels = torch.full((len(pairs), width), -100, dtype=torch.long)
    for row, (p, a) in enumerate(pairs):
        seq = p + a
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = 1
        labels[row, len(p):len(seq)] = torch.tensor(a)
    return ids, mask, labels


def fine_tune(model, tokenizer, *, steps: int, lr: float, batch_size: int, seed: int,
              task: str = "arith") -> list[float]:
    """Next-token cross-entropy on answer tokens; each row a random sft question and one of its worked
    answers chosen uniformly (so every format stays likely). Returns the loss of every step."""
    data = examples(tokenizer, task=task)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for _ in range(steps):
            picks = [rng.choice(data) for _ in range(batch_size)]
            ids, mask, labels = batch_tensors([(p, rng.choice(ans)) for p, ans in picks], tokenizer.pad_token_id)
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
    model.eval()
    return losses


def weights_sha256(folder: Path) -> str:
    """SHA-256 over the folder's *.safetensors files in name order: which starting model a run had."""
    h = hashlib.sha256()
    for f in sorted(Path(folder).glob("*.safetensors")):
        h.update(f.read_bytes())
    return h.hexdigest()


def warm_started(tiny: dict, warm: dict) -> Path:
    """The folder of the warm-started tiny model for these settings, trained and saved on first use
    (atomically: a temporary folder renamed into place; a concurrent builder's result is kept)."""
    target = cache_dir(tiny, warm)
    if target.is_dir():
        return target
    tokenizer = build.build_tiny_tokenizer()
    model = build.build_tiny_model(tokenizer, **tiny, seed=warm["seed"])
    shipped, losses = shipped_weights(tiny, warm), []
    if shipped is None:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # one thread: the same weights whatever the caller's thread count
        try:
            losses = fine_tune(model, tokenizer, steps=warm["steps"], lr=warm["lr"], batch_size=warm["batch_size"],
                               seed=warm["seed"], task=warm.get("task", "arith"))
        finally:
            torch.set_num_threads(threads)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        build.save_policy(model, tokenizer, tmp)  # config and tokenizer; the weights are the shipped ones
        if shipped is not None:
            shutil.copyfile(shipped, tmp / "model.safetensors")
            want = json.loads(shipped.with_suffix(".json").read_text())["sha256"]
            if weights_sha256(tmp) != want:
                raise ValueError(f"{shipped} does not match the SHA-256 in {shipped.with_suffix('.json').name}")
        (tmp / "exgrpo_warm_start.json").write_text(json.dumps(
            {"tiny": tiny, "warm": canonical(warm), "version": FORMAT_VERSION, "first_loss": losses[0] if losses else None,
             "last_loss": losses[-1] if losses else None, "sha256": weights_sha256(tmp),
             "source": str(shipped.name) if shipped else "trained"}))
        tmp.chmod(0o755)
        os.rename(tmp, target)
    except OSError:
        if not target.is_dir():
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target
