#!/usr/bin/env python3
"""Screenshot the published asv dashboard in headless Chromium and check that graphs rendered.

Why a real browser: asv's pages draw every graph in JavaScript (jQuery + flot) after
loading JSON over HTTP, so a published directory can be complete on disk and still show a
blank or error page. Two independent checks, both required:

* the DOM after the page settled (``--dump-dom``) holds flot plot canvases
  (``canvas.flot-base``) and is not asv's "dependencies failed to load" page;
* the screenshot is not blank: enough pixels differ from the page background.

With ``--expect-marks N`` the graph must also carry N change point labels
(``div.optimus-change``, drawn by the script ``harness/nightly/asv_marks.py`` adds to the site).

asv loads jQuery, flot and bootstrap from public CDNs. Offline, the page cannot render and
this script says so (exit 1); ``--assets-dir DIR`` serves local copies instead (files named
like the CDN files, e.g. ``jquery-3.3.1.min.js``, ``jquery.flot.min.js``).

    python scripts/asv_screenshot.py [--html-dir results/html] [--out results/tmp/asv-dashboard.png]
        [--page '#bench_compiled.CompiledSpeedup.track_speedup'] [--assets-dir DIR]

Needs Debian's chromium (``apt-get install -y chromium``). Exit 0: rendered; 1: not; 2: error.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--hide-scrollbars",
]
CDN = re.compile(r"""(src|href)="(https://[^"]+/([^"/]+\.(?:js|css)))"[^>]*?>""")
ERROR_PAGE = "dependencies of airspeed velocity failed to load"


def find_chromium(explicit: str | None) -> str:
    for name in [explicit] if explicit else ["chromium", "chromium-browser", "google-chrome"]:
        path = shutil.which(name) if name else None
        if path:
            return path
    raise SystemExit(
        "asv_screenshot: no chromium found; install Debian's package: apt-get install -y chromium"
    )


def localize(html_dir: Path, assets: Path, work: Path) -> Path:
    """Copy the site and point its CDN script/link tags at files of ``assets`` (same basename)."""
    site = work / "site"
    shutil.copytree(html_dir, site)
    index = site / "index.html"
    text = index.read_text()
    missing: list[str] = []

    def swap(m: re.Match[str]) -> str:
        attr, _url, name = m.group(1), m.group(2), m.group(3)
        src = assets / name
        if not src.exists():
            missing.append(name)
            return m.group(0)
        shutil.copy(src, site / name)
        tag = m.group(0)
        tag = re.sub(r'\s(integrity|crossorigin|referrerpolicy)="[^"]*"', "", tag)
        return tag.replace(f'{attr}="{_url}"', f'{attr}="{name}"')

    index.write_text(CDN.sub(swap, text))
    if missing:
        print(f"asv_screenshot: --assets-dir lacks {', '.join(missing)}; those still load from the CDN")
    return site


@contextmanager
def serve(directory: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))

    class Server(http.server.ThreadingHTTPServer):
        def handle_error(self, request: Any, client_address: Any) -> None:
            exc = sys.exc_info()[1]
            if not isinstance(exc, ConnectionError):  # the browser closing early is normal
                super().handle_error(request, client_address)

    server = Server(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def chromium(exe: str, args: list[str], profile: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    cmd = [exe, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)


def dom_report(dom: str) -> dict[str, Any]:
    return {
        "error_page": ERROR_PAGE in dom,
        "plot_canvases": len(re.findall(r'<canvas[^>]*class="flot-base"', dom)),
        "change_marks": len(re.findall(r'<div[^>]*class="optimus-change"', dom)),
        "change_mark_labels": re.findall(r'<div[^>]*class="optimus-change"[^>]*>([^<]*)</div>', dom),
        "canvases": dom.count("<canvas"),
        "dom_bytes": len(dom),
    }


def pixel_report(png: Path) -> dict[str, Any]:
    """Share of pixels that differ from the most common colour (the background), and colours."""
    import matplotlib.image as mpimg
    import numpy as np

    img = mpimg.imread(str(png))[..., :3]
    flat = (img.reshape(-1, 3) * 255).round().astype(np.uint8)
    colours, counts = np.unique(flat, axis=0, return_counts=True)
    background = colours[counts.argmax()]
    differ = float(np.any(flat != background, axis=1).mean())
    return {"width": int(img.shape[1]), "height": int(img.shape[0]), "non_background": differ,
            "colours": len(colours)}  # fmt: skip


def check(html_dir: Path, out: Path, page: str, exe: str, budget_ms: int, assets: Path | None,
          window: str = "1400,900", keep_site: Path | None = None, expect_marks: int = 0) -> dict[str, Any]:  # fmt: skip
    """Render ``page`` of the published site; return the DOM and pixel reports and a verdict."""
    if not (html_dir / "index.html").exists():
        raise SystemExit(f"asv_screenshot: {html_dir}/index.html not found; run `asv publish` first")
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="asv-shot-") as tmp:
        work = Path(tmp)
        site = localize(html_dir, assets, work) if assets else html_dir
        if keep_site is not None and assets:
            shutil.rmtree(keep_site, ignore_errors=True)
            shutil.copytree(site, keep_site)
        with serve(site) as url:
            target = url + "index.html" + page
            timing = [f"--virtual-time-budget={budget_ms}", f"--window-size={window}"]
            dump = chromium(exe, [*timing, "--dump-dom", target], work / "p1", 120)
            shot = chromium(exe, [*timing, f"--screenshot={out.resolve()}", target], work / "p2", 120)
    if not out.exists():
        raise SystemExit(f"asv_screenshot: chromium wrote no screenshot:\n{shot.stderr[-2000:]}")
    report = {
        "url": "index.html" + page,
        "screenshot": str(out),
        **dom_report(dump.stdout),
        **pixel_report(out),
    }
    reasons = []
    if report["error_page"]:
        reasons.append("asv's error page: its JavaScript dependencies (CDN) failed to load")
    if report["plot_canvases"] == 0:
        reasons.append("no flot plot canvas in the DOM")
    if report["non_background"] < 0.01:
        reasons.append(f"blank screenshot ({report['non_background']:.2%} non-background pixels)")
    if report["change_marks"] < expect_marks:
        reasons.append(f"{report['change_marks']} change point mark(s) on the graph, expected {expect_marks}")
    report["rendered"] = not reasons
    report["reasons"] = reasons
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html-dir", default="results/html")
    ap.add_argument("--out", default="results/tmp/asv-dashboard.png")
    ap.add_argument(
        "--page", default="", help="URL fragment, e.g. '#bench_compiled.CompiledSpeedup.track_speedup'"
    )
    ap.add_argument("--chromium", help="browser executable (default: chromium on PATH)")
    ap.add_argument("--budget-ms", type=int, default=20000, help="virtual time the page gets to settle")
    ap.add_argument("--assets-dir", help="local copies of asv's CDN scripts/styles, by file name")
    ap.add_argument("--keep-site", help="with --assets-dir: also write the localized site here (to serve it)")
    ap.add_argument("--expect-marks", type=int, default=0,
                    help="also require this many change point labels (harness/nightly/asv_marks.py) on the graph")  # fmt: skip
    args = ap.parse_args(argv)
    exe = find_chromium(args.chromium)
    report = check(Path(args.html_dir), Path(args.out), args.page, exe, args.budget_ms,
                   Path(args.assets_dir) if args.assets_dir else None,
                   keep_site=Path(args.keep_site) if args.keep_site else None,
                   expect_marks=args.expect_marks)  # fmt: skip
    print(json.dumps(report, indent=1))
    return 0 if report["rendered"] else 1


if __name__ == "__main__":
    sys.exit(main())
