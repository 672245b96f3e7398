"""Names to rules: patterns compiled once, the literal-prefix index, pattern coverage (and
the cheap hints read from a pattern's text that lint asks first).

Never imports JAX (an import-linter contract in pyproject.toml holds it): matching is
pure text work, and the policy document above builds on it.
"""
