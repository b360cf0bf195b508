"""Regenerate the benchmark tables in docs/benchmarks.md and the README's speed figures
from the result files."""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def run(args: argparse.Namespace) -> None:
    pass
