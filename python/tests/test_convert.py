"""rlx.convert_to_gguf on a tiny random Llama that the test writes as a Hugging Face directory.

The converted file's exact-mode logits are checked against a float64 forward pass written here in numpy over
the *unconverted* safetensors weights, in Hugging Face's own convention (rotate_half rotary on the original
Q/K rows, repeat_interleave of the KV heads), so the Q/K permutation and every name mapping are checked, not
assumed.
"""
import json

import numpy as np
import pytest

import pyrlx as rlx

safetensors_numpy = pytest.importorskip("safetensors.numpy", reason="the safetensors package is not installed")

EMBD, LAYERS, HEADS, KV_HEADS, FF = 64, 2, 4, 2, 96
HEAD_DIM = EMBD // HEADS


def byte_symbols():
    """GPT-2's byte -> printable character table (the byte-level BPE alphabet)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def write_checkpoint(directory, seed=0):
    rng = np.random.default_rng(seed)
    symbols = byte_symbols()
    vocab = {s: i for i, s in enumerate(symbols)}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("\u0120", "w")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    eot = len(vocab)
    n_vocab = eot + 1
    tokenizer = {
        "version": "1.0",
        "added_tokens": [{"id": eot, "content": "<|endoftext|>", "special": True}],
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
        "model": {"type": "BPE", "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": EMBD,
              "intermediate_size": FF, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "max_position_embeddings": 128, "vocab_size": n_vocab, "tie_word_embeddings": True}
    (directory / "config.json").write_text(json.dumps(config))

    def mat(rows, cols):
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm():
        return (1 + 0.1 * rng.standard_normal(EMBD)).astype(np.float32)

    w = {"model.embed_tokens.weight": mat(n_vocab, EMBD), "model.norm.weight": norm()}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        w.update({p + "input_layernorm.weight": norm(), p + "post_attention_layernorm.weight": norm(),
                  p + "self_attn.q_proj.weight": mat(HEADS * HEAD_DIM, EMBD),
                  p + "self_attn.k_proj.weight": mat(KV_HEADS * HEAD_DIM, EMBD),
                  p + "self_attn.v_proj.weight": mat(KV_HEADS * HEAD_DIM, EMBD),
                  p + "self_attn.o_proj.weight": mat(EMBD, HEADS * HEAD_DIM),
                  p + "mlp.gate_proj.weight": mat(FF, EMBD), p + "mlp.up_proj.weight": mat(FF, EMBD),
                  p + "mlp.down_proj.weight": mat(EMBD, FF)})
    # Two shards, as save_pretrained writes a large model.
    names = sorted(w)
    safetensors_numpy.save_file({k: w[k] for k in names[::2]}, str(directory / "model-00001-of-00002.safetensors"))
    safetensors_numpy.save_file({k: w[k] for k in names[1::2]}, str(directory / "model-00002-of-00002.safetensors"))
    return {k: v.astype(np.float64) for k, v in w.items()}, vocab, eot


def hf_forward(w, ids):
    """transformers' LlamaForCausalLM in float64: rotate_half rotary, repeat_interleave KV heads."""
    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5) * g

    T = len(ids)
    inv = 10000.0 ** (-np.arange(0, HEAD_DIM, 2) / HEAD_DIM)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang), np.cos(ang)], -1)[:, None, :]
    sin = np.concatenate([np.sin(ang), np.sin(ang)], -1)[:, None, :]

    def rope(x):
        x1, x2 = x[..., : HEAD_DIM // 2], x[..., HEAD_DIM // 2:]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    x = w["model.embed_tokens.weight"][ids]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = rope((h @ w[p + "self_attn.q_proj.weight"].T).reshape(T, HEADS, HEAD_DIM))
        k = rope((h @ w[p + "self_attn.k_proj.weight"].T).reshape(T, KV_HEADS, HEAD_DIM))
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(T, KV_HEADS, HEAD_DIM)
        k, v = np.repeat(k, HEADS // KV_HEADS, axis=1), np.repeat(v, HEADS // KV_HEADS, axis=1)
        s = np.einsum("thd,shd->hts", q, k) / np.sqrt(HEAD_DIM) + causal
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hts,shd->thd", s, v).reshape(T, EMBD)
        x = x + o @ w[p + "self_attn.o_proj.weight"].T
        f = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = f @ w[p + "mlp.gate_proj.weight"].T
        x = x + ((gate / (1 + np.exp(-gate))) * (f @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    return rms(x, w["model.norm.weight"]) @ w["model.embed_tokens.weight"].T


@pytest.fixture()
def checkpoint(tmp_path):
    d = tmp_path / "tiny-llama"
    d.mkdir()
    weights, vocab, eot = write_checkpoint(d)
    return d, weights, vocab, eot


@pytest.mark.parametrize("qtype, tol", [("F32", 1e-4), ("F16", 5e-3), ("Q8_0", 3e-2)])
def test_converted_logits_match_a_float64_hf_forward(checkpoint, tmp_path, qtype, tol):
    d, weights, vocab, eot = checkpoint
    out = tmp_path / f"tiny-{qtype}.gguf"
    counts = rlx.convert_to_gguf(d, out, qtype)
    assert sum(counts.values()) == 2 + 9 * LAYERS, counts
    ids = [vocab["hell"], vocab["o"], vocab["\u0120w"], 17, 200, eot, 3]
    want = hf_forward(weights, ids)
    got = np.asarray(rlx.LLM(str(out), exact=True).logits(ids), dtype=np.float64)
    assert got.shape == want.shape
    assert np.all(np.isfinite(got))
    err = np.max(np.abs(got - want)) / np.max(np.abs(want))
    assert err < tol, f"{qtype}: max |dlogit| / max |logit| = {err:.2e}"


def test_the_converted_tokenizer_applies_the_merges_and_round_trips(checkpoint, tmp_path):
    d, _, vocab, eot = checkpoint
    out = tmp_path / "tiny.gguf"
    rlx.convert_to_gguf(d, out, "F32")
    llm = rlx.LLM(str(out))
    assert llm.tokenize("hello", add_special=False) == [vocab["hell"], vocab["o"]]
    for text in ["hello world", "héllo, wörld 123!", "  spaces\n\ttabs"]:
        assert llm.detokenize(llm.tokenize(text, add_special=False)) == text
    # A special token in the text is its id (and, a control token, renders as nothing, as llama.cpp).
    assert llm.tokenize("a<|endoftext|>b", add_special=False) == [vocab["a"], eot, vocab["b"]]
    f = rlx.load_gguf(str(out))
    assert f.metadata["tokenizer.ggml.eos_token_id"] == eot
    assert f.metadata["llama.attention.head_count_kv"] == KV_HEADS


def test_a_checkpoint_it_cannot_convert_is_an_rlx_error_naming_why(checkpoint, tmp_path):
    d, _, _, _ = checkpoint
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(rlx.Error, match="model_type 'gpt2'"):
        rlx.convert_to_gguf(d, tmp_path / "x.gguf")
    (d / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 1}))
    with pytest.raises(rlx.Error, match="model.layers.1"):
        rlx.convert_to_gguf(d, tmp_path / "x.gguf")
    (d / "config.json").write_text(json.dumps({**cfg, "hidden_size": 32}))
    with pytest.raises(rlx.Error, match="config.json needs"):
        rlx.convert_to_gguf(d, tmp_path / "x.gguf")
    (d / "config.json").unlink()
    with pytest.raises(rlx.Error, match="config.json is missing"):
        rlx.convert_to_gguf(d, tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()
