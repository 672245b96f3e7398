"""Reading: a checkpoint found wherever it is, its tensors read, placed, and `load_file`.

Bottom to top:

- `buffers` (aligned host memory reads land in), `checkpoints` (which files make a
  checkpoint), `map_or_read` (which tensors are mapped, which read), `reopening` (a local
  file opened again for its data, unchanged; mapped), `sending` (host arrays sent to their
  devices in batches, the host bytes in flight bounded).
- `checkpoint_sources` (a checkpoint local or at a URL: its path parsed once, `Where`;
  chosen, each file's header read, its source handed over for the data) and
  `tensor_reads` (whole tensors, and the range reads every reader shares).
- `naming` (the names tensors are decided under, and every tensor of a checkpoint so
  named), `ranges` (the slices of a sharded tensor this process holds), `readahead` (runs
  of small tensors, or a large tensor, read one ahead while the last is placed).
- `fill_tree` (`load_file(into=...)`: a tree's leaves matched to tensors) and `progress`
  (the bar and each file's events).
- `load`: `load_file` (its keywords defined once, `LoadOptions`) and the loop that places
  a file's tensors; the rule-use warnings (judged by `_decide/rule_use`) said once a
  load.

Only a local file is mapped or read with scattered `preadv` calls (the fast paths behind
`fileno()`); everything else goes through the source. `buffers`, `checkpoints`, `naming`,
`reopening`, `tensor_reads` and `ranges` import no JAX.
"""
