"""`optimus-bench models`: the model catalog, every family at every scale."""

from __future__ import annotations

import argparse

NAME = "models"
HELP = "the model catalog: every family at every scale"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--families", help="comma list of families (default: all)")
    p.add_argument("--scales", help="comma list of scales (default: all)")
    p.add_argument(
        "--nodes",
        action="store_true",
        help="count dense-graph FX nodes afresh (Dynamo capture, slow at large scales; default: stored counts)",
    )


def main(args: argparse.Namespace) -> int:
    import models
    from harness.spec import parse_list

    families = parse_list(args.families, "families", models.FAMILIES) if args.families else models.FAMILIES
    scales = parse_list(args.scales, "scales", models.SCALES) if args.scales else models.SCALES
    rows = models.catalog.rows(nodes=True if args.nodes else None, families=families, scales=scales)
    print(models.catalog.format_table(rows))
    return 0
