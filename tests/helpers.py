"""Helpers shared by several test modules: `from helpers import ...`.

pytest puts tests/ on sys.path (the test modules are rootdir-less), so this module imports by
its name; it holds no tests. Paths are relative to this file, never to the working directory.

    FIXTURES                      tests/fixtures
    copy_fixture, with_tokenizer  a fixture copied into a temp dir; a 96-token vocabulary added
    rewrite_safetensors           edit a folder's model.safetensors tensors in place
    CharTokenizer, ALPHABET       one token per character, for hand-built models
    PlantedTask, planted_model    a tiny GPT-2 with one helpful and one harmful head planted
    localize_cli                  `cel-numpy localize ...` through its own parser
    run_cli                       (exit status, stderr) of `cel-numpy ...`, in process
    write_tiny_gguf, gguf_name,   the tiny_llama fixture written as GGUF (llama.cpp's layout),
    llama_cpp_permute, all_f32,   with a storage type per tensor
    all_q8_0, all_q4_1, smollm2_mix
    gguf_of_arch                  a minimal GGUF declaring some architecture
    SMOLLM2_MISSING_BYTES         the bytes SmolLM2's vocabulary has no token for
    tiny_chat_model               tiny_llama with a tokenizer.json, a chat template, any context
    chat_argv                     test-heads options for arithmetic_chat on such a model
    theory_params, localize_argv  a theory model's params.npz and a quick localize on it
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf.quants import quantize

from cel_numpy.models.config import ModelConfig
from cel_numpy.models.model import Model
from cel_numpy.tasks.base import Item

FIXTURES = Path(__file__).parent / "fixtures"


def copy_fixture(tmp: Path, name: str) -> Path:
    """tests/fixtures/NAME (file or folder) copied to TMP/NAME."""
    target = tmp / name
    if (FIXTURES / name).is_dir():
        shutil.copytree(FIXTURES / name, target)
    else:
        shutil.copy(FIXTURES / name, target)
    return target


def with_tokenizer(folder: Path) -> Path:
    """Add a 96-token byte-level vocabulary (printable ASCII, no merges) to a tiny folder."""
    from cel_numpy.models.tokenizer import bytes_to_unicode

    b2u = bytes_to_unicode()
    (folder / "vocab.json").write_text(json.dumps({b2u[b]: b - 32 for b in range(32, 128)}))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    return folder


def rewrite_safetensors(folder: Path, edit: Callable[[dict], None]) -> Path:
    """Load FOLDER/model.safetensors, let `edit` change the dict of arrays, write it back."""
    from safetensors.numpy import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    edit(tensors)
    save_file(tensors, folder / "model.safetensors")
    return folder


# --------------------------------------------------------------------------- a planted model


class CharTokenizer:
    """One token per character: enough to run the real Model on text."""

    def __init__(self, alphabet):
        self.alphabet = alphabet
        self.bos_id = self.eos_id = None
        self.pad_id = 0
        self.add_bos = False

    def encode(self, text):
        return [self.alphabet.index(ch) for ch in text]

    def decode(self, ids):
        return "".join(self.alphabet[i] for i in ids)


ALPHABET = "_xyab\n"  # "_" is padding


class PlantedTask:
    """Prompts of x/y characters; the answer is always "a" (b is the planted wrong answer)."""

    def __init__(self, scoring):
        self.scoring = scoring
        self.name = f"planted-{scoring}"
        self.max_new_tokens = 1
        self.answer_separator = ""  # the answer is the very next character

    def sample(self, rng, n):
        prompts = ["".join(rng.choice(list("xy"), size=int(rng.integers(3, 9)))) for _ in range(n)]
        return [
            Item(self.name, "s", p, "a", ("a", "b") if self.scoring == "choice" else ())
            for p in prompts
        ]

    def is_correct(self, item, output):
        return output.strip() == item.answer


def planted_model(rng, good=(0, 0), bad=(1, 1), n_layers=2, n_heads=3):
    """Tiny GPT-2 (2 layers x 3 heads by default) with random weights, one head writing a
    constant push toward "a" (the right answer) and a stronger head writing a constant push
    toward "b" (wrong).

    A constant-writing head: W_V = 0 and b_V = e_0, so z = e_0 whatever it attends to (attention
    rows sum to 1), and W_O maps e_0 to the push. Unembedding is tied: tokens "a" and "b" get
    embeddings along d_a = e_0 - e_1 and d_b = e_2 - e_3 (mean zero, so LayerNorm keeps them).
    """
    L, H, D, E, F, V = n_layers, n_heads, 8, 4, 16, len(ALPHABET)
    config = ModelConfig(
        family="gpt2",
        n_layers=L,
        n_heads=H,
        n_kv_heads=H,
        d_model=D,
        d_head=E,
        d_mlp=F,
        vocab_size=V,
        n_ctx=32,
        norm_eps=1e-5,
        attn_bias=True,
        mlp_bias=True,
        name="planted",
    )
    small = lambda *shape: 0.1 * rng.standard_normal(shape)
    eye = np.eye(D)
    d_a, d_b = eye[0] - eye[1], eye[2] - eye[3]
    W_E = np.zeros((V, D))
    W_E[:, 4:] = rng.standard_normal((V, 4))  # x, y, pad, newline live in dims 4..7
    W_E[ALPHABET.index("a")] = 2 * d_a
    W_E[ALPHABET.index("b")] = 2 * d_b
    blocks = []
    for _ in range(L):
        blocks.append(
            {
                "ln1": {"w": np.ones(D), "b": np.zeros(D)},
                "attn": {
                    "W_Q": small(H, D, E),
                    "W_K": small(H, D, E),
                    "W_V": small(H, D, E),
                    "W_O": small(H, E, D),
                    "b_Q": np.zeros((H, E)),
                    "b_K": np.zeros((H, E)),
                    "b_V": np.zeros((H, E)),
                    "b_O": np.zeros(D),
                },
                "ln2": {"w": np.ones(D), "b": np.zeros(D)},
                "mlp": {
                    "W_in": small(D, F),
                    "b_in": np.zeros(F),
                    "W_out": small(F, D),
                    "b_out": np.zeros(D),
                },
            }
        )
    for (l, h), push in ((good, 5 * d_a), (bad, 10 * d_b)):
        attn = blocks[l]["attn"]
        attn["W_V"][h] = 0.0
        attn["b_V"][h] = np.eye(E)[0]
        attn["W_O"][h] = np.outer(np.eye(E)[0], push)  # (E, D): z = e_0 -> push
    params = {
        "embed": {"W_E": W_E},
        "pos_embed": {"W_pos": small(32, D)},
        "blocks": blocks,
        "ln_final": {"w": np.ones(D), "b": np.zeros(D)},
        "unembed": {"W_U": W_E.T},
    }
    return Model(params, config, CharTokenizer(ALPHABET), source="planted")


def localize_cli(argv: list[str]) -> int:
    """`cel-numpy localize ARGV` through its own parser (errors raise instead of exiting)."""
    import argparse

    from cel_numpy.localize.cli import register

    parser = argparse.ArgumentParser(prog="cel-numpy")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def run_cli(argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of `cel-numpy ARGV`, in process; usage errors exit
    through SystemExit."""
    from cel_numpy.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as exit_:
            status = exit_.code
    return status, err.getvalue()


# --------------------------------------------------------------------------- GGUF files


HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER_TO_GGUF = {
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


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """As `LlamaModel.permute` in llama.cpp's convert_hf_to_gguf.py."""
    return (
        w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def gguf_name(hf: str) -> str:
    if hf in HF_TO_GGUF:
        return HF_TO_GGUF[hf]
    _, _, layer, rest = hf.split(".", 3)  # model.layers.{l}.rest
    return f"blk.{layer}.{LAYER_TO_GGUF[rest]}"


def write_tiny_gguf(
    path: Path, qtype_for, *, arch: str = "llama", with_tokenizer: bool = True
) -> dict:
    """Write tiny_llama as GGUF; qtype_for(gguf_name, array) picks each tensor's storage.

    Returns {gguf name: float32 array in GGUF (permuted) layout} for tolerance checks.
    """
    from safetensors.numpy import load_file

    from cel_numpy.models.tokenizer import bytes_to_unicode

    hf = load_file(FIXTURES / "tiny_llama" / "model.safetensors")
    H, G, D, E = 4, 2, 32, 8
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(D)
    w.add_feed_forward_length(64)
    w.add_head_count(H)
    w.add_head_count_kv(G)
    w.add_rope_dimension_count(E)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    if with_tokenizer:
        b2u = bytes_to_unicode()
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("gpt2")
        tokens = [b2u[b] for b in range(32, 127)] + [
            b2u[32] + "t"
        ]  # printable ASCII + one merge: 96
        w.add_token_list(tokens)
        w.add_token_types([1] * 96)
        w.add_token_merges([f"{b2u[32]} t"])
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_add_bos_token(False)
    written = {}
    for name, array in hf.items():
        if name.endswith("q_proj.weight"):
            array = llama_cpp_permute(array, H)
        elif name.endswith("k_proj.weight"):
            array = llama_cpp_permute(array, G)
        target = gguf_name(name)
        qtype = qtype_for(target, array)
        w.add_tensor(target, quantize(array, qtype), raw_dtype=qtype)
        written[target] = array
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return written


def all_f32(name, a):
    return Q.F32


def all_q8_0(name, a):
    return Q.Q8_0 if a.ndim == 2 else Q.F32


def all_q4_1(name, a):
    return Q.Q4_1 if a.ndim == 2 else Q.F32


def smollm2_mix(name, a):  # SmolLM2's file: Q8_0 embedding, Q4_1 matrices, F32 norms
    return Q.Q8_0 if name == "token_embd.weight" else Q.Q4_1 if a.ndim == 2 else Q.F32


def gguf_of_arch(tmp: Path, arch: str) -> Path:
    """A minimal GGUF file (one zero embedding tensor) declaring architecture `arch`."""
    path = tmp / f"{arch}.gguf"
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 32), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --------------------------------------------------------------------------- SmolLM2's vocabulary

SMOLLM2_MISSING_BYTES = (
    0x04,
    0x06,
    0x13,
    0x14,
    0x16,
    0x1D,
    0xC0,
    0xC1,
    0xF1,
    0xF2,
    *range(0xF5, 0x100),
)


# --------------------------------------------------------------------------- a chat model


def tiny_chat_model(tmp: Path, template: str, n_ctx: int = 1024) -> Path:
    """tiny_llama with a tokenizer.json (printable ASCII and the merge " t"), `template` as its
    chat template, and a context of n_ctx tokens (rotary: no weight depends on it)."""
    from cel_numpy.models.tokenizer import bytes_to_unicode

    tmp.mkdir(parents=True, exist_ok=True)
    folder = copy_fixture(tmp, "tiny_llama")
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = n_ctx
    (folder / "config.json").write_text(json.dumps(config))
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b - 32 for b in range(32, 127)}
    vocab[b2u[32] + "t"] = 95
    spec = {
        "model": {"type": "BPE", "vocab": vocab, "merges": [f"{b2u[32]} t"]},
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False},
        "added_tokens": [],
    }
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    config = {"chat_template": template, "eos_token": "~"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def chat_argv(folder: Path, out: Path) -> list[str]:
    """`test-heads` options (after the command) for arithmetic_chat on a tiny chat model."""
    return [
        "--model", str(folder), "--task", "arithmetic_chat", "--heads", "L0H0",
        "--heldout", "2", "--discovery", "2", "--out", str(out), "--quiet",
    ]  # fmt: skip


def theory_params(tmp: Path, n_heads: int = 4) -> Path:
    """A theory model's parameters (seed 0, 8 types, 8 dims, init scale 1) in TMP/params.npz."""
    from cel_numpy.theory.model import init_params

    path = tmp / "params.npz"
    np.savez(path, **init_params(np.random.default_rng(0), n_heads, 8, 8, 1.0))
    return path


def localize_argv(params: Path, out: Path, *extra: str) -> list[str]:
    """`cel-numpy localize` on a theory model, task A, 12 + 12 items, quiet."""
    return [
        "localize", "--model", f"theory:{params}", "--task", "A", "--discovery", "12",
        "--heldout", "12", "--out", str(out), "--quiet", *extra,
    ]  # fmt: skip
