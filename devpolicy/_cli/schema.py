"""`devpolicy schema`: the JSON Schema of the policy format."""

from __future__ import annotations

import argparse
import json

import devpolicy

from .common import EXIT_OK


def command(args: argparse.Namespace) -> int:
    """Print the JSON Schema of the policy format."""
    print(json.dumps(devpolicy.policy_schema(), indent=2))
    return EXIT_OK
