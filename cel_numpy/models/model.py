"""Model: params + config + tokenizer, with logits, named activations, ablations and generation.

    model = cel_numpy.load_model("smollm2")
    ids = model.tokenizer.encode("The capital of France is")
    logits = model.logits([ids])                                   # (1, T, V)
    logits = model.logits([ids], ablate=[(3, 1)])                  # head 1 of layer 3 zeroed
    logits = model.logits([ids], ablate=[(3, 1)], ablation="mean", reference=ref_ids)
    logits, cache = model.run_with_cache([ids]); cache["blocks.0.attn.pattern"]  # (1, H, T, T)
    model.generate("The capital of France is", max_new_tokens=8)  # -> " Paris. ..."

Batches: `ids` is a list of token-id lists (any lengths) or an int array (B, T). Lists are
LEFT-padded by `pad`, so column -1 is every prompt's next-token position; outputs at padding
positions are garbage. Positions count real tokens only: clip(cumsum(mask) - 1, 0).

Ablation acts on z, each head's output before the output projection W_O. Heads are (layer, head),
0-based, in any spelling of cel_numpy.heads: "L3H1", "L3H1+L5H0", (3, 1), [(3, 1), (5, 0)].
Under grouped-query attention one query head is removed; the key/value group it reads stays
(other heads use it).
  - zero: z_h = 0.
  - mean: z_h = mean of z_h over every non-pad position of a reference batch, computed with the
    intact model (one vector per head, the same at every position) -- `mean_z`. A mean_z of
    shape (L, B, H, E) gives every batch row its own vector: resample ablation passes, per row,
    the mean z of another item's prompt (`row_mean_z`; donors: `cel_numpy.localize.resample`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from cel_numpy.errors import (
    InvalidHeadError,
    ModelFileError,
    NoTokenizerError,
    OptionError,
    PromptError,
    UserError,
)
from cel_numpy.heads import check_heads, parse_heads
from cel_numpy.models.config import ModelConfig
from cel_numpy.models.transformer import (
    ForwardCache,
    blocks_forward,
    embed,
    flatten_params,
    params_dtype,
    prepare_inputs,
    transformer_forward,
)
from cel_numpy.ops import finite_argmax

ABLATIONS = ("zero", "mean")


def check_text_fits(
    tokenizer, text, n_tokens: int, what: str = "the text", why: str = "", fix: str = "shorten it"
) -> None:
    """PromptError when `text` needs more than n_tokens tokens by its length alone (checked
    without encoding it; see tokenizer.token_lower_bound). why: where n_tokens comes from,
    default the model's context."""
    from cel_numpy.models.tokenizer import token_lower_bound

    bound = token_lower_bound(tokenizer, text)
    why = why or "of the model's context"
    if bound > n_tokens:
        raise PromptError(
            f"{what} is {len(text):,} characters, at least {bound:,} tokens: more than the "
            f"{n_tokens:,} tokens {why}: {fix}"
        )


def check_attention_mask(mask, shape: tuple[int, ...]) -> np.ndarray:
    """An attention_mask of `shape` holding only 0 (padding) and 1 (a token), with at least one
    token per row; PromptError otherwise (a 0.5 or a NaN would weigh a key, an all-zero row
    would attend to nothing)."""
    mask = np.asarray(mask)
    if mask.shape != tuple(shape):
        raise PromptError(
            f"attention_mask has shape {mask.shape}, the ids {tuple(shape)}: give one 0/1 "
            "entry per token"
        )
    if mask.dtype == bool:
        mask = mask.astype(np.int64)
    if mask.size and not np.isin(mask, (0, 1)).all():
        raise PromptError("attention_mask must hold only 0 (padding) and 1 (a token)")
    if mask.size and not mask.any(axis=-1).all():
        raise PromptError("every row of attention_mask needs at least one 1: a row of padding only")
    return mask


def check_batch_size(batch_size) -> None:
    """OptionError unless batch_size is a positive integer."""
    if not (_is_int(batch_size) and batch_size >= 1):
        raise OptionError(f"batch_size must be a positive integer, got {batch_size!r}")


def _is_int(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, np.integer))


class Model:
    """A loaded GPT-2 or Llama model. Stateless between calls: every intervention is an argument."""

    def __init__(self, params: dict, config: ModelConfig, tokenizer=None, *, source: str = ""):
        self.params = params
        self.config = config
        self.tokenizer = tokenizer
        self.source = source
        self.weight_cache = None  # the weight cache file the params are mapped from (read-only)
        self.padding_ids = np.zeros(0, dtype=np.int64)  # embedding rows that are no token
        if getattr(tokenizer, "vocab_size", None) is not None:  # any object with encode/decode
            if tokenizer.vocab_size > config.vocab_size:
                raise ModelFileError(
                    f"{source or 'model'}: the tokenizer has {tokenizer.vocab_size} tokens but the "
                    f"embedding only {config.vocab_size} rows: the tokenizer files belong to "
                    "another model (use the tokenizer shipped with these weights)"
                )
            if hasattr(tokenizer, "padding_ids"):
                self.padding_ids = tokenizer.padding_ids(config.vocab_size)
            else:
                self.padding_ids = np.arange(tokenizer.vocab_size, config.vocab_size)

    def mask_padding(self, logits: np.ndarray) -> np.ndarray:
        """logits (..., V) with the padding rows' logits set to the lowest float (in place).

        The lowest finite value rather than -inf, so the check that logits are finite still holds
        and softmax gives those rows exactly 0.

        Checkpoints pad the vocabulary (Qwen2: 151,936 rows, 151,665 tokens); a padding row
        must never be chosen by argmax, top-k or sampling.
        """
        if self.padding_ids.size:
            logits[..., self.padding_ids] = np.finfo(logits.dtype).min  # finite: p = 0 exactly
        return logits

    # ------------------------------------------------------------------ description

    @property
    def dtype(self) -> np.dtype:
        return params_dtype(self.params)

    def n_params(self) -> int:
        """Distinct parameter count (a tied unembedding counted once)."""
        seen, total = set(), 0
        for array in flatten_params(self.params).values():
            base = array.base if array.base is not None else array
            if id(base) not in seen:
                seen.add(id(base))
                total += array.size
        return total

    def weight_bytes(self) -> int:
        return self.n_params() * self.dtype.itemsize

    def describe(self) -> dict:
        c = self.config
        return {
            "family": c.family,
            "architecture": c.arch or c.family,
            "layers": c.n_layers,
            "heads": c.n_heads,
            "kv_heads": c.n_kv_heads,
            "d_model": c.d_model,
            "d_head": c.d_head,
            "d_mlp": c.d_mlp,
            "vocab": c.vocab_size,
            "n_ctx": c.n_ctx,
            "tied_embeddings": c.tied_embeddings,
            "rope_base": c.rope_base if c.family == "llama" else None,
            "dtype": str(self.dtype),
            "parameters": self.n_params(),
            "file": self.source,
        }

    def __repr__(self) -> str:
        c = self.config
        return (
            f"Model({c.family}, {c.n_layers} layers x {c.n_heads} heads ({c.n_kv_heads} kv), "
            f"d_model {c.d_model}, vocab {c.vocab_size}, {self.dtype}, source={self.source!r})"
        )

    # ------------------------------------------------------------------ text

    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise NoTokenizerError(
                f"{self.source or 'this model'} was loaded without tokenizer files "
                "(tokenizer.json or vocab.json + merges.txt): pass token ids instead of text"
            )
        return self.tokenizer

    def encode(self, text: str) -> list[int]:
        return self._require_tokenizer().encode(text)

    def check_text_length(self, text, what: str = "the text", fix: str = "shorten it") -> None:
        """PromptError, before encoding, when `text` is too long for the context whatever its
        tokens (`tokenizer.token_lower_bound`): a 2 MB text is refused at once, not encoded.
        fix: the advice (a task's prompt cannot be shortened by whoever runs it)."""
        check_text_fits(self.tokenizer, text, self.config.n_ctx, what, fix=fix)

    def decode(self, ids: Iterable[int]) -> str:
        if isinstance(ids, (str, bytes)) or not isinstance(ids, Iterable):
            raise PromptError(f"decode takes a sequence of token ids, got {type(ids).__name__}")
        ids = ids.ravel().tolist() if isinstance(ids, np.ndarray) else list(ids)
        self.check_ids(ids)  # a float or bool id would be truncated, a negative one wrap around
        return self._require_tokenizer().decode([int(i) for i in ids])

    # ------------------------------------------------------------------ batches

    @property
    def pad_id(self) -> int:
        tok = self.tokenizer
        for candidate in (getattr(tok, "pad_id", None), getattr(tok, "eos_id", None)):
            if candidate is not None:
                return int(candidate)
        return 0

    def pad(self, seqs: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """List of id lists -> ids (B, T) int64, attention_mask (B, T) int64, LEFT-padded."""
        seqs = [list(s) for s in seqs]
        if not seqs:
            raise PromptError("empty batch: give at least one prompt")
        if any(len(s) == 0 for s in seqs):
            raise PromptError(
                "every prompt needs at least one token: an empty prompt has nothing to continue"
            )
        for s in seqs:
            self.check_ids(s)
        T = max(len(s) for s in seqs)
        ids = np.full((len(seqs), T), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(seqs), T), dtype=np.int64)
        for b, s in enumerate(seqs):
            ids[b, T - len(s) :] = s
            mask[b, T - len(s) :] = 1
        return ids, mask

    def check_ids(self, ids) -> None:
        """Token ids (one sequence, or a (B, T) array) must be integers in [0, vocab_size):
        PromptError otherwise (a float id would be truncated, a negative one index from the end)."""
        if isinstance(ids, np.ndarray) and np.issubdtype(ids.dtype, np.integer):
            arr = ids
        else:
            values = ids.ravel().tolist() if isinstance(ids, np.ndarray) else list(ids)
            bad = next((x for x in values if not _is_int(x)), None)
            if bad is not None:
                raise PromptError(
                    f"token ids must be integers, got {bad!r} ({type(bad).__name__}): pass ints"
                )
            arr = np.asarray(values, dtype=np.int64)
        if arr.size == 0:
            return
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high >= self.config.vocab_size:
            raise PromptError(
                f"token id {low if low < 0 else high} is out of range: the vocabulary has ids 0 "
                f"to {self.config.vocab_size - 1}"
            )

    def as_batch(self, ids, attention_mask=None) -> tuple[np.ndarray, np.ndarray]:
        """ids as list of lists (padded here) or (B, T) array (mask of ones if not given)."""
        if isinstance(ids, (str, bytes)):  # list("hello") would be five one-letter prompts
            raise PromptError(
                "ids must be a batch: a string is one prompt, so pass [text] (or [ids])"
            )
        if isinstance(ids, np.ndarray):
            if ids.ndim != 2:
                raise PromptError(
                    f"ids must be a (B, T) batch, got shape {ids.shape}: wrap one prompt as [ids]"
                )
            self.check_ids(ids)
            if attention_mask is None:
                attention_mask = np.ones(ids.shape, dtype=np.int64)
            return ids, check_attention_mask(attention_mask, ids.shape)
        seqs = list(ids)
        if seqs and isinstance(seqs[0], (int, np.integer)):
            raise PromptError("ids must be a batch (a list of id lists): wrap one prompt as [ids]")
        if seqs and isinstance(seqs[0], str):
            seqs = [self.encode(s) for s in seqs]
        if attention_mask is not None:
            for seq in seqs:
                self.check_ids(seq)
            if len({len(s) for s in seqs}) > 1:
                raise PromptError(
                    "prompts of different lengths with an attention_mask: pass them without "
                    "a mask (they are padded here), or as one (B, T) array"
                )
            batch = np.asarray(seqs, dtype=np.int64)
            return batch, check_attention_mask(attention_mask, batch.shape)
        return self.pad(seqs)

    # ------------------------------------------------------------------ ablation

    def head_mask(self, ablate) -> np.ndarray | None:
        """Heads to remove -> (L, H) mask, 0 at ablated heads; None if nothing is ablated.

        ablate: "L3H1", "L3H1+L5H0", (3, 1), or a list of pairs/names (cel_numpy.heads).
        """
        if ablate is None:
            return None
        L, H = self.config.n_layers, self.config.n_heads
        heads = parse_heads(ablate, what="ablate", repeats=True)
        check_heads(heads, L, H, what="ablate")
        mask = np.ones((L, H), dtype=self.dtype)
        for layer, h in heads:
            mask[layer, h] = 0
        return mask if heads else None

    def mean_z(self, reference, attention_mask=None, *, batch_size: int = 32) -> np.ndarray:
        """Per-head mean of z over all non-pad positions of `reference`, intact model. (L, H, E).

        reference: list of id lists (or strings), or a (B, T) array with its attention_mask.
        """
        ids, mask = self.as_batch(reference, attention_mask)
        check_batch_size(batch_size)
        c = self.config
        total = np.zeros((c.n_layers, c.n_heads, c.d_head), dtype=np.float64)
        for _, layer, z, valid in self._intact_z(ids, mask, batch_size):
            total[layer] += np.einsum("bhte,bt->he", z, valid)  # (H, E)
        return (total / int(mask.sum())).astype(self.dtype)

    def row_mean_z(self, reference, *, batch_size: int = 32) -> np.ndarray:
        """Per row of `reference`, each head's mean z over that row's non-pad positions, intact
        model: (L, N, H, E), in the row order given (what resample ablation fills in)."""
        ids, mask = self.as_batch(reference)
        check_batch_size(batch_size)
        c = self.config
        out = np.zeros((c.n_layers, ids.shape[0], c.n_heads, c.d_head), dtype=np.float64)
        for rows, layer, z, valid in self._intact_z(ids, mask, batch_size):
            count = valid.sum(axis=1)[:, None, None]  # (B, 1, 1)
            out[layer, rows] = np.einsum("bhte,bt->bhe", z, valid) / count  # (B, H, E)
        return out.astype(self.dtype)

    def _intact_z(self, ids: np.ndarray, mask: np.ndarray, batch_size: int):
        """Yield (rows, layer, z (B, H, T, E), valid (B, T)) for every chunk of `batch_size` rows
        and every layer, running the intact model one layer at a time (only z is kept)."""
        c = self.config
        for start in range(0, ids.shape[0], batch_size):
            rows = slice(start, start + batch_size)
            chunk_ids, chunk_mask = ids[rows], mask[rows]
            inputs = prepare_inputs(c, chunk_mask, chunk_ids.shape[1], self.dtype)
            x = embed(self.params, c, chunk_ids, inputs.positions)  # (B, T, D)
            valid = chunk_mask.astype(self.dtype)  # (B, T)
            for layer in range(c.n_layers):
                x, caches, _ = blocks_forward(self.params, c, x, inputs, range(layer, layer + 1))
                yield rows, layer, caches[layer].attn.z, valid

    def intervention(self, ablate=None, ablation: str = "zero", reference=None, mean_z=None):
        """(head_mask (L, H) or None, head_fill (L, H, E) or None) for an ablation spec."""
        if ablation not in ABLATIONS:
            raise UserError(f"ablation must be one of {', '.join(ABLATIONS)}, got {ablation!r}")
        head_mask = self.head_mask(ablate)
        if head_mask is None:
            return None, None
        return head_mask, self.ablation_fill(ablation, reference, mean_z)

    def ablation_fill(
        self, ablation: str = "zero", reference=None, mean_z=None
    ) -> np.ndarray | None:
        """What a removed head's z becomes: None (zero ablation) or mean_z (mean): (L, H, E),
        or (L, B, H, E) with one vector per batch row (resample ablation)."""
        if ablation not in ABLATIONS:
            raise UserError(f"ablation must be one of {', '.join(ABLATIONS)}, got {ablation!r}")
        if ablation == "zero":
            return None
        if mean_z is None:
            if reference is None:
                raise UserError(
                    "mean ablation needs reference=... (token ids of a reference batch) "
                    "or mean_z=..."
                )
            mean_z = self.mean_z(reference)
        c = self.config
        shape = np.shape(mean_z)
        if shape != (c.n_layers, c.n_heads, c.d_head) and (
            len(shape) != 4 or shape[::2] != (c.n_layers, c.n_heads) or shape[3] != c.d_head
        ):
            raise ValueError(
                f"mean_z must be (L, H, E) = {(c.n_layers, c.n_heads, c.d_head)} or per row "
                f"(L, B, H, E), got {shape}"
            )
        return np.asarray(mean_z, dtype=self.dtype)

    # ------------------------------------------------------------------ forward

    def run_with_cache(
        self, ids, attention_mask=None, *, ablate=None, ablation="zero", reference=None, mean_z=None
    ) -> tuple[np.ndarray, ForwardCache]:
        """logits (B, T, V) and every activation by name (see ForwardCache.names())."""
        ids, mask = self.as_batch(ids, attention_mask)
        head_mask, head_fill = self.intervention(ablate, ablation, reference, mean_z)
        return transformer_forward(
            self.params, self.config, ids, mask, head_mask=head_mask, head_fill=head_fill
        )

    def attention_pattern(
        self, ids, layer: int, *, ablate=None, ablation="zero", reference=None, mean_z=None
    ) -> np.ndarray:
        """The attention pattern of every head of `layer`: (B, H, T, T).

        Runs layers 0..layer only and keeps nothing else (no logits, no other layer's
        activations): what a picture of one layer needs, in a fraction of the memory of
        run_with_cache.
        """
        c = self.config
        if not (_is_int(layer) and 0 <= layer < c.n_layers):
            raise InvalidHeadError(
                f"layer {layer!r} is not in the model: it has {c.n_layers} layers, 0 to "
                f"{c.n_layers - 1} (counted from 0)"
            )
        ids, mask = self.as_batch(ids)
        head_mask, head_fill = self.intervention(ablate, ablation, reference, mean_z)
        inputs = prepare_inputs(c, mask, ids.shape[1], self.dtype)
        x = embed(self.params, c, ids, inputs.positions)  # (B, T, D)
        ablation_kw = {"head_mask": head_mask, "head_fill": head_fill}
        # (B, T, D): the input of `layer`
        x, _, _ = blocks_forward(
            self.params, c, x, inputs, range(layer), keep_activations=False, **ablation_kw
        )
        _, caches, _ = blocks_forward(
            self.params, c, x, inputs, range(layer, layer + 1), **ablation_kw
        )
        return caches[layer].attn.probs  # (B, H, T, T)

    def logits(
        self, ids, attention_mask=None, *, ablate=None, ablation="zero", reference=None, mean_z=None
    ):
        """ids (B, T) or list of id lists -> logits (B, T, V) in the model dtype."""
        ids, mask = self.as_batch(ids, attention_mask)
        head_mask, head_fill = self.intervention(ablate, ablation, reference, mean_z)
        logits, _ = transformer_forward(
            self.params,
            self.config,
            ids,
            mask,
            head_mask=head_mask,
            head_fill=head_fill,
            keep_activations=False,
        )
        return logits

    def next_token_logits(self, ids, attention_mask=None, **ablation) -> np.ndarray:
        """Logits at the last column only (every prompt's next token after left-padding): (B, V)."""
        ids, mask = self.as_batch(ids, attention_mask)
        head_mask, head_fill = self.intervention(**ablation)
        logits, _ = transformer_forward(
            self.params,
            self.config,
            ids,
            mask,
            head_mask=head_mask,
            head_fill=head_fill,
            keep_activations=False,
            logit_positions=slice(-1, None),
        )
        return logits[:, -1]  # (B, V)

    # ------------------------------------------------------------------ gradients

    def loss_and_grads(
        self,
        ids,
        targets,
        attention_mask=None,
        *,
        head_mask=None,
        ablation="zero",
        reference=None,
        mean_z=None,
    ) -> tuple[float, dict]:
        """Mean next-token cross-entropy over the scored positions, and its gradients.

        ids: (B, T) array or list of id lists (left-padded here). targets: same shape as ids, or
        list of lists of the same lengths; targets[b, t] is the token logits[b, t] should predict,
        negative = not scored. head_mask (L, H) floats (ones when None):
        z_h -> m z_h + (1 - m) fill_h, fill = 0 (zero ablation) or the head's mean output (mean).
        Run in float64 for gradient checks.

        Returns loss, grads: the parameter gradients keyed exactly like `params` (a tied
        unembedding holds the total gradient under both keys), plus grads["head_mask"] (L, H) =
        dloss/dm. Removing head h changes the loss by about -m_h * grads["head_mask"][l, h].
        """
        from cel_numpy.models.backward import IGNORE, cross_entropy_loss, transformer_backward

        if isinstance(ids, np.ndarray):
            batch, mask = self.as_batch(ids, attention_mask)
            targets = np.asarray(targets)
        else:
            seqs, rows = [list(s) for s in ids], [list(t) for t in targets]
            if [len(s) for s in seqs] != [len(t) for t in rows]:
                raise ValueError("targets must have the same lengths as ids, row by row")
            batch, mask = self.pad(seqs)
            T = batch.shape[1]
            targets = np.full(batch.shape, IGNORE, dtype=np.int64)
            for b, t in enumerate(rows):
                targets[b, T - len(t) :] = t
        c = self.config
        if head_mask is None:
            head_mask = np.ones((c.n_layers, c.n_heads))
        head_mask = np.asarray(head_mask, dtype=self.dtype)
        if head_mask.shape != (c.n_layers, c.n_heads):
            raise InvalidHeadError(
                f"head_mask must be (L, H) = {(c.n_layers, c.n_heads)}, got {head_mask.shape}"
            )
        head_fill = self.ablation_fill(ablation, reference, mean_z)  # (L, H, E) or None
        # (B, T, V)
        logits, cache = transformer_forward(
            self.params, c, batch, mask, head_mask=head_mask, head_fill=head_fill
        )
        loss, dlogits = cross_entropy_loss(logits, targets)
        grads, dhead_mask = transformer_backward(
            dlogits, self.params, c, cache, batch, head_fill=head_fill
        )
        grads["head_mask"] = dhead_mask
        return loss, grads

    # ------------------------------------------------------------------ generation

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int = 16,
        *,
        ablate=None,
        ablation: str = "zero",
        reference=None,
        mean_z=None,
        stop_at_eos: bool = True,
        stop_ids: Iterable[int] | None = None,
        use_cache: bool = True,
    ) -> list[list[int]]:
        """Greedy continuation of each prompt (new ids only; the stop token is not included).

        With use_cache the prompts run once and every new token reuses the keys/values of
        earlier positions (past_kv); without, every step recomputes the whole sequence (same
        tokens, for tests and teaching). Rows stop at a stop token -- `stop_ids` when given
        (e.g. the tokenizer's end-of-turn and end-of-text ids), else eos when stop_at_eos -- and
        the loop stops when all rows have. Padding rows of the vocabulary are never chosen.
        """
        if not (_is_int(max_new_tokens) and max_new_tokens >= 0):
            raise OptionError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
        ids, mask = self.pad(prompts)
        head_mask, head_fill = self.intervention(ablate, ablation, reference, mean_z)
        if stop_ids is None:
            eos = getattr(self.tokenizer, "eos_id", None) if stop_at_eos else None
            stop_ids = () if eos is None else (eos,)
        if isinstance(stop_ids, (str, bytes)) or not isinstance(stop_ids, Iterable):
            raise PromptError(f"stop_ids must be a sequence of token ids, got {stop_ids!r:.40}")
        stop_ids = list(stop_ids)
        self.check_ids(stop_ids)  # a 57.5 would stop at 57
        stops = frozenset(int(i) for i in stop_ids)
        B = ids.shape[0]
        new: list[list[int]] = [[] for _ in range(B)]
        done = np.zeros(B, dtype=bool)
        past, step_ids, all_ids = None, ids, ids
        for _ in range(max_new_tokens):
            logits, cache = transformer_forward(
                self.params,
                self.config,
                step_ids if use_cache else all_ids,
                mask,
                head_mask=head_mask,
                head_fill=head_fill,
                past=past,
                keep_activations=False,
                logit_positions=slice(-1, None),
            )
            next_ids = finite_argmax(self.mask_padding(logits[:, -1]))  # (B,)
            for b in np.flatnonzero(~done):
                token = int(next_ids[b])
                if token in stops:
                    done[b] = True
                else:
                    new[b].append(token)
            if done.all():
                break
            step_ids = next_ids[:, None].astype(np.int64)  # (B, 1)
            all_ids = np.concatenate([all_ids, step_ids], axis=1)  # (B, T + steps)
            mask = np.concatenate([mask, np.ones((B, 1), dtype=mask.dtype)], axis=1)
            past = cache.kv if use_cache else None
        return new

    def chat(self, messages, *, add_generation_prompt: bool = True, **variables) -> str:
        """The conversation written in the model's own chat template (text, not ids).

        messages: [{"role": "system" | "user" | "assistant", "content": str}, ...]. The template
        is the GGUF's tokenizer.chat_template or the folder's tokenizer_config.json one,
        rendered like transformers' apply_chat_template (sandboxed jinja2, same globals). Encode
        the result with `encode_chat_text` (no BOS is added: the template writes its own).
        """
        from cel_numpy.models.chat import render_chat, special_token_variables

        tok = self._require_tokenizer()
        if not getattr(tok, "chat_template", None):
            raise NoTokenizerError(
                f"{self.source or 'this model'} has no chat template (GGUF tokenizer.chat_template "
                "or tokenizer_config.json chat_template): format the prompt yourself"
            )
        return render_chat(
            tok.chat_template,
            messages,
            where=getattr(tok, "chat_template_file", None) or self.source,
            add_generation_prompt=add_generation_prompt,
            **(special_token_variables(tok) | variables),
        )

    def encode_chat_text(self, text: str) -> list[int]:
        """Ids of a rendered conversation: special tokens matched, no BOS added (as HF does)."""
        tok = self._require_tokenizer()
        self.check_text_length(text, "the rendered conversation")
        return tok.encode(text, add_bos=False)

    def generate(
        self, text: str | Sequence[str], max_new_tokens: int = 16, **kwargs
    ) -> str | list[str]:
        """Greedy continuation of a prompt (or of each prompt in a list); returns the new
        text only."""
        tok = self._require_tokenizer()
        prompts = [text] if isinstance(text, str) else list(text)
        new = self.generate_ids([tok.encode(p) for p in prompts], max_new_tokens, **kwargs)
        out = [tok.decode(ids) for ids in new]
        return out[0] if isinstance(text, str) else out
