"""Headless Chromium for the report's tests (test helper): a page rendered as a browser shows
it, measured from inside (a script writes what it found into the DOM) and photographed.

Each call starts Chromium with a fresh profile and nothing that reaches the network.
"""

from __future__ import annotations

import base64
import html
import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--force-color-profile=srgb",  # the screenshot's pixels are the page's colours
    "--virtual-time-budget=10000",
]


def needs_chromium() -> None:
    if shutil.which("chromium") is None:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium (.ci/run does)")
        pytest.skip("needs Debian's chromium (apt-get install chromium)")


def chromium(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HOME": os.environ.get("HOME", "/tmp")}
    with tempfile.TemporaryDirectory(prefix="zkl-chromium-") as profile:
        cmd = ["chromium", *FLAGS, f"--user-data-dir={profile}", *args]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def png_size(path: Path) -> tuple[int, int, int]:
    """(width, height, bytes of image data) of a PNG."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    idat, pos = 0, 8
    while pos < len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        if data[pos + 4 : pos + 8] == b"IDAT":
            idat += length
        pos += 12 + length
    return width, height, idat


def measure(page: Path, script: str, size: str = "1400,900") -> dict:
    """What `script` (the body of a function run after the page loaded) returns, as JSON."""
    probe = page.with_name(page.stem + "_probe.html")
    wrapped = (
        "<script>window.addEventListener('load', () => setTimeout(() => {"
        f"const found = (() => {{{script}}})();"
        "const pre = document.createElement('pre'); pre.id = 'probe';"
        "pre.textContent = JSON.stringify(found); document.body.appendChild(pre);"
        "}, 200));</script>"
    )
    probe.write_text(page.read_text().replace("</body>", wrapped + "</body>"))
    dom = chromium(f"--window-size={size}", "--dump-dom", probe.as_uri()).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, f"the probe did not run in {page}"
    return json.loads(html.unescape(found.group(1)))


def colour_counts(png: Path, box: dict, colours: list[str]) -> dict[str, int]:
    """How many pixels of the screenshot inside `box` ({x, y, width, height}) have each of
    `colours` (#RRGGBB) exactly: the browser reads the PNG back through a canvas."""
    data = base64.b64encode(png.read_bytes()).decode()
    page = png.with_suffix(".pixels.html")
    script = f"""
    const img = new Image();
    img.onload = () => {{
      const c = document.createElement('canvas'); c.width = img.width; c.height = img.height;
      const g = c.getContext('2d'); g.drawImage(img, 0, 0);
      const b = {json.dumps(box)};
      const d = g.getImageData(b.x, b.y, b.width, b.height).data;
      const want = {json.dumps([c.lower() for c in colours])};
      const counts = Object.fromEntries(want.map(w => [w, 0]));
      for (let i = 0; i < d.length; i += 4) {{
        const hex = '#' + [d[i], d[i + 1], d[i + 2]]
          .map(v => v.toString(16).padStart(2, '0')).join('');
        if (hex in counts) counts[hex] += 1;
      }}
      const pre = document.createElement('pre'); pre.id = 'probe';
      pre.textContent = JSON.stringify(counts); document.body.appendChild(pre);
    }};
    img.src = 'data:image/png;base64,{data}';"""
    page.write_text(f"<html><body><script>{script}</script></body></html>")
    dom = chromium("--dump-dom", page.as_uri()).stdout
    found = re.search(r'<pre id="probe">(.*?)</pre>', dom, re.S)
    assert found, "the pixel probe did not run"
    counts = json.loads(found.group(1))
    return {c: counts[c.lower()] for c in colours}
