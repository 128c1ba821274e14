"""`python tests/flows/vllm_stand_in_cli.py OUT.json exgrpo-args...`: the `exgrpo` command with the vLLM
stand-in (tests/exgrpo_core/fake_vllm.py) installed; each engine's events are written to OUT.json at exit."""

import atexit
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "exgrpo_core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import fake_vllm  # noqa: E402

if __name__ == "__main__":
    out = Path(sys.argv[1])
    fake_vllm.install()
    atexit.register(lambda: out.write_text(json.dumps([llm.events for llm in fake_vllm.LLM.instances])))
    with fake_vllm.cuda():
        from flows.cli import main

        code = main(sys.argv[2:])
    sys.exit(code)
