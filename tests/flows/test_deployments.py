"""prefect.yaml: every deployment loads, and its parameter form is the one the Prefect UI renders.

The schema checked here is the `parameter_openapi_schema` that `prefect deploy` stores (it calls
`parameter_schema(flow)` on the loaded entrypoint); the server validates "Run" requests against it
with `prefect.utilities.schema_tools.validate`, as done below.
"""

import inspect
import uuid
from pathlib import Path

import pytest
import yaml
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.callables import parameter_schema
from prefect.utilities.schema_tools import validate

from exgrpo_core.config.load import load_config
from exgrpo_core.config.schema import ExGRPOConfig
from flows.train_params import PRESETS, run_config

ROOT = Path(__file__).resolve().parents[2]
SPEC = yaml.safe_load((ROOT / "prefect.yaml").read_text())
DEPLOYMENTS = {d["name"]: d for d in SPEC["deployments"]}
EXPECTED = {"exgrpo-train": "flows/train.py:train", "exgrpo-evaluate": "flows/evaluate.py:evaluate",
            "exgrpo-compare": "flows/compare/flow.py:compare"}


def _schema(name: str) -> dict:
    flow = load_flow_from_entrypoint(str(ROOT / DEPLOYMENTS[name]["entrypoint"]))
    return parameter_schema(flow).model_dump_for_openapi()


def _resolve(schema: dict, node: dict) -> dict:
    ref = node.get("$ref")
    return schema["definitions"][ref.split("/")[-1]] if ref else node


def test_each_existing_flow_has_its_deployment_on_the_process_pool():
    for name, entrypoint in EXPECTED.items():
        if (ROOT / entrypoint.split(":")[0]).exists():
            assert DEPLOYMENTS[name]["entrypoint"] == entrypoint
    assert "exgrpo-train" in DEPLOYMENTS
    for d in DEPLOYMENTS.values():
        assert d["work_pool"]["name"] == "{{ $EXGRPO_WORK_POOL }}", d["name"]  # the services' pool (test_deploy_pool)
        assert set(d) >= {"description", "parameters", "tags"}, d["name"]


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_deployment_defaults_pass_the_servers_parameter_validation(name):
    schema = _schema(name)
    params = DEPLOYMENTS[name]["parameters"]
    assert set(params) <= set(schema["properties"]), "deployment sets a parameter the flow does not take"
    assert validate(params, schema, raise_on_error=False, preprocess=True) == []
    assert schema["properties"]["preset"]["type"] == "string"
    if name == "exgrpo-train":  # a select box of the shipped presets
        assert schema["properties"]["preset"]["enum"] == list(PRESETS)
    overrides = schema["properties"]["overrides"]  # a plain list input, no "None" type toggle
    assert overrides["type"] == "array" and overrides["items"] == {"type": "string"} and overrides["default"] == []


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_no_form_field_is_a_type_toggle(name):
    """Prefect's form draws `anyOf [X, null]` as a type toggle showing `Property is type "None"`, and would send
    a null default, which the server refuses for a typed property: only the whole `config` tree (advanced,
    ignored unless given) keeps its null choice."""
    for field, prop in _schema(name)["properties"].items():
        if field == "config":
            assert {"type": "null"} in prop["anyOf"] and prop["default"] is None
            continue
        assert {"type": "null"} not in prop.get("anyOf", []) and prop.get("default", "") is not None, (field, prop)


@pytest.mark.parametrize("name", sorted(DEPLOYMENTS))
def test_every_ref_in_the_form_resolves(name):
    schema = _schema(name)
    refs: list[str] = []

    def walk(node):
        if isinstance(node, dict):
            if "$ref" in node:
                refs.append(node["$ref"])
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)

    walk(schema)
    for ref in refs:
        assert ref.startswith("#/definitions/") and ref.split("/")[-1] in schema["definitions"], ref


def test_train_config_form_is_the_documented_config_tree():
    schema = _schema("exgrpo-train")
    config = schema["properties"]["config"]
    assert {"type": "null"} in config["anyOf"] and config["default"] is None  # optional: preset wins
    root = _resolve(schema, next(o for o in config["anyOf"] if "$ref" in o))
    assert set(root["properties"]) == set(ExGRPOConfig.model_fields)
    for section, prop in root["properties"].items():
        sub = _resolve(schema, prop.get("allOf", [prop])[0])
        for field, spec in sub.get("properties", {}).items():
            # field docstrings become the form's help text
            assert spec.get("description"), f"config.{section}.{field} has no description in the form"
    for name in ("preset", "run_name", "steps", "replay_ratio", "seed", "overrides", "config"):  # docstring Args:
        assert schema["properties"][name].get("description"), f"train parameter {name} has no help text"
    group = _resolve(schema, root["properties"]["rollout"])["properties"]["group_size"]
    assert "K responses per question" in group["description"] and group["default"] == 8
    resume = _resolve(schema, root["properties"]["run"])["properties"]["resume"]
    assert resume["enum"] == ["auto", "never", "must"]  # rendered as a select box


def test_a_full_config_submitted_from_the_form_validates_and_round_trips():
    schema = _schema("exgrpo-train")
    cfg = load_config("tiny", ["run.steps=3"])
    params = {"preset": "tiny", "overrides": [], "config": cfg.model_dump(mode="json")}
    assert validate(params, schema, raise_on_error=False, preprocess=True) == []
    assert ExGRPOConfig.model_validate(params["config"]) == cfg


def test_the_form_rejects_a_wrong_type_like_the_server_does():
    schema = _schema("exgrpo-train")
    bad = load_config("tiny", []).model_dump(mode="json")
    bad["rollout"]["group_size"] = "eight"
    errors = validate({"preset": "tiny", "config": bad}, schema, raise_on_error=False, preprocess=True)
    assert errors and "eight" in str(errors)


def test_the_train_form_has_typed_run_fields_checked_like_the_server_does():
    schema = _schema("exgrpo-train")
    props = schema["properties"]
    assert [p for p in props if props[p]["position"] < 6] == ["preset", "run_name", "steps", "replay_ratio",
                                                                "seed", "overrides"]
    # plain inputs: no anyOf with null (the form's type toggle, `Property is type "None"`) and no null default
    # (the form would send it, and the server refuses null for a property with a default)
    plain = {k: {f: v for f, v in props[k].items() if f not in ("title", "description", "position")}
             for k in ("run_name", "steps", "replay_ratio", "seed", "overrides", "parent_mlflow_run_id")}
    assert plain == {"run_name": {"type": "string", "default": ""},
                     "steps": {"type": "integer", "minimum": 0, "default": 0},
                     "replay_ratio": {"type": "number", "minimum": -1, "exclusiveMaximum": 1, "default": -1.0},
                     "seed": {"type": "integer", "minimum": -1, "default": -1},
                     "overrides": {"type": "array", "items": {"type": "string"}, "default": []},
                     "parent_mlflow_run_id": {"type": "string", "default": ""}}
    assert "0: the preset's" in props["steps"]["description"] and "-1: the preset's" in props["seed"]["description"]
    ok = {"preset": "cpu-demo", "run_name": "a", "steps": 4, "replay_ratio": 0.0, "seed": 3, "overrides": []}
    assert validate(ok, schema, raise_on_error=False, preprocess=True) == []
    for bad in ({"preset": "configs/mine.yaml"}, {"steps": -1}, {"replay_ratio": 1.0}, {"seed": "x"},
                {"steps": None}):
        assert validate({**ok, **bad}, schema, raise_on_error=False, preprocess=True), bad
    form = {k: DEPLOYMENTS["exgrpo-train"]["parameters"][k] for k in ("run_name", "steps", "replay_ratio", "seed")}
    assert form == {k: props[k]["default"] for k in form}  # the form opens on the flow's defaults
    assert validate(form, schema, raise_on_error=False, preprocess=True) == []


def test_the_form_defaults_mean_the_presets_values():
    from flows.train import train

    defaults = {k: p.default for k, p in inspect.signature(train.fn).parameters.items()}
    flow_run = uuid.UUID(int=7)
    for preset in ("tiny", "cpu-demo"):
        cfg, sets = run_config({**defaults, "preset": preset}, "brave-otter", flow_run)
        bare, _ = run_config({"preset": preset}, "brave-otter", flow_run)  # what an empty form field meant
        assert cfg == bare and not [o for o in sets if o.split("=")[0] in ("run.steps", "run.seed",
                                                                            "buffer.replay_ratio")]
    set_all, _ = run_config({**defaults, "preset": "tiny", "steps": 3, "replay_ratio": 0.0, "seed": 0}, "a", flow_run)
    assert (set_all.run.steps, set_all.buffer.replay_ratio, set_all.run.seed) == (3, 0.0, 0)
