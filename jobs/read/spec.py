"""What a read plan needs to know of an audit: :class:`ReadSpec`.

The audit hands the read stage this small, frozen spec instead of its whole options: the store roots and
their broker names, the mode, whether bodies are decoded, and the CommitLog split.  Every plan builds its
``rocketmq_*`` data source options from it (:meth:`ReadSpec.source_options`), so they agree by construction.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Dict, Tuple

from jobs.sources.options import DEFAULT_SPLIT_BYTES


@dataclass(frozen=True)
class ReadSpec:
    stores: Tuple[str, ...]          # store roots, in the order given
    brokers: Tuple[str, ...]         # one broker name per store root
    mode: str = "full"               # "full" or "indexed"
    include_bodies: bool = False     # decode message bodies into the records
    split_bytes: int = DEFAULT_SPLIT_BYTES   # CommitLog cell size (a data source partition)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stores", tuple(self.stores))
        object.__setattr__(self, "brokers", tuple(self.brokers))
        object.__setattr__(self, "split_bytes", int(self.split_bytes))

    def source_options(self, **extra: str) -> Dict[str, str]:
        """The data source options of these stores (``paths``, ``brokers``, ``split_bytes``) plus ``extra``."""
        return dict({"paths": json.dumps(list(self.stores)), "brokers": ",".join(self.brokers),
                     "split_bytes": str(self.split_bytes)}, **extra)


__all__ = ["ReadSpec"]
