"""The `devpolicy` command line: one module per command group over shared helpers.

It uses the public API as any user would, except `run`, which reads the settings without
building a Policy so that it never imports JAX.
"""
