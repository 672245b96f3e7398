"""Leaves every layer uses: errors, shared limits, visible-safe text, sizes, events, the
jax-version table and safe file opening.

The bottom layer: it imports nothing else of devpolicy, and no JAX at module level
(`compat.mesh_context` and `events` import it only inside the functions that need it).
"""
