"""Byte-level BPE tokenizer in pure Python (GPT-2, SmolLM2 and similar vocabularies).

Encoding, in order:
1. split the text on special/added tokens (e.g. "<|im_start|>"), which map to their own ids;
2. pre-tokenize each remaining segment into pieces with regex splits (GPT-2 pattern, and for
   SmolLM2 every digit isolated first);
3. map each piece's UTF-8 bytes to the printable byte-level alphabet (GPT-2's bytes_to_unicode);
4. apply BPE merges (lowest rank first) within the piece; pieces are cached per tokenizer.

Decoding maps ids back to bytes and decodes UTF-8, so decode(encode(s)) == s for any string
(unless a prefix space is added by a tokenizer.json ByteLevel(add_prefix_space=True), or the
tokenizer normalizes text first: Qwen2's NFC gives decode(encode(s)) == NFC(s)).

Qwen2 differs from GPT-2 in its pre-tokenizer (`QWEN2_PATTERN`: every digit is its own piece, a
word may take one leading punctuation character) and in normalizing text to NFC first.

Constructors: BPETokenizer.from_gpt2_files, .from_vocab_merges, .from_hf_tokenizer_json,
.from_gguf_fields. A malformed file of any kind raises TokenizerError (one line, naming the
file); text that is not valid Unicode (a lone surrogate such as "\\ud800", which Python strings
allow) raises PromptError. Empty text encodes to no tokens (plus BOS if the tokenizer adds one):
whether a model accepts that is for the caller to decide.
"""

from __future__ import annotations

import functools
import time
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import regex

from cel_numpy.errors import PromptError, TokenizerError
from cel_numpy.limits import (
    MAX_JSON_BYTES,
    MAX_TOKENIZER_JSON_BYTES,
    read_bytes_limited,
    read_json,
)

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DIGIT_PATTERN = r"\p{N}"  # one numeric character (HF Digits(individual_digits=True))
DIGITS_PATTERN = r"\p{N}+"  # a run of numeric characters (HF Digits(individual_digits=False))

PIECE_CACHE_SIZE = 1 << 16  # distinct pre-tokenized pieces remembered per tokenizer


def _file_errors(constructor):
    """Decorator: any parsing failure inside a constructor becomes a TokenizerError naming the file.

    The constructor's first argument is the file (or a GGUF reader). Files come from users
    (truncated downloads, the wrong file), so KeyError/IndexError/JSON errors deep in the
    parsing must not escape raw.
    """

    @functools.wraps(constructor)
    def checked(cls, source, *args, **kwargs):
        name = _source_name(source)
        try:
            return constructor(cls, source, *args, **kwargs)
        except TokenizerError as err:
            if str(err).startswith((name, str(Path(name).parent))):  # names its file already
                raise
            raise TokenizerError(f"{name}: {err}") from None
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
            detail = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
            where = getattr(err, "filename", None) or name  # merges.txt, not vocab.json
            raise TokenizerError(f"{where}: malformed tokenizer file ({detail})") from None
        except RecursionError:
            raise TokenizerError(
                f"{name}: JSON nested too deeply to be a tokenizer file (malformed)"
            ) from None

    return checked


def _source_name(source) -> str:
    """A path as text; for a GGUF reader, the file it maps (found through its data buffer)."""
    if isinstance(source, (str, Path)):
        return str(source)
    base = getattr(source, "data", None)
    while base is not None and not hasattr(base, "filename"):
        base = getattr(base, "base", None)
    return str(getattr(base, "filename", None) or "GGUF file")


# ----------------------------------------------------------------------------- pre-tokenizers


@dataclass(frozen=True)
class RegexSplit:
    """Split a piece into regex matches and the text between them (HF behavior "Isolated").

    `where` (the tokenizer file) names the pattern's origin in errors. A pattern that is not a
    valid regex is a TokenizerError; so is one that backtracks catastrophically (`(a|aa)+c` on
    forty a's): matching stops after `regex_timeout(len(piece))` seconds.
    """

    pattern: str
    where: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        try:
            compiled = regex.compile(self.pattern)
        except (regex.error, RecursionError, OverflowError) as err:
            raise TokenizerError(
                f"{self.where or 'tokenizer'}: invalid pre_tokenizer regex {self.pattern!r} ({err})"
            ) from None
        object.__setattr__(self, "_compiled", compiled)

    def __call__(self, piece: str) -> list[str]:
        # The regex module's timeout is wall-clock time; on a loaded machine a process can wait
        # longer than that for a core (a HellaSwag run on a 2-core machine under load 23 failed
        # on an ordinary 389-character piece). So a timeout is retried until this process has
        # spent the budget in CPU time: real backtracking still fails after one budget.
        budget, start = regex_timeout(len(piece)), time.process_time()
        while True:
            try:
                return split_isolated(self._compiled, piece, timeout=budget)
            except TimeoutError:
                if time.process_time() - start >= 0.9 * budget:  # (clock granularity)
                    break
        raise TokenizerError(
            f"{self.where or 'tokenizer'}: the pre_tokenizer regex {self.pattern!r} did not "
            f"finish on a piece of {len(piece)} characters (catastrophic backtracking): the "
            "tokenizer file is unusable; use the model's original tokenizer files"
        )


def regex_timeout(n_chars: int) -> float:
    """Seconds a pre-tokenizer regex may take on n_chars: 100x what the GPT-2 pattern needs
    (about 1 microsecond per character), and a quarter second at least."""
    return 0.25 + 1e-4 * n_chars


@dataclass(frozen=True)
class PrefixSpace:
    """Prepend a space to a piece that does not start with one (ByteLevel add_prefix_space)."""

    def __call__(self, piece: str) -> list[str]:
        return [piece if piece.startswith(" ") else " " + piece]


PreTokenizeStep = RegexSplit | PrefixSpace

GPT2_PRE: tuple[PreTokenizeStep, ...] = (RegexSplit(GPT2_PATTERN),)
SMOLLM_PRE: tuple[PreTokenizeStep, ...] = (RegexSplit(DIGIT_PATTERN), RegexSplit(GPT2_PATTERN))

# llama.cpp's tokenizer.ggml.pre names -> our steps. "smollm" is llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_SMOLLM, which shares StarCoder's rules: regexes "\p{N}" then GPT-2's.
# Qwen2: case-insensitive contractions, a letter run may take one leading non-letter/non-digit
# (not a newline), every digit alone, punctuation runs keep trailing newlines, newline runs
# keep their leading spaces. Same text as Qwen2's tokenizer.json Split pre-tokenizer.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
QWEN2_PRE: tuple[PreTokenizeStep, ...] = (RegexSplit(QWEN2_PATTERN),)

GGUF_PRE: dict[str, tuple[PreTokenizeStep, ...]] = {
    "gpt2": GPT2_PRE,
    "smollm": SMOLLM_PRE,
    "starcoder": SMOLLM_PRE,
    "qwen2": QWEN2_PRE,
}
GGUF_NORMALIZER = {"qwen2": "NFC"}  # Qwen2's tokenizer.json normalizes text to NFC first
NORMALIZERS = ("NFC", "NFD", "NFKC", "NFKD")  # unicodedata forms (tokenizer.json normalizer types)

# Tokens that end a turn or a text in the chat formats we know: generation stops there.
END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>", "<end_of_turn>")


def split_isolated(pattern: regex.Pattern, text: str, timeout: float | None = None) -> list[str]:
    """Split `text` into the non-empty matches of `pattern` and the gaps between them."""
    pieces = []
    pos = 0
    for match in pattern.finditer(text, timeout=timeout):
        start, end = match.span()
        if start == end:
            continue  # zero-width match: nothing to isolate
        if start > pos:
            pieces.append(text[pos:start])
        pieces.append(match.group())
        pos = end
    if pos < len(text):
        pieces.append(text[pos:])
    return pieces


def pre_tokenize(steps: Sequence[PreTokenizeStep], text: str) -> list[str]:
    """Apply each step to every piece produced by the previous one."""
    pieces = [text]
    for step in steps:
        pieces = [out for piece in pieces for out in step(piece)]
    return pieces


# ----------------------------------------------------------------------------- byte alphabet


@functools.cache
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from the 256 byte values to printable unicode characters."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def _to_byte_level(piece: str) -> str:
    """The piece's UTF-8 bytes written in the byte-level alphabet.

    Latin-1 decoding turns each byte into the code point of the same value, which
    str.translate then maps through bytes_to_unicode (a byte value -> character table).
    """
    return piece.encode("utf-8").decode("latin-1").translate(bytes_to_unicode())


@functools.cache
def _byte_decoder() -> dict[int, str]:
    """str.translate table inverting bytes_to_unicode: alphabet character -> chr(byte)."""
    return {ord(ch): chr(b) for b, ch in bytes_to_unicode().items()}


@functools.cache
def _outside_alphabet() -> regex.Pattern:
    """Matches any character that is not in the byte-level alphabet."""
    alphabet = "".join(bytes_to_unicode().values())
    return regex.compile(f"[^{regex.escape(alphabet)}]")


def _token_bytes(token: str) -> bytes:
    """Bytes of a byte-level vocabulary token (characters outside the alphabet kept as UTF-8)."""
    if not _outside_alphabet().search(token):
        return token.translate(_byte_decoder()).encode("latin-1")  # fast path: pure alphabet
    return b"".join(
        ch.encode("utf-8") if _outside_alphabet().match(ch) else _token_bytes(ch) for ch in token
    )


# ----------------------------------------------------------------------------- the tokenizer


class BPETokenizer:
    """Byte-level BPE: vocab (token -> id), ranked merges, special tokens, pre-tokenizer.

    `special_tokens` (content -> id) are matched in raw text before pre-tokenization and
    decoded verbatim. `ignore_merges=True` (HF option, used by Llama-3-style tokenizers)
    emits a whole piece as one token when it is in the vocabulary.

    Bytes whose byte-level character is missing from the vocabulary (`missing_bytes`; e.g.
    SmolLM2 lacks 0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xf1, 0xf2 and the bytes that never
    occur in UTF-8) are dropped before merging when `unk_id` is None, exactly as HF
    `tokenizers` and llama.cpp do; otherwise each becomes `unk_id` (one per run if
    `fuse_unk`). Text containing them does not round-trip.
    """

    def __init__(
        self,
        vocab: dict[str, int],
        merges: Sequence[tuple[str, str]],
        *,
        special_tokens: dict[str, int] | None = None,
        pre_tokenizer: Sequence[PreTokenizeStep] = GPT2_PRE,
        bos_id: int | None = None,
        eos_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool = False,
        ignore_merges: bool = False,
        unk_id: int | None = None,
        fuse_unk: bool = False,
        normalizer: str | None = None,
        unused_ids: Iterable[int] = (),
        eot_id: int | None = None,
        chat_template: str | None = None,
    ) -> None:
        if normalizer is not None and normalizer not in NORMALIZERS:
            raise TokenizerError(
                f"unsupported normalizer {normalizer!r} (supported: {', '.join(NORMALIZERS)})"
            )
        self.normalizer = normalizer
        self.chat_template = chat_template
        self._vocab = dict(vocab)
        self._special = dict(special_tokens or {})
        if "" in self._special:  # it would match between every two characters of any text
            raise TokenizerError(
                f"special token {self._special['']} has empty text, which would be inserted "
                "between every two characters: the tokenizer file is damaged"
            )
        for content, idx in self._special.items():
            self._vocab.setdefault(content, idx)
        self._ranks = {pair: rank for rank, pair in enumerate(merges)}
        self._pre_tokenizer = tuple(pre_tokenizer)
        self._ignore_merges = ignore_merges
        self.unk_id, self._fuse_unk = unk_id, fuse_unk
        self.bos_id, self.eos_id, self.pad_id = bos_id, eos_id, pad_id
        self.add_bos = add_bos
        self._id_to_token = _invert_vocab(self._vocab)
        for label, idx in (
            ("bos_id", bos_id),
            ("eos_id", eos_id),
            ("pad_id", pad_id),
            ("unk_id", unk_id),
        ):
            if idx is not None and not (isinstance(idx, int) and 0 <= idx < len(self._id_to_token)):
                raise TokenizerError(
                    f"{label} {idx!r} is not a token id (vocabulary size {len(self._id_to_token)})"
                )
        if eot_id is not None and not (isinstance(eot_id, int) and 0 <= eot_id < self.vocab_size):
            raise TokenizerError(f"eot_id {eot_id!r} is not a token id")
        self.eot_id = eot_id
        self._unused = frozenset(int(i) for i in unused_ids) | frozenset(
            i for i, t in enumerate(self._id_to_token) if t is None
        )
        self._id_bytes = [_token_bytes(t) if t is not None else b"" for t in self._id_to_token]
        for content, idx in self._special.items():
            self._id_bytes[idx] = content.encode("utf-8")
        self.max_token_bytes = max(1, max(map(len, self._id_bytes), default=1))
        self._special_re = _alternation(self._special)
        self.missing_bytes = self._check_byte_alphabet()
        self._missing_chars = frozenset(bytes_to_unicode()[b] for b in self.missing_bytes)
        self._check_merges()
        # per-instance LRU cache: piece (str) -> token ids (tuple)
        self._encode_piece = functools.lru_cache(maxsize=PIECE_CACHE_SIZE)(
            self._encode_piece_uncached
        )

    # ------------------------------------------------------------------ public API

    @property
    def vocab_size(self) -> int:
        """Number of ids (largest id + 1, special tokens included)."""
        return len(self._id_to_token)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a generation: eos, end-of-turn, and the known end tokens present.

        A chat model ends its turn with e.g. `<|im_end|>` (ChatML) and may instead emit
        end-of-text; both must stop decoding. Never empty when the tokenizer has an eos_id.
        """
        ids = {i for i in (self.eos_id, self.eot_id) if i is not None}
        ids |= {self._special[t] for t in END_TOKENS if t in self._special}
        return frozenset(ids)

    def padding_ids(self, n_rows: int) -> np.ndarray:
        """Embedding rows in [0, n_rows) that are no token: (n,) int64, sorted.

        Checkpoints pad the embedding (Qwen2: 151,936 rows for 151,665 tokens); the padding rows
        (ids past the vocabulary, unused GGUF slots such as "[PAD151665]", gaps in the ids)
        must never be produced by argmax, top-k or sampling.
        """
        extra = range(self.vocab_size, n_rows)
        ids = sorted(i for i in self._unused if i < n_rows) + list(extra)
        return np.asarray(ids, dtype=np.int64)

    @property
    def special_tokens(self) -> dict[str, int]:
        """Special/added tokens matched verbatim in text: content -> id."""
        return dict(self._special)

    def token_to_id(self, token: str) -> int:
        """Id of a vocabulary token (byte-level spelling, e.g. "Ġworld"); KeyError if absent."""
        try:
            return self._vocab[token]
        except KeyError:
            raise KeyError(f"token {token!r} is not in the vocabulary") from None

    def id_to_token(self, idx: int) -> str:
        """Vocabulary string of an id (byte-level spelling); IndexError if out of range."""
        if not 0 <= idx < len(self._id_to_token) or self._id_to_token[idx] is None:
            raise IndexError(f"token id {idx} is not in the vocabulary (size {self.vocab_size})")
        return self._id_to_token[idx]

    def encode(self, text: str, *, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; prepend bos_id if add_bos (default: self.add_bos).

        `text` must be valid Unicode: a lone surrogate raises PromptError naming its position.
        """
        if not isinstance(text, str):
            raise PromptError(f"text to encode must be a str, got {type(text).__name__}")
        ids: list[int] = []
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise ValueError("add_bos requested but this tokenizer has no bos_id")
            ids.append(self.bos_id)
        try:
            for segment, special_id in self._split_special(text):
                if special_id is not None:
                    ids.append(special_id)
                    continue
                if self.normalizer is not None:
                    segment = unicodedata.normalize(self.normalizer, segment)
                for piece in pre_tokenize(self._pre_tokenizer, segment):
                    ids.extend(self._encode_piece(piece))
        except UnicodeEncodeError:
            at = next(i for i, ch in enumerate(text) if 0xD800 <= ord(ch) <= 0xDFFF)
            raise PromptError(
                f"text is not valid Unicode: lone surrogate U+{ord(text[at]):04X} at character "
                f"{at} (text decoded with errors='surrogateescape'? decode it as UTF-8 first)"
            ) from None
        return ids

    def decode(self, ids: Iterable[int], *, skip_special: bool = False) -> str:
        """Text of token ids (invalid UTF-8 from partial sequences becomes U+FFFD)."""
        special_ids = set(self._special.values()) if skip_special else set()
        chunks = []
        for idx in ids:
            idx = int(idx)
            if idx in special_ids:
                continue
            if not 0 <= idx < len(self._id_bytes):
                raise IndexError(f"token id {idx} is out of range (vocab size {self.vocab_size})")
            chunks.append(self._id_bytes[idx])
        return b"".join(chunks).decode("utf-8", errors="replace")

    def __repr__(self) -> str:
        return (
            f"BPETokenizer(vocab_size={self.vocab_size}, merges={len(self._ranks)}, "
            f"special={len(self._special)}, bos_id={self.bos_id}, eos_id={self.eos_id}, "
            f"pad_id={self.pad_id}, add_bos={self.add_bos})"
        )

    # ------------------------------------------------------------------ constructors

    @classmethod
    @_file_errors
    def from_vocab_merges(
        cls,
        vocab_json: str | Path,
        merges_txt: str | Path,
        *,
        special_tokens: Iterable[str] = ("<|endoftext|>",),
    ) -> BPETokenizer:
        """From a HF GPT-2 folder's vocab.json + merges.txt (GPT-2 pre-tokenizer).

        `special_tokens` present in the vocab are matched verbatim in text; "<|endoftext|>"
        becomes bos_id and eos_id when present (as for GPT-2). No BOS is added by default.
        """
        vocab = read_json(
            vocab_json, "vocabulary", error=TokenizerError, max_bytes=MAX_TOKENIZER_JSON_BYTES
        )
        if not isinstance(vocab, dict):
            raise TokenizerError(
                f"{vocab_json}: holds a JSON {type(vocab).__name__}, not a vocabulary"
            )
        merges = _read_merges_txt(Path(merges_txt))
        special = {t: vocab[t] for t in special_tokens if t in vocab}
        eot = special.get("<|endoftext|>")
        try:
            return cls(vocab, merges, special_tokens=special, bos_id=eot, eos_id=eot)
        except TokenizerError as err:  # a merge the vocabulary lacks: both files, name merges.txt
            if " merge " not in f" {err} ":
                raise
            raise TokenizerError(f"{merges_txt}: {err} ({Path(vocab_json).name})") from None

    @classmethod
    def from_gpt2_files(
        cls,
        encoder_json: str | Path,
        vocab_bpe: str | Path,
        *,
        special_tokens: Iterable[str] = ("<|endoftext|>",),
    ) -> BPETokenizer:
        """From OpenAI's GPT-2 encoder.json (token -> id) and vocab.bpe (ranked merges)."""
        return cls.from_vocab_merges(encoder_json, vocab_bpe, special_tokens=special_tokens)

    @classmethod
    @_file_errors
    def from_hf_tokenizer_json(cls, path: str | Path) -> BPETokenizer:
        """From a Hugging Face tokenizer.json with a byte-level BPE model.

        Reads model.vocab, model.merges ("a b" strings or [a, b] pairs), added_tokens and the
        pre_tokenizer (ByteLevel, Split(Isolated), Digits, Sequence). bos/eos/pad and
        add_bos come from a tokenizer_config.json next to it when present, and add_bos also
        from a TemplateProcessing post_processor that starts with a special token.
        """
        path = Path(path)
        spec = read_json(
            path, "tokenizer file", error=TokenizerError, max_bytes=MAX_TOKENIZER_JSON_BYTES
        )
        if not isinstance(spec, dict):
            raise TokenizerError(f"{path}: holds a JSON {type(spec).__name__}, not a tokenizer")
        vocab, merges, options = _hf_model(spec.get("model"), path)
        normalizer = None
        if spec.get("normalizer") is not None:
            normalizer = spec["normalizer"].get("type")
            if normalizer not in NORMALIZERS:
                raise TokenizerError(
                    f"{path}: unsupported normalizer type {normalizer!r} "
                    f"(supported: null, {', '.join(NORMALIZERS)})"
                )
        pre = _hf_pre_tokenizer(spec.get("pre_tokenizer"), path)
        special = _hf_added_tokens(spec.get("added_tokens") or [], path)
        config_path = path.with_name("tokenizer_config.json")
        config = _read_tokenizer_config(config_path)
        bos, eos, pad = (
            _token_id(config.get(k), vocab, special)
            for k in ("bos_token", "eos_token", "pad_token")
        )
        template_bos = _template_bos(spec.get("post_processor"), vocab, special)
        add_bos = config.get("add_bos_token", template_bos is not None)
        template, template_file = config.get("chat_template"), config_path
        if template is None and path.with_name("chat_template.jinja").is_file():
            template_file = path.with_name("chat_template.jinja")
            template = read_bytes_limited(
                template_file, "chat template", max_bytes=MAX_JSON_BYTES, error=TokenizerError
            ).decode("utf-8")
        if not (template is None or isinstance(template, str)):
            raise TokenizerError(
                f"{config_path}: chat_template must be one template "
                "string (named templates are not supported)"
            )
        tokenizer = cls(
            vocab,
            merges,
            special_tokens=special,
            pre_tokenizer=pre,
            bos_id=bos if bos is not None else template_bos,
            eos_id=eos,
            pad_id=pad,
            add_bos=bool(add_bos),
            normalizer=normalizer,
            chat_template=template,
            **options,
        )
        tokenizer.chat_template_file = str(template_file)  # named in template errors
        return tokenizer

    @classmethod
    @_file_errors
    def from_gguf_fields(cls, reader) -> BPETokenizer:
        """From the tokenizer.ggml.* fields of a `gguf.GGUFReader` (model "gpt2" only).

        CONTROL (3) and USER_DEFINED (4) tokens become special tokens. Scalars are read from
        the field's value part (field.parts[field.data[0]]): parts[0] is the key's length,
        which is truthy and would make add_bos_token look true.
        """
        model = gguf_field(reader, "tokenizer.ggml.model")
        if model != "gpt2":
            raise TokenizerError(
                f"GGUF tokenizer.ggml.model is {model!r}; supported: 'gpt2' (byte-level BPE) and "
                "'llama' (SentencePiece with byte fallback, without a space prefix)"
            )
        # older files: GPT-2 rules
        pre_name = gguf_field(reader, "tokenizer.ggml.pre", default="gpt2")
        if pre_name not in GGUF_PRE:
            raise TokenizerError(
                f"GGUF tokenizer.ggml.pre {pre_name!r} is not supported "
                f"(known: {', '.join(GGUF_PRE)})"
            )
        tokens = gguf_field(reader, "tokenizer.ggml.tokens")
        types = gguf_field(reader, "tokenizer.ggml.token_type", default=[1] * len(tokens))
        merges = [
            _split_merge(m, "GGUF tokenizer.ggml.merges")
            for m in gguf_field(reader, "tokenizer.ggml.merges")
        ]
        vocab = {tok: i for i, tok in enumerate(tokens)}
        special = {tok: i for i, (tok, kind) in enumerate(zip(tokens, types)) if kind in (3, 4)}
        unused = [i for i, kind in enumerate(types) if kind == 5]  # UNUSED: padding slots
        return cls(
            vocab,
            merges,
            special_tokens=special,
            pre_tokenizer=GGUF_PRE[pre_name],
            bos_id=gguf_field(reader, "tokenizer.ggml.bos_token_id", default=None),
            eos_id=gguf_field(reader, "tokenizer.ggml.eos_token_id", default=None),
            pad_id=gguf_field(reader, "tokenizer.ggml.padding_token_id", default=None),
            add_bos=bool(gguf_field(reader, "tokenizer.ggml.add_bos_token", default=False)),
            normalizer=GGUF_NORMALIZER.get(pre_name),
            unused_ids=unused,
            eot_id=gguf_field(reader, "tokenizer.ggml.eot_token_id", default=None),
            chat_template=_gguf_template(reader),
        )

    # ------------------------------------------------------------------ internals

    def _split_special(self, text: str) -> list[tuple[str, int | None]]:
        """Text segments and special tokens in order: (segment, None) or (content, id)."""
        return split_on_tokens(text, self._special_re, self._special)

    def _encode_piece_uncached(self, piece: str) -> tuple[int, ...]:
        """Token ids of one pre-tokenized piece."""
        word = _to_byte_level(piece)
        if self._ignore_merges and word in self._vocab:
            return (self._vocab[word],)
        if self._missing_chars and not self._missing_chars.isdisjoint(word):
            return self._encode_with_missing(word)
        return tuple(self._vocab[part] for part in bpe_merge(word, self._ranks))

    def _encode_with_missing(self, word: str) -> tuple[int, ...]:
        """BPE of a byte-level word containing characters the vocabulary lacks."""
        if self.unk_id is None:  # dropped before merging, so neighbours may merge (as in HF)
            kept = "".join(ch for ch in word if ch not in self._missing_chars)
            return tuple(self._vocab[part] for part in bpe_merge(kept, self._ranks))
        ids: list[int] = []
        known_run = ""  # characters since the last missing one; merged on their own
        previous_unk = False
        for ch in word:
            if ch not in self._missing_chars:
                known_run += ch
                continue
            ids.extend(self._vocab[part] for part in bpe_merge(known_run, self._ranks))
            if not (self._fuse_unk and previous_unk and not known_run):
                ids.append(self.unk_id)
            known_run, previous_unk = "", True
        ids.extend(self._vocab[part] for part in bpe_merge(known_run, self._ranks))
        return tuple(ids)

    def _check_byte_alphabet(self) -> tuple[int, ...]:
        """Bytes without a vocabulary token; error if even printable ASCII is missing."""
        missing = tuple(b for b, ch in bytes_to_unicode().items() if ch not in self._vocab)
        ascii_missing = [b for b in missing if 0x21 <= b <= 0x7E]
        if ascii_missing:
            raise TokenizerError(
                f"vocabulary lacks the byte-level token for {chr(ascii_missing[0])!r}: "
                "not a byte-level BPE vocabulary"
            )
        return tuple(sorted(missing))

    def _check_merges(self) -> None:
        """Every merge result must be a vocabulary token."""
        for a, b in self._ranks:
            if a + b not in self._vocab:
                raise TokenizerError(
                    f"merge ({a!r}, {b!r}) produces {a + b!r}, which is not in the vocabulary"
                )


HEAP_MERGE_FROM = 64  # characters: longer words merge with a heap, O(n log n)


def token_lower_bound(tokenizer, text: str) -> int:
    """A number of tokens `text` needs at least, from its length alone (no encoding): 0 when the
    tokenizer cannot say (no `max_token_bytes`).

    Every token covers at most `max_token_bytes` bytes of UTF-8, bytes without a token (dropped)
    cover none, and NFC normalization shrinks text by at most 3x (a Hangul syllable from three
    jamo). A text whose bound exceeds the context is refused before it is encoded.
    """
    longest = getattr(tokenizer, "max_token_bytes", None)
    if not longest or not isinstance(text, str):
        return 0
    data = text.encode("utf-8", "surrogatepass")
    missing = bytes(getattr(tokenizer, "missing_bytes", ()))
    if missing:
        data = data.translate(None, missing)
    shrink = 3 if getattr(tokenizer, "normalizer", None) else 1
    return -(-len(data) // (longest * shrink))


def bpe_merge(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """Split `word` into characters, then repeatedly merge the adjacent pair of lowest rank.

    All occurrences of the chosen pair are merged left to right (GPT-2's encoder.py). Short words
    use that loop as written (`bpe_merge_simple`); from HEAP_MERGE_FROM characters on,
    `bpe_merge_heap` gives the same parts in O(n log n) instead of O(n^2) (a 100 kB word of one
    letter would otherwise take minutes).
    """
    if len(word) >= HEAP_MERGE_FROM:
        return bpe_merge_heap(word, ranks)
    return bpe_merge_simple(word, ranks)


def bpe_merge_heap(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """`bpe_merge_simple`'s result through a heap of (rank, position) over a linked list.

    Each round takes every queued occurrence of the lowest-ranked pair (one pair per rank) and
    merges them left to right, skipping an occurrence whose symbols changed (the second of
    "a a a"); the pairs a round creates are queued for later rounds, as GPT-2 rescans after
    each full pass. Stale queue entries are skipped when popped.
    """
    import heapq

    symbols = list(word)
    n = len(symbols)
    nxt = list(range(1, n)) + [-1]
    prv = list(range(-1, n - 1))
    alive = [True] * n
    heap = []
    for i in range(n - 1):
        rank = ranks.get((symbols[i], symbols[i + 1]))
        if rank is not None:
            heap.append((rank, i, symbols[i], symbols[i + 1]))
    heapq.heapify(heap)

    def queue(i: int) -> None:
        j = nxt[i]
        if i >= 0 and j >= 0:
            rank = ranks.get((symbols[i], symbols[j]))
            if rank is not None:
                heapq.heappush(heap, (rank, i, symbols[i], symbols[j]))

    while heap:
        rank = heap[0][0]
        round_ = []
        while heap and heap[0][0] == rank:
            round_.append(heapq.heappop(heap))
        for _, i, left, right in round_:  # ascending positions: left to right
            j = nxt[i]
            if not alive[i] or j < 0 or symbols[i] != left or symbols[j] != right:
                continue
            symbols[i] = left + right
            alive[j] = False
            nxt[i] = nxt[j]
            if nxt[j] >= 0:
                prv[nxt[j]] = i
        for _, i, _, _ in round_:  # the pairs around each merged symbol, for later rounds
            if alive[i]:
                queue(prv[i])
                queue(i)
    return [symbols[i] for i in range(n) if alive[i]]


def bpe_merge_simple(word: str, ranks: dict[tuple[str, str], int]) -> list[str]:
    """GPT-2's merge loop as written: O(n) per merge, O(n^2) per word."""
    parts = list(word)
    while len(parts) > 1:
        best_rank, best_pair = None, None
        for pair in zip(parts, parts[1:]):
            rank = ranks.get(pair)
            if rank is not None and (best_rank is None or rank < best_rank):
                best_rank, best_pair = rank, pair
        if best_pair is None:
            break
        parts = _merge_pair(parts, best_pair)
    return parts


def _merge_pair(parts: list[str], pair: tuple[str, str]) -> list[str]:
    """Replace every non-overlapping occurrence of `pair` (left to right) by its concatenation."""
    first, second = pair
    merged = []
    i = 0
    while i < len(parts):
        if i + 1 < len(parts) and parts[i] == first and parts[i + 1] == second:
            merged.append(first + second)
            i += 2
        else:
            merged.append(parts[i])
            i += 1
    return merged


# ----------------------------------------------------------------------------- file helpers


def _invert_vocab(vocab: dict[str, int]) -> list[str | None]:
    """id -> token list (None for unused ids); rejects negative or duplicate ids."""
    if not vocab:
        raise TokenizerError("empty vocabulary")
    if not all(isinstance(idx, int) and not isinstance(idx, bool) for idx in vocab.values()):
        raise TokenizerError("vocabulary ids must be integers")
    if max(vocab.values()) > 16 * len(vocab) + 1024:
        raise TokenizerError(
            f"token id {max(vocab.values())} is far beyond the {len(vocab)} tokens "
            "of the vocabulary"
        )
    table: list[str | None] = [None] * (max(vocab.values()) + 1)
    for token, idx in vocab.items():
        if idx < 0:
            raise TokenizerError(f"negative token id {idx} for {token!r}")
        if table[idx] is not None and table[idx] != token:
            raise TokenizerError(f"token id {idx} is used by both {table[idx]!r} and {token!r}")
        table[idx] = token
    return table


def _alternation(special: dict[str, int]) -> regex.Pattern | None:
    """Regex matching any special token, longest first (leftmost-longest like HF)."""
    if not special:
        return None
    contents = sorted(special, key=len, reverse=True)
    return regex.compile("|".join(regex.escape(c) for c in contents))


def _split_merge(line: str, where: str) -> tuple[str, str]:
    """Split a merge written "a b" into ("a", "b"); byte-level tokens never contain a space."""
    parts = line.split(" ")
    if len(parts) != 2 or not all(parts):
        raise TokenizerError(f"{where}: malformed merge {line!r} (expected 'a b')")
    return parts[0], parts[1]


def _read_merges_txt(path: Path) -> list[tuple[str, str]]:
    """Merges from vocab.bpe / merges.txt: optional "#version" header, one "a b" per line."""
    merges = []
    raw = read_bytes_limited(
        path, "merges file", max_bytes=MAX_TOKENIZER_JSON_BYTES, error=TokenizerError
    )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise TokenizerError(f"{path}: not UTF-8 text ({err})") from None
    for number, line in enumerate(text.split("\n")):
        if not line or (number == 0 and line.startswith("#version")):
            continue
        merges.append(_split_merge(line, f"{path}:{number + 1}"))
    return merges


def _hf_model(model: dict | None, path: Path) -> tuple[dict[str, int], list[tuple[str, str]], dict]:
    """(vocab, merges, options) of a tokenizer.json "model" section of type BPE.

    options holds the BPETokenizer keywords ignore_merges, unk_id and fuse_unk.
    """
    kind = (model or {}).get("type")
    if kind != "BPE":
        raise TokenizerError(
            f"{path}: unsupported tokenizer model type {kind!r} (only byte-level 'BPE')"
        )
    for option in ("continuing_subword_prefix", "end_of_word_suffix", "byte_fallback", "dropout"):
        if model.get(option):
            raise TokenizerError(f"{path}: unsupported BPE option {option}={model[option]!r}")
    merges = []
    for item in model.get("merges", []):
        if isinstance(item, str):
            merges.append(_split_merge(item, f"{path} model.merges"))
        elif isinstance(item, list) and len(item) == 2:
            merges.append((item[0], item[1]))
        else:
            raise TokenizerError(f"{path}: malformed merge {item!r}")
    vocab = dict(model["vocab"])
    unk = model.get("unk_token")
    options = {
        "ignore_merges": bool(model.get("ignore_merges", False)),
        "unk_id": None if unk is None else vocab[unk],
        "fuse_unk": bool(model.get("fuse_unk", False)),
    }
    return vocab, merges, options


def _hf_pre_tokenizer(spec: dict | None, path: Path) -> tuple[PreTokenizeStep, ...]:
    """Our steps for a tokenizer.json pre_tokenizer; ByteLevel must appear (byte-level BPE)."""
    steps = _hf_pre_steps(spec, path)
    if not _has_byte_level(spec):
        raise TokenizerError(
            f"{path}: pre_tokenizer has no ByteLevel step; not a byte-level BPE tokenizer"
        )
    return steps


def _has_byte_level(spec: dict | None) -> bool:
    """True if the pre_tokenizer (or one in its Sequence) is ByteLevel."""
    if spec is None:
        return False
    if spec.get("type") == "Sequence":
        return any(_has_byte_level(s) for s in spec.get("pretokenizers", []))
    return spec.get("type") == "ByteLevel"


def _hf_pre_steps(spec: dict | None, path: Path) -> tuple[PreTokenizeStep, ...]:
    """Translate one pre_tokenizer spec (recursively for Sequence)."""
    kind = None if spec is None else spec.get("type")
    if kind is None:
        return ()
    if kind == "Sequence":
        return tuple(step for s in spec.get("pretokenizers", []) for step in _hf_pre_steps(s, path))
    if kind == "ByteLevel":
        steps: tuple[PreTokenizeStep, ...] = (
            (PrefixSpace(),) if spec.get("add_prefix_space") else ()
        )
        return steps + (GPT2_PRE if spec.get("use_regex", True) else ())
    if kind == "Digits":
        return (RegexSplit(DIGIT_PATTERN if spec.get("individual_digits") else DIGITS_PATTERN),)
    if kind == "Split":
        return (_hf_split(spec, path),)
    raise TokenizerError(
        f"{path}: unsupported pre_tokenizer type {kind!r} "
        "(supported: ByteLevel, Split, Digits, Sequence)"
    )


def _hf_split(spec: dict, path: Path) -> RegexSplit:
    """A Split pre-tokenizer with behavior Isolated and invert false."""
    behavior, invert = spec.get("behavior"), spec.get("invert", False)
    if behavior != "Isolated" or invert:
        raise TokenizerError(
            f"{path}: unsupported Split pre_tokenizer (behavior={behavior!r}, invert={invert}); "
            "only Isolated"
        )
    pattern = spec.get("pattern", {})
    if "Regex" in pattern:
        return RegexSplit(pattern["Regex"], where=str(path))
    if "String" in pattern:
        return RegexSplit(regex.escape(pattern["String"]), where=str(path))
    raise TokenizerError(f"{path}: Split pre_tokenizer without a Regex or String pattern")


def _hf_added_tokens(added: list[dict], path: Path) -> dict[str, int]:
    """content -> id for tokenizer.json added_tokens (plain matching only)."""
    special = {}
    for token in added:
        for option in ("lstrip", "rstrip", "single_word"):
            if token.get(option):
                raise TokenizerError(
                    f"{path}: added token {token['content']!r} uses unsupported {option}=true"
                )
        special[token["content"]] = token["id"]
    return special


def _read_tokenizer_config(path: Path) -> dict:
    """tokenizer_config.json next to tokenizer.json, or {} when absent (errors name it)."""
    if not path.exists():
        return {}
    config = read_json(path, "tokenizer config", error=TokenizerError)
    if not isinstance(config, dict):
        raise TokenizerError(f"{path}: holds a JSON {type(config).__name__}, not an object")
    return config


def _token_id(token, vocab: dict[str, int], special: dict[str, int]) -> int | None:
    """Id of a tokenizer_config token entry ("<s>" or {"content": "<s>", ...}), or None."""
    if isinstance(token, dict):
        token = token.get("content")
    if token is None:
        return None
    return special.get(token, vocab.get(token))


def _template_bos(post: dict | None, vocab: dict[str, int], special: dict[str, int]) -> int | None:
    """Id of the special token a TemplateProcessing post_processor puts before $A, if any."""
    if post is None:
        return None
    if post.get("type") == "Sequence":
        for inner in post.get("processors", []):
            found = _template_bos(inner, vocab, special)
            if found is not None:
                return found
        return None
    if post.get("type") != "TemplateProcessing" or not post.get("single"):
        return None
    first = post["single"][0]
    if "SpecialToken" not in first:
        return None
    return _token_id(first["SpecialToken"]["id"], vocab, special)


def _gguf_template(reader) -> str | None:
    """tokenizer.chat_template, which must be a string when present."""
    template = gguf_field(reader, "tokenizer.chat_template", default=None)
    if not (template is None or isinstance(template, str)):
        raise TokenizerError(
            f"GGUF tokenizer.chat_template is a {type(template).__name__}, not a template string"
        )
    return template


def split_on_tokens(text: str, pattern, ids: dict[str, int]) -> list[tuple[str, int | None]]:
    """`text` cut at every match of `pattern` (an alternation of token contents, or None):
    in order, (segment, None) for the text between matches and (content, ids[content]) for each
    match."""
    if pattern is None:
        return [(text, None)] if text else []
    out: list[tuple[str, int | None]] = []
    pos = 0
    for match in pattern.finditer(text):
        if match.start() > pos:
            out.append((text[pos : match.start()], None))
        out.append((match.group(), ids[match.group()]))
        pos = match.end()
    if pos < len(text):
        out.append((text[pos:], None))
    return out


def gguf_field(reader, key: str, default=KeyError):
    """Value of a GGUF metadata field: str, int, float, bool, or a list of them. `reader`: a
    gguf.GGUFReader, or a dict of values already read.

    `field.data` indexes the value parts in `field.parts`; the other parts are the key and
    type headers. Concatenating the value parts works whether arrays are stored one part
    per element or as one block. Missing key: `default`, or KeyError if none is given.
    """
    if isinstance(reader, dict):  # values read earlier (`gguf_loader.tokenizer_fields`)
        if key not in reader and default is KeyError:
            raise KeyError(f"GGUF file has no field {key!r}")
        return reader.get(key, default)
    from gguf import GGUFValueType  # local: only GGUF users need the package

    field = reader.fields.get(key)
    if field is None:
        if default is KeyError:
            raise KeyError(f"GGUF file has no field {key!r}")
        return default
    kind = field.types[0]
    if kind == GGUFValueType.ARRAY:
        if len(field.data) == 0:
            return []
        if field.types[1] == GGUFValueType.STRING:
            return [field.parts[i].tobytes().decode("utf-8") for i in field.data]
        return np.concatenate([field.parts[i] for i in field.data]).tolist()
    value = field.parts[field.data[0]]
    if kind == GGUFValueType.STRING:
        return bytes(value).decode("utf-8")
    if kind == GGUFValueType.BOOL:
        return bool(value[0])
    return value[0].item()
