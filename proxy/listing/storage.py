"""Listing a directory on storage, through fsspec: local ``file:`` and ``s3://`` (s3fs).

Hive's rules apply: files whose name starts with ``_`` or ``.`` are hidden (``_SUCCESS``,
``.crc`` files, staging directories), and so is everything under a hidden directory. The
names of hidden files are kept apart, because the sealed rule may look for a marker file.
Listing blocks, so it runs in a worker thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import datetime
import posixpath
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from proxy.config import Options


class StorageError(Exception):
    """The location cannot be listed (unsupported scheme, missing credentials, gone)."""


@dataclass(frozen=True, slots=True)
class FileEntry:
    path: str
    size: int
    mtime_ms: int


@dataclass(frozen=True, slots=True)
class Directory:
    files: tuple[FileEntry, ...]
    names: frozenset[str]  # every name directly in the directory, hidden ones included


def hidden(name: str) -> bool:
    return name.startswith(("_", "."))


def _mtime_ms(info: dict[str, Any]) -> int:
    for key in ("mtime", "LastModified", "last_modified", "updated"):
        value = info.get(key)
        if isinstance(value, int | float):
            return int(value * 1000)
        if isinstance(value, datetime.datetime):
            return int(value.timestamp() * 1000)
        if isinstance(value, str) and value:
            try:
                parsed = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
                return int(parsed.timestamp() * 1000)
            except ValueError:
                continue
    return 0


class Storage:
    def __init__(self, options: Options) -> None:
        self.options = options
        # Threads of its own: listings wait on object stores, and must neither starve nor be
        # starved by the default executor's few threads.
        self._threads = ThreadPoolExecutor(
            max_workers=max(1, options.listing_concurrency), thread_name_prefix="listing"
        )

    def _storage_options(self, protocol: str) -> dict[str, Any]:
        if protocol in ("s3", "s3a", "s3n"):
            opts: dict[str, Any] = {}
            client: dict[str, Any] = {}
            if self.options.s3_endpoint_url:
                client["endpoint_url"] = self.options.s3_endpoint_url
            if self.options.s3_region:
                client["region_name"] = self.options.s3_region
            if client:
                opts["client_kwargs"] = client
            if self.options.s3_access_key:
                opts["key"] = self.options.s3_access_key
                opts["secret"] = self.options.s3_secret_key or ""
            return opts
        return {}

    def _filesystem(self, location: str) -> tuple[Any, str]:
        import fsspec

        protocol = location.split(":", 1)[0] if ":" in location else "file"
        if protocol in ("s3a", "s3n"):  # Hadoop's names for the same store
            location = "s3" + location[len(protocol) :]
            protocol = "s3"
        try:
            fs, path = fsspec.core.url_to_fs(location, **self._storage_options(protocol))
        except (ImportError, ValueError) as exc:
            raise StorageError(f"cannot list {location}: {exc}") from exc
        return fs, str(path)

    def list_sync(self, location: str, recursive: bool) -> Directory:
        fs, root = self._filesystem(location)
        root = root.rstrip("/")
        # Paths are given in the location's own spelling (file:/..., s3a://...), as the
        # metastore and the engines write them.
        base = location.rstrip("/")
        fs.invalidate_cache(root)  # s3fs keeps listings; a live listing must not reuse them
        try:
            entries = fs.ls(root, detail=True)
        except FileNotFoundError:
            return Directory((), frozenset())  # Hive treats a missing directory as empty
        except OSError as exc:
            raise StorageError(f"cannot list {location}: {exc}") from exc
        names = frozenset(posixpath.basename(e["name"].rstrip("/")) for e in entries)
        files: list[FileEntry] = []
        pending = list(entries)
        while pending:
            entry = pending.pop()
            name = entry["name"].rstrip("/")
            if hidden(posixpath.basename(name)) or not name.startswith(root + "/"):
                continue
            if entry.get("type") == "directory":
                if recursive:
                    try:
                        fs.invalidate_cache(name)
                        pending.extend(fs.ls(name, detail=True))
                    except FileNotFoundError:
                        continue  # removed while listed
                    except OSError as exc:
                        raise StorageError(f"cannot list {name}: {exc}") from exc
                continue
            path = f"{base}/{name[len(root) + 1 :]}"
            files.append(FileEntry(path, int(entry.get("size") or 0), _mtime_ms(entry)))
        files.sort(key=lambda f: f.path)
        return Directory(tuple(files), names)

    async def list(self, location: str, recursive: bool) -> Directory:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._threads, self.list_sync, location, recursive)

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)
