"""Applying decisions to arrays: scopes and decorators, `put`, commits and moves, 64-bit
narrowing, batches sent ahead, windows of host arrays, zero-copy host views, carrying a
scope into threads.
"""
