"""The read engine: bytes of a local file read into the caller's buffers, and a mapping's
pages given back. No JAX; it imports only `_base`.

A range read whole by position (`exact`: the one `preadv` loop loads and streams share),
positional reads of windows of a file-backed view (`positional`: `preadv`, or a group in one
io_uring call), one range of rows over several parts (`parts`: a window's pieces across
shards, their files opened as reads need them), the io_uring ring itself (`uring`), and a
mapping's touched pages advised and given back (`pages`). One engine below both the I/O wing
(`_io`: loads, `save_chunks`) and the stream wing (`_apply/stream`), so neither keeps its
own copy and a file writer does not depend on the training-data wing.
"""
