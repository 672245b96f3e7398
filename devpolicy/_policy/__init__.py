"""The front: `Policy` (one loaded policy and its verbs), loading a policy through its
layers, the active policy and the module-level verbs, `bootstrap()`, and lint.
"""
