"""Tests of devpolicy/_io/writing/, one file per module."""
