"""Decisions: names (and sizes) in, `Decision`s out.

`routing` is the one fallback walk; `decider` the one place a name meets the rules, with
one cache. Everything above asks these two, never a copy of them.
"""
