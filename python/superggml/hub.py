"""Models by name: GGUF files of Hugging Face Hub repositories, through ``huggingface_hub`` (the ``hub`` extra)
and its cache, as ``llama_cpp.Llama.from_pretrained`` and ``llama-cli -hf`` open them.

A file the cache already holds opens without the network; with ``HF_HUB_OFFLINE=1`` (or ``local_files_only``)
only the cache is looked at, and a file it lacks is a ``FileNotFoundError`` naming the repository and what was
looked for."""

from __future__ import annotations

import fnmatch
import os
import re
import socket
import threading
import urllib.parse
from dataclasses import dataclass
from typing import Any

from .errors import UnsupportedModelError, require_extra

DEFAULT_QUANT = "Q4_K_M"  # llama.cpp's -hf default
PROBE_SECONDS = 1.5  # the Hub answers a connection within this, or it is taken as unreachable


def hub() -> Any:
    """The huggingface_hub module, or MissingExtra naming the extra that installs it."""
    require_extra("hub", "opening models by name")
    import huggingface_hub

    return huggingface_hub


def offline(local_files_only: bool | None) -> bool:
    if local_files_only is not None:
        return local_files_only
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def cached_files(repo_id: str, cache_dir: str | None = None) -> list[str]:
    """The files of `repo_id` the cache holds (its revision main's snapshot, else any), repo-relative."""
    h = hub()
    try:
        info = h.scan_cache_dir(cache_dir)
    except h.CacheNotFound:
        return []
    for repo in info.repos:
        rev = newest(repo) if repo.repo_id == repo_id and repo.repo_type == "model" else None
        if rev is not None:
            return sorted(str(f.file_path.relative_to(rev.snapshot_path)) for f in rev.files)
    return []


def reachable(timeout: float = PROBE_SECONDS) -> bool:
    """Whether the Hub's endpoint (HF_ENDPOINT) takes a TCP connection within `timeout` seconds (name lookup
    included): without a network, huggingface_hub would retry for half a minute."""
    url = urllib.parse.urlsplit(hub().constants.ENDPOINT)
    host, port = url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout)
    return bool(ok)


def repo_files(repo_id: str, *, local_files_only: bool | None = None, cache_dir: str | None = None) -> list[str]:
    """The files of `repo_id`: the Hub's list, or where offline or unreachable, the cache's."""
    if not offline(local_files_only):
        from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

        try:
            return sorted(hub().HfApi().list_repo_files(repo_id))
        except (RepositoryNotFoundError, GatedRepoError):
            raise
        except Exception:  # no network: what the cache holds
            pass
    return cached_files(repo_id, cache_dir)


SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$", re.IGNORECASE)


def choose(repo_id: str, files: list[str], pattern: str | None) -> str:
    """The one GGUF of `files` that `pattern` (a glob; None: llama.cpp's choice, the Q4_K_M file or the first
    GGUF) picks."""
    ggufs = [f for f in files if f.lower().endswith(".gguf")]
    if pattern is None:
        chosen = [f for f in ggufs if DEFAULT_QUANT.lower() in f.lower()] or ggufs[:1]
    else:
        chosen = [f for f in ggufs if fnmatch.fnmatch(f.lower(), pattern.lower())]
    if not chosen:
        have = ", ".join(ggufs) if ggufs else "no GGUF files"
        looked = f"file matching {pattern!r}" if pattern else "GGUF file"
        raise FileNotFoundError(f"Hugging Face repo {repo_id!r} has no {looked} (it has: {have})")
    if len(chosen) > 1:
        raise FileNotFoundError(
            f"Hugging Face repo {repo_id!r}: {pattern!r} matches {len(chosen)} files ({', '.join(chosen)}): "
            "give one of them"
        )
    if SPLIT.search(chosen[0]):
        raise UnsupportedModelError(
            f"{repo_id}/{chosen[0]} is one part of a split GGUF: merge the parts into one file first "
            "(llama.cpp's llama-gguf-split --merge)"
        )
    return chosen[0]


def download(
    repo_id: str, filename: str | None = None, *, local_files_only: bool | None = None, cache_dir: str | None = None
) -> str:
    """The local path of `repo_id`'s GGUF that `filename` (a glob) picks, downloaded into the cache unless there
    already. FileNotFoundError naming the repository and what was looked for where there is none."""
    h = hub()
    local = offline(local_files_only)
    unreachable = not local and not reachable()
    files = repo_files(repo_id, local_files_only=local or unreachable, cache_dir=cache_dir)
    if not files:
        where = "the Hugging Face cache" + (" (offline)" if local else " or on the Hub")
        if unreachable:
            where = f"the Hugging Face cache, and the Hub ({h.constants.ENDPOINT}) is unreachable"
        raise FileNotFoundError(
            f"Hugging Face repo {repo_id!r}: no {filename or 'GGUF'!r} file in {where} "
            f"({h.constants.HF_HUB_CACHE if cache_dir is None else cache_dir})"
        )
    name = choose(repo_id, files, filename)
    return str(h.hf_hub_download(repo_id, name, local_files_only=local or unreachable, cache_dir=cache_dir))


def parse_spec(spec: str) -> tuple[str, str | None]:
    """`-hf org/name[:quant]` -> the repository and a glob of its GGUF (None: the default choice)."""
    repo, _, quant = spec.partition(":")
    if repo.count("/") != 1 or not all(repo.split("/")):
        raise ValueError(f"-hf wants org/name[:quant], not {spec!r}")
    return repo, f"*{quant}*.gguf" if quant else None


@dataclass(frozen=True)
class CachedModel:
    """A GGUF the Hugging Face cache holds."""

    repo_id: str
    filename: str
    path: str
    size: int


def newest(repo: Any) -> Any:
    """A cached repository's revision main, else its latest."""
    revisions = sorted(repo.revisions, key=lambda r: ("main" not in r.refs, -r.last_modified))
    return revisions[0] if revisions else None


def cached_models(cache_dir: str | None = None) -> list[CachedModel]:
    """Every GGUF in the cache (each repository's revision main, else its latest)."""
    h = hub()
    try:
        info = h.scan_cache_dir(cache_dir)
    except h.CacheNotFound:
        return []
    out = []
    for repo in info.repos:
        rev: Any = newest(repo) if repo.repo_type == "model" else None
        for f in rev.files if rev is not None else ():
            name = str(f.file_path.relative_to(rev.snapshot_path))
            if name.lower().endswith(".gguf"):
                out.append(CachedModel(repo.repo_id, name, str(f.file_path), int(f.size_on_disk)))
    return sorted(out, key=lambda m: (m.repo_id, m.filename))
