"""A directory of store descriptors, shared by the replicas of one pool.

LMCache's key holds no KV layout or head geometry, so a consumer cannot tell from a
fetched object alone that it was computed with another head split of the same width.
When replicas share this directory (beside an `fs://` pool, or on any shared path),
the store hook leaves each page's descriptor here and the guard compares a fetched
page with what its producer stored. Writes are atomic renames: a reader sees a whole
descriptor or none.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from kvaudit.contract import PageDescriptor

if TYPE_CHECKING:
    from lmcache.utils import CacheEngineKey


class StoreRegistry:
    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: CacheEngineKey) -> Path:
        # The whole key string (model, world size, worker, hash, dtype, tags) names the
        # entry, hashed because model names may hold path separators.
        return self.directory / hashlib.blake2b(key.to_string().encode(), digest_size=16).hexdigest()

    def put(self, key: CacheEngineKey, page: PageDescriptor) -> None:
        path = self._path(key)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(page.to_attributes()))
        os.replace(tmp, path)

    def get(self, key: CacheEngineKey) -> PageDescriptor | None:
        try:
            return PageDescriptor.from_attributes(json.loads(self._path(key).read_text()))
        except (FileNotFoundError, ValueError, TypeError):
            # Absent, or not a descriptor: the guard then has no store to compare with.
            return None
