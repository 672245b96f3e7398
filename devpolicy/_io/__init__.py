"""Bytes read and written: the safetensors format, whole-tensor loading, shard-local range
reads, read-ahead, filling a tree (`into=`), saving, the plan, rule-use accounting.

Readers take their bytes from a byte source (a local file today); a new place bytes live
is a new source, not a second loader.
"""
