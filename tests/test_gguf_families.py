"""GGUF files of every family that has a GGUF architecture (qwen2, gemma2, phi3, gpt2; llama in
tests/test_gguf.py): a random small transformers model of each family is written with ``gguf.GGUFWriter`` as
llama.cpp's converter writes it (its tensor names and metadata keys, Gemma's 1 folded into the norms, Phi-3's
fused attn_qkv and ffn_up, GPT-2's Conv1D weights transposed), then read by attnlab and by transformers
(which dequantizes GGUF): logits and attention weights within 1e-5. In F32 and in Q8_0, Q4_0, Q4_1 and a K
type; ``quantized=True`` keeps the weights in their types, its logits within 1e-5 of the float32 load."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from attnlab.models import load_model  # noqa: E402
from attnlab.stack.transformer import forward, new_caches  # noqa: E402

Q = gguf.GGMLQuantizationType


def sibling(name: str):
    """A test module beside this one, by path (the tests are not a package)."""
    spec = importlib.util.spec_from_file_location(f"_{name}", Path(__file__).with_name(f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BPE = sibling("test_gguf")                       # its byte-level vocabulary: TOKENS, MERGES, TYPES

# A small SentencePiece vocabulary as llama.cpp's converter writes one: <unk>, <s>, </s>, the 256 byte tokens,
# then pieces by score (the best first), a user-defined and two control tokens of a chat format (llama.cpp
# looks <|endoftext|> up in a file named Phi-3).
SPM_PIECES = (["▁", "t", "h", "e", "c", "a", "s", "i", "n", "o", "r", "d", "m", "l", "é", "1", "2", "3", ",", ".",
               "!", "'", "-", "T", "H", "W", "w", "u", "y", "g"]
              + ["▁t", "he", "▁the", "▁c", "at", "▁cat", "▁s", "▁sat", "in", "▁in", "er", "on", "▁on", "12", "▁1",
                 "▁12", "▁▁", "▁▁▁▁", "▁T", "▁The", "ll", "▁He", "▁Hell", "▁Hello", "or", "▁w", "▁wor", "▁world",
                 "▁W", "▁World", "▁ma", "▁mat", "ma", "ed", "▁red", "ing", "éd", "th", "the"])
SPM_TOKENS = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES + ["<|user|>", "<|end|>",
                                                                                      "<|endoftext|>"]
SPM_TYPES = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [4, 3, 3]
SPM_SCORES = [0.0, 0.0, 0.0] + [0.0] * 256 + [-float(i) for i in range(len(SPM_PIECES))] + [0.0, 0.0, 0.0]


def write_tokenizer(w, kind: str, *, space_prefix: bool | None = None) -> int:
    """The vocabulary of ``kind`` ("gpt2" byte-level, "llama" SentencePiece) into the writer; its size.
    ``space_prefix``: ``tokenizer.ggml.add_space_prefix`` (False in Gemma's files; absent: llama.cpp's True)."""
    if kind == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2")
        w.add_token_list(BPE.TOKENS)
        w.add_token_types(BPE.TYPES)
        w.add_token_merges(BPE.MERGES)
        w.add_bos_token_id(len(BPE.TOKENS) - 2)
        w.add_eos_token_id(len(BPE.TOKENS) - 1)
        return len(BPE.TOKENS)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(SPM_TOKENS)
    w.add_token_scores(SPM_SCORES)
    w.add_token_types(SPM_TYPES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    if space_prefix is not None:
        w.add_add_space_prefix(space_prefix)
    w.add_chat_template("{{ bos_token }}{% for m in messages %}<|user|>{{ m.content }}<|end|>{% endfor %}")
    return len(SPM_TOKENS)


def qwen2_tensors(sd: dict, cfg) -> dict:
    """llama.cpp's names for a Qwen2 state dict; q and k rows left in rotate_half's layout (NeoX RoPE)."""
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"]}
    if "lm_head.weight" in sd and not cfg.tie_word_embeddings:
        out["output.weight"] = sd["lm_head.weight"]
    parts = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
             "self_attn.qkv_proj": "attn_qkv", "mlp.gate_up_proj": "ffn_up", "self_attn.q_norm": "attn_q_norm",
             "self_attn.k_norm": "attn_k_norm"}
    for i in range(cfg.num_hidden_layers):
        for hf, cpp in parts.items():
            for leaf in ("weight", "bias"):
                if f"model.layers.{i}.{hf}.{leaf}" in sd:
                    out[f"blk.{i}.{cpp}.{leaf}"] = sd[f"model.layers.{i}.{hf}.{leaf}"]
    return out


def gemma2_tensors(sd: dict, cfg) -> dict:
    """Gemma-2's: the sandwich's norms renamed (post_attention_layernorm is the attention's second norm), and
    Gemma's 1 added to every norm weight, as llama.cpp's converter does."""
    sd = {k.replace("post_attention_layernorm", "POST_ATTN"): v for k, v in sd.items()}
    out = qwen2_tensors(sd, cfg)
    for i in range(cfg.num_hidden_layers):
        out[f"blk.{i}.post_attention_norm.weight"] = sd[f"model.layers.{i}.POST_ATTN.weight"]
    out.pop("output.weight", None)
    return {k: v + 1 if k.endswith("norm.weight") else v for k, v in out.items()}


def gpt2_tensors(sd: dict, cfg) -> dict:
    """GPT-2's: Conv1D weights transposed into a Linear's (d_out, d_in), ``lm_head`` as ``output``."""
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"token_embd.weight": sd["wte.weight"], "position_embd.weight": sd["wpe.weight"],
           "output_norm.weight": sd["ln_f.weight"], "output_norm.bias": sd["ln_f.bias"]}
    if "lm_head.weight" in sd:
        out["output.weight"] = sd["lm_head.weight"]
    parts = {"ln_1": "attn_norm", "attn.c_attn": "attn_qkv", "attn.c_proj": "attn_output", "ln_2": "ffn_norm",
             "mlp.c_fc": "ffn_up", "mlp.c_proj": "ffn_down"}
    for i in range(cfg.n_layer):
        for hf, cpp in parts.items():
            w = sd[f"h.{i}.{hf}.weight"]
            out[f"blk.{i}.{cpp}.weight"] = w if hf.startswith("ln") else w.T
            out[f"blk.{i}.{cpp}.bias"] = sd[f"h.{i}.{hf}.bias"]
    return out


def common_meta(cfg) -> dict:
    d_head = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "rope.freq_base": 10000.0,
            "attention.key_length": d_head, "attention.value_length": d_head, "rope.dimension_count": d_head}


def qwen2_meta(cfg) -> dict:
    return common_meta(cfg)


def gemma2_meta(cfg) -> dict:
    return common_meta(cfg) | {"attention.sliding_window": cfg.sliding_window,
                               "attn_logit_softcapping": float(cfg.attn_logit_softcapping),
                               "final_logit_softcapping": float(cfg.final_logit_softcapping)}


def gemma3_meta(cfg) -> dict:
    return common_meta(cfg) | {"attention.sliding_window": cfg.sliding_window, "rope.freq_base": 1_000_000.0}


def phi3_meta(cfg) -> dict:
    d_head = cfg.hidden_size // cfg.num_attention_heads
    factor = (cfg.rope_parameters or {}).get("partial_rotary_factor", 1.0)
    return common_meta(cfg) | {"rope.dimension_count": int(factor * cfg.hidden_size) // cfg.num_attention_heads,
                               "attention.sliding_window": 0, "attention.key_length": d_head}


def gpt2_meta(cfg) -> dict:
    return {"block_count": cfg.n_layer, "context_length": cfg.n_positions, "embedding_length": cfg.n_embd,
            "feed_forward_length": 4 * cfg.n_embd, "attention.head_count": cfg.n_head,
            "attention.layer_norm_epsilon": float(cfg.layer_norm_epsilon)}


FAMILIES = {"qwen2": ("gpt2", qwen2_tensors, qwen2_meta), "gemma2": ("llama", gemma2_tensors, gemma2_meta),
            "phi3": ("llama", qwen2_tensors, phi3_meta), "gpt2": ("gpt2", gpt2_tensors, gpt2_meta),
            "qwen3": ("gpt2", qwen2_tensors, qwen2_meta), "gemma3": ("llama", gemma2_tensors, gemma3_meta)}


def hf_model(family: str, vocab: int, *, tied=True, partial=1.0, d_model=64, d_mlp=96, seed=0):
    """A random small transformers model of ``family`` (float32, eager attention), its norms not all 1."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=d_model, intermediate_size=d_mlp, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if family == "qwen2":
        cfg = transformers.Qwen2Config(**common)
    elif family == "gemma2":
        cfg = transformers.Gemma2Config(**common, head_dim=16, query_pre_attn_scalar=16, sliding_window=8)
    elif family == "qwen3":
        cfg = transformers.Qwen3Config(**common, head_dim=16)
    elif family == "gemma3":           # six layers: five local (window 8, base 10,000), one global (1,000,000)
        cfg = transformers.Gemma3TextConfig(**dict(common, num_hidden_layers=6), head_dim=16, query_pre_attn_scalar=16,
                                            sliding_window=8)
    elif family == "phi3":
        cfg = transformers.Phi3Config(**common, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                                 "partial_rotary_factor": partial})
    else:
        cfg = transformers.GPT2Config(vocab_size=vocab, n_positions=128, n_embd=d_model, n_layer=2, n_head=4,
                                      tie_word_embeddings=tied, bos_token_id=None, eos_token_id=None)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:
                p.copy_(torch.randn_like(p) * 0.1 + (0.0 if family.startswith("gemma") or "bias" in name else 1.0))
            else:
                p.copy_(torch.randn_like(p) * 0.2)
    return model.eval()


def k_blocks(w: np.ndarray, t) -> np.ndarray:
    """A K type's bytes for ``w``: gguf has no K quantizer, so tests/test_quantized.py's random blocks."""
    return sibling("test_quantized").encoded(w, t)


def write_family_gguf(path, family: str, model, qtype=Q.F32) -> Path:
    """``model`` written as llama.cpp writes a file of ``family``: metadata, vocabulary, tensors (2-D ones in
    ``qtype``; 1-D ones, norms and biases, in F32, as llama.cpp's converter keeps them)."""
    kind, tensors, meta = FAMILIES[family]
    w = gguf.GGUFWriter(str(path), family)
    write_tokenizer(w, kind, space_prefix=False if family == "gemma2" else None)
    for key, value in meta(model.config).items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{family}.{key}", value)
    for name, t in tensors({k: v.detach().numpy() for k, v in model.state_dict().items()}, model.config).items():
        arr = np.ascontiguousarray(t, np.float32)
        if arr.ndim == 1 or qtype == Q.F32:
            w.add_tensor(name, arr)
        elif qtype in (Q.Q4_K, Q.Q6_K):
            w.add_tensor(name, k_blocks(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def transformers_reads(path, ids, **config):
    """transformers' logits and attention weights for ``ids`` from the GGUF file (float32, eager);
    ``config``: fields the file does not state, set as attnlab reads them (Gemma-2's query_pre_attn_scalar)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    cfg = transformers.AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
    for key, value in config.items():
        setattr(cfg, key, value)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, config=cfg,
                                                           attn_implementation="eager", dtype=torch.float32)
    with torch.no_grad():
        out = hf(torch.tensor(ids)[None], output_attentions=True)
    return out.logits[0].numpy(), [a[0].numpy() for a in out.attentions]


def source_reads(model, ids):
    """The transformers model the file was written from: its logits and attention weights for ``ids``."""
    import torch

    with torch.no_grad():
        out = model(torch.tensor(ids)[None], output_attentions=True)
    return out.logits[0].numpy(), [a[0].numpy() for a in out.attentions]


def rel(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


FLOAT_CASES = {
    "qwen2 tied": ("qwen2", {}), "qwen2 untied": ("qwen2", {"tied": False}),
    "gemma2": ("gemma2", {}),
    "phi3 untied": ("phi3", {"tied": False}), "phi3 partial rotary": ("phi3", {"partial": 0.5}),
    "gpt2": ("gpt2", {}), "gpt2 with output.weight": ("gpt2", {"tied": False}),
    "qwen3": ("qwen3", {}), "gemma3": ("gemma3", {}),
}
# what transformers takes from no GGUF key: Gemma-2's query_pre_attn_scalar (2B/9B's is head_dim, as llama.cpp
# has it), Phi-3's pad id (its config's default, 32000, lies past these vocabularies), GPT-2's n_positions
# (transformers reads gpt2.context_length into n_ctx, which GPT2Config no longer uses), Qwen3's head_dim (it reads
# no qwen3.attention.key_length)
EXTRA = {"gemma2": {"query_pre_attn_scalar": 16}, "gemma3": {"query_pre_attn_scalar": 16}, "phi3": {"pad_token_id": None},
         "gpt2": {"n_positions": 128}, "qwen3": {"head_dim": 16}}


@pytest.mark.parametrize("case", FLOAT_CASES, ids=list(FLOAT_CASES))
def test_a_family_gguf_matches_transformers_reading_the_same_file(tmp_path, case):
    family, kwargs = FLOAT_CASES[case]
    vocab = len(BPE.TOKENS) if FAMILIES[family][0] == "gpt2" else len(SPM_TOKENS)
    model = hf_model(family, vocab, **kwargs)
    path = write_family_gguf(tmp_path / f"{family}.gguf", family, model)
    ids = np.random.default_rng(1).integers(3, vocab - 2, 40)                      # (40,) past gemma2's window 8
    ours, _ = load_model(path)
    assert ours.config.family == family and ours.config.n_layers == model.config.num_hidden_layers
    out = forward(ours, ids, return_weights=True)
    source, source_weights = source_reads(model, ids)
    assert rel(out.logits, source) < 1e-5                                          # the file says the model
    assert max(np.abs(a - b).max() for a, b in zip(out.attentions, source_weights)) < 1e-5
    if family == "phi3" and kwargs.get("partial", 1.0) < 1:
        return    # transformers reads no rope.dimension_count from a phi3 GGUF: it would turn every feature
    ref, ref_weights = transformers_reads(path, ids, **EXTRA.get(family, {}))
    assert rel(out.logits, ref) < 1e-5
    assert max(np.abs(a - b).max() for a, b in zip(out.attentions, ref_weights)) < 1e-5


QUANT_CASES = {
    "qwen2 Q8_0": ("qwen2", Q.Q8_0, {}), "gemma2 Q4_0": ("gemma2", Q.Q4_0, {}),
    "phi3 Q4_1": ("phi3", Q.Q4_1, {"tied": False}), "gpt2 Q8_0": ("gpt2", Q.Q8_0, {}),
    "qwen2 Q4_K": ("qwen2", Q.Q4_K, {"d_model": 256, "d_mlp": 256}),
    "phi3 Q6_K": ("phi3", Q.Q6_K, {"d_model": 256, "d_mlp": 256}),
    "qwen3 Q4_0": ("qwen3", Q.Q4_0, {}), "gemma3 Q8_0": ("gemma3", Q.Q8_0, {}),
}


@pytest.mark.parametrize("case", QUANT_CASES, ids=list(QUANT_CASES))
def test_quantized_family_files_keep_their_types(tmp_path, case):
    """The float32 load matches transformers dequantizing the same file; ``quantized=True`` keeps every weight
    of a kernel type in it, and its logits (a prefill, then decode steps) equal the float32 load's within 1e-5."""
    pytest.importorskip("numba")
    from attnlab.kernels.quantized import QuantizedMatrix

    family, qtype, kwargs = QUANT_CASES[case]
    vocab = len(BPE.TOKENS) if FAMILIES[family][0] == "gpt2" else len(SPM_TOKENS)
    model = hf_model(family, vocab, **kwargs)
    path = write_family_gguf(tmp_path / f"{family}.gguf", family, model, qtype)
    ids = np.random.default_rng(2).integers(3, vocab - 2, 24)                      # (24,)
    exact, _ = load_model(path)
    quant, _ = load_model(path, quantized=True)
    assert isinstance(quant.blocks[1].mlp.W_out, QuantizedMatrix)
    assert isinstance(quant.blocks[0].attn.W_Q, QuantizedMatrix)
    assert isinstance(exact.blocks[1].mlp.W_out, np.ndarray)
    logits = forward(exact, ids).logits
    assert rel(forward(quant, ids).logits, logits) < 1e-5
    cq, ce = new_caches(quant, 32), new_caches(exact, 32)
    forward(quant, ids, caches=cq), forward(exact, ids, caches=ce)
    for t in (5, 77):
        assert rel(forward(quant, [t], caches=cq).logits, forward(exact, [t], caches=ce).logits) < 1e-5
    ref, _ = transformers_reads(path, ids, **EXTRA.get(family, {}))
    assert rel(logits, ref) < 1e-5


def test_a_chat_on_a_sentencepiece_file_starts_with_one_bos(tmp_path):
    """The file's template writes ``{{ bos_token }}`` and its vocabulary adds bos too (SentencePiece's
    default): the first turn starts with one bos, as transformers' apply_chat_template has it."""
    pytest.importorskip("jinja2")
    from attnlab.stack.chat import Chat

    path = write_family_gguf(tmp_path / "phi3.gguf", "phi3", hf_model("phi3", len(SPM_TOKENS)))
    model, tok = load_model(path)
    assert tok.chat_template.startswith("{{ bos_token }}")
    ids = Chat(model, tok).prompt_ids("the cat").tolist()
    ID = {t: i for i, t in enumerate(SPM_TOKENS)}
    assert ids == [ID["<s>"], ID["<|user|>"], ID["▁the"], ID["▁cat"], ID["<|end|>"]]


# gpt-oss (llama.cpp's architecture "gpt-oss"): sinks, alternating windows, YaRN, and the experts, whose gate and
# up rows llama.cpp's converter takes apart from transformers' interleaved gate_up_proj
OSS_YARN = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 8.0, "original_max_position_embeddings": 64,
            "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False}


def gpt_oss_model(vocab: int, *, d_expert=32, seed=0):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.GptOssConfig(vocab_size=vocab, hidden_size=64, intermediate_size=d_expert, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_local_experts=4,
                                    num_experts_per_tok=2, sliding_window=6, max_position_embeddings=512,
                                    rope_parameters=OSS_YARN, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = transformers.GptOssForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith(("bias", "sinks")):
                p.add_((1.0 if name.endswith("sinks") else 0.2) * torch.randn_like(p))
            elif "experts" in name or "router" in name:
                p.normal_(0, 0.3)
    return model


def gpt_oss_tensors(sd: dict, cfg) -> dict:
    out = {"token_embd.weight": sd["model.embed_tokens.weight"], "output_norm.weight": sd["model.norm.weight"],
           "output.weight": sd["lm_head.weight"]}
    for i in range(cfg.num_hidden_layers):
        p, b = f"model.layers.{i}", f"blk.{i}"
        out |= {f"{b}.attn_norm.weight": sd[f"{p}.input_layernorm.weight"],
                f"{b}.post_attention_norm.weight": sd[f"{p}.post_attention_layernorm.weight"],
                f"{b}.attn_sinks.weight": sd[f"{p}.self_attn.sinks"],
                f"{b}.ffn_gate_inp.weight": sd[f"{p}.mlp.router.weight"],
                f"{b}.ffn_gate_inp.bias": sd[f"{p}.mlp.router.bias"]}
        for hf, cpp in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
            for leaf in ("weight", "bias"):
                out[f"{b}.{cpp}.{leaf}"] = sd[f"{p}.self_attn.{hf}.{leaf}"]
        gate_up = sd[f"{p}.mlp.experts.gate_up_proj"].transpose(0, 2, 1)                 # (E, 2·m, d)
        bias = sd[f"{p}.mlp.experts.gate_up_proj_bias"]                                  # (E, 2·m)
        out |= {f"{b}.ffn_gate_exps.weight": gate_up[:, ::2], f"{b}.ffn_up_exps.weight": gate_up[:, 1::2],
                f"{b}.ffn_gate_exps.bias": bias[:, ::2], f"{b}.ffn_up_exps.bias": bias[:, 1::2],
                f"{b}.ffn_down_exps.weight": sd[f"{p}.mlp.experts.down_proj"].transpose(0, 2, 1),   # (E, d, m)
                f"{b}.ffn_down_exps.bias": sd[f"{p}.mlp.experts.down_proj_bias"]}
    return out


def gpt_oss_meta(cfg) -> dict:
    y = cfg.rope_parameters
    return {"block_count": cfg.num_hidden_layers, "context_length": cfg.max_position_embeddings,
            "embedding_length": cfg.hidden_size, "feed_forward_length": cfg.intermediate_size,
            "attention.head_count": cfg.num_attention_heads, "attention.head_count_kv": cfg.num_key_value_heads,
            "attention.layer_norm_rms_epsilon": float(cfg.rms_norm_eps), "rope.freq_base": float(y["rope_theta"]),
            "attention.key_length": cfg.head_dim, "attention.value_length": cfg.head_dim,
            "expert_count": cfg.num_local_experts, "expert_used_count": cfg.num_experts_per_tok,
            "expert_feed_forward_length": cfg.intermediate_size, "attention.sliding_window": cfg.sliding_window,
            "rope.scaling.type": "yarn", "rope.scaling.factor": float(y["factor"]),
            "rope.scaling.original_context_length": y["original_max_position_embeddings"],
            "rope.scaling.yarn_beta_fast": float(y["beta_fast"]), "rope.scaling.yarn_beta_slow": float(y["beta_slow"])}


def write_gpt_oss_gguf(path, model, qtype=Q.F32, experts=Q.F32) -> Path:
    """As llama.cpp's converter writes gpt-oss: 2-D weights in ``qtype``, the experts in ``experts`` (MXFP4 in
    the released files), biases (the experts' are 2-D) and norms in F32."""
    w = gguf.GGUFWriter(str(path), "gpt-oss")
    write_tokenizer(w, "gpt2")
    for key, value in gpt_oss_meta(model.config).items():
        (w.add_float32 if isinstance(value, float) else w.add_string if isinstance(value, str) else w.add_uint32)(
            f"gpt-oss.{key}", value)
    for name, t in gpt_oss_tensors({k: v.detach().numpy() for k, v in model.state_dict().items()},
                                   model.config).items():
        arr = np.ascontiguousarray(t, np.float32)
        kind = experts if "_exps.weight" in name else qtype if arr.ndim == 2 and name.endswith(".weight") else Q.F32
        w.add_tensor(name, arr) if kind == Q.F32 else w.add_tensor(name, gguf.quants.quantize(arr, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("qtype, experts", [(Q.F32, Q.F32), (Q.Q8_0, Q.F32), (Q.F32, Q.MXFP4), (Q.Q8_0, Q.MXFP4)])
def test_a_gpt_oss_gguf_matches_the_model_it_was_written_from(tmp_path, qtype, experts):
    """transformers reads no llama.cpp gpt-oss file (its GGUF reader expects other expert names), so the
    reference is the transformers model the file was written from, its weights put through the same
    quantization (MXFP4 by gguf.quants): logits and attention weights within 1e-5, past the window of 6."""
    import torch

    model = gpt_oss_model(len(BPE.TOKENS))
    path = write_gpt_oss_gguf(tmp_path / "oss.gguf", model, qtype, experts)
    if (qtype, experts) != (Q.F32, Q.F32):    # the reference gets the file's values: dequantized from the file
        reader = gguf.GGUFReader(str(path))
        back = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
        names = gpt_oss_tensors({k: v.detach().numpy() for k, v in model.state_dict().items()}, model.config)
        assert set(back) == set(names)
        sd = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
        for i in range(2):
            p, b = f"model.layers.{i}", f"blk.{i}"
            gate, up = back[f"{b}.ffn_gate_exps.weight"], back[f"{b}.ffn_up_exps.weight"]      # (E, m, d)
            gate_up = np.empty((gate.shape[0], 2 * gate.shape[1], gate.shape[2]), np.float32)
            gate_up[:, ::2], gate_up[:, 1::2] = gate, up
            sd[f"{p}.mlp.experts.gate_up_proj"] = gate_up.transpose(0, 2, 1)
            sd[f"{p}.mlp.experts.down_proj"] = back[f"{b}.ffn_down_exps.weight"].transpose(0, 2, 1)
            for hf, cpp in (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output")):
                sd[f"{p}.self_attn.{hf}.weight"] = back[f"{b}.{cpp}.weight"]
            sd[f"{p}.mlp.router.weight"] = back[f"{b}.ffn_gate_inp.weight"]
        sd["model.embed_tokens.weight"], sd["lm_head.weight"] = back["token_embd.weight"], back["output.weight"]
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in sd.items()})
    ids = np.random.default_rng(3).integers(0, len(BPE.TOKENS) - 2, 30)                # (30,)
    ours, tok = load_model(path)
    assert ours.config.family == "gpt_oss" and ours.config.experts.n_experts == 4
    assert [c.window for c in ours.config.layers] == [6, None]
    out = forward(ours, ids, return_weights=True)
    ref, ref_weights = source_reads(model, ids)
    assert rel(out.logits, ref) < 1e-5
    assert max(np.abs(a - b).max() for a, b in zip(out.attentions, ref_weights)) < 1e-5
    if qtype != Q.F32:
        pytest.importorskip("numba")
        from attnlab.kernels.quantized import QuantizedMatrix

        quant, _ = load_model(path, quantized=True)
        assert isinstance(quant.blocks[0].attn.W_Q, QuantizedMatrix)     # Q8_0 kept; MXFP4 experts: float32
        assert rel(forward(quant, ids).logits, out.logits) < 1e-5


# llama.cpp's own forward pass on the same files (llama-cpp-python, F32 KV cache, no flash attention). Where it
# computes what attnlab does, 1e-5; two known departures, measured: its GELU reads a float16 table (Gemma-2,
# Gemma-3, GPT-2: 2e-4 to 4e-4 relative), and it floors and ceils the ends of gpt-oss's YaRN ramp, which
# gpt-oss's own code and transformers do not (5e-4; attnlab with the ramp truncated gives 7e-7)
LLAMA_CPP_TOLERANCE = {"qwen2": 1e-5, "qwen3": 1e-5, "phi3": 1e-5, "gemma2": 1e-3, "gemma3": 1e-3, "gpt2": 1e-3,
                       "gpt-oss": 1e-3}


@pytest.mark.parametrize("family", list(LLAMA_CPP_TOLERANCE))
def test_logits_against_llama_cpp_on_the_same_file(tmp_path, family):
    llama_cpp = pytest.importorskip("llama_cpp")
    if family == "gpt-oss":
        vocab = len(BPE.TOKENS)
        path = write_gpt_oss_gguf(tmp_path / "oss.gguf", gpt_oss_model(vocab))
    else:
        vocab = len(BPE.TOKENS) if FAMILIES[family][0] == "gpt2" else len(SPM_TOKENS)
        path = write_family_gguf(tmp_path / f"{family}.gguf", family, hf_model(family, vocab))
    ids = np.random.default_rng(1).integers(3, vocab - 2, 40)                      # (40,)
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, type_k=0, type_v=0,
                          flash_attn=False, n_threads=1)                            # 0: GGML_TYPE_F32
    llm.eval([int(i) for i in ids])
    theirs = np.array(llm.scores[:len(ids)], np.float32)                            # (40, vocab)
    ours, _ = load_model(path)
    assert rel(forward(ours, ids).logits, theirs) < LLAMA_CPP_TOLERANCE[family]
