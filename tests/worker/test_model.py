"""The model: HF safetensors round trip, Llama and Qwen3 layouts, load errors, one-rank step."""

from __future__ import annotations

import json

import pytest
import torch

from vertumnus.worker.config import ModelConfig
from vertumnus.worker.kv_cache import PagedKVCache
from vertumnus.worker.model import Model
from vertumnus.worker.reference import reference_hidden
from vertumnus.worker.step import GroupComm, StepRequest, prefill_step

from .conftest import random_tokens


@pytest.mark.parametrize(
    "cfg",
    [
        ModelConfig.tiny(),
        ModelConfig(model_type="qwen3"),
        ModelConfig(model_type="llama", tie_word_embeddings=True),
    ],
    ids=["qwen3_moe", "qwen3", "llama-tied"],
)
def test_hf_safetensors_round_trip(tmp_path, cfg):
    model = Model.random(cfg, seed=5, dtype=torch.float64)
    model.save(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == cfg.model_type
    from safetensors.torch import load_file

    names = set(load_file(str(tmp_path / "model.safetensors")))
    assert "model.layers.0.self_attn.q_proj.weight" in names
    if cfg.model_type == "qwen3_moe":
        assert "model.layers.1.mlp.experts.3.down_proj.weight" in names
        assert "model.layers.1.mlp.gate.weight" in names
        assert "model.layers.0.self_attn.q_norm.weight" in names
    loaded = Model.load(tmp_path, dtype=torch.float64)
    assert loaded.cfg == model.cfg
    assert all(torch.equal(model.weights[k], loaded.weights[k]) for k in model.weights)
    assert set(loaded.weights) == set(model.weights)
    tokens = random_tokens(11, seed=0)
    # bit-equal weights; outputs agree to rounding (alignment can change SIMD paths)
    assert (
        reference_hidden(model, tokens) - reference_hidden(loaded, tokens)
    ).abs().max().item() < 1e-12


def test_load_refuses_incomplete_or_foreign_checkpoints(tmp_path):
    model = Model.random(ModelConfig.tiny(), seed=5)
    del model.weights["model.layers.1.mlp.experts.2.up_proj.weight"]
    model.save(tmp_path)
    with pytest.raises(ValueError, match="lacks 1 weights.*experts.2.up_proj"):
        Model.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="no config.json"):
        Model.load(tmp_path / "nowhere")
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "hidden_size": 8, "num_attention_heads": 2})
    )
    with pytest.raises(ValueError, match="model_type 'gpt2' is not supported"):
        Model.load(tmp_path)
    (tmp_path / "config.json").write_text(
        json.dumps({"model_type": "qwen3", "attention_bias": True})
    )
    with pytest.raises(ValueError, match="attention_bias=true is not supported"):
        Model.load(tmp_path)


def test_config_reads_a_real_qwen3_moe_config(tmp_path):
    """Field names and extras as in Qwen3-30B-A3B's config.json."""
    raw = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "attention_bias": False,
        "hidden_size": 2048,
        "head_dim": 128,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "num_hidden_layers": 48,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "rms_norm_eps": 1e-06,
        "rope_scaling": None,
        "rope_theta": 1000000.0,
        "sliding_window": None,
        "use_sliding_window": False,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "vocab_size": 151936,
        "max_position_embeddings": 40960,
    }
    (tmp_path / "config.json").write_text(json.dumps(raw))
    cfg = ModelConfig.from_json(tmp_path / "config.json")
    assert cfg.qk_norm and cfg.is_moe_layer(0) and cfg.is_moe_layer(47)
    assert (cfg.num_key_value_heads, cfg.head_dim, cfg.rope_theta) == (4, 128, 1e6)
    assert (
        cfg.kv_bytes_per_token_per_element * 2 == 98304
    )  # design.md: 96 KiB of K/V per token in bf16


def test_one_rank_step_matches_reference_with_and_without_prefix(tiny64):
    cache = PagedKVCache(
        num_blocks=32, block_size=8, layers=2, kv_heads=2, head_dim=16, dtype=torch.float64
    )
    comm = GroupComm(None, 1, 0)
    base = random_tokens(40, seed=1)
    batch = [StepRequest("a", tuple(base)), StepRequest("b", tuple(random_tokens(3, seed=2)))]
    results, _ = prefill_step(tiny64, cache, comm, batch, return_hidden=True)
    for r, req in zip(results, batch, strict=True):
        ref = reference_hidden(tiny64, req.tokens)
        assert r.cached_tokens == 0
        assert (r.hidden - ref).abs().max().item() < 1e-12
        assert r.first_token == int(tiny64.logits(ref[-1]).argmax())
    assert len(cache) == 5  # 40 tokens = 5 full blocks; the 3-token request has none
    longer = tuple(base + random_tokens(9, seed=3))
    (r,), _ = prefill_step(tiny64, cache, comm, [StepRequest("c", longer)], return_hidden=True)
    assert r.cached_tokens == 40
    assert (r.hidden - reference_hidden(tiny64, longer)[40:]).abs().max().item() < 1e-12
    # a fully cached prompt still computes its last token
    (r,), _ = prefill_step(tiny64, cache, comm, [StepRequest("d", tuple(base))], return_hidden=True)
    assert r.cached_tokens == 39 and r.uncached_tokens == 1


def test_a_full_cache_evicts_lru_tails_and_keeps_serving(tiny64):
    cache = PagedKVCache(
        num_blocks=4, block_size=8, layers=2, kv_heads=2, head_dim=16, dtype=torch.float64
    )
    comm = GroupComm(None, 1, 0)
    first, second = random_tokens(24, seed=10), random_tokens(24, seed=11)
    prefill_step(tiny64, cache, comm, [StepRequest("a", tuple(first))])
    cache.drain_events()
    (r,), _ = prefill_step(
        tiny64, cache, comm, [StepRequest("b", tuple(second))], return_hidden=True
    )
    assert (r.hidden - reference_hidden(tiny64, second)).abs().max().item() < 1e-12
    from vertumnus.worker.blocks import block_keys

    a, b = block_keys(first, 8), block_keys(second, 8)
    removed, stored = cache.drain_events()
    assert removed.kind == "removed" and removed.block_keys == (a[2], a[1])  # tail first
    assert stored.block_keys == b
    (r,), _ = prefill_step(tiny64, cache, comm, [StepRequest("a2", tuple(first))])
    assert r.cached_tokens == 8  # the head of the first prompt survived
