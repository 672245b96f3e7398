"""Bytes read and written: safetensors files, checkpoints, the loader, the plan, saving.

One module per job, bottom to top (imports go down; `pyproject.toml` checks the order):

- `sources`: where a file's bytes come from. `ByteSource` is what every reader reads
  ranges of; `LocalFile` (opened safely: regular files only, never blocking) is today's
  only one. A new place bytes live is a new source, not a second loader.
- `foreign`: what a file that is not safetensors is (`.npy`, `.npz`, PyTorch, pickle).
- `format`: dtypes, tensor entries, headers read from a source and validated.
- `agreement` (steps the processes of a job take together, each ending in every
  process's verdict), `buffers` (aligned host memory), `checkpoints` (which files make a
  checkpoint), `layout` (where tensors, and slices of them, go in a file devpolicy
  writes), `opening` (a local file opened again for its data, unchanged; mapped),
  `remote` (the byte sources of s3://, gs://, hf:// and https:// URLs, and folders
  listed there).
- `keys` (PRNG key arrays stored as their key data, wrapped again on load), `mapping`
  (which tensors map, which are read), `naming` (the names tensors are decided under),
  `places` (a checkpoint local or at a URL: chosen, each file's header read, its source
  handed over for the data), `whole` (whole-tensor reads, the range reads every reader
  shares), `writing` (atomic writes, a file several processes write together,
  `align_file`).
- `accounting` (what each rule took; what must not pass in silence), `into` (filling a
  tree), `joint` (arrays that span processes, saved by all of them into one file),
  `progress` (the bar and each file's events), `ranges` (shard-local slice reads),
  `readahead` (runs of small tensors, read one run ahead).
- `load` (`load_file` and the loop that places a file's tensors), `planning` (`plan`),
  `saving` (`save_file`).

`sources`, `foreign`, `format`, `buffers`, `checkpoints`, `layout`, `naming`, `opening`, `whole`,
`writing` and `ranges` never import JAX.
"""
