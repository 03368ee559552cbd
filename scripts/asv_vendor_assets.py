#!/usr/bin/env python3
"""Fetch local copies of the JavaScript/CSS the asv dashboard loads from public CDNs.

Why: asv's published pages load jQuery, flot, bootstrap and three small plugins from
code.jquery.com, cdnjs and jsdelivr; without those hosts (an offline CI runner, a firewalled
lab) every page is asv's "dependencies failed to load" page. The same releases are on the
npm registry; this script fetches them with ``npm pack`` (no install, nothing global) and
writes them under the CDN file names, which ``scripts/asv_screenshot.py --assets-dir``
and ``asv preview`` of a localized copy use. Where asv pins a Subresource Integrity hash
and the npm file is byte-identical, the hash is checked; the report says which differ
(flot's npm release ships unminified files; stupidtable 1.0.1 is not on npm, 1.1.3 is).

    python scripts/asv_vendor_assets.py [--out results/tmp/asv-assets] [--index results/html/index.html]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# CDN file name -> (npm package@version, path inside the package tarball)
SOURCES: dict[str, tuple[str, str]] = {
    "jquery-3.3.1.min.js": ("jquery@3.3.1", "package/dist/jquery.min.js"),
    "jquery.flot.min.js": ("flot@0.8.3", "package/jquery.flot.js"),
    "jquery.flot.time.min.js": ("flot@0.8.3", "package/jquery.flot.time.js"),
    "jquery.flot.selection.min.js": ("flot@0.8.3", "package/jquery.flot.selection.js"),
    "jquery.flot.categories.min.js": ("flot@0.8.3", "package/jquery.flot.categories.js"),
    "jquery.flot.orderBars.js": ("flot-orderbars@1.0.0", "package/js/jquery.flot.orderBars.js"),
    "stupidtable.min.js": ("stupid-table-plugin@1.1.3", "package/stupidtable.min.js"),
    "md5.min.js": ("blueimp-md5@2.19.0", "package/js/md5.min.js"),
    "bootstrap.min.js": ("bootstrap@3.1.1", "package/dist/js/bootstrap.min.js"),
    "bootstrap.min.css": ("bootstrap@3.1.1", "package/dist/css/bootstrap.min.css"),
}
TAG = re.compile(r"""(?:src|href)="https://[^"]+/([^"/]+)"[^>]*?integrity="(sha\d+)-([^"]+)\"""")


def sri_of(index: Path) -> dict[str, tuple[str, str]]:
    """CDN file name -> (hash algorithm, base64 digest) pinned in the published index.html."""
    if not index.exists():
        return {}
    return {m.group(1): (m.group(2), m.group(3)) for m in TAG.finditer(index.read_text())}


def fetch(out: Path, index: Path) -> list[dict[str, str]]:
    out.mkdir(parents=True, exist_ok=True)
    pins = sri_of(index)
    rows = []
    with tempfile.TemporaryDirectory(prefix="asv-assets-") as tmp:
        packs: dict[str, Path] = {}
        for spec in sorted({s for s, _ in SOURCES.values()}):
            proc = subprocess.run(["npm", "pack", spec, "--silent"], cwd=tmp, capture_output=True, text=True,
                                  timeout=300)  # fmt: skip
            if proc.returncode != 0:
                raise SystemExit(f"asv_vendor_assets: npm pack {spec} failed:\n{proc.stderr[-2000:]}")
            packs[spec] = Path(tmp, proc.stdout.strip().splitlines()[-1])
        for name, (spec, member) in SOURCES.items():
            with tarfile.open(packs[spec]) as tar:
                f = tar.extractfile(member)
                if f is None:
                    raise SystemExit(f"asv_vendor_assets: {spec} has no file {member}")
                data = f.read()
            (out / name).write_bytes(data)
            check = "not pinned"
            if name in pins:
                algo, want = pins[name]
                got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
                check = "matches asv's SRI hash" if got == want else "differs from asv's CDN file"
            rows.append(
                {"file": name, "from": f"{spec}:{member}", "bytes": str(len(data)), "integrity": check}
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="results/tmp/asv-assets")
    ap.add_argument(
        "--index", default="results/html/index.html", help="published page whose SRI pins to check"
    )
    args = ap.parse_args(argv)
    rows = fetch(Path(args.out), Path(args.index))
    print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
