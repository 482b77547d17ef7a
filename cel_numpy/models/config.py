"""ModelConfig: the few numbers that decide the shape of a GPT-2, Llama or Qwen2 transformer.

One frozen dataclass drives the one forward in `transformer.py`. The two families differ in:

    family   norm       positions           MLP                  attention       unembedding
    gpt2     LayerNorm  learned W_pos       GELU-tanh, biases    H heads, biases  tied to W_E
    llama    RMSNorm    rotary (half-split) SwiGLU (W_gate)      G <= H kv-heads  tied or not

Qwen2 is the llama family with biases on the query, key and value projections (none on the
output projection): `qkv_bias=True`, `arch="qwen2"`. Everything else (RMSNorm, rotate-half
rotary, SwiGLU, grouped-query attention) is Llama's.

Gemma 3 (`arch="gemma3"`) is the llama family with six changes, each a field here:
  embed_scale     the embedding is multiplied by sqrt(D) on the way in (not on the way out)
  query_scale     scores are q.k * query_scale^-1/2 (Gemma's query_pre_attn_scalar)
  qk_norm         an RMSNorm over each head's E on q and on k, before rotary
  sandwich_norms  the attention and MLP outputs are RMS-normed again before the residual add
  mlp_act         "gelu_tanh": the gate goes through GELU (tanh form), not SiLU
  local_layers    layers with a sliding window of `sliding_window` keys and rotary base
                  `rope_local_base` (10k); the others attend globally with `rope_base` (1e6)
Gemma's RMSNorm multiplies by (1 + w); we store the multiplier 1 + w itself, so every norm is
the same x / rms(x) * w (GGUF files already hold 1 + w; Hugging Face folders hold w).

Constructors read the configuration of a Hugging Face folder (`from_hf_config`) and the
dictionary that `to_dict` writes (the `.npz` export's `config_json`). GGUF metadata is read in
`gguf_loader.py`.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, fields, replace

from cel_numpy.errors import ConfigError

FAMILIES = ("gpt2", "llama")
# model_type -> family
HF_ARCHITECTURES = {"gpt2": "gpt2", "llama": "llama", "qwen2": "llama", "gemma3_text": "llama"}
MLP_ACTIVATIONS = ("silu", "gelu_tanh")  # the gate's nonlinearity in a gated MLP


def _required(hf: dict, key: str):
    """hf[key], or a ConfigError naming the missing key."""
    if key not in hf or hf[key] is None:
        raise ConfigError(f"missing key {key!r}")
    return hf[key]


def _count(value, key: str) -> int:
    """A positive integer read from config.json (checked before any arithmetic on it)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    return value


MAX_SIZE = 2**40  # no dimension, layer count or vocabulary of a real model comes near


def _shown(value) -> str:
    """repr, with an enormous integer shortened to its leading digits and length."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:12]}... ({len(text)} digits)"


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "gpt2" | "llama"
    n_layers: int  # L
    n_heads: int  # H query heads
    n_kv_heads: int  # G key/value heads (H for GPT-2; divides H)
    d_model: int  # D
    d_head: int  # E
    d_mlp: int  # F
    vocab_size: int  # V
    n_ctx: int  # longest sequence the positions support
    norm_eps: float
    rope_base: float = 10000.0  # llama only
    tied_embeddings: bool = True  # W_U = W_E^T
    attn_bias: bool = False  # b_Q, b_K, b_V, b_O present
    qkv_bias: bool = False  # b_Q, b_K, b_V present, no b_O (Qwen2)
    mlp_bias: bool = False  # b_in, b_out (and b_gate) present
    name: str = ""  # free text: where the config came from
    arch: str = ""  # architecture label for display ("qwen2"); the family decides the maths
    # Gemma 3 (module docstring); the defaults are Llama's
    mlp_act: str = "silu"  # gated MLP: act(x W_gate) * (x W_in)
    embed_scale: float = 1.0  # x_0 = W_E[ids] * embed_scale
    query_scale: float | None = None  # scores scaled by query_scale^-1/2; None: d_head
    qk_norm: bool = False  # RMSNorm (E,) weights on q and k: attn.q_norm.w, attn.k_norm.w
    sandwich_norms: bool = False  # ln1_post.w after attention, ln2_post.w after the MLP
    local_layers: tuple[int, ...] = ()  # layers with the sliding window and the local rotary base
    sliding_window: int | None = None  # a local layer's query sees its last sliding_window keys
    rope_local_base: float = 10000.0  # rotary base of the local layers

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ConfigError(
                f"unknown model family {self.family!r}; supported: {', '.join(FAMILIES)}"
            )
        for f in (
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "d_model",
            "d_head",
            "d_mlp",
            "vocab_size",
            "n_ctx",
        ):
            value = getattr(self, f)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{f} must be a positive integer, got {value!r}")
            if value > MAX_SIZE:
                raise ConfigError(f"{f} is {_shown(value)}, larger than any model's (> 2^40)")
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.family == "gpt2":
            if self.n_kv_heads != self.n_heads:
                raise ConfigError(
                    "gpt2 has no grouped-query attention: n_kv_heads must equal n_heads"
                )
            if not self.tied_embeddings:
                raise ConfigError("gpt2 ties its unembedding to W_E (tied_embeddings=True)")
        if self.family == "llama" and self.d_head % 2:
            raise ConfigError(f"rotary needs an even d_head, got {self.d_head}")
        for f in ("norm_eps", "rope_base"):
            value = getattr(self, f)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not 0 < value < math.inf
                or value > 1e300  # float() of a larger int overflows
            ):
                raise ConfigError(f"{f} must be a positive number, got {_shown(value)}")
        # Python floats, not NumPy scalars: a np.float64 eps would promote float32 activations.
        object.__setattr__(self, "norm_eps", float(self.norm_eps))
        object.__setattr__(self, "rope_base", float(self.rope_base))
        self._check_gemma_fields()

    def _check_gemma_fields(self) -> None:
        """The Gemma 3 fields: types, ranges, and that they only appear on the llama family."""
        if self.mlp_act not in MLP_ACTIVATIONS:
            raise ConfigError(f"mlp_act must be one of {MLP_ACTIVATIONS}, got {self.mlp_act!r}")
        for f in ("embed_scale", "query_scale", "rope_local_base"):
            value = getattr(self, f)
            if value is None and f == "query_scale":
                continue
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not 0 < value < 1e300
            ):
                raise ConfigError(f"{f} must be a positive number, got {_shown(value)}")
            object.__setattr__(self, f, float(value))
        if not isinstance(self.local_layers, (tuple, list)):  # a list when read back from JSON
            raise ConfigError(
                f"local_layers must be a list of layer indices, got {self.local_layers!r}"
            )
        layers = tuple(self.local_layers)
        if not all(isinstance(l, int) and not isinstance(l, bool) for l in layers) or any(
            not 0 <= l < self.n_layers for l in layers
        ):
            raise ConfigError(f"local_layers must be layer indices in [0, {self.n_layers})")
        object.__setattr__(self, "local_layers", tuple(sorted(set(layers))))
        if layers and not (
            isinstance(self.sliding_window, int)
            and not isinstance(self.sliding_window, bool)
            and 1 <= self.sliding_window <= MAX_SIZE
        ):
            raise ConfigError(
                f"local_layers need a positive integer sliding_window, got {self.sliding_window!r}"
            )
        gemma = (
            self.mlp_act != "silu"
            or self.embed_scale != 1.0
            or self.query_scale is not None
            or self.qk_norm
            or self.sandwich_norms
            or layers
        )
        if gemma and self.family != "llama":
            raise ConfigError("the Gemma 3 fields apply to the llama family only")

    # ------------------------------------------------------------------ derived

    @property
    def attn_scale(self) -> float:
        """What q.k is multiplied by: 1/sqrt(d_head), or 1/sqrt(query_scale) when set (Gemma)."""
        return 1.0 / math.sqrt(self.d_head if self.query_scale is None else self.query_scale)

    def is_local(self, layer: int) -> bool:
        """True if `layer` attends through the sliding window with the local rotary base."""
        return layer in self.local_layers

    @property
    def group_size(self) -> int:
        """Query heads per key/value head: head h reads kv group h // group_size."""
        return self.n_heads // self.n_kv_heads

    def n_params(self) -> int:
        """Number of distinct parameters (a tied unembedding counted once)."""
        D, E, F, V, H, G = (
            self.d_model,
            self.d_head,
            self.d_mlp,
            self.vocab_size,
            self.n_heads,
            self.n_kv_heads,
        )
        attn = D * E * (2 * H + 2 * G) + (E * (H + 2 * G) + D if self.attn_bias else 0)
        attn += E * (H + 2 * G) if self.qkv_bias and not self.attn_bias else 0
        n_mats = 3 if self.family == "llama" else 2
        mlp = n_mats * D * F + ((n_mats - 1) * F + D if self.mlp_bias else 0)
        norms = 2 * D if self.family == "llama" else 4 * D
        norms += 2 * D if self.sandwich_norms else 0
        norms += 2 * E if self.qk_norm else 0
        per_layer = attn + mlp + norms
        total = V * D + self.n_layers * per_layer + (D if self.family == "llama" else 2 * D)
        if self.family == "gpt2":
            total += self.n_ctx * D
        if not self.tied_embeddings:
            total += D * V
        return total

    # ------------------------------------------------------------------ (de)serialisation

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> ModelConfig:
        """Inverse of `to_dict`; unknown keys are an error (a typo should not pass silently)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown config keys {unknown}; expected some of {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_hf_config(cls, hf: dict, name: str = "") -> ModelConfig:
        """Read a Hugging Face config.json dictionary (GPT-2 or Llama architectures)."""
        if not isinstance(hf, dict):
            raise ConfigError(f"expected a JSON object, got {type(hf).__name__}")
        model_type = hf.get("model_type")
        if not isinstance(model_type, str) or model_type not in HF_ARCHITECTURES:
            archs = hf.get("architectures") or []
            raise ConfigError(
                f"unsupported architecture {str(model_type or archs)!r} in config.json; "
                f"supported model_type: {', '.join(HF_ARCHITECTURES)}"
            )
        read = {"gpt2": _gpt2_from_hf, "qwen2": _qwen2_from_hf, "gemma3_text": _gemma3_from_hf}
        try:
            return read.get(model_type, _llama_from_hf)(hf, name)
        except ConfigError as err:  # say n_layer or num_hidden_layers, as the file does
            raise ConfigError(in_file_terms(str(err), HF_ARCHITECTURES[model_type], hf)) from None


# What a config.json calls the fields ModelConfig checks, per family (where the names differ).
HF_KEYS = {
    "gpt2": {"n_layers": "n_layer", "n_heads": "n_head", "n_kv_heads": "n_head",
             "d_model": "n_embd", "d_mlp": "n_inner", "n_ctx": "n_positions",
             "norm_eps": "layer_norm_epsilon"},
    "llama": {"n_layers": "num_hidden_layers", "n_heads": "num_attention_heads",
              "n_kv_heads": "num_key_value_heads", "d_model": "hidden_size", "d_head": "head_dim",
              "d_mlp": "intermediate_size", "n_ctx": "max_position_embeddings",
              "norm_eps": "rms_norm_eps", "rope_base": "rope_theta",
              "query_scale": "query_pre_attn_scalar", "rope_local_base": "rope_local_base_freq"},
}  # fmt: skip


def in_file_terms(message: str, family: str, hf: dict) -> str:
    """`message` with each ModelConfig field named by its config.json key for `family`, where
    the file has that key (a field derived from others says from what); quoted values stay."""
    keys = HF_KEYS.get(family, {})
    derived = {"d_head": "d_head (hidden_size / num_attention_heads)"} if family == "llama" else {}

    def name(match: re.Match) -> str:
        word = match.group(0)
        if word.startswith("'") or word not in keys:
            return word
        return keys[word] if keys[word] in hf else derived.get(word, word)

    return re.sub(r"'[^']*'|\b[a-z_]+\b", name, message)


def _gpt2_from_hf(hf: dict, name: str) -> ModelConfig:
    act = hf.get("activation_function", "gelu_new")
    if act not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConfigError(f"gpt2 activation {act!r} not supported (GELU-tanh only: gelu_new)")
    if hf.get("scale_attn_by_inverse_layer_idx") or hf.get("scale_attn_weights") is False:
        raise ConfigError("gpt2 attention scaling variants are not supported")
    D, H = _count(_required(hf, "n_embd"), "n_embd"), _count(_required(hf, "n_head"), "n_head")
    if D % H:
        raise ConfigError(f"n_embd={D} is not a multiple of n_head={H}")
    return ModelConfig(
        family="gpt2",
        n_layers=_required(hf, "n_layer"),
        n_heads=H,
        n_kv_heads=H,
        d_model=D,
        d_head=D // H,
        d_mlp=hf.get("n_inner") or 4 * D,
        vocab_size=_required(hf, "vocab_size"),
        n_ctx=hf.get("n_positions", hf.get("n_ctx", 1024)),
        norm_eps=hf.get("layer_norm_epsilon", 1e-5),
        tied_embeddings=True,
        attn_bias=True,
        mlp_bias=True,
        name=name,
        arch="gpt2",
    )


def _llama_from_hf(hf: dict, name: str) -> ModelConfig:
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ConfigError(f"llama activation {act!r} not supported (SwiGLU with silu only)")
    # transformers <5 writes rope_theta/rope_scaling; 5.x writes rope_parameters.
    rope = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    if not isinstance(rope, dict):
        raise ConfigError(f"rope_scaling must be an object, got {rope!r}")
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ConfigError(f"rope scaling {rope_type!r} not supported (plain rotary only)")
    rope_base = rope.get("rope_theta", hf.get("rope_theta", 10000.0))
    D = _count(_required(hf, "hidden_size"), "hidden_size")
    H = _count(_required(hf, "num_attention_heads"), "num_attention_heads")
    return ModelConfig(
        family="llama",
        n_layers=_required(hf, "num_hidden_layers"),
        n_heads=H,
        n_kv_heads=hf.get("num_key_value_heads") or H,
        d_model=D,
        d_head=hf.get("head_dim") or D // H,
        d_mlp=_required(hf, "intermediate_size"),
        vocab_size=_required(hf, "vocab_size"),
        n_ctx=hf.get("max_position_embeddings", 2048),
        norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_base=rope_base,
        tied_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attn_bias=bool(hf.get("attention_bias", False)),
        mlp_bias=bool(hf.get("mlp_bias", False)),
        name=name,
        arch="llama",
    )


def _qwen2_from_hf(hf: dict, name: str) -> ModelConfig:
    """Qwen2ForCausalLM: Llama's config keys, biased Q/K/V, optional sliding window (refused)."""
    if hf.get("use_sliding_window"):
        raise ConfigError("qwen2 sliding-window attention is not supported (use_sliding_window)")
    llama = _llama_from_hf({**hf, "attention_bias": False, "mlp_bias": False}, name)
    return replace(llama, qkv_bias=True, arch="qwen2")


def _gemma3_from_hf(hf: dict, name: str) -> ModelConfig:
    """Gemma3ForCausalLM (model_type gemma3_text): Llama's keys plus the Gemma 3 fields."""
    act = hf.get("hidden_activation", "gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ConfigError(f"gemma3 activation {act!r} not supported (gelu_pytorch_tanh only)")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if hf.get(key) is not None:
            raise ConfigError(f"gemma3 {key}={hf[key]!r} is not supported (Gemma 3 has none)")
    if hf.get("use_bidirectional_attention"):
        raise ConfigError("gemma3 bidirectional attention is not supported (causal only)")
    rope = hf.get("rope_parameters") or {}
    bases = {}
    for kind, default in (("full_attention", 1e6), ("sliding_attention", 1e4)):
        params = rope.get(kind) or {}
        if params.get("rope_type", "default") != "default":
            raise ConfigError(f"gemma3 rope scaling {params['rope_type']!r} is not supported")
        bases[kind] = params.get("rope_theta", default)
    if not rope:  # transformers < 5: rope_theta (global) and rope_local_base_freq
        bases = {
            "full_attention": hf.get("rope_theta", 1e6),
            "sliding_attention": hf.get("rope_local_base_freq", 1e4),
        }
    L = _count(_required(hf, "num_hidden_layers"), "num_hidden_layers")
    types = hf.get("layer_types") or gemma3_layer_types(L, hf.get("sliding_window_pattern", 6))
    if len(types) != L or set(types) - {"sliding_attention", "full_attention"}:
        raise ConfigError(f"gemma3 layer_types must name {L} sliding/full layers, got {types!r}")
    llama = _llama_from_hf(
        {**hf, "hidden_act": "silu", "rope_parameters": None, "rope_scaling": None}, name
    )
    return replace(
        llama,
        rope_base=bases["full_attention"],
        tied_embeddings=bool(hf.get("tie_word_embeddings", True)),
        arch="gemma3",
        mlp_act="gelu_tanh",
        embed_scale=math.sqrt(llama.d_model),
        query_scale=hf.get("query_pre_attn_scalar", 256),
        qk_norm=True,
        sandwich_norms=True,
        local_layers=tuple(i for i, t in enumerate(types) if t == "sliding_attention"),
        sliding_window=hf.get("sliding_window", 4096),
        rope_local_base=bases["sliding_attention"],
    )


def gemma3_layer_types(n_layers: int, pattern: int = 6) -> list[str]:
    """Gemma 3's default layout: every `pattern`-th layer (5, 11, 17, ...) attends globally."""
    return [
        "full_attention" if (i + 1) % pattern == 0 else "sliding_attention" for i in range(n_layers)
    ]
