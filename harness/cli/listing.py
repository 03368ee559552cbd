"""`optimus-bench list`: the models, scales, modes, phases and Optimus rules this install offers."""

from __future__ import annotations

import argparse

from harness.cli.common import add_provider_option
from harness.modes import mode_registry
from harness.spec import PHASES, provider_families, provider_scales

NAME = "list"
HELP = "models, scales, modes, phases and Optimus rules"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_provider_option(p)


def main(args: argparse.Namespace) -> int:
    try:
        families, scales = provider_families(args.provider), provider_scales(args.provider)
    except (ImportError, ValueError) as e:  # ProviderError is a ValueError
        families, scales = (), ()
        print(f"models: unavailable ({e})")
    print("models: " + ", ".join(families))
    print("scales: " + ", ".join(scales))
    print("modes:  " + ", ".join(mode_registry.names()))
    print("phases: " + ", ".join(PHASES))
    try:
        import optimus

        print("rules:  " + ", ".join(optimus.RULES))  # type: ignore[attr-defined]
    except (ImportError, AttributeError) as e:
        print(f"rules:  unavailable (optimus: {e})")
    return 0
