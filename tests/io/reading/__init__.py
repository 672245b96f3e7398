"""Tests of devpolicy/_io/reading/, one file per module."""
