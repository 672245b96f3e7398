"""The machine: which devices exist (`inventory`, the only caller of `jax.devices`), a
described machine for planning, free memory, the policy's meshes, and the ledger of what
is live where.
"""
