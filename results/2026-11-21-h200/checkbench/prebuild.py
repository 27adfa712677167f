"""Build every baseline and candidate the GPU run needs, in parallel (nvcc is the slow part).

    python3 results/2026-11-21-h200/checkbench/prebuild.py WORKSPACE_ROOT
"""
from __future__ import annotations

import re
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from astra_sglang.harness.timer import build_helpers
from astra_sglang.build import first_error_line
from astra_sglang.build.workspace import Workspace

REPO = Path(__file__).resolve().parents[2]


def main(root: Path) -> int:
    jobs = []
    for ws_dir in sorted(p for p in root.iterdir() if (p / "manifest.json").exists()):
        ws = Workspace.open(ws_dir.name, path=ws_dir)
        jobs.append((ws, None))
        shipped = REPO / "kernels" / ws.op / "kernel.cu"
        if shipped.exists():
            jobs.append((ws, shipped))
    wss = {ws.op: ws for ws, _ in jobs}
    for f in sorted((REPO / "tests" / "bad_candidates").glob("*.cu")):
        op = re.search(r"^// op: (\w+)", f.read_text(), re.M).group(1)
        if op in wss:
            jobs.append((wss[op], f))
    t0 = time.time()

    def one(job):
        ws, src = job
        r = ws.build(src)
        return ws.op, (src.name if src else "baseline"), r.ok, r.seconds, "" if r.ok else first_error_line(r.log)

    with ThreadPoolExecutor(16) as ex:
        results = list(ex.map(one, jobs))
    arch = next(iter(wss.values())).manifest.get("arch", "sm_90") if wss else "sm_90"
    build_helpers(arch)
    for op, name, ok, secs, err in results:
        print(f"build {op:18s} {name:32s} {'ok' if ok else 'FAIL'} {secs:5.1f}s {err}")
    print(f"prebuild: {len(results)} builds in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
