"""Numbers that several modules must agree on, each written once, with why."""

from __future__ import annotations

#: XLA's CPU client adopts a host buffer without copying when its address is a multiple of
#: this; safetensors files written by devpolicy put large tensors at such file offsets.
ALIGN = 64

#: Bytes read per system call: bounds each call and paces the progress bar.
CHUNK_BYTES = 64 * 2**20

#: Decisions kept per cache generation. A name used within the last generation is found
#: again; a working set of up to about this many names never goes cold.
CACHE_GENERATION = 65_536

#: First-seen records kept (what decides info vs debug), as hashes. Four times the
#: decision cache, so a turnover of the cache never re-logs names at info.
SEEN_LIMIT = 4 * CACHE_GENERATION
