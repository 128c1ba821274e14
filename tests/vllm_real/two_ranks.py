"""Run by test_two_processes.py under `torchrun --nproc_per_node 2`: a tiny rollout.engine=vllm run whose two
training processes each hold a vLLM worker (the external launcher); rank 0 prints each step's sync gap."""

import json
import os
import sys

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

if __name__ == "__main__":
    from exgrpo_core import loop
    from exgrpo_core.config.load import load_config
    from exgrpo_core.run import session as S

    out = sys.argv[1]
    cfg = load_config("tiny", [f"run.output_dir={out}", f"run.db_url=sqlite:///{out}/x.db", "run.resume=never",
                               "rollout.engine=vllm", "rollout.vllm_enforce_eager=true", "rollout.max_response_tokens=3",
                               *sys.argv[2:]])
    if int(os.environ["RANK"]) == 0:
        s = S.open_session(cfg)
        for _ in range(2):
            stats = loop.run_iteration(s)
            print("STATS " + json.dumps({k: stats[k] for k in ("engine/sync_logprob_gap", "rollout/responses")}),
                  flush=True)
        s.close()
    else:
        S.run_follower(cfg)
