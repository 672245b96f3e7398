"""Planning: `plan`, what `load_file` would do with a checkpoint, asked of the same readers
(`reading/`) without reading a tensor's bytes.

- `plan`: `plan(...)` (its keywords defined once, `PlanOptions`) and the records it
  returns (`Plan`, `PlannedTensor`, ...).
"""
