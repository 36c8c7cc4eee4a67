"""rlx.convert_to_gguf: a Hugging Face Llama checkpoint as a GGUF file (docs/gguf.md).

The directory holds what `save_pretrained` writes: `config.json`, one or more `*.safetensors`, and a BPE
`tokenizer.json` (with `tokenizer_config.json` for the chat template and the special tokens, when present).
Tensors are read with the `safetensors` package and written with the `gguf` package's writer, as f32 (vectors
and every tensor of an f32 file) or f16; a block type (Q8_0, Q4_K, ...) is then made from that file by
rlx.quantize, the same code as `rlx quantize`.

Q and K rows are permuted as llama.cpp's converter does: GGUF's Llama rotates adjacent pairs (x[2i], x[2i+1]),
Hugging Face's the two halves of each head.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any, NoReturn, Optional, Union

import numpy as np

PathLike = Union[str, os.PathLike]

_FLOAT_TYPES = ("F32", "F16")

# Hugging Face's tensor names -> GGUF's (per layer, after "model.layers.{i}.").
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}


def _fail(message: str) -> "NoReturn":
    """A checkpoint this converter cannot write: rlx.Error naming the file and the field."""
    from . import _C

    raise _C.Error(message)


def _read_json(path: Path, required: bool = True) -> dict:
    if not path.exists():
        if required:
            _fail(f"convert_to_gguf: {path} is missing")
        return {}
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        _fail(f"convert_to_gguf: {path} is not valid JSON: {e}")


def _need(config: dict, key: str, source: Path) -> Any:
    if key not in config:
        _fail(f"convert_to_gguf: {source} has no '{key}'")
    return config[key]


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
    """Each head's rows from Hugging Face's half-split rotary order into GGUF's interleaved pairs."""
    rows = w.shape[0]
    if rows % (2 * heads):
        _fail(f"convert_to_gguf: {rows} rows do not split into {heads} heads of pairs")
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _read_tensors(directory: Path) -> dict:
    try:
        from safetensors import safe_open
    except ImportError:  # pragma: no cover - the bootstrap installs it
        _fail("convert_to_gguf needs the 'safetensors' package (scripts/bootstrap.sh installs it)")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        _fail(f"convert_to_gguf: no *.safetensors file in {directory}")
    tensors = {}
    for path in files:
        with safe_open(str(path), framework="numpy") as f:
            for name in f.keys():
                if name in tensors:
                    _fail(f"convert_to_gguf: tensor '{name}' is in two files (the second: {path})")
                tensors[name] = f.get_tensor(name)
    return tensors


def _pre_tokenizer(tok: dict) -> str:
    """tokenizer.ggml.pre for the pre-tokenizer tokenizer.json describes (docs/llm.md lists the variants)."""
    text = json.dumps(tok.get("pre_tokenizer") or {})
    if "individual_digits" in text and '"Digits"' in text:
        return "smollm"
    if r"\\p{N}{1,3}" in text:
        return "llama-bpe"
    if r"\\p{N}" in text and "(?i:'s|'t|'re|'ve|'m|'ll|'d)" in text:
        return "qwen2"
    return "default"


def _tokenizer(directory: Path, vocab_size: int, config: dict) -> dict:
    source = directory / "tokenizer.json"
    tok = _read_json(source)
    model = tok.get("model") or {}
    if model.get("type") != "BPE":
        _fail(f"convert_to_gguf: {source}: model.type is {model.get('type')!r}; "
                           "this converter writes BPE tokenizers (tokenizer.ggml.model = gpt2)")
    vocab = dict(model.get("vocab") or {})
    specials = set()
    for added in tok.get("added_tokens") or []:
        vocab[added["content"]] = added["id"]
        if added.get("special"):
            specials.add(added["id"])
    if not vocab:
        _fail(f"convert_to_gguf: {source} has an empty vocabulary")
    n = max(vocab.values()) + 1
    if n > vocab_size:
        _fail(f"convert_to_gguf: {source} has token id {n - 1}, past the embedding's {vocab_size} rows")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [5] * vocab_size  # unused, until a token claims the id
    for piece, i in vocab.items():
        tokens[i] = piece
        types[i] = 3 if i in specials else 1  # control, normal
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges") or []]
    tok_config = _read_json(directory / "tokenizer_config.json", required=False)

    def token_id(key: str) -> Optional[int]:
        v = tok_config.get(key)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str) and v in vocab:
            return vocab[v]
        cid = config.get(f"{key}_id")
        return cid if isinstance(cid, int) else None

    return {"tokens": tokens, "types": types, "merges": merges, "pre": _pre_tokenizer(tok),
            "bos": token_id("bos_token"), "eos": token_id("eos_token"), "pad": token_id("pad_token"),
            "template": tok_config.get("chat_template")}


def convert_to_gguf(safetensors_dir: PathLike, out_path: PathLike, qtype: str = "F16") -> dict:
    """Writes the Hugging Face Llama checkpoint in `safetensors_dir` to `out_path` as GGUF with its weights in
    `qtype` (F32, F16, or a block type such as Q8_0, Q4_0, Q4_K); returns the tensor count per type.

    Raises rlx.Error naming the file and field for a checkpoint it cannot convert: another
    architecture, rope scaling, a tensor it does not know, a shape that disagrees with config.json.
    """
    import gguf

    from . import _C

    directory = Path(safetensors_dir)
    source = directory / "config.json"
    config = _read_json(source)
    arch = config.get("architectures") or []
    if config.get("model_type") != "llama" and "LlamaForCausalLM" not in arch:
        _fail(f"convert_to_gguf: {source}: model_type {config.get('model_type')!r} / architectures "
                           f"{arch}: this converter writes the Llama layout")
    if config.get("rope_scaling"):
        _fail(f"convert_to_gguf: {source}: rope_scaling {config['rope_scaling']} is not supported")
    qtype = qtype.upper()
    embd = int(_need(config, "hidden_size", source))
    layers = int(_need(config, "num_hidden_layers", source))
    heads = int(_need(config, "num_attention_heads", source))
    kv_heads = int(config.get("num_key_value_heads") or heads)
    ff = int(_need(config, "intermediate_size", source))
    head_dim = int(config.get("head_dim") or embd // heads)
    if head_dim * heads != embd:
        _fail(f"convert_to_gguf: {source}: head_dim {head_dim} x {heads} heads != hidden_size {embd}")

    hf = _read_tensors(directory)
    vocab = int(config.get("vocab_size") or hf["model.embed_tokens.weight"].shape[0])
    tied = bool(config.get("tie_word_embeddings", "lm_head.weight" not in hf))
    expected = {"token_embd.weight": (vocab, embd), "output_norm.weight": (embd,)}
    if not tied:
        expected["output.weight"] = (vocab, embd)
    per_layer = {"attn_norm.weight": (embd,), "attn_q.weight": (heads * head_dim, embd),
                 "attn_k.weight": (kv_heads * head_dim, embd), "attn_v.weight": (kv_heads * head_dim, embd),
                 "attn_output.weight": (embd, heads * head_dim), "ffn_norm.weight": (embd,),
                 "ffn_gate.weight": (ff, embd), "ffn_up.weight": (ff, embd), "ffn_down.weight": (embd, ff)}
    for i in range(layers):
        expected.update({f"blk.{i}.{k}": v for k, v in per_layer.items()})

    out = {}
    layer_re = re.compile(r"model\.layers\.(\d+)\.(.+)")
    for name, w in hf.items():
        if name.endswith("rotary_emb.inv_freq") or (tied and name == "lm_head.weight"):
            continue
        m = layer_re.fullmatch(name)
        target = f"blk.{m.group(1)}.{_LAYER_NAMES.get(m.group(2), '?')}" if m else _GLOBAL_NAMES.get(name)
        if target is None or target not in expected:
            _fail(f"convert_to_gguf: tensor '{name}' is not part of a {layers}-layer Llama")
        if tuple(w.shape) != expected[target]:
            _fail(f"convert_to_gguf: tensor '{name}' is {list(w.shape)}, config.json needs "
                               f"{list(expected[target])}")
        w = np.asarray(w, dtype=np.float32)
        if target.endswith("attn_q.weight"):
            w = _permute(w, heads)
        elif target.endswith("attn_k.weight"):
            w = _permute(w, kv_heads)
        out[target] = w
    missing = sorted(set(expected) - set(out))
    if missing:
        _fail(f"convert_to_gguf: {directory} lacks {len(missing)} tensors, e.g. {missing[0]}")

    tok = _tokenizer(directory, vocab, config)
    out_path = Path(out_path)
    block = qtype not in _FLOAT_TYPES
    with tempfile.TemporaryDirectory(dir=out_path.parent) as tmp:
        float_path = Path(tmp) / "f.gguf" if block else out_path
        w = gguf.GGUFWriter(str(float_path), "llama")
        w.add_name(config.get("_name_or_path") or directory.name)
        w.add_context_length(int(config.get("max_position_embeddings", 2048)))
        w.add_embedding_length(embd)
        w.add_block_count(layers)
        w.add_feed_forward_length(ff)
        w.add_head_count(heads)
        w.add_head_count_kv(kv_heads)
        w.add_rope_dimension_count(head_dim)
        w.add_rope_freq_base(float(config.get("rope_theta", 10000.0)))
        w.add_layer_norm_rms_eps(float(config.get("rms_norm_eps", 1e-5)))
        w.add_file_type(0 if qtype == "F32" or block else 1)
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(tok["pre"])
        w.add_token_list(tok["tokens"])
        w.add_token_types(tok["types"])
        w.add_token_merges(tok["merges"])
        for key, adder in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("pad", w.add_pad_token_id)):
            if tok[key] is not None:
                adder(tok[key])
        if isinstance(tok["template"], str):
            w.add_chat_template(tok["template"])
        for name, t in out.items():
            half = qtype == "F16" and t.ndim == 2
            w.add_tensor(name, t.astype(np.float16) if half else t)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        if block:
            return dict(_C.quantize(str(float_path), str(out_path), qtype))
    counts: dict = {}
    for t in gguf.GGUFReader(str(out_path)).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts
