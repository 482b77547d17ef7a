"""SentencePiece-style BPE with byte fallback, as GGUF files of tokenizer model 'llama' hold it
(Gemma 3), in pure Python.

Encoding, in order:
1. split the text on added tokens (GGUF CONTROL tokens such as "<start_of_turn>", and
   USER_DEFINED ones such as "\\n\\n" or "\\t\\t"), which map to their own ids;
2. in each remaining segment write every space as "▁" (U+2581); no space is added in front;
3. start from the segment's characters; a character that is no token becomes the byte tokens
   "<0xXX>" of its UTF-8 bytes (byte fallback);
4. repeatedly merge the adjacent pair whose concatenation is the best-ranked token: the token
   nearest the top of the vocabulary, then the longer left part, then the leftmost pair.

Step 4 ranks by the vocabulary's order. SentencePiece's own BPE ranks by the token scores, and a
GGUF file keeps them (`tokenizer.ggml.scores`); in Gemma's file the ordinary tokens' scores are
exactly minus their rank, so both agree there, but the whitespace-run tokens ("  ", "   ", ...)
sit near the top of the vocabulary with a USER_DEFINED score. transformers' GGUF reader ranks them
by their place in the vocabulary (and spells them "▁▁", ...), and we follow it: the parity
fixture is written by transformers.

Decoding maps "▁" back to a space and byte tokens back to their bytes, then decodes UTF-8, so
decode(encode(s)) == s for any text without added-token spellings.

Built by `SentencePieceTokenizer.from_gguf_fields`; its public surface is that of
`BPETokenizer` (encode, decode, vocab_size, stop_ids, padding_ids, ...).
"""

from __future__ import annotations

import functools
import heapq
from collections.abc import Iterable, Sequence

import numpy as np

from cel_numpy.errors import PromptError, TokenizerError
from cel_numpy.models.tokenizer import (
    END_TOKENS,
    _alternation,
    _file_errors,
    _gguf_template,
    gguf_field,
    split_on_tokens,
)

SPACE = "\u2581"  # "▁": SentencePiece's visible space
CONTROL, USER_DEFINED, BYTE = 3, 4, 6  # GGUF token types (tokenizer.ggml.token_type)
PIECE_CACHE_SIZE = 1 << 14  # distinct segments remembered per tokenizer


def byte_token(b: int) -> str:
    """The byte-fallback token of byte value b: "<0x41>" for b = 65."""
    return f"<0x{b:02X}>"


class SentencePieceTokenizer:
    """BPE over characters with byte fallback; merges ranked by vocabulary order.

    tokens: the vocabulary in id order. `added` (content -> id) are matched verbatim in raw text
    before anything else (leftmost, longest first); `special_ids` are the added tokens that
    `decode(skip_special=True)` drops (control tokens).
    """

    def __init__(
        self,
        tokens: Sequence[str],
        *,
        added: dict[str, int],
        special_ids: Iterable[int] = (),
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        unk_id: int | None = None,
        add_bos: bool = False,
        eot_id: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        if not tokens:
            raise TokenizerError("empty vocabulary")
        self._tokens = list(tokens)
        # token -> id; a spelling listed twice keeps its last id (as transformers' dict does)
        self._vocab = {t: i for i, t in enumerate(self._tokens)}
        self._added = dict(added)
        self._special_ids = frozenset(int(i) for i in special_ids)
        n = len(self._tokens)
        for label, idx in (
            ("bos_id", bos_id),
            ("eos_id", eos_id),
            ("pad_id", pad_id),
            ("unk_id", unk_id),
            ("eot_id", eot_id),
        ):
            if idx is not None and not (isinstance(idx, int) and 0 <= idx < n):
                raise TokenizerError(f"{label} {idx!r} is not a token id (vocabulary size {n})")
        self.bos_id, self.eos_id, self.pad_id, self.unk_id = bos_id, eos_id, pad_id, unk_id
        self.eot_id, self.add_bos, self.chat_template = eot_id, add_bos, chat_template
        missing = [b for b in range(256) if byte_token(b) not in self._vocab]
        if missing:
            raise TokenizerError(
                f"vocabulary lacks the byte token {byte_token(missing[0])}: byte fallback needs "
                "all 256 (not a SentencePiece byte-fallback vocabulary)"
            )
        self._byte_ids = [self._vocab[byte_token(b)] for b in range(256)]
        self._id_bytes = [self._token_bytes(i, t) for i, t in enumerate(self._tokens)]
        self._added_re = _alternation(self._added)
        # per-instance LRU cache: segment (str) -> token ids (tuple)
        self._encode_segment = functools.lru_cache(maxsize=PIECE_CACHE_SIZE)(
            self._encode_segment_uncached
        )

    # ------------------------------------------------------------------ public API

    @property
    def vocab_size(self) -> int:
        return len(self._tokens)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a generation: eos, end-of-turn, and the known end tokens present."""
        ids = {i for i in (self.eos_id, self.eot_id) if i is not None}
        ids |= {self._added[t] for t in END_TOKENS if t in self._added}
        return frozenset(ids)

    def padding_ids(self, n_rows: int) -> np.ndarray:
        """Embedding rows in [0, n_rows) that are no token: those past the vocabulary."""
        return np.arange(self.vocab_size, n_rows, dtype=np.int64)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Added tokens matched verbatim in text: content -> id."""
        return dict(self._added)

    def token_to_id(self, token: str) -> int:
        try:
            return self._vocab[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in the vocabulary") from None

    def id_to_token(self, idx: int) -> str:
        if not 0 <= idx < len(self._tokens):
            raise IndexError(f"token id {idx} is not in the vocabulary (size {self.vocab_size})")
        return self._tokens[idx]

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; prepend bos_id if add_bos (default: self.add_bos)."""
        if not isinstance(text, str):
            raise PromptError(f"text to encode must be a str, got {type(text).__name__}")
        bad = next((i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF), None)
        if bad is not None:
            raise PromptError(
                f"text is not valid Unicode: lone surrogate U+{ord(text[bad]):04X} at character "
                f"{bad} (text decoded with errors='surrogateescape'? decode it as UTF-8 first)"
            )
        ids: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos requested but this tokenizer has no bos_id")
            ids.append(self.bos_id)
        for segment, added_id in self._split_added(text):
            if added_id is not None:
                ids.append(added_id)
            else:
                ids.extend(self._encode_segment(segment))
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of token ids (invalid UTF-8 from partial byte sequences becomes U+FFFD)."""
        chunks = []
        for idx in ids:
            idx = int(idx)
            if skip_special and idx in self._special_ids:
                continue
            if not 0 <= idx < len(self._id_bytes):
                raise IndexError(f"token id {idx} is out of range (vocab size {self.vocab_size})")
            chunks.append(self._id_bytes[idx])
        return b"".join(chunks).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (
            f"SentencePieceTokenizer(vocab_size={self.vocab_size}, added={len(self._added)}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id}, add_bos={self.add_bos})"
        )

    # ------------------------------------------------------------------ constructor

    @classmethod
    @_file_errors
    def from_gguf_fields(cls, reader) -> SentencePieceTokenizer:
        """From the tokenizer.ggml.* fields of a GGUF file whose tokenizer model is 'llama'.

        Whitespace-only tokens with a space (GGUF spells Gemma's space runs with real spaces)
        are respelled with one "▁" per character and merged like any token; the other
        USER_DEFINED tokens and all CONTROL tokens
        are matched verbatim in text. A file asking for a space in front of the text
        (add_space_prefix) is refused: Gemma adds none, and no other file is checked.
        """
        model = gguf_field(reader, "tokenizer.ggml.model")
        if model != "llama":
            raise TokenizerError(f"GGUF tokenizer.ggml.model is {model!r}, not 'llama'")
        if gguf_field(reader, "tokenizer.ggml.add_space_prefix", default=True):
            raise TokenizerError(
                "GGUF tokenizer.ggml.add_space_prefix is true (or absent): only SentencePiece "
                "vocabularies without a space prefix (Gemma) are supported"
            )
        raw = gguf_field(reader, "tokenizer.ggml.tokens")
        types = gguf_field(reader, "tokenizer.ggml.token_type", default=[1] * len(raw))
        if len(types) != len(raw):
            raise TokenizerError(
                f"GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(raw)} tokens"
            )
        tokens = [SPACE * len(t) if " " in t and not t.strip() else t for t in raw]
        added = {
            t: i
            for i, (t, kind) in enumerate(zip(tokens, types))
            if kind == CONTROL or (kind == USER_DEFINED and t == raw[i])
        }
        bos_id = gguf_field(reader, "tokenizer.ggml.bos_token_id", default=None)
        # no add_bos_token field: llama.cpp (and transformers) add BOS to a SentencePiece text
        add_bos = gguf_field(reader, "tokenizer.ggml.add_bos_token", default=bos_id is not None)
        return cls(
            tokens,
            added=added,
            special_ids=[i for i, kind in enumerate(types) if kind == CONTROL],
            bos_id=bos_id,
            eos_id=gguf_field(reader, "tokenizer.ggml.eos_token_id", default=None),
            pad_id=gguf_field(reader, "tokenizer.ggml.padding_token_id", default=None),
            unk_id=gguf_field(reader, "tokenizer.ggml.unknown_token_id", default=None),
            add_bos=bool(add_bos),
            eot_id=gguf_field(reader, "tokenizer.ggml.eot_token_id", default=None),
            chat_template=_gguf_template(reader),
        )

    # ------------------------------------------------------------------ internals

    def _token_bytes(self, idx: int, token: str) -> bytes:
        """What token `idx` decodes to: its byte for "<0xXX>", else its text with "▁" -> " "."""
        if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
            try:
                value = int(token[3:5], 16)
            except ValueError:
                value = None
            if value is not None and self._byte_ids[value] == idx:
                return bytes([value])
        return token.replace(SPACE, " ").encode("utf-8")

    def _split_added(self, text: str) -> list[tuple[str, int | None]]:
        """Text segments and added tokens in order: (segment, None) or (content, id)."""
        return split_on_tokens(text, self._added_re, self._added)

    def _encode_segment_uncached(self, segment: str) -> tuple[int, ...]:
        """Token ids of one segment without added tokens (steps 2-4 of the module docstring)."""
        symbols: list[str | int] = []  # a character (str) or a byte-fallback token id (int)
        for ch in segment.replace(" ", SPACE):
            if ch in self._vocab:
                symbols.append(ch)
            else:
                symbols.extend(self._byte_ids[b] for b in ch.encode("utf-8"))
        return tuple(
            s if isinstance(s, int) else self._vocab[s] for s in merge_by_rank(symbols, self._vocab)
        )


def merge_by_rank(symbols: list, ranks: dict[str, int]) -> list:
    """BPE merges in rank order over a linked list of symbols, with a heap: O(n log n).

    symbols: strings (mergeable) or ints (byte-fallback ids, never merged). Each step merges the
    adjacent pair (a, b) of strings whose concatenation has the lowest rank, ties going to the
    longer a, then to the leftmost pair (transformers' merge list for a GGUF SentencePiece
    vocabulary puts a token's splits in that order).
    """
    n = len(symbols)
    text = list(symbols)
    nxt = list(range(1, n + 1))  # index of the next live symbol (n: none)
    prv = list(range(-1, n - 1))  # index of the previous live symbol (-1: none)
    heap: list[tuple[int, int, int, str, str]] = []

    def push(i: int) -> None:
        j = nxt[i] if i >= 0 else n
        if i < 0 or j >= n or not isinstance(text[i], str) or not isinstance(text[j], str):
            return
        rank = ranks.get(text[i] + text[j])
        if rank is not None:
            heapq.heappush(heap, (rank, -len(text[i]), i, text[i], text[j]))

    for i in range(n - 1):
        push(i)
    while heap:
        _, _, i, left, right = heapq.heappop(heap)
        j = nxt[i]
        if text[i] != left or j >= n or text[j] != right:  # stale: a side merged meanwhile
            continue
        text[i] = left + right
        text[j] = None  # removed
        nxt[i] = nxt[j]
        if nxt[j] < n:
            prv[nxt[j]] = i
        push(prv[i])
        push(i)
    out = []
    i = 0
    while i < n:
        out.append(text[i])
        i = nxt[i]
    return out
