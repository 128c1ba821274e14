"""Section (e) of benchmarks/gpu_check.sh: the tests marked `gpu` (pytest -m gpu, in the files that use the
marker), with pass / fail / skip counts and the failures' names. On a CPU they skip with a reason: the
section then shows that they were collected. Writes cuda_tests.json (the JUnit XML it reads stays in a
scratch folder: the lent machine returns at most 8 files per call).
pytest's verbose log streams to cuda_tests.log, so a run cut off by its time limit still records the
tests that finished (the H200 rerun of 2026-11-27 lost them all). The limit defaults to the section's
(GPU_SECTION_LIMIT, set by gpu_check.sh) less 15 s.

    python benchmarks/gpu/cuda_tests.py [--tiny] [--out DIR] [--timeout S]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.common import ROOT, Report, parse  # noqa: E402


def marked_files() -> list[str]:
    """Test files that mark tests `gpu`."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text(errors="replace"))


def finished_in_log(text: str) -> dict[str, list[str]]:
    """Outcomes of the tests pytest -v reported before it was stopped: {"PASSED": [nodeid, ...], ...}."""
    out: dict[str, list[str]] = {}
    for node, outcome in re.findall(r"^(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, flags=re.M):
        out.setdefault(outcome, []).append(node)
    return out


def main() -> None:
    limit = int(os.environ.get("GPU_SECTION_LIMIT", "255")) - 15
    args = parse(__doc__, lambda ap: ap.add_argument("--timeout", type=int, default=limit))
    rep = Report("cuda_tests", args)
    files = marked_files()
    scratch = tempfile.TemporaryDirectory(prefix="cuda_tests_")
    xml, log = Path(scratch.name) / "cuda_tests.xml", Path(args.out) / "cuda_tests.log"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-v", "--durations=0", "-p", "no:cacheprovider",
           f"--junitxml={xml}", *files]
    rep.add("files", files)
    with log.open("w") as sink:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, stdout=sink, stderr=subprocess.STDOUT, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    text = log.read_text(errors="replace")
    tail = text[-3000:]
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed, skipped = [], []
    if rc == "timeout":  # no JUnit XML: what the streamed log says finished
        done = finished_in_log(text)
        counts = {"passed": len(done.get("PASSED", [])), "failed": len(done.get("FAILED", [])),
                  "errors": len(done.get("ERROR", [])), "skipped": len(done.get("SKIPPED", []))}
        failed = done.get("FAILED", []) + done.get("ERROR", [])
        skipped = done.get("SKIPPED", [])
        rep.add("cut_off_after_seconds", args.timeout)
    elif xml.exists():
        for case in ET.parse(xml).getroot().iter("testcase"):
            name = f"{case.get('classname')}::{case.get('name')}"
            if case.find("failure") is not None:
                counts["failed"] += 1
                failed.append(name)
            elif case.find("error") is not None:
                counts["errors"] += 1
                failed.append(name)
            elif case.find("skipped") is not None:
                counts["skipped"] += 1
                skipped.append(f"{name}: {case.find('skipped').get('message', '')[:120]}")
            else:
                counts["passed"] += 1
    scratch.cleanup()
    rep.add("counts", counts)
    rep.add("failed", failed)
    rep.add("skipped", skipped[:40])
    rep.add("pytest", {"command": " ".join(cmd[1:]), "returncode": rc, "output_tail": tail})
    rep.done("ok" if rc in (0, 5) and not failed else "failed")


if __name__ == "__main__":
    main()
