"""Text tables and byte sizes as kilnet prints them (summaries, `kilnet inspect`, bundles)."""


def fmt_bytes(n):
    """``n`` bytes as B, KiB, MiB or GiB, one decimal above B."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def table(heads, rows, right=()):
    """Rows of strings in columns as wide as their widest cell; columns in ``right`` align right."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
              for i, h in enumerate(heads)]

    def line(cells):
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()
    return [line(heads)] + [line(r) for r in rows]
