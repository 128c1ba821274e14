"""The paper's pictures of a training run, drawn at evaluation / checkpoint steps for MLflow.

`entropy.png`: H(o) of the responses sampled since the previous picture, correct vs incorrect (the
paper's observation that correct responses have lower entropy); `buckets.png`: every question rolled
out so far per bucket k = 0..K of its latest group (the pool holds 0 < k < K; k = K are retired); `replays.png`: replayed questions per source
bucket against the question weighting's share (the Gaussian target around k = K/2). `data.json`
holds the numbers behind them. matplotlib's Agg backend, small figures: a fraction of a second.
"""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from exgrpo_core import metrics as M  # noqa: E402


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def entropy_histogram(correct: list[float], incorrect: list[float], title: str, path: Path) -> Path:
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    values = correct + incorrect
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    bins = [lo + (hi - lo) * i / 30 for i in range(31)] if hi > lo else 10
    for data, label, color in ((incorrect, "incorrect", "tab:red"), (correct, "correct", "tab:green")):
        if data:
            mean = sum(data) / len(data)
            ax.hist(data, bins=bins, alpha=0.55, color=color, label=f"{label} (n={len(data)}, mean {mean:.3f})")
    ax.set_xlabel("response entropy H(o), nats per token")
    ax.set_ylabel("responses")
    ax.set_title(title, fontsize=10)
    if values:
        ax.legend(fontsize=8)
    return _save(fig, path)


def bucket_bars(counts: dict[int, int], group_size: int, title: str, path: Path) -> Path:
    ks = list(range(group_size + 1))
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.bar(ks, [counts.get(k, 0) for k in ks], color="tab:blue")
    ax.set_xticks(ks)
    ax.set_xlabel("bucket k (correct responses of K in the latest group)")
    ax.set_ylabel("questions rolled out so far")
    ax.set_title(title, fontsize=10)
    return _save(fig, path)


def replay_bars(replays: dict[int, int], weights: dict[int, float], title: str, path: Path) -> Path:
    """Replayed questions per source bucket (share of all replays) beside the weighting's normalised share."""
    ks = sorted(set(weights) | set(replays))
    total_r, total_w = sum(replays.values()), sum(weights.values())
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    x = list(range(len(ks)))
    ax.bar([i - 0.2 for i in x], [replays.get(k, 0) / total_r if total_r else 0 for k in ks], width=0.4,
           color="tab:orange", label=f"replayed (n={total_r})")
    ax.bar([i + 0.2 for i in x], [weights.get(k, 0) / total_w if total_w else 0 for k in ks], width=0.4,
           color="tab:gray", label="question weighting (normalised)")
    ax.set_xticks(x, [str(k) for k in ks])
    ax.set_xlabel("source bucket k")
    ax.set_ylabel("share")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return _save(fig, path)


def write_run_pictures(folder: str | Path, *, step: int, since_step: int, group_size: int,
                       correct: list[float], incorrect: list[float], buckets: dict[int, int],
                       replays: dict[int, int], weights: dict[int, float]) -> Path:
    """The three pictures and data.json for 0-based step indices `since_step`..`step` in `folder` (created);
    titles and data.json name them by step number (metrics.step_number). Returns the folder."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    first, last = M.step_number(since_step), M.step_number(step)
    steps = f"steps {first}-{last}" if first < last else f"step {last}"
    entropy_histogram(correct, incorrect, f"Response entropy, {steps}", folder / "entropy.png")
    bucket_bars(buckets, group_size, f"Questions by bucket after step {last}", folder / "buckets.png")
    replay_bars(replays, weights, f"Replays by source bucket, steps 1-{last}", folder / "replays.png")
    data = {"step": last, "first_step": first, "entropy_correct": correct, "entropy_incorrect": incorrect,
            "buckets": buckets, "replays": replays, "weights": weights}
    (folder / "data.json").write_text(json.dumps(data))
    return folder
