"""Tests of devpolicy/_io/format/, one file per module."""
