"""`cel-numpy fetch | inspect | generate | attention`: the real-model subcommands.

cel-numpy fetch smollm2
cel-numpy inspect --model smollm2
cel-numpy generate --model smollm2 "The capital of France is" --ablate L3H1+L5H0 --ablation zero
cel-numpy attention --model smollm2 "The capital of France is" --layer 11 --ablate L10H3 --out a.png
"""

from __future__ import annotations

import numpy as np

from cel_numpy import heads as head_notation
from cel_numpy.errors import OptionError, PromptError
from cel_numpy.models.model import check_text_fits


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "fetch", help="download a known model, vocabulary or benchmark into the cache"
    )
    p.add_argument(
        "name", help="known name, e.g. smollm2, gpt2-tokenizer, hellaswag, boolq or mbpp"
    )
    p.set_defaults(func=cmd_fetch)

    p = subparsers.add_parser(
        "inspect", help="describe a model: family, sizes, dtype, parameters, file"
    )
    p.add_argument(
        "--model", default="smollm2", help="known name, HF folder, .gguf or .npz (default: smollm2)"
    )
    p.set_defaults(func=cmd_inspect)

    p = subparsers.add_parser(
        "generate", help="greedy generation, top-k next tokens, optional head ablation"
    )
    p.add_argument("prompt", help="text prompt")
    p.add_argument(
        "--model", default="smollm2", help="known name, HF folder, .gguf or .npz (default: smollm2)"
    )
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--top-k", type=int, default=5, help="show this many next-token candidates")
    p.add_argument(
        "--ablate",
        action="append",
        default=None,
        metavar="HEADS",
        help="heads to remove, e.g. L3H1 or L3H1+L5H0 (layer and head counted from 0); "
        "repeatable: --ablate L3H1 --ablate L5H0 removes both",
    )
    p.add_argument("--ablation", choices=("zero", "mean"), default="zero")
    p.add_argument(
        "--reference",
        action="append",
        default=None,
        metavar="TEXT",
        help="reference text for mean ablation (repeatable); default: the prompt itself",
    )
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.set_defaults(func=cmd_generate)

    p = subparsers.add_parser(
        "attention",
        help="draw attention patterns (one head, or every head of a layer) to a PNG",
        description="Draw the attention pattern of one head (--head) or of every head of a layer "
        "on TEXT, with token labels on both axes; with --ablate, intact and with those heads "
        "removed side by side. Layers and heads count from 0.",
    )
    p.add_argument("text", help="text to run the model on")
    p.add_argument(
        "--model", default="smollm2", help="known name, HF folder, .gguf or .npz (default: smollm2)"
    )
    p.add_argument("--layer", type=int, required=True, help="layer to draw (from 0)")
    p.add_argument("--head", type=int, default=None, help="one head (from 0); default: all")
    p.add_argument(
        "--ablate",
        default=None,
        metavar="HEADS",
        help="also draw the model with these heads removed, e.g. L10H3 or L10H3+L11H5",
    )
    p.add_argument("--ablation", choices=("zero", "mean"), default="zero")
    p.add_argument(
        "--reference",
        action="append",
        default=None,
        metavar="TEXT",
        help="reference text for mean ablation (repeatable); default: the text itself",
    )
    p.add_argument("--out", required=True, help="PNG file to write")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    p.set_defaults(func=cmd_attention)


def parse_heads(spec: str | list[str] | None) -> list[tuple[int, int]]:
    """--ablate's value(s) ("L3H1+L5H0", "L3H1,L5H0", or one per --ablate) -> [(3, 1), (5, 0)];
    None -> []. Every given value counts (an empty one is an error, a head twice too)."""
    if isinstance(spec, list):
        for value in spec:
            if not value.strip():
                head_notation.parse_heads(value, what="--ablate")  # the empty-list error
        spec = "+".join(spec)
    return list(head_notation.parse_heads(spec, what="--ablate"))


def check_heads(ablate: list[tuple[int, int]], config) -> None:
    """Every head exists in a model of this config (InvalidHeadError naming the sizes otherwise)."""
    head_notation.check_heads(ablate, config.n_layers, config.n_heads, what="--ablate")


def cmd_fetch(args) -> int:
    from cel_numpy.models.fetch import fetch

    print(fetch(args.name))
    return 0


def _storage(path) -> str:
    """Storage dtypes of the file, e.g. 'Q4_1 79%, Q8_0 21%, F32 0%' (SmolLM2; by weight count)."""
    from pathlib import Path

    path = Path(path)
    counts: dict[str, int] = {}
    if path.suffix == ".gguf":
        from cel_numpy.models.gguf_loader import gguf_storage

        counts = gguf_storage(path)
    elif path.is_dir():
        from cel_numpy.models.loaders import safetensors_entries

        for entry in safetensors_entries(path).values():
            kind = entry.header.dtype
            counts[kind] = counts.get(kind, 0) + int(np.prod(entry.header.shape))
    elif path.suffix == ".npz":
        with np.load(path) as z:
            for name in z.files:
                if name != "config_json":
                    a = z[name]
                    counts[str(a.dtype)] = counts.get(str(a.dtype), 0) + a.size
    total = sum(counts.values()) or 1
    return ", ".join(
        f"{k} {100 * v / total:.0f}%" for k, v in sorted(counts.items(), key=lambda kv: -kv[1])
    )


def cmd_inspect(args) -> int:
    from cel_numpy.models.loaders import load_model

    model = load_model(args.model)
    info = model.describe()
    rows = [
        ("family", info["family"]),
        ("architecture", info["architecture"]),
        ("layers", info["layers"]),
        ("heads", info["heads"]),
        ("kv-heads", info["kv_heads"]),
        ("d_model", info["d_model"]),
        ("d_head", info["d_head"]),
        ("d_mlp", info["d_mlp"]),
        ("vocab", info["vocab"]),
        ("context", info["n_ctx"]),
        ("tied unembedding", info["tied_embeddings"]),
    ]
    if info["rope_base"] is not None:
        rows.append(("rope base", f"{info['rope_base']:g}"))
    rows += [
        ("dtype", f"{info['dtype']} in memory; stored as {_storage(info['file'])}"),
        (
            "parameters",
            f"{info['parameters']:,} ({model.weight_bytes() / 1e6:.1f} MB as {info['dtype']})",
        ),
        (
            "tokenizer",
            repr(model.tokenizer) if model.tokenizer is not None else "none (no tokenizer files)",
        ),
        ("file", info["file"]),
    ]
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
    return 0


def _top_k(model, logits: np.ndarray, k: int) -> list[tuple[str, float]]:
    """logits (V,) -> [(token text, probability)] for the k most likely tokens."""
    from cel_numpy.ops import finite_argmax, softmax_forward

    finite_argmax(logits)  # NaN/Inf logits are an error, never probabilities
    probs, _ = softmax_forward(model.mask_padding(logits.astype(np.float64)))  # pad rows: p = 0
    tokens = np.setdiff1d(np.arange(probs.shape[-1]), model.padding_ids)  # (V - padding,)
    top = tokens[np.argsort(-probs[tokens], kind="stable")[:k]]  # never a padding row
    return [(model.decode([i]), float(probs[i])) for i in top]


def check_prompt(ids: list[int], max_new_tokens: int, n_ctx: int, what: str = "the prompt") -> None:
    """A prompt of len(ids) tokens plus max_new_tokens generated must fit the context window."""
    if not ids:
        raise PromptError(f"{what} encodes to no tokens: give some text")
    if len(ids) + max_new_tokens > n_ctx:
        generated = (  # a text nothing is generated after (attention, a reference) has no cap
            f"; with --max-new-tokens {max_new_tokens} that is {len(ids) + max_new_tokens}"
            if max_new_tokens
            else ""
        )
        raise PromptError(
            f"{what} is {len(ids)} tokens{generated}, more than the model's context of {n_ctx} "
            "tokens: shorten it"
        )


def encode_before_weights(texts: list[tuple[str, str, int]], encoded: dict[str, list[int]]):
    """A load_model(check_tokenizer=...) hook: each (text, what, new tokens) is checked against
    the context by its length, then encoded and checked by its tokens, before any weight is
    read; the ids land in `encoded` (text -> ids)."""

    def check(tokenizer, config) -> None:
        if tokenizer is None:
            return  # Model.encode says so once the model is built
        for text, what, extra in texts:
            if extra >= config.n_ctx:  # no prompt fits: shortening it cannot help
                raise OptionError(
                    f"--max-new-tokens {extra} leaves no room for a prompt in the model's "
                    f"context of {config.n_ctx:,} tokens: give at most {config.n_ctx - 1:,}"
                )
            why = f"that the context of {config.n_ctx} leaves with --max-new-tokens {extra}"
            check_text_fits(tokenizer, text, config.n_ctx - extra, what, why if extra else "")
            encoded[text] = tokenizer.encode(text)
            check_prompt(encoded[text], extra, config.n_ctx, what)

    return check


def cmd_generate(args) -> int:
    from cel_numpy.models.loaders import load_model

    heads = parse_heads(args.ablate)  # every check that needs no model comes before loading it
    if args.max_new_tokens < 0 or args.top_k < 1:
        raise OptionError("--max-new-tokens must be >= 0 and --top-k >= 1")
    for text, what in [(args.prompt, "the prompt")] + [
        (t, "a --reference text") for t in args.reference or []
    ]:
        if not text:
            raise PromptError(f"{what} is empty: give some text")
    if args.reference and not (heads and args.ablation == "mean"):
        raise OptionError("--reference is only used by --ablation mean with --ablate")
    texts = [(args.prompt, "the prompt", args.max_new_tokens)]
    if heads:
        texts += [(t, "a --reference text", 0) for t in args.reference or []]
    encoded: dict[str, list[int]] = {}
    model = load_model(
        args.model,
        dtype=args.dtype,
        check_config=lambda config: check_heads(heads, config),
        check_tokenizer=encode_before_weights(texts, encoded),
    )
    ids = encoded.get(args.prompt) or model.encode(args.prompt)
    check_prompt(ids, args.max_new_tokens, model.config.n_ctx)
    spec = {}
    if heads:
        reference = [encoded.get(t) or model.encode(t) for t in (args.reference or [args.prompt])]
        for ref in reference:
            check_prompt(ref, 0, model.config.n_ctx, "a --reference text")
        mean_z = model.mean_z(reference) if args.ablation == "mean" else None
        spec = {"ablate": heads, "ablation": args.ablation, "mean_z": mean_z}
    runs = [("intact", {})] + (
        [(f"ablated {head_notation.heads_name(heads)} ({args.ablation})", spec)] if heads else []
    )
    print(f"prompt: {args.prompt!r} ({len(ids)} tokens)")
    for label, kw in runs:
        logits = model.next_token_logits([ids], **kw)[0]  # (V,)
        print(f"\n[{label}] next token:")
        for text, p in _top_k(model, logits, args.top_k):
            print(f"  {p:7.2%}  {text!r}")
        if args.max_new_tokens:
            new = model.generate_ids([ids], args.max_new_tokens, **kw)[0]
            print(f"[{label}] greedy: {args.prompt!r} + {model.decode(new)!r}")
    return 0


def cmd_attention(args) -> int:
    from pathlib import Path

    from cel_numpy.models.loaders import load_model
    from cel_numpy.plots import attention_pattern, check_attention_size

    removed = parse_heads(args.ablate)  # every check that needs no model comes before loading it
    out = Path(args.out)
    if out.suffix.lower() != ".png":
        raise OptionError(f"--out {out} must be a .png file")
    if out.is_dir() or not out.parent.is_dir():
        raise OptionError(f"--out {out}: give a file in an existing directory")
    if not args.text:
        raise PromptError("the text is empty: give some text")
    if args.reference and not (removed and args.ablation == "mean"):
        raise OptionError("--reference is only used by --ablation mean with --ablate")

    texts = [(args.text, "the text", 0)]
    if removed and args.ablation == "mean":
        texts += [(t, "a --reference text", 0) for t in args.reference or []]
    encoded: dict[str, list[int]] = {}
    encode = encode_before_weights(texts, encoded)

    def check_picture(tokenizer, config) -> None:
        encode(tokenizer, config)
        if args.text in encoded:  # the picture's size, before any weight is read
            n_heads = 1 if args.head is not None else config.n_heads
            check_attention_size(n_heads, 2 if removed else 1, len(encoded[args.text]))

    def check(config) -> None:
        check_heads(removed, config)
        if not 0 <= args.layer < config.n_layers:
            raise OptionError(
                f"--layer {args.layer}: the model has {config.n_layers} layers, 0 to "
                f"{config.n_layers - 1} (counted from 0)"
            )
        if args.head is not None and not 0 <= args.head < config.n_heads:
            raise OptionError(
                f"--head {args.head}: the model has {config.n_heads} heads per layer, 0 to "
                f"{config.n_heads - 1} (counted from 0)"
            )

    model = load_model(
        args.model, dtype=args.dtype, check_config=check, check_tokenizer=check_picture
    )
    ids = encoded.get(args.text) or model.encode(args.text)
    check_prompt(ids, 0, model.config.n_ctx, "the text")
    reference = None
    if removed and args.ablation == "mean":
        reference = [encoded.get(t) or model.encode(t) for t in (args.reference or [args.text])]
        for ref in reference:
            check_prompt(ref, 0, model.config.n_ctx, "a --reference text")
    picture = attention_pattern(
        model,
        ids,
        args.layer,
        args.head,
        ablate=removed or None,
        ablation=args.ablation,
        reference=reference,
        path=out,
    )
    what = "every head" if args.head is None else f"head {args.head}"
    removed_text = f", intact and without {head_notation.heads_name(removed)}" if removed else ""
    print(f"layer {args.layer}, {what}{removed_text}, {len(picture.tokens)} tokens: wrote {out}")
    return 0
