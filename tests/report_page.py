"""Reading a report page (kilnet/report.py) back, for tests/test_report.py and
tests/test_report_browser.py: the page as a tree of tags (html.parser, checked to nest), and the
checks both make of it, on the file as written and on the DOM a browser made of it."""
from html.parser import HTMLParser

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}
# Elements whose end tag HTML lets a writer leave out (the browser's DOM dump leaves none out;
# kilnet's writer leaves none out either, which `Page(strict=True)` checks).
OPTIONAL_END = {"p", "li", "tr", "td", "th", "thead", "tbody", "option"}
SVG_SELF_CLOSING = {"path", "rect", "line", "circle", "stop"}


class Page(HTMLParser):
    """The tags of ``text`` in document order: ``tags`` [(tag, attrs dict, ancestors' attrs)];
    ``errors``: end tags that close nothing open, or elements left open at the end."""

    def __init__(self, text, strict=True):
        super().__init__(convert_charrefs=True)
        self.strict = strict
        self.tags, self.errors, self.stack, self.text = [], [], [], []
        self.feed(text)
        self.close()
        if self.stack:
            self.errors.append(f"left open: {[t for t, _ in self.stack]}")

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a, [x for _, x in self.stack]))
        if tag not in VOID:
            self.stack.append((tag, a))

    def handle_startendtag(self, tag, attrs):
        self.tags.append((tag, dict(attrs), [x for _, x in self.stack]))

    def handle_endtag(self, tag):
        if tag in VOID:
            return
        if not self.stack or self.stack[-1][0] != tag:
            if not self.strict:
                names = [t for t, _ in self.stack]
                if tag in names:
                    while self.stack[-1][0] != tag:
                        self.stack.pop()
                    self.stack.pop()
                    return
            self.errors.append(f"</{tag}> closes {self.stack[-1][0] if self.stack else 'nothing'}")
            return
        self.stack.pop()

    def handle_data(self, data):
        self.text.append(data)

    def find(self, tag=None, **attrs):
        """The (tag, attrs, ancestors) of every element of ``tag`` (any if None) that has each of
        ``attrs`` (name with _ for -; value True: present with any value)."""
        out = []
        for t, a, anc in self.tags:
            if tag is not None and t != tag:
                continue
            if all((k.replace("_", "-") in a) if v is True else a.get(k.replace("_", "-")) == v
                   for k, v in attrs.items()):
                out.append((t, a, anc))
        return out

    def launch_rows(self):
        return [a["data-launch"] for t, a, _ in self.find("tr", data_launch=True)]

    def arenas(self):
        """{role: (bytes of the arena, [(kind, name, offset, bytes)] of its boxes in order)}."""
        out = {}
        for t, a, _ in self.find(data_arena=True):
            out[a["data-arena"]] = (int(a["data-bytes"]), [])
        for t, a, anc in self.tags:
            if "data-buffer" in a or "data-gap" in a:
                owner = [x["data-arena"] for x in anc if "data-arena" in x]
                assert len(owner) == 1, f"a box outside one arena: {a}"
                if "data-buffer" in a:
                    assert a["data-role"] == owner[0], a
                out[owner[0]][1].append(("buffer" if "data-buffer" in a else "gap",
                                         a.get("data-buffer"), int(a["data-offset"]),
                                         int(a["data-bytes"])))
        return out


def network_references(page):
    """Everything in ``page`` (a Page) that would fetch over a network, or fetch at all: a
    <link>, a <script src>, an <iframe>/<img>/<object>/<embed>/<source>/<video>/<audio>, any
    src/href/action/srcset/xlink:href that is not a #fragment, and url(...) or @import in CSS."""
    found = []
    for t, a, _ in page.tags:
        if t in ("link", "iframe", "img", "object", "embed", "source", "video", "audio", "base"):
            found.append(f"<{t} {a}>")
        if t == "script" and "src" in a:
            found.append(f"<script src={a['src']!r}>")
        for k in ("src", "href", "action", "srcset", "xlink:href", "poster", "data"):
            v = a.get(k)
            if v is not None and not v.startswith("#"):
                found.append(f"<{t} {k}={v!r}>")
        style = a.get("style", "")
        if "url(" in style:
            found.append(f"<{t} style={style!r}>")
    css = "".join(page.text)
    for bad in ("@import", "http://", "https://", "url("):
        if bad in css:
            found.append(f"text holds {bad!r}")
    return found


def check_arenas(page, expected):
    """Each arena's boxes (buffers and gaps) cover it exactly, in offset order, with no hole
    and no overlap, and its bytes are ``expected[role]``: [] when all is well, else what is
    wrong."""
    wrong = []
    arenas = page.arenas()
    if set(arenas) != set(expected):
        wrong.append(f"arenas {sorted(arenas)}, expected {sorted(expected)}")
    for role, (total, boxes) in arenas.items():
        if expected.get(role) != total:
            wrong.append(f"{role}: data-bytes {total}, the plan's {expected.get(role)}")
        at = 0
        for kind, name, offset, size in boxes:
            if offset != at:
                wrong.append(f"{role}: {kind} {name} at byte {offset}, the last box ended at {at}")
            at = offset + size
        if sum(b[3] for b in boxes) != total:
            wrong.append(f"{role}: boxes sum to {sum(b[3] for b in boxes)} bytes of {total}")
    return wrong
