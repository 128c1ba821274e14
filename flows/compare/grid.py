"""A sweep's grid: `--grid 'train.lr=1e-6,3e-6'` (repeatable) x seeds -> one child run per point and seed.

The points are the cartesian product of the --grid values, in the order given. The key `arm` takes
comparison arms (`--grid arm=on_policy,exgrpo`: each value stands for that arm's overrides, which win
over the user's; flows/compare/arms.py). A child is named
`<sweep>-<point>-s<seed>`, the point written as `key-value` pairs (`train.lr-1e-6`; other characters
become `-`), so the same sweep rerun finds the same runs. No Prefect import here: the CLI checks the
grid before any server starts.
"""

from __future__ import annotations

import itertools
import re

from exgrpo_core.config.load import ConfigError, load_config
from flows.compare.arms import ARMS, can_evaluate, check_name, parse_arms, parse_seeds
from flows.compare.parallel import Child


def parse_grid(grid: list[str] | str) -> list[tuple[str, list[str]]]:
    """['train.lr=1e-6,3e-6', ...] -> [('train.lr', ['1e-6', '3e-6']), ...]; keys distinct, values given."""
    items = [grid] if isinstance(grid, str) else list(grid)
    if not items:
        raise ConfigError("a sweep needs at least one --grid KEY=V1,V2 (e.g. --grid train.lr=1e-6,3e-6)")
    out: list[tuple[str, list[str]]] = []
    for item in items:
        key, eq, values = item.partition("=")
        vals = [v.strip() for v in values.split(",") if v.strip()]
        if not eq or not key.strip() or not vals:
            raise ConfigError(f"--grid {item!r}: expected KEY=V1,V2 (e.g. train.lr=1e-6,3e-6)")
        if len(set(vals)) < len(vals):
            raise ConfigError(f"--grid {item!r}: values repeat")
        if key.strip() == "arm":
            parse_arms(vals)  # an unknown arm: one line naming the choices
        out.append((key.strip(), vals))
    keys = [k for k, _ in out]
    if len(set(keys)) < len(keys):
        raise ConfigError(f"--grid keys repeat: {keys}; give each key once with all its values")
    return out


def grid_points(grid: list[tuple[str, list[str]]]) -> list[list[str]]:
    """Every combination of the grid's values as a list of `key=value` overrides, first key outermost."""
    return [[f"{k}={v}" for k, v in zip([k for k, _ in grid], combo)]
            for combo in itertools.product(*[vals for _, vals in grid])]


def point_label(point: list[str]) -> str:
    """The report's row label of a grid point: `train.lr=1e-6 buffer.replay_ratio=0`."""
    return " ".join(point)


def point_slug(point: list[str]) -> str:
    """A grid point in a run name: `train.lr-1e-6_buffer.replay-ratio-0`."""
    return "_".join(re.sub(r"[^A-Za-z0-9.]+", "-", o).strip("-") for o in point)


def expand_arm(point: list[str]) -> list[str]:
    """A point's overrides with `arm=<name>` replaced by that comparison arm's overrides."""
    return [o for x in point for o in (ARMS[x[4:]][0] if x.startswith("arm=") else (x,))]


def build_children(preset: str, overrides: list[str] | None, grid: list[str] | str, seeds: list[int] | str,
                   name: str, evaluate: bool) -> list[Child]:
    """Resolved configs of every (grid point, seed), points outer; a bad key or value is a ConfigError now."""
    check_name(name, "sweep")
    points = grid_points(parse_grid(grid))
    slugs = [point_slug(p) for p in points]
    if len(set(slugs)) < len(slugs):
        raise ConfigError(f"grid points give the same run names {slugs}: make the values differ in letters or digits")
    base = load_config(preset, overrides)  # a bad user override fails here, once
    final_eval = ["eval.final=true"] if evaluate and can_evaluate(base) else []
    children = []
    for point, slug in zip(points, slugs):
        for seed in parse_seeds(seeds):
            child = [*(overrides or []), *expand_arm(point), *final_eval, f"run.name={name}-{slug}-s{seed}",
                     f"run.seed={seed}"]
            children.append(Child(point_label(point), seed, load_config(preset, child), child))
    return children
