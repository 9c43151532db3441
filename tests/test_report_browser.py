"""The report page (kilnet/report.py) in a real browser: headless Chromium loads the file as a
reader would (file://, no network), runs its script, and dumps the DOM it made: the script ran
(``data-js="ready"`` on <body>), raised nothing (its window.onerror collector, <pre id=errors>,
stays empty), found every arena's boxes summing to its size (``data-arenas="ok"``), and the DOM
still holds one launch row per launch. A screenshot is decoded (zlib and struct, no imaging
package) and must not be blank.

Chromium is looked for on PATH (chromium, chromium-browser, google-chrome) or in
KILNET_CHROMIUM; without one these tests skip, unless KILNET_BROWSER=required (CI's system job),
where they fail.

    python tests/test_report_browser.py [OUT.png]    # the docs' screenshot (docs/img/report.png)
"""
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

from report_page import Page, check_arenas  # noqa: E402

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def chromium():
    """The Chromium binary to run, or None."""
    given = os.environ.get("KILNET_CHROMIUM")
    if given:
        return given if os.path.isfile(given) else shutil.which(given)
    return next((p for p in map(shutil.which, NAMES) if p), None)


@pytest.fixture(scope="module")
def browser():
    path = chromium()
    if path is None:
        why = f"no Chromium found (looked for {', '.join(NAMES)} on PATH and KILNET_CHROMIUM)"
        if os.environ.get("KILNET_BROWSER") == "required":
            pytest.fail(why + "; KILNET_BROWSER=required")
        pytest.skip(why)
    return path


def run_chromium(binary, url, *flags, timeout=60):
    """Chromium headless on ``url`` with ``flags``: (stdout, stderr). A fresh profile folder
    each time; --no-sandbox because CI runs as root."""
    with tempfile.TemporaryDirectory() as profile:
        r = subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu",
                            "--no-first-run", "--disable-extensions", "--hide-scrollbars",
                            f"--user-data-dir={profile}", *flags, url],
                           capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        raise AssertionError(f"chromium exited {r.returncode}: {r.stderr[-2000:]}")
    return r.stdout, r.stderr


def screenshot(binary, page_path, png_path, size=(1400, 1000)):
    run_chromium(binary, "file://" + os.path.abspath(page_path),
                 f"--window-size={size[0]},{size[1]}", f"--screenshot={png_path}")


# -- PNG, read with zlib and struct -------------------------------------------------------------
def read_png(path):
    """The pixels of an 8-bit PNG (gray, RGB, gray+alpha or RGBA; not interlaced, not indexed)
    as a uint8 array (height, width, channels)."""
    with open(path, "rb") as f:
        data = f.read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    at, idat, head = 8, [], None
    while at < len(data):
        n, kind = struct.unpack(">I4s", data[at:at + 8])
        body = data[at + 8:at + 8 + n]
        if kind == b"IHDR":
            head = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        elif kind == b"IEND":
            break
        at += 12 + n
    width, height, depth, color, _, _, interlace = head
    channels = {0: 1, 2: 3, 4: 2, 6: 4}.get(color)
    assert depth == 8 and channels and not interlace, f"PNG kind {head} not read here"
    raw = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8)
    stride = width * channels
    rows = raw.reshape(height, stride + 1)
    out = np.zeros((height, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        f, line = rows[y, 0], rows[y, 1:].astype(np.int32)
        if f == 0:
            cur = line
        elif f == 1:            # Sub: a running sum per channel
            cur = np.cumsum(line.reshape(width, channels), axis=0).reshape(-1) & 255
        elif f == 2:            # Up
            cur = (line + prev) & 255
        elif f in (3, 4):       # Average, Paeth: each byte depends on the one decoded before
            cur = line.copy()
            up = prev
            for x in range(stride):
                left = cur[x - channels] if x >= channels else 0
                if f == 3:
                    cur[x] = (cur[x] + ((left + up[x]) >> 1)) & 255
                else:
                    ul = up[x - channels] if x >= channels else 0
                    p = left + up[x] - ul
                    pa, pb, pc = abs(p - left), abs(p - up[x]), abs(p - ul)
                    pred = left if pa <= pb and pa <= pc else up[x] if pb <= pc else ul
                    cur[x] = (cur[x] + pred) & 255
        else:
            raise AssertionError(f"PNG row filter {f}")
        out[y] = cur
        prev = cur
    return out.reshape(height, width, channels)


def colours(pixels):
    """The number of distinct colours in ``pixels`` (height, width, channels)."""
    flat = pixels.reshape(-1, pixels.shape[2]).astype(np.uint32)
    key = np.zeros(len(flat), np.uint32)
    for c in range(flat.shape[1]):
        key = key << 8 | flat[:, c]
    return len(np.unique(key))


def errors_shown(dom):
    """The text of the page's error collector, <pre id="errors">, in a dumped DOM."""
    found = re.findall(r'<pre id="errors"[^>]*>([^<]*)</pre>', dom)
    assert len(found) == 1, f"{len(found)} error collectors in the page"
    return found[0]


# -- the tests ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """(model, path of its report with a profile)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    try:
        import two_spirals
    finally:
        sys.path.remove(os.path.join(ROOT, "examples"))
    model = two_spirals.build_model()
    rng = np.random.default_rng(0)
    prof = model.profile({"point": rng.standard_normal((model.batch, 2))},
                         {"class": np.eye(2)[rng.integers(0, 2, model.batch)]}, repeat=1)
    path = str(tmp_path_factory.mktemp("report") / "spirals.html")
    model.report(path, prof)
    return model, path


def test_the_page_runs_in_chromium_without_errors(browser, page):
    model, path = page
    dom, _ = run_chromium(browser, "file://" + path, "--dump-dom")
    got = Page(dom, strict=False)
    body = got.find("body")
    assert body, dom[:500]
    attrs = body[0][1]
    errors = [a for t, a, _ in got.find("pre", id="errors")]
    assert errors, "the page lost its error collector"
    shown = errors_shown(dom)
    assert shown == "", f"the page's script raised: {shown}"
    assert attrs.get("data-js") == "ready", f"the page's script did not finish: {attrs}"
    assert attrs.get("data-arenas") == "ok", f"the in-page arena check: {attrs}"
    # The DOM the browser built: a row per launch, and every arena's boxes sum to it.
    assert got.launch_rows() == [la.name for la in model.kernels]
    expected = {role: n * model._exec.item for role, n in model.plan.arenas.items()}
    assert check_arenas(got, expected) == []
    assert f"{len(model.kernels)} of {len(model.kernels)} shown" in dom     # the filter's count
    assert got.find("g", data_timeline=True)


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_the_page_of_a_random_graph_runs_in_chromium(browser, seed, tmp_path):
    """Any model, not only the examples: a fuzzed graph's training plan (tests/random_graphs.py),
    unprofiled; the DOM Chromium builds has a row per launch, its arenas add up, the script ran."""
    from test_report import fuzzed
    model = fuzzed(seed)
    path = str(tmp_path / "fuzzed.html")
    model.report(path)
    dom, _ = run_chromium(browser, "file://" + path, "--dump-dom")
    got = Page(dom, strict=False)
    assert errors_shown(dom) == ""
    attrs = got.find("body")[0][1]
    assert attrs.get("data-js") == "ready" and attrs.get("data-arenas") == "ok", attrs
    assert got.launch_rows() == [la.name for la in model.kernels]
    expected = {role: n * model._exec.item for role, n in model.plan.arenas.items()}
    assert check_arenas(got, expected) == []


def test_an_error_in_the_page_shows(browser, page, tmp_path):
    """The check is not blind: a page whose script throws shows it in <pre id=errors> and never
    reaches data-js="ready"."""
    _, path = page
    text = open(path, encoding="utf-8").read()
    bad = tmp_path / "bad.html"
    bad.write_text(text.replace('"use strict";', '"use strict"; null.boom();', 1), encoding="utf-8")
    dom, _ = run_chromium(browser, "file://" + str(bad), "--dump-dom")
    assert "null" in errors_shown(dom)
    assert 'data-js="ready"' not in dom


def test_the_screenshot_is_not_blank(browser, page, tmp_path):
    _, path = page
    png = str(tmp_path / "shot.png")
    screenshot(browser, path, png, size=(1000, 700))
    pixels = read_png(png)
    assert pixels.shape[:2] == (700, 1000)
    assert colours(pixels) > 2, "the screenshot is blank"


def test_the_png_reader_reads_every_filter(tmp_path):
    """read_png against an image written by hand with each row filter (0-4)."""
    rng = np.random.default_rng(1)
    img = rng.integers(0, 256, (5, 4, 3)).astype(np.int32)
    raw, prev = b"", np.zeros(12, np.int32)
    for y in range(5):
        cur = img[y].reshape(-1)
        left = np.concatenate([np.zeros(3, np.int32), cur[:-3]])
        ul = np.concatenate([np.zeros(3, np.int32), prev[:-3]])
        if y == 0:
            enc = cur
        elif y == 1:
            enc = cur - left
        elif y == 2:
            enc = cur - prev
        elif y == 3:
            enc = cur - ((left + prev) >> 1)
        else:
            p = left + prev - ul
            pa, pb, pc = abs(p - left), abs(p - prev), abs(p - ul)
            enc = cur - np.where((pa <= pb) & (pa <= pc), left, np.where(pb <= pc, prev, ul))
        raw += bytes([y]) + bytes((enc & 255).astype(np.uint8))
        prev = cur

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
    path = tmp_path / "t.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 4, 5, 8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
    assert (read_png(str(path)) == img).all()
    assert colours(read_png(str(path))) == len({tuple(p) for p in img.reshape(-1, 3)})


# -- the docs' screenshot -----------------------------------------------------------------------
def main(out=os.path.join(ROOT, "docs", "img", "report.png")):
    """Write the screenshot the docs show: the report of examples/two_spirals.py's model with a
    profile of train_step, 1400 x 1000 pixels."""
    binary = chromium()
    if binary is None:
        raise SystemExit("no Chromium found: apt-get install chromium")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import two_spirals
    model = two_spirals.build_model()
    rng = np.random.default_rng(0)
    prof = model.profile({"point": rng.standard_normal((model.batch, 2))},
                         {"class": np.eye(2)[rng.integers(0, 2, model.batch)]}, repeat=3)
    with tempfile.TemporaryDirectory() as folder:
        path = model.report(os.path.join(folder, "two_spirals.html"), prof)
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        screenshot(binary, path, out)
    print(f"wrote {out}: {colours(read_png(out))} colours")


if __name__ == "__main__":
    main(*sys.argv[1:])
