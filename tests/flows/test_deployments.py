"""prefect.yaml declares the training deployment with typed parameters the Prefect UI can render."""

from pathlib import Path

import yaml
from prefect.flows import load_flow_from_entrypoint
from prefect.utilities.callables import parameter_schema

ROOT = Path(__file__).resolve().parents[2]


def test_train_deployment_entrypoint_and_typed_parameters():
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployments = {d["name"]: d for d in spec["deployments"]}
    train = deployments["train"]
    flow = load_flow_from_entrypoint(str(ROOT / train["entrypoint"]))
    schema = parameter_schema(flow).model_dump_for_openapi()
    props = schema["properties"]
    assert set(train["parameters"]) <= set(props), "deployment sets a parameter the flow does not take"
    assert props["preset"]["type"] == "string"
    assert props["overrides"]["anyOf"][0]["type"] == "array"
    # the nested config renders as a documented form: field descriptions come from the docstrings
    definitions = schema["definitions"]
    rollout = definitions["RolloutConfig"]["properties"]["group_size"]
    assert "K responses per question" in rollout["description"] and rollout["default"] == 8
