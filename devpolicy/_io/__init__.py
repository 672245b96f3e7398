"""Bytes read and written: safetensors files, checkpoints, the loader, the plan, saving.

One folder per job, bottom to top (imports go down; `pyproject.toml` checks the order, and
each folder's own order below):

- `format/`: the file and where its bytes come from: `sources` (`ByteSource`, what every
  reader reads ranges of; `LocalFile`, a local file opened safely), `foreign` (what a file
  that is not safetensors is), `header` (the safetensors format: dtypes, tensor entries,
  headers read and validated), `layout` (how a file devpolicy writes is laid out) and
  `keys` (PRNG key arrays stored as their key data).
- `remote/`: the byte sources of s3://, gs://, hf:// and https:// URLs, folders listed
  there, and an s3:// object written as one multipart upload.
- `reading/`: a checkpoint found and its tensors read and placed, up to `load_file`
  (`reading.load`).
- `writing/`: files written, alone or by every process of a job together, up to
  `save_file` (`writing.saving`). Reading and writing never import each other.
- `planning/`: `plan`, what a load would do, asked of the readers without reading.

A new place bytes live is a new source (`format.sources`, `remote/`), not a second loader.
"""
