"""Do the tests catch a broken vLLM call? Each mutation below is a realistic one-line slip in our use of vLLM;
applied one at a time to a copy of the tree, the named tests must then fail.

    python scripts/vllm_mutations.py            # all; prints a table, exit status 1 if any survives
    python scripts/vllm_mutations.py --only 3   # one (numbers as printed)

The contract tests run in .venv, the real-vLLM tests (tests/vllm_real) in .venv-vllm.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = (".venv", ["tests/exgrpo_core/rollout/test_vllm_contract.py"])
COLOCATED = (".venv-vllm", ["tests/vllm_real/test_colocated.py"])
REMOTE = (".venv-vllm", ["tests/vllm_real/test_remote.py"])
# (what, file, old text, new text, tests that must fail)
MUTATIONS = [
    ("trainer init info: master_addr=", "exgrpo_core/rollout/remote.py", "NCCLTrainerInitInfo(master_address=",
     "NCCLTrainerInitInfo(master_addr=", CONTRACT),
    ("trainer_init(weights=...)", "exgrpo_core/rollout/remote.py", "client=client, source=source)",
     "client=client, weights=source)", CONTRACT),
    ("/get_world_size read as ['size']", "exgrpo_core/rollout/remote.py", '"/get_world_size")["world_size"]',
     '"/get_world_size")["size"]', REMOTE),
    ("/pause?mode=drain", "exgrpo_core/rollout/remote.py", 'query={"mode": "wait"', 'query={"mode": "drain"', REMOTE),
    ("weight_versions span key renamed", "exgrpo_core/rollout/remote.py", 'sorted({s["version"] for s in spans})',
     'sorted({s["weight_version"] for s in spans})', REMOTE),
    ("/weight_checker answer key renamed", "exgrpo_core/rollout/remote.py", '{"action": "checksum"})["checksums"]',
     '{"action": "checksum"})["checksum"]', REMOTE),
    ("logprobs_mode=processed_logits", "exgrpo_core/rollout/vllm_engine.py", 'logprobs_mode="processed_logprobs"',
     'logprobs_mode="processed_logits"', COLOCATED),
    ("logprobs_mode=raw_logprobs", "exgrpo_core/rollout/vllm_engine.py", 'logprobs_mode="processed_logprobs"',
     'logprobs_mode="raw_logprobs"', COLOCATED),
    ("push without vLLM's layerwise reload", "exgrpo_core/rollout/vllm_engine.py",
     '        self.llm.collective_rpc("exgrpo_start_load")', "        pass", COLOCATED),
    ("gloo push received, not loaded", "exgrpo_core/rollout/gloo_transfer.py",
     "self.model.load_weights([(name, t.to(self.device))])", "pass", REMOTE),
    ("push without its weight version", "exgrpo_core/rollout/remote.py",
     '{"weight_version": weight_version or self.version}', "{}", REMOTE),
]


def run(index: int, m) -> tuple[bool, float, str]:
    what, rel, old, new, (venv, tests) = m
    with tempfile.TemporaryDirectory(prefix="exgrpo-mutant-") as tmp:
        tree = Path(tmp) / "tree"
        shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".git", ".venv", ".venv-vllm", "runs", "__pycache__"))
        path = tree / rel
        text = path.read_text()
        if text.count(old) < 1:
            raise SystemExit(f"mutation {index} ({what}): {rel} no longer contains {old!r}; update the list")
        path.write_text(text.replace(old, new))
        t0 = time.monotonic()
        proc = subprocess.run([str(ROOT / venv / "bin" / "python"), "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
                               *tests], cwd=tree, capture_output=True, text=True)
        last = (proc.stdout.strip().splitlines() or [""])[-1]
        return proc.returncode != 0, time.monotonic() - t0, last


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", type=int, nargs="*", help="mutation numbers to run")
    a = ap.parse_args(argv)
    picked = [(i, m) for i, m in enumerate(MUTATIONS, 1) if not a.only or i in a.only]
    print("| # | mutation | tests | caught | s | pytest's last line |\n|---:|---|---|---|---:|---|")
    survived = 0
    for i, m in picked:
        caught, secs, last = run(i, m)
        survived += not caught
        print(f"| {i} | {m[0]} | {', '.join(Path(t).name for t in m[4][1])} | {'yes' if caught else '**no**'} | "
              f"{secs:.0f} | {last} |", flush=True)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
