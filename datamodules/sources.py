"""Where documents come from: local files (jsonl, jsonl.gz, jsonl.zst, parquet, txt) or a hub data set.

Both kinds expose the same thing to the pipeline: a deterministic stream of *records* for one shard
of one split, each record being ``(text, None)`` or ``(None, skip_reason)``. Bad records are never
dropped silently: the caller counts every skip reason (see ``datamodules.text.PipelineStats``).

Sharding (DDP ranks x DataLoader workers = ``num_shards``): whole files go to shards when there are
at least as many files as shards and the count divides evenly (no reading of other shards' files);
otherwise every shard reads all files and keeps the records whose global index ``% num_shards`` is
its own. Either way the shards are disjoint and together complete.
"""

from __future__ import annotations

import glob
import gzip
import json
import logging
import os
import pathlib
import random
import socket
import threading
import zlib
from collections.abc import Iterator
from urllib.parse import urlparse

import datasets
import zstandard

log = logging.getLogger(__name__)

# datasets 5.2 sleeps 5 s at the end of every pass over a multi-shard parquet stream while it waits for
# its reader threads; our streams end often (validation, long documents), so remove the stall.
datasets.config.SLEEP_TIME_ON_THREADS_SHUTDOWN = 0

Record = tuple[str | None, str | None]  # (text, None) or (None, reason the record was skipped)

LOCAL_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".parquet", ".txt")
_NETWORK_TIMEOUT_S = 0.5


class HubUnavailableError(ConnectionError):
    """The Hugging Face hub cannot be reached (offline mode or no network)."""


def _hub_reachable(timeout: float = _NETWORK_TIMEOUT_S) -> bool:
    """A quick TCP connect to the hub endpoint, bounded in time even when DNS itself hangs."""
    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"
    result: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            result.append(True)
        except OSError:
            result.append(False)

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.2)  # getaddrinfo has no timeout of its own: never wait on it past ~0.7 s
    return bool(result and result[0])


def _env_offline() -> bool:
    return any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on") for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


def require_hub(hub_id: str, what: str, local_hint: str) -> None:
    """Raise ``HubUnavailableError`` within ~0.7 s when ``hub_id`` cannot be fetched, naming the local option.

    Without this check ``datasets`` retries for ~23 s before failing. The probe only reads ``os.environ``: it never
    sets ``HF_HUB_OFFLINE``/``HF_DATASETS_OFFLINE``, which would switch the rest of the process (and its children)
    offline behind the caller's back; the error raised here already stops the load that would have waited.
    """
    if not _env_offline() and _hub_reachable():
        return
    raise HubUnavailableError(
        f"cannot load {what} {hub_id!r} from the Hugging Face hub: no network (or HF_HUB_OFFLINE/"
        f"HF_DATASETS_OFFLINE is set). Use local files instead: {local_hint}."
    )


# ---------------------------------------------------------------------------------------------- local files


def expand_files(patterns: str | list[str] | None, base: str | None = None) -> list[str]:
    """Sorted, de-duplicated files matching ``patterns`` (globs, ``**`` allowed; relative to ``base``).

    Raises ``FileNotFoundError`` when a pattern matches nothing, so a typo never yields an empty split.
    """
    if patterns is None:
        return []
    if isinstance(patterns, str):
        patterns = [patterns]
    files: set[str] = set()
    for pattern in patterns:
        full = os.path.join(base, pattern) if base and not os.path.isabs(pattern) else pattern
        full = os.path.expanduser(full)
        if os.path.isdir(full):
            full = os.path.join(full, "**", "*")
        matches = [m for m in glob.glob(full, recursive=True) if os.path.isfile(m)]
        if os.path.isdir(os.path.dirname(full) or ".") or matches:
            matches = [m for m in matches if m.endswith(LOCAL_SUFFIXES)]
        if not matches:
            raise FileNotFoundError(f"no data files match {full!r} (supported: {', '.join(LOCAL_SUFFIXES)})")
        files.update(matches)
    return sorted(files)


class CorruptDataError(ValueError):
    """A data file is truncated (a compressed one also: corrupt): an error naming the file and the line where it
    stopped, never a silently shorter stream."""


def _open_text_lines(path: str) -> Iterator[bytes]:
    """Raw lines of a (possibly gzip/zstd compressed) text file; bytes, so bad UTF-8 is per line.

    A compressed file that ends inside a frame/member or fails to decompress raises ``CorruptDataError`` (naming the
    file and the number of complete lines read before it); the incomplete last line is never yielded.
    """
    if not path.endswith((".gz", ".zst")):
        with open(path, "rb") as f:
            yield from f
        return
    lines = 0
    try:
        for line in (_gzip_lines(path) if path.endswith(".gz") else _zstd_lines(path)):
            yield line
            lines += 1
    except (EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError) as error:
        kind = "gzip" if path.endswith(".gz") else "zstd"
        raise CorruptDataError(
            f"{path}: truncated or corrupt {kind} data after line {lines} (lines 1-{lines} were read; {error}); "
            f"re-download or rebuild the file") from None


def _gzip_lines(path: str) -> Iterator[bytes]:
    with gzip.open(path, "rb") as f:  # gzip raises EOFError when the file ends before the end-of-stream marker
        yield from f


def _zstd_lines(path: str) -> Iterator[bytes]:
    """Lines of a .zst file of one or more frames. zstandard's stream reader returns a short read, not an error,
    when the file ends inside a frame, so frames are decoded here and an incomplete last frame raises."""
    dctx = zstandard.ZstdDecompressor()
    frame, in_frame, pending = dctx.decompressobj(), False, b""
    with open(path, "rb") as raw:
        while chunk := raw.read(1 << 20):
            while chunk:
                in_frame = True
                out = frame.decompress(chunk)
                if out:  # (hundreds of MB/s: far faster than tokenising what it yields)
                    *complete, pending = (pending + out).split(b"\n")
                    yield from (line + b"\n" for line in complete)  # with its newline, as plain and gzip lines
                if frame.eof:  # a frame ended: the rest of the chunk (if any) starts the next one
                    chunk, frame, in_frame = frame.unused_data, dctx.decompressobj(), False
                else:
                    chunk = b""
    if in_frame:
        raise EOFError("the file ends inside a zstd frame")
    if pending:
        yield pending


def _jsonl_records(path: str, text_field: str) -> Iterator[Record]:
    for number, line in enumerate(_open_text_lines(path), 1):
        if not line.strip():
            continue  # blank line: not a record
        try:
            obj = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            if not line.endswith(b"\n"):
                # Only the last line lacks its newline, and one that does not parse is a record cut off by a
                # truncated copy or download: an error, like a truncated .gz/.zst, never a silently shorter stream.
                raise CorruptDataError(
                    f"{path}: line {number} is cut off (the file ends inside a record; lines 1-{number - 1} were "
                    f"read); re-download or rebuild the file") from None
            yield None, "invalid_utf8" if isinstance(error, UnicodeDecodeError) else "invalid_json"
            continue
        yield _text_of(obj, text_field)


#: what each skip reason of a record means and what to do about it (``describe_skips``)
SKIP_CAUSES = {
    "invalid_utf8": "not UTF-8 text (a binary or otherwise encoded file?)",
    "invalid_json": "not a JSON object on one line (is the file JSON Lines?)",
    "missing_field": "no {field!r} field",
    "not_text": "a {field!r} that is not a string",
    "empty_text": "an empty {field!r}",
    "empty_file": "an empty file",
}


def describe_skips(skipped: dict, text_field: str) -> str:
    """``"3 records: not UTF-8 text (...); 1 record: an empty file"``: skip counts by cause, each with its own
    explanation, the most frequent first; ``"none"`` for no skip."""
    parts = []
    for reason, count in sorted(skipped.items(), key=lambda item: (-item[1], item[0])):
        what = SKIP_CAUSES.get(reason, reason).format(field=text_field)
        parts.append(f"{count} {'file' if reason == 'empty_file' else 'record'}{'s' if count != 1 else ''}: {what}")
    return "; ".join(parts) or "none"


def _text_of(obj: object, text_field: str) -> Record:
    if not isinstance(obj, dict) or text_field not in obj:
        return None, "missing_field"
    text = obj[text_field]
    if not isinstance(text, str):
        return None, "missing_field" if text is None else "not_text"
    if not text:
        return None, "empty_text"
    return text, None


def _parquet_records(path: str, text_field: str) -> Iterator[Record]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    if text_field not in pf.schema_arrow.names:
        raise KeyError(f"{path}: no column {text_field!r} (columns: {pf.schema_arrow.names}); set text_field")
    for batch in pf.iter_batches(columns=[text_field], batch_size=256):
        for text in batch.column(0).to_pylist():
            if isinstance(text, bytes):  # a binary column: decode like a jsonl line
                try:
                    text = text.decode("utf-8")
                except UnicodeDecodeError:
                    yield None, "invalid_utf8"
                    continue
            yield _text_of({text_field: text}, text_field)


def _txt_records(path: str) -> Iterator[Record]:
    """A ``.txt`` file is one document."""
    data = pathlib.Path(path).read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        yield None, "invalid_utf8"
        return
    yield (text, None) if text.strip() else (None, "empty_text")


def file_records(path: str, text_field: str) -> Iterator[Record]:
    """Records of one local file, dispatching on its suffix."""
    if os.path.getsize(path) == 0:
        yield None, "empty_file"
        return
    if path.endswith(".parquet"):
        yield from _parquet_records(path, text_field)
    elif path.endswith(".txt"):
        yield from _txt_records(path)
    else:
        yield from _jsonl_records(path, text_field)


def shard_files(files: list[str], num_shards: int, shard: int, seed: int, epoch: int) -> tuple[list[str], bool]:
    """This pass's file order (shuffled by ``seed`` and ``epoch``) and this shard's part of it.

    Returns ``(files_to_read, by_file)``: when ``by_file`` is False the caller must keep only the
    records whose global index ``% num_shards == shard``.
    """
    order = list(files)
    random.Random(f"{seed}/{epoch}").shuffle(order)
    if len(order) >= num_shards and len(order) % num_shards == 0:
        return order[shard::num_shards], True
    return order, False


def local_records(files: list[str], text_field: str, num_shards: int, shard: int, seed: int, epoch: int) -> Iterator[Record]:
    """One pass over this shard's records of ``files``, in a deterministic order."""
    chosen, by_file = shard_files(files, num_shards, shard, seed, epoch)
    index = 0
    for path in chosen:
        for record in file_records(path, text_field):
            if by_file or index % num_shards == shard:
                yield record
            index += 1


# ---------------------------------------------------------------------------------------------- hub


def hub_records(
    name: str,
    split: str,
    text_field: str,
    num_shards: int,
    shard: int,
    seed: int,
    epoch: int,
    data_files: str | list[str] | dict | None = None,
    local_hint: str = "",
) -> Iterator[Record]:
    """One pass over a hub data set's split, streamed with HF ``datasets`` and sharded like local files.

    ``name`` may also be a packaged builder ("json", "parquet") with ``data_files``, which streams
    offline; the tests use that to exercise this path.
    """
    if data_files is None:
        require_hub(name, what="data set", local_hint=local_hint)
    ds = datasets.load_dataset(name, data_files=data_files, split=split, streaming=True)
    if ds.num_shards >= num_shards and ds.num_shards % num_shards == 0:
        ds = ds.shard(num_shards=num_shards, index=shard)
        by_file = True
    else:
        by_file = False
    # buffer_size=1: permute the order of the files per pass, not the records (resume skips records).
    ds = ds.shuffle(seed=seed + epoch, buffer_size=1)
    index = 0
    for example in ds:
        if by_file or index % num_shards == shard:
            yield _text_of(example, text_field)
        index += 1

