"""The policy document: YAML read with lines, the pydantic schema, `DEVPOLICY_*`
variables, discovery of the file, and the precedence of the layers
(defaults < file < environment < code).

Never imports JAX: `devpolicy run` reads a policy without starting it (an import-linter
contract in pyproject.toml holds it).
"""
