"""CPU tests of `e2e --step`'s memory check (e2e/step_memory.py): the weight estimate from the shipped
configs, the refusal, and run_step refusing before any worker starts."""
from __future__ import annotations

import json

import pytest

from astra_sglang.e2e import step as step_mod
from astra_sglang.e2e import step_memory as sm
from astra_sglang.e2e.model_configs import CONFIGS_DIR, shipped_configs
from astra_sglang.errors import AstraError

GIB = 1 << 30


def _cfg(name: str) -> dict:
    return json.loads((CONFIGS_DIR / name / "config.json").read_text())


def test_weight_bytes_of_the_shipped_configs():
    assert sm.weight_bytes(_cfg("qwen3-30b-a3b")) == pytest.approx(57 * GIB, rel=0.1)   # 30.5B params, bf16
    assert sm.weight_bytes(_cfg("llama3-8b")) == pytest.approx(15 * GIB, rel=0.1)
    assert sm.weight_bytes(_cfg("qwen2.5-7b")) == pytest.approx(7.6e9 * 2, rel=0.05)  # untied 152064-row embeddings
    assert sm.weight_bytes(_cfg("llama3-70b")) == pytest.approx(70.6e9 * 2, rel=0.05)
    assert sm.weight_bytes(_cfg("llama-small")) < 1 * GIB
    # 20 of Gemma-3-27B's 62 layers (0.83 GB each) and its tied 262208 x 5376 embeddings
    assert sm.weight_bytes(_cfg("gemma3-27b-20l")) == pytest.approx(18 * GIB, rel=0.05)
    # DeepSeek's first_k_dense_replace dense layers, n_routed_experts + n_shared_experts in the rest
    assert sm.weight_bytes(_cfg("deepseek-v3-2l")) == pytest.approx(26 * GIB, rel=0.05)
    assert sm.kv_bytes_per_token(_cfg("deepseek-v3-2l"), tp=2) == 2 * (512 + 64) * 2  # MLA: one latent a layer
    for name in shipped_configs():
        assert sm.weight_bytes(_cfg(name)) > 0


def test_moe_outweighs_the_dense_model_of_its_width():
    moe = _cfg("qwen3-30b-a3b")
    dense = {k: v for k, v in moe.items() if k not in ("num_experts", "moe_intermediate_size")}
    assert sm.weight_bytes(moe) > 2 * sm.weight_bytes(dense)
    shared = {**moe, "shared_expert_intermediate_size": 4096}
    assert sm.weight_bytes(shared) - sm.weight_bytes(moe) == moe["num_hidden_layers"] * 3 * 2048 * 4096 * 2


def test_dtype_and_tied_embeddings():
    cfg = _cfg("llama-small")
    assert sm.weight_bytes({**cfg, "torch_dtype": "float32"}) == 2 * sm.weight_bytes(cfg)
    tied = sm.weight_bytes({**cfg, "tie_word_embeddings": True})
    assert sm.weight_bytes(cfg) - tied == cfg["vocab_size"] * cfg["hidden_size"] * 2


def test_check_fits():
    qwen = _cfg("qwen3-30b-a3b")
    with pytest.raises(AstraError) as e:
        sm.check_fits(qwen, 4, 1, 80 * GIB)
    msg = str(e.value)
    assert "\n" not in msg and "--procs-at-once 1" in msg and "4 processes" in msg and "80.0 GiB" in msg
    sm.check_fits(qwen, 2, 1, 141 * GIB)             # A and B, one process each, on an H200
    sm.check_fits(qwen, 4, 2, 141 * GIB)             # half the weights per GPU at --tp 2
    with pytest.raises(AstraError):
        sm.check_fits(qwen, 2, 1, 80 * GIB)          # the OOM that prompted the check
    sm.check_fits(qwen, 100, 1, None)                # no nvidia-smi: no check


def test_the_wave_must_fit_within_the_mem_fraction():
    """SGLang keeps (1 - mem_fraction) of the memory free at each process's start as slack: four 20-layer MoE
    processes at 0.5 on an H200 left the last without a KV cache (2026-11-30), though their weights fit the GPU."""
    cut = _cfg("qwen3-30b-a3b-20l")
    sm.check_fits(cut, 4, 1, 141 * GIB)                          # the GPU's size alone: it would pass
    with pytest.raises(AstraError) as e:
        sm.check_fits(cut, 4, 1, 141 * GIB, mem_fraction=0.5)
    msg = str(e.value)
    assert "\n" not in msg and "--mem-fraction-static 0.5" in msg and "--procs-at-once 1" in msg
    assert "raise --mem-fraction-static" in msg and "at most 2 fit at once" in msg
    sm.check_fits(cut, 2, 1, 141 * GIB, mem_fraction=0.5)       # --procs-at-once 1: what ran
    # the step runs of the records, one process an arm at 0.5 on an H200, still pass
    for name in ("llama3-8b", "qwen3-8b", "qwen2.5-7b", "gemma2-9b", "gemma3-12b", "gemma3-27b-20l",
                 "deepseek-v3-2l", "gemma-7b"):
        sm.check_fits(_cfg(name), 2, 1, 141 * GIB, mem_fraction=0.5)
    # a fraction above USABLE changes nothing: the GPU's size bounds the wave
    with pytest.raises(AstraError) as e:
        sm.check_fits(_cfg("qwen3-30b-a3b"), 2, 1, 80 * GIB, mem_fraction=0.99)
    assert "usable)" in str(e.value) and "raise --mem-fraction-static" not in str(e.value)


def test_gpu_memory_bytes_without_nvidia_smi(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sm.gpu_memory_bytes() is None
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 81559\necho 81559\n")
    smi.chmod(0o755)
    assert sm.gpu_memory_bytes() == 81559 << 20


class _Started(Exception):
    pass


def _no_workers(monkeypatch):
    started = []

    def worker(name, *a, **k):
        started.append(name)
        raise _Started(name)

    monkeypatch.setattr(step_mod, "WorkerProc", worker)
    return started


def _run(tmp_path, procs, **kw):
    return step_mod.run_step("qwen3-30b-a3b", "all", [1], 16, 8, 1, tmp_path / "out", procs=procs,
                             profile=False, **kw)


def test_run_step_refuses_before_any_worker_starts(monkeypatch, tmp_path):
    started = _no_workers(monkeypatch)
    monkeypatch.setattr(sm, "gpu_memory_bytes", lambda: 80 * GIB)
    with pytest.raises(AstraError, match="--procs-at-once") as e:
        _run(tmp_path, 2)
    assert started == [] and "4 processes" in str(e.value)
    # one process per arm on an H200 fits: the first worker starts
    monkeypatch.setattr(sm, "gpu_memory_bytes", lambda: 141 * GIB)
    with pytest.raises(_Started):
        _run(tmp_path, 2, procs_at_once=1)
    assert started == ["A-p1"]


def test_run_step_checks_the_wave_at_its_mem_fraction(monkeypatch, tmp_path):
    started = _no_workers(monkeypatch)
    monkeypatch.setattr(sm, "gpu_memory_bytes", lambda: 141 * GIB)

    def run(**kw):
        return step_mod.run_step("qwen3-30b-a3b-20l", "all", [1], 16, 8, 1, tmp_path / "out", procs=2,
                                 profile=False, **kw)

    with pytest.raises(AstraError, match="--mem-fraction-static 0.5"):
        run(mem_fraction=0.5)
    assert started == []
    with pytest.raises(_Started):
        run(mem_fraction=0.5, procs_at_once=1)
    assert started == ["A-p1"]


def test_run_step_checks_nothing_for_a_stand_in_worker(monkeypatch, tmp_path):
    started = _no_workers(monkeypatch)
    monkeypatch.setattr(sm, "gpu_memory_bytes", lambda: 80 * GIB)
    with pytest.raises(_Started):
        _run(tmp_path, 2, module="tests/step_fake_worker.py")
    assert started == ["A-p1"]


def test_two_gemma2_servers_with_65536_token_pools_do_not_fit_an_h100():
    """What happened on an H100 (2026-11-26): arm A died in CUDA-graph capture. The check says so up front, with a
    --max-total-tokens that fits, and lets the H200 and the smaller pool through."""
    cfg = _cfg("gemma2-9b")
    assert sm.kv_bytes_per_token(cfg) == 42 * 2 * 8 * 256 * 2
    with pytest.raises(AstraError, match="--max-total-tokens") as e:
        sm.check_servers_fit(cfg, 2, 1, 65536, 80 * GIB)
    fits = int(str(e.value).split("pass --max-total-tokens ")[1].split()[0])
    assert 16384 <= fits < 65536
    sm.check_servers_fit(cfg, 2, 1, fits, 80 * GIB)
    sm.check_servers_fit(cfg, 2, 1, 65536, 141 * GIB)
    sm.check_servers_fit(cfg, 2, 1, 65536, None)          # no nvidia-smi: nothing checked
    with pytest.raises(AstraError, match="--tp"):
        sm.check_servers_fit(cfg, 2, 1, 1024, 40 * GIB)


def test_the_20_layer_moe_config_fits_the_step_on_an_h100():
    full = _cfg("qwen3-30b-a3b")
    cut = _cfg("qwen3-30b-a3b-20l")
    with pytest.raises(AstraError):
        sm.check_fits(full, 2, 1, 80 * GIB)
    sm.check_fits(cut, 2, 1, 80 * GIB)
    assert {k: v for k, v in cut.items() if k not in ("num_hidden_layers", "max_window_layers")} == \
        {k: v for k, v in full.items() if k not in ("num_hidden_layers", "max_window_layers")}
