"""The file format and the byte sources under it: the bottom of the I/O wing.

Bottom to top:

- `sources`: where a file's bytes come from. `ByteSource` is what every reader reads
  ranges of; `LocalFile` (opened safely: regular files only, never blocking) is the local
  one (`remote/` holds the others).
- `foreign`: what a file that is not safetensors is (`.npy`, `.npz`, PyTorch, pickle).
- `header`: the safetensors format: dtypes, tensor entries, headers read from a source and
  validated.
- `layout` (where tensors, and slices of them, go in a file devpolicy writes) and `keys`
  (PRNG key arrays stored as their key data, wrapped again on load).

Everything here but `keys` imports no JAX.
"""
