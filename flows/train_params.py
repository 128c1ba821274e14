"""The training flow's run form and which run a flow run trains.

The form (Prefect's deployment "Run" page) offers the shipped presets as a choice, typed fields for
the usual changes (`run_name`, `steps`, `replay_ratio`, `seed`: plain inputs whose defaults, "" / 0 / -1 /
-1, mean the preset's value) and the free `overrides` list. A run
started from the form without a run name is a new run named `<preset>-<flow run name>-<4 hex of
the flow run id>`, so clicking Run twice trains twice; a Retry of that flow run (same id, a later
attempt) continues the run its first attempt started; a given run name continues that run as
`exgrpo train` does. A finished run is never resumed silently: unless more steps are asked for
explicitly (`asks_for_steps`), `finished_run` says so and the flow ends `Cancelled` ("AlreadyFinished")
without touching it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field
from pydantic.json_schema import SkipJsonSchema

from exgrpo_core.config.load import PRESETS_DIR, load_config
from exgrpo_core.config.redact import masked, reveal
from exgrpo_core.config.schema import ExGRPOConfig
from flows.param_secrets import scrub_parameters
from flows.planned_end import PlannedEnd

PRESETS = tuple(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
# A string whose form is a select box of the shipped presets; Python callers may still pass a YAML path.
Preset = Annotated[str, Field(json_schema_extra={"enum": list(PRESETS)})]
# Typed form fields: one plain input each, with a real default meaning "the preset's" (UNSET), so Prefect's
# form has no "None" type toggle; Python callers may still pass None for the same (SkipJsonSchema).
RunName = str | SkipJsonSchema[None]
Steps = Annotated[int, Field(ge=0)] | SkipJsonSchema[None]
ReplayRatio = Annotated[float, Field(ge=-1, lt=1)] | SkipJsonSchema[None]
Seed = Annotated[int, Field(ge=-1)] | SkipJsonSchema[None]
Overrides = list[str] | SkipJsonSchema[None]
UNSET = {"run_name": "", "steps": 0, "replay_ratio": -1.0, "seed": -1}
Text = str | SkipJsonSchema[None]  # other flows' optional text and list inputs: "" / [] mean not set
Texts = list[str] | SkipJsonSchema[None]
Count = Annotated[int, Field(ge=0)] | SkipJsonSchema[None]  # 0: not set


class AlreadyFinishedError(PlannedEnd):
    """The run named is finished and no more steps were asked for (the CLI's one line, exit 0; the flow's
    AlreadyFinished)."""

    exit_code = 0
    label = "[yellow]finished[/yellow]"


# typed form fields -> the config key each one sets
TYPED_KEYS = {"run_name": "run.name", "steps": "run.steps", "replay_ratio": "buffer.replay_ratio", "seed": "run.seed"}


def form_overrides(overrides: list[str] | None, **typed) -> list[str]:
    """The overrides list followed by one `key=value` per typed field that is set, i.e. neither None nor its
    UNSET value (typed fields win)."""
    out = list(overrides or [])
    out += [f"{TYPED_KEYS[k]}={v}" for k, v in typed.items() if v is not None and v != UNSET[k]]
    return out


def names_a_run(overrides: list[str]) -> bool:
    """Whether the overrides choose the run's name (then the run is resumed by that name)."""
    return any(o.split("=", 1)[0].strip() == "run.name" for o in overrides)


def new_run_name(preset_name: str, flow_run_name: str | None, flow_run_id) -> str:
    """`<preset>-<flow run name>-<first 4 hex digits of the flow run id>`: one new run per flow run."""
    tail = str(flow_run_id).replace("-", "")[:4] if flow_run_id else ""
    return "-".join(p for p in (preset_name, flow_run_name or "run", tail) if p)


def run_config(params: dict, flow_run_name: str | None = None, flow_run_id=None,
               retry: bool = False) -> tuple[ExGRPOConfig, list[str] | None]:
    """The config a train flow run with these parameters trains (also used by the flow's hooks), and the
    overrides that give it from the preset (credentials masked; None when `config` was given).

    `config` is used as is (the CLI and the comparison: resume by name). Otherwise preset + overrides +
    typed fields; without a run name the run named after the flow run: a new one (run.resume=never) on
    the flow run's first attempt, the one that attempt started (run.resume=auto) on a `retry`.
    Credentials in `params` are masked in the flow run's stored parameters (flows/param_secrets.py), and
    masked ones are filled back in from the environment (redact.reveal)."""
    scrub_parameters(params, flow_run_id)
    if params.get("config"):
        cfg = params["config"]
        return reveal(cfg if isinstance(cfg, ExGRPOConfig) else ExGRPOConfig.model_validate(cfg)), None
    preset = params.get("preset") or "tiny"
    sets = form_overrides(params.get("overrides"), **{k: params.get(k) for k in TYPED_KEYS})
    cfg = load_config(preset, sets)
    if names_a_run(sets):
        return reveal(cfg), masked(sets)
    resume = "auto" if retry else "never"
    sets += [f"run.name={new_run_name(cfg.preset, flow_run_name, flow_run_id)}", f"run.resume={resume}"]
    return reveal(load_config(preset, sets)), masked(sets)


def form_problems(params: dict) -> str | None:
    """Every problem of a form's preset and overrides, in one line (None: none): each override that does not
    parse, then what validating the rest says, key by key."""
    from exgrpo_core.config.load import ConfigError, parse_override

    sets = form_overrides(params.get("overrides"), **{k: params.get(k) for k in TYPED_KEYS})
    problems, good = [], []
    for item in sets:
        try:
            parse_override(item)
            good.append(item)
        except ConfigError as e:
            problems.append(str(e))
    try:
        load_config(params.get("preset") or "tiny", good)
    except ConfigError as e:
        head, *lines = str(e).splitlines()
        problems.append(f"{head.rstrip(':')}: " + "; ".join(x.strip() for x in lines) if lines else head)
    return "; ".join(masked(problems)) if problems else None


def asks_for_steps(overrides: list[str] | None, config: str | None = None) -> bool:
    """Whether the user asked for a number of steps: `run.steps` among the overrides (`--set`, the form's
    steps field) or in their own YAML file (a shipped preset's steps are no request)."""
    if any(o.split("=", 1)[0].strip() == "run.steps" for o in overrides or []):
        return True
    if not config:
        return False
    import yaml

    from exgrpo_core.config.load import resolve_preset

    path = resolve_preset(config).resolve()
    if path.parent == PRESETS_DIR.resolve():
        return False
    data = yaml.safe_load(path.read_text()) or {}
    return isinstance(data, dict) and isinstance(data.get("run"), dict) and "steps" in data["run"]


def finished_run(cfg: ExGRPOConfig, extend: bool = False) -> dict | None:
    """When the run `cfg` names already finished (status `finished`) and is not to train further: its
    database row plus `message`, one line saying so and how to continue it; else None. It trains further
    only when `extend` (the user asked for a number of steps, `asks_for_steps`) and run.steps is more than
    it did: a preset's larger default never extends a finished run. Reads only the run folder and the
    run's database row."""
    from exgrpo_core.run.checkpoint import latest_checkpoint
    from exgrpo_core.store.experience_store import ExperienceStore, resolve_db_url

    run_dir = Path(cfg.run.output_dir).resolve() / cfg.run.name
    if cfg.run.resume == "never" or latest_checkpoint(run_dir) is None:
        return None
    with ExperienceStore(resolve_db_url(cfg.run.db_url, run_dir)) as store:
        run_id = store.find_run_by_name(cfg.run.name)
        row = store.get_run(run_id) if run_id else None
    if row is None or row["status"] != "finished":
        return None
    done = row["step"] + 1
    if done < cfg.run.steps and extend:
        return None
    why = f" (run.steps={cfg.run.steps} was not asked for)" if done < cfg.run.steps else ""
    return {**row, "message": (
        f"run '{cfg.run.name}' already finished {done} steps: nothing trained{why}. To continue it, ask for "
        f"more steps (--set run.steps=N with N > {done}; the Prefect form's steps), or start a new run "
        "(another run name; from the Prefect form: leave run_name empty)")}
