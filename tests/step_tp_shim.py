"""The real step_worker main loop and tensor-parallel ranks, with a stand-in Worker (no SGLang, no GPU).

Run as a script: `python tests/step_tp_shim.py '<spec json>'`. Spawned ranks re-import this file as
__mp_main__, so the stand-in replaces step_worker.Worker in every rank. Each rank's run reply names
its rank and the NCCL port it was given; FAKE_TP_DIVERGE=<rank> makes that rank sample other ids.
"""
from __future__ import annotations

import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import astra_sglang.e2e.step_worker as sw  # noqa: E402


class StandInWorker:
    def __init__(self, spec, rank=0):
        self.spec, self.rank, self.load_s = spec, rank, 0.0
        args = spec.get("server_args", [])
        self.port = args[args.index("--nccl-port") + 1] if "--nccl-port" in args else None
        self.timer = types.SimpleNamespace(hook="StandIn.replay", pad_cycles=0)
        self.align_note = f"stand-in aligner, tp {spec.get('tp', 1)}"
        self.model_runner = None
        self.gpu_name = f"StandIn GPU {rank}"

    def execute(self, cmd):
        if cmd["cmd"] == "profile":
            prefix = cmd.get("prefix", "A") + (f"-TP{self.rank}" if self.rank else "")
            return {"captures": [{"stage": "decode", "batch_size": cmd["batch_size"], "trace": f"{prefix}.json.gz",
                                  "arm": prefix}]}
        ids = [[1, 2, 3]] if str(self.rank) != os.environ.get("FAKE_TP_DIVERGE") else [[1, 2, 4]]
        return {"gpu_step_s": [0.001 * (self.rank + 1)], "tokens": ids, "rank": self.rank, "nccl_port": self.port}


sw.Worker = StandInWorker

if __name__ == "__main__":
    sw.main()
