"""Writing: safetensors files written atomically, alone or by every process of a job
together, and `save_file`.

Bottom to top:

- `local_files` (atomic writes, a file several processes write together, `align_file`),
  `joint_steps` (steps the processes of a `jax.distributed` job take together, each ending
  in every process's verdict, with a deadline), `upload_parts` (which process uploads which
  part of a file saved to object storage).
- `joint_save`: arrays that span processes saved by all of them into one file, each its
  replica-0 shards, behind a `JointTarget` seam (a local file, or an s3:// upload).
- `saving`: `save_file`.

`local_files` imports no JAX.
"""
