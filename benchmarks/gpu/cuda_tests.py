"""Section (e) of benchmarks/gpu_check.sh: the tests marked `gpu` (pytest -m gpu, in the files that use the
marker), with pass / fail / skip counts and the failures' names. On a CPU they skip with a reason: the
section then shows that they were collected. Writes cuda_tests.json (and the JUnit XML beside it).

    python benchmarks/gpu/cuda_tests.py [--tiny] [--out DIR] [--timeout S]
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.gpu.common import ROOT, Report, parse  # noqa: E402


def marked_files() -> list[str]:
    """Test files that mark tests `gpu`."""
    return sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
                  if "mark.gpu" in p.read_text(errors="replace"))


def main() -> None:
    args = parse(__doc__, lambda ap: ap.add_argument("--timeout", type=int, default=240))
    rep = Report("cuda_tests", args)
    files = marked_files()
    xml = Path(args.out) / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *files]
    rep.add("files", files)
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=args.timeout)
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e.stdout or "")[-3000:]
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failed, skipped = [], []
    if xml.exists():
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
    rep.add("counts", counts)
    rep.add("failed", failed)
    rep.add("skipped", skipped[:40])
    rep.add("pytest", {"command": " ".join(cmd[1:]), "returncode": rc, "output_tail": tail})
    rep.done("ok" if rc in (0, 5) and not failed else "failed")


if __name__ == "__main__":
    main()
