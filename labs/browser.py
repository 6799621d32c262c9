"""Headless Chromium (Debian's package) reading a page served on loopback.

Used by the fleet lab test: it loads the aggregator's page as an operator's
browser would, returns the DOM after the page ran, and saves a screenshot.
Each call gets a new, empty profile directory, and every background service
that would reach the network is switched off (this machine's network is
closed, and lab traffic stays on loopback anyway).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--disable-extensions")
TIMEOUT_S = 60.0


class BrowserError(RuntimeError):
    pass


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def _run(url: str, *args: str) -> subprocess.CompletedProcess:
    if not url.startswith(("http://127.0.0.1:", "http://localhost:", "http://[::1]:")):
        raise BrowserError(f"only pages on loopback are loaded, not {url!r}")
    exe = chromium()
    if exe is None:
        raise BrowserError("chromium is not installed (./scripts/bootstrap.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="lp-chromium-") as profile:
        proc = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args, url],
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    if proc.returncode != 0:
        raise BrowserError(f"chromium exited {proc.returncode} on {url}: {proc.stderr[-1500:]}")
    return proc


def dump_dom(url: str) -> str:
    """The page's DOM as Chromium serialises it after loading `url`."""
    return _run(url, "--dump-dom").stdout


def screenshot(url: str, path: Path, size: tuple[int, int] = (1280, 900)) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _run(url, f"--screenshot={path}", f"--window-size={size[0]},{size[1]}")
    if not path.exists() or path.stat().st_size == 0:
        raise BrowserError(f"chromium wrote no screenshot to {path}")
    return path
