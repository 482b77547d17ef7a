"""ModelConfig: the few numbers that decide the shape of a GPT-2, Llama or Qwen2 transformer.

One frozen dataclass drives the one forward in `transformer.py`. The two families differ in:

    family   norm       positions           MLP                  attention       unembedding
    gpt2     LayerNorm  learned W_pos       GELU-tanh, biases    H heads, biases  tied to W_E
    llama    RMSNorm    rotary (half-split) SwiGLU (W_gate)      G <= H kv-heads  tied or not

Qwen2 is the llama family with biases on the query, key and value projections (none on the
output projection): `qkv_bias=True`, `arch="qwen2"`. Everything else (RMSNorm, rotate-half
rotary, SwiGLU, grouped-query attention) is Llama's.

Constructors read the configuration of a Hugging Face folder (`from_hf_config`) and the
dictionary that `to_dict` writes (the `.npz` export's `config_json`). GGUF metadata is read in
`gguf_loader.py`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

from cel_numpy.errors import ConfigError

FAMILIES = ("gpt2", "llama")
HF_ARCHITECTURES = {"gpt2": "gpt2", "llama": "llama", "qwen2": "llama"}  # model_type -> family


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

    # ------------------------------------------------------------------ derived

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
        if model_type == "gpt2":
            return _gpt2_from_hf(hf, name)
        if model_type == "qwen2":
            return _qwen2_from_hf(hf, name)
        return _llama_from_hf(hf, name)


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
