"""timeseries_csv: read the CSV files people have — price bars and (date, value) series — for the
examples, with plain numpy and the csv module (no pandas).

    bars = read_bars("EURUSD_H1.csv")            # dict: time (datetime64[s]), open, high, low, close, volume
    s = read_series("sales.csv")                 # Series: times, values, freq, columns
    s.freq.label, s.freq.season                  # "weekly", 52

Layouts. A delimited text file (comma, semicolon or tab: sniffed from the header line; UTF-8, or
UTF-16 with a byte-order mark as some MetaTrader exports) with a header row. Column names are
matched case-insensitively, ignoring MetaTrader's <ANGLE> brackets, quotes, and "_" vs " ".
The timestamp is, unless a column is named explicitly:
  * a column named time, timestamp, datetime, date, gmt time, local time, ds, period (in that
    order of preference); or
  * a Date column plus a Time column holding clock times (MetaTrader: <DATE> <TIME>); or
  * an unnamed first column (what pandas' ``DataFrame.to_csv`` writes for a datetime index); or
  * the first column, when its first value is a date.
With a semicolon or tab delimiter a decimal comma (1,2345) is read as a decimal point.

Timestamps (the format is taken from the first data row and every row must share it):
  * ISO: ``2024-01-31``, ``2024-01-31 13:00``, ``2024-01-31T13:00:00[.fff]``, with an optional
    ``Z`` or offset (``+02:00``, ``-0500``): times with an offset are converted to UTC, so a
    series across a daylight-saving change stays in order; ``/`` or ``.`` may replace ``-``
    (``2024.01.31 13:00`` as MetaTrader writes it);
  * ``DD.MM.YYYY[ HH:MM[:SS[.fff]]]`` (European, Dukascopy);
  * ``YYYYMMDD`` (compact integers such as 20240131), optionally followed by a time;
  * ``YYYY-MM`` (a month) and ``YYYY`` (a year);
  * Unix seconds (9-10 digits, optional fraction) or Unix milliseconds (13 digits).
Ambiguous layouts such as ``01/02/2024`` (January 2 or February 1?) are rejected. Fractions of a
second are dropped. Rows must be in increasing time order; a file in strictly decreasing order
(newest first, as many downloads are) is reversed.

Frequency. ``infer_frequency`` takes the median spacing of the timestamps, so gaps (weekends,
holidays, missing days) do not change it, and names the nearest calendar unit: minute, hour,
day, week, month, quarter or year, or a multiple (5 minutes, 4 hours). Daily data with no
Saturday or Sunday is "business-daily". Each comes with a season length in steps, the cycle the
seasonal-naive forecast and the harmonics use:

    minute 1440 (a day)   hour 24 (a day)   day 7 (a week)   business day 5 (a week)
    week 52 (a year)      month 12          quarter 4        year 1 (no season)

(k-minute and k-hour steps: a day's worth, 1440/k or 24/k, rounded.) Minute data gets a day rather
than an hour because intraday trading and demand follow the clock of the day. Gaps in time (rows
that are not there) are left as they are: no rows are invented; the models read consecutive rows
and see the real timestamps, and ``Frequency.gaps`` counts the steps longer than 1.5 times the median.

Missing values. An empty cell, ``NA``, ``N/A``, ``NaN``, ``null`` or ``None`` (any case), or a
sentinel the caller names (``na_values``, e.g. ``-999.99``; never guessed) is a missing value.
``read_series(missing=...)``: "interpolate" (the default) fills each linearly in time between
its neighbours (one at either end takes the nearest value), "drop" removes its row, "error"
raises; ``Series.filled`` counts the values filled or dropped. A series with more than half of
its values missing is refused. ``read_bars`` drops a bar with a missing price (or open, high,
low or volume) and counts it in ``bars["dropped"]``.

Errors. Anything unreadable raises ValueError with a one-line message naming the file, the line
and the value: a missing column, an unparsable date, a non-numeric or non-finite value, rows
out of order, too few rows, an empty file.
"""
import codecs
import csv
import datetime as dt
import math
import re
from collections import namedtuple

import numpy as np

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
WEEK, YEAR = 7 * DAY, 365.25 * DAY

TIME_NAMES = ("time", "timestamp", "datetime", "date time", "date", "gmt time", "local time", "ds",
              "period")
VALUE_NAMES = ("value", "y", "close", "adj close", "price", "target")
PRICE_NAMES = ("close", "adj close", "price", "last", "value")
VOLUME_NAMES = ("volume", "tickvol", "tick volume", "vol", "real volume")

_CLOCK = r"(?P<H>\d{1,2}):(?P<M>\d{2})(?::(?P<S>\d{2})(?:[.,]\d+)?)?"
_TZ = r"\s*(?P<tz>Z|UTC|GMT|[+-]\d{2}(?::?\d{2})?)?"
_FAMILIES = {  # name: (regex, how it is written in messages)
    "iso": (rf"(?P<y>\d{{4}})(?P<sep>[-/.])(?P<m>\d{{1,2}})(?P=sep)(?P<d>\d{{1,2}})(?:(?:T|\s+){_CLOCK})?{_TZ}",
            "YYYY-MM-DD[ HH:MM[:SS]]"),
    "dmy": (rf"(?P<d>\d{{1,2}})\.(?P<m>\d{{1,2}})\.(?P<y>\d{{4}})(?:(?:T|\s+){_CLOCK})?{_TZ}",
            "DD.MM.YYYY[ HH:MM[:SS]]"),
    "compact": (rf"(?P<y>\d{{4}})(?P<m>\d{{2}})(?P<d>\d{{2}})(?:(?:T|\s+){_CLOCK})?", "YYYYMMDD"),
    "month": (r"(?P<y>\d{4})-(?P<m>\d{1,2})", "YYYY-MM"),
    "year": (r"(?P<y>\d{4})", "YYYY"),
    "unix": (r"(?P<s>\d{9,10})(?:\.\d+)?", "Unix seconds"),
    "unix_ms": (r"(?P<ms>\d{13})", "Unix milliseconds"),
}
_FAMILIES = {k: (re.compile(f"^{rx}$"), text) for k, (rx, text) in _FAMILIES.items()}
ACCEPTED = ("YYYY-MM-DD[ HH:MM[:SS]], YYYYMMDD, YYYY.MM.DD, DD.MM.YYYY, YYYY-MM, YYYY or Unix "
            "seconds")
_CLOCK_ONLY = re.compile(rf"^{_CLOCK}$")
_EPOCH = dt.datetime(1970, 1, 1)


# -- reading the table --------------------------------------------------------------------------
def _decode(path):
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as e:
        raise ValueError(f"{path}: cannot read: {e.strerror or e}") from None
    if raw.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return raw.decode("utf-16")
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def norm(name):
    """A column name as it is matched: stripped of spaces, quotes and <>, lower case, "_" as " "."""
    name = name.strip().strip("\"'").strip().strip("<>").strip().lower()
    return re.sub(r"[\s_]+", " ", name)


class Table:
    """A delimited file: ``header`` (names as written), ``rows`` [(line number, fields)] without
    blank lines, ``delimiter``."""

    def __init__(self, path):
        self.path = path
        text = _decode(path)
        lines = [(i, ln) for i, ln in enumerate(text.splitlines(), start=1) if ln.strip()]
        if not lines:
            raise ValueError(f"{path}: empty file (expected a header row and data rows)")
        head = lines[0][1]
        self.delimiter = max(",;\t", key=head.count)
        if head.count(self.delimiter) == 0:
            raise ValueError(f"{path}: the header has one column ({head.strip()[:40]!r}); expected "
                             "comma-, semicolon- or tab-separated columns")
        fields = list(csv.reader([ln for _, ln in lines], delimiter=self.delimiter))
        self.header = [h.strip() for h in fields[0]]
        self.names = [norm(h) for h in self.header]
        self.rows = [(i, [f.strip() for f in row]) for (i, _), row in zip(lines[1:], fields[1:])]
        if not self.rows:
            raise ValueError(f"{path}: no data rows (only the header: {', '.join(self.header)})")

    def columns(self):
        return ", ".join(h or "(unnamed)" for h in self.header)

    def find(self, names):
        """Index of the first column called any of ``names`` (normalised), or None."""
        for n in names:
            if n in self.names:
                return self.names.index(n)
        return None

    def column(self, name, flag):
        """Index of the column ``name`` given by the user with ``flag``; ValueError if absent."""
        i = self.find([norm(name)])
        if i is None:
            raise ValueError(f"{self.path}: no column {name!r} in the header (columns: "
                             f"{self.columns()}); choose with {flag}")
        return i

    def first(self, i):
        row = self.rows[0][1]
        return row[i] if i < len(row) else ""

    def field(self, lineno, row, i):
        if i >= len(row):
            raise ValueError(f"{self.path}, line {lineno}: {len(row)} fields, expected at least {i + 1}")
        return row[i]

    def numbers(self, i, what, na_values=None):
        """Column ``i`` as float64; ValueError naming the line of a non-numeric or infinite value.
        With ``na_values`` (a set of texts, ``missing_texts``), a missing value is NaN."""
        decimal_comma = self.delimiter != ","
        out = np.empty(len(self.rows))
        for k, (lineno, row) in enumerate(self.rows):
            text = self.field(lineno, row, i)
            if na_values is not None and text.strip().lower() in na_values:
                out[k] = np.nan
                continue
            try:
                v = float(text.replace(",", ".") if decimal_comma else text)
            except ValueError:
                raise ValueError(f"{self.path}, line {lineno}: {what} {text!r} in column "
                                 f"{self.header[i] or '(unnamed)'!r} is not a number") from None
            if not math.isfinite(v):
                raise ValueError(f"{self.path}, line {lineno}: {what} {text!r} in column "
                                 f"{self.header[i] or '(unnamed)'!r} is not finite")
            out[k] = v
        return out


# -- missing values -----------------------------------------------------------------------------
NA_TEXTS = ("", "na", "n/a", "nan", "null", "none")
MISSING = ("interpolate", "drop", "error")
MOST_MISSING = 0.5          # a series with more of its values missing is refused


def missing_texts(na_values=()):
    """The cell texts (lower case) read as a missing value: NA_TEXTS and the caller's sentinels."""
    if isinstance(na_values, str):
        na_values = [na_values]
    return set(NA_TEXTS) | {str(v).strip().lower() for v in na_values}


def fill_missing(path, times, values, lines, missing, what="value"):
    """(times, values, how many were missing) with the NaNs of ``values`` (ordered by ``times``,
    seconds) handled as ``missing`` says; ``lines`` are the rows' line numbers, for messages."""
    if missing not in MISSING:
        raise ValueError(f"missing must be one of {', '.join(MISSING)}, got {missing!r}")
    gaps = np.isnan(values)
    n = int(gaps.sum())
    if not n:
        return times, values, 0
    if n > MOST_MISSING * len(values):
        raise ValueError(f"{path}: {n} of {len(values)} {what}s are missing (more than "
                         f"{MOST_MISSING:.0%}): too few to fill from")
    if missing == "error":
        raise ValueError(f"{path}, line {lines[int(np.argmax(gaps))]}: {what} is missing ({n} "
                         f"missing in all); fill them (missing='interpolate') or drop their rows "
                         f"(missing='drop')")
    if missing == "drop":
        return times[~gaps], values[~gaps], n
    t = times.astype(np.float64)
    out = values.copy()
    out[gaps] = np.interp(t[gaps], t[~gaps], values[~gaps])
    return times, out, n


# -- timestamps ---------------------------------------------------------------------------------
def timestamp_family(text):
    """The name of the format ``text`` is written in (a key of _FAMILIES), or None."""
    text = text.strip()
    for name, (rx, _) in _FAMILIES.items():
        if rx.match(text) and _to_seconds(name, rx.match(text)) is not None:
            return name
    return None


def _to_seconds(family, m):
    g = m.groupdict()
    if family == "unix":
        return int(g["s"])
    if family == "unix_ms":
        return int(g["ms"]) // 1000
    try:
        stamp = dt.datetime(int(g["y"]), int(g.get("m") or 1), int(g.get("d") or 1),
                            int(g.get("H") or 0), int(g.get("M") or 0), int(g.get("S") or 0))
    except ValueError:
        return None
    seconds = (stamp - _EPOCH) // dt.timedelta(seconds=1)
    tz = g.get("tz")
    if tz and tz[0] in "+-":
        digits = tz[1:].replace(":", "")
        offset = int(digits[:2]) * 3600 + int(digits[2:4] or 0) * 60
        seconds -= offset if tz[0] == "+" else -offset
    return seconds


def parse_times(texts, lines, path, column):
    """Parse timestamp strings (one per row; ``lines`` their line numbers) into datetime64[s].
    The format is the first value's; a value that does not parse raises ValueError naming its line."""
    family = timestamp_family(texts[0])
    if family is None:
        raise ValueError(f"{path}, line {lines[0]}: unparsable date {texts[0]!r} in column "
                         f"{column!r} (accepted: {ACCEPTED})")
    rx, written = _FAMILIES[family]
    out = np.empty(len(texts), np.int64)
    for k, (text, lineno) in enumerate(zip(texts, lines)):
        m = rx.match(text.strip())
        s = None if m is None else _to_seconds(family, m)
        if s is None:
            raise ValueError(f"{path}, line {lineno}: unparsable date {text!r} in column {column!r} "
                             f"(the file's dates are {written}, as on line {lines[0]})")
        out[k] = s
    return out.astype("datetime64[s]"), family


def _time_columns(table, override, flag):
    """(indices of the timestamp column(s), name for messages): one column, or (date, time)."""
    if override:
        i = table.column(override, flag)
        return (i,), table.header[i] or "(unnamed)"
    d, t = table.find(["date"]), table.find(["time"])
    if d is not None and t is not None and _CLOCK_ONLY.match(table.first(t)):
        return (d, t), f"{table.header[d]} + {table.header[t]}"
    i = table.find(TIME_NAMES)
    if i is None and table.names[0] in ("", "unnamed: 0", "index"):
        i = 0                                                   # pandas' index column
    if i is None and timestamp_family(table.first(0)) in ("iso", "dmy", "compact", "month"):
        i = 0
    if i is None:
        raise ValueError(f"{table.path}: no date or time column (columns: {table.columns()}); "
                         f"name it with {flag}")
    return (i,), table.header[i] or "(unnamed)"


def _read_times(table, cols, name):
    lines = [ln for ln, _ in table.rows]
    if len(cols) == 2:
        texts = [f"{table.field(ln, r, cols[0])} {table.field(ln, r, cols[1])}" for ln, r in table.rows]
    else:
        texts = [table.field(ln, r, cols[0]) for ln, r in table.rows]
    return parse_times(texts, lines, table.path, name)


def _text(t):
    text = str(np.datetime64(t, "s"))
    return text[:-9] if text.endswith("T00:00:00") else text.replace("T", " ")


def _order(table, times, what="date"):
    """Indices putting the rows in increasing time order: as they are, or reversed when the whole
    file runs backwards; ValueError at the first row that breaks the order otherwise."""
    d = np.diff(times.astype(np.int64))
    if len(d) and (d < 0).all():
        return np.arange(len(times))[::-1]
    bad = np.nonzero(d <= 0)[0]
    if len(bad):
        k = int(bad[0]) + 1
        raise ValueError(f"{table.path}, line {table.rows[k][0]}: {what} {_text(times[k])} is not after "
                         f"the previous row's {_text(times[k - 1])} (rows must be in increasing "
                         f"{what} order)")
    return np.arange(len(times))


# -- frequency ----------------------------------------------------------------------------------
Frequency = namedtuple("Frequency", "unit every step season periods label gaps")
Frequency.__doc__ = """unit ("minute" ... "year"), every (k of them per step), step (the median
spacing, seconds), season (steps per seasonal cycle), periods (seconds, for time harmonics),
label ("daily", "every 5 minutes", ...), gaps (steps longer than 1.5 × the median)."""

_ADJECTIVE = {"minute": "minutely", "hour": "hourly", "day": "daily", "business day": "business-daily",
              "week": "weekly", "month": "monthly", "quarter": "quarterly", "year": "yearly"}


def infer_frequency(times):
    """The Frequency of datetime64 timestamps in increasing order (at least 2)."""
    t = np.asarray(times).astype("datetime64[s]").astype(np.int64)
    if len(t) < 2:
        raise ValueError("need at least two timestamps to tell the frequency")
    steps = np.diff(t).astype(np.float64)
    step = float(np.median(steps))
    gaps = int((steps > 1.5 * step).sum())
    days = step / DAY
    day_numbers = t // 86400
    if step < 0.75 * HOUR:
        unit, every = "minute", max(1, round(step / MINUTE))
        season, periods = max(1, round(1440 / every)), [HOUR, DAY]
    elif step < 0.75 * DAY:
        unit, every = "hour", max(1, round(step / HOUR))
        season, periods = max(1, round(24 / every)), [DAY, WEEK]
    elif days < 1.5:
        weekday = (day_numbers + 3) % 7                      # 1970-01-01 was a Thursday: Mon = 0
        business = len(t) >= 10 and (weekday < 5).all()
        if business:                                         # a weekend is no gap
            d = day_numbers.astype("datetime64[D]")
            gaps = int((np.busday_count(d[:-1], d[1:]) > 1).sum())
        unit, every = ("business day" if business else "day"), 1
        season, periods = (5 if business else 7), [WEEK, YEAR]
    elif days < 5:
        unit, every = "day", round(days)
        season, periods = max(1, round(7 / every)), [WEEK, YEAR]
    elif days < 10:
        unit, every, season, periods = "week", 1, 52, [YEAR]
    elif days < 25:
        unit, every, season, periods = "week", round(days / 7), round(52 / round(days / 7)), [YEAR]
    elif days < 45:
        unit, every, season, periods = "month", 1, 12, [YEAR]
    elif days < 75:
        unit, every, season, periods = "month", 2, 6, [YEAR]
    elif days < 135:
        unit, every, season, periods = "quarter", 1, 4, [YEAR]
    elif days < 250:
        unit, every, season, periods = "month", 6, 2, [YEAR]
    else:
        unit, every = "year", max(1, round(days / 365.25))
        season, periods = 1, [10 * YEAR]
    label = _ADJECTIVE[unit] if every == 1 else f"every {every} {unit}s"
    return Frequency(unit, every, step, season, periods, label, gaps)


def show(t, freq):
    """A timestamp as text at the resolution of ``freq``: dates for daily and longer steps."""
    return str(np.datetime_as_string(np.datetime64(t, "s"), unit="D" if freq.step >= DAY else "m")).replace("T", " ")


# -- series -------------------------------------------------------------------------------------
# filled: how many values were missing (filled or dropped, as ``missing`` says; None if none was)
Series = namedtuple("Series", "times values freq date_column value_column filled missing",
                    defaults=(0, None))
Series.__doc__ = """times (datetime64[s]), values (float64), freq (Frequency), and the names of
the columns read."""


def read_series(path, date_column=None, value_column=None, min_rows=None, need="",
                missing="interpolate", na_values=()):
    """A (date, value) series from the CSV at ``path``. Columns are found as the module docstring
    says unless named; the value column, unless named, is one called value, y, close, adj close,
    price or target, or else the only numeric column. ``min_rows``: fewer rows raise ValueError
    (``need`` says why in the message). ``missing`` and ``na_values``: see "Missing values"."""
    if missing not in MISSING:
        raise ValueError(f"missing must be one of {', '.join(MISSING)}, got {missing!r}")
    na = missing_texts(na_values)
    table = Table(path)
    cols, tname = _time_columns(table, date_column, "--date-column")
    if value_column:
        vi = table.column(value_column, "--value-column")
    else:
        vi = table.find(VALUE_NAMES)
        if vi is None or vi in cols:
            numeric = [i for i in range(len(table.header)) if i not in cols and
                       any(_is_number(r[i]) for _, r in table.rows[:20]
                           if i < len(r) and r[i].strip().lower() not in na)]
            if not numeric:
                raise ValueError(f"{path}: no numeric value column (columns: {table.columns()}); "
                                 "name it with --value-column")
            if len(numeric) > 1:
                raise ValueError(f"{path}: several numeric columns ("
                                 f"{', '.join(table.header[i] or '(unnamed)' for i in numeric)}); "
                                 "choose one with --value-column")
            vi = numeric[0]
    times, _ = _read_times(table, cols, tname)
    values = table.numbers(vi, "value", na)
    order = _order(table, times)
    times, values = times[order], values[order]
    lines = [table.rows[k][0] for k in order]
    times, values, filled = fill_missing(path, times, values, lines, missing)
    if min_rows is not None and len(values) < min_rows:
        raise ValueError(f"{path}: too few rows: {len(values)}, need at least {min_rows}"
                         + (f" ({need})" if need else ""))
    if len(values) < 2:
        raise ValueError(f"{path}: too few rows: {len(values)}, need at least 2")
    return Series(times, values, infer_frequency(times), tname, table.header[vi] or "(unnamed)",
                  filled, missing if filled else None)


def _is_number(text):
    try:
        float(text.replace(",", "."))
        return True
    except ValueError:
        return False


# -- bars ---------------------------------------------------------------------------------------
def read_bars(path, time_column=None, price_column=None, open_column=None, high_column=None,
              low_column=None, volume_column=None, min_bars=None, need="", na_values=()):
    """OHLCV bars from the CSV at ``path``: a dict with ``time`` (datetime64[s]), ``open``,
    ``high``, ``low``, ``close``, ``volume`` (float64) and ``columns`` (what was read from where).

    ``price_column`` is the price traded on, returned as ``close`` (default: Close, else Adj Close,
    Price, Last or Value). Open, High and Low are read when the file has them (``*_column`` to
    name them); a file of one price has none, and each bar then opens at the previous close
    (the first at its own close) with high and low the larger and smaller of open and close.
    When the price column is not the Close column and the file has one too (Yahoo's Adj Close next
    to Close), Open, High and Low are scaled by price/Close, as adjusted prices are made.
    Volume: Volume, else TickVol, Vol or Real Volume; ``volume_column="none"`` reads none (zeros).
    A bar with a missing value in a column it reads is dropped; ``dropped`` counts them.
    """
    na = missing_texts(na_values)
    table = Table(path)
    cols, tname = _time_columns(table, time_column, "--time-column")
    pi = (table.column(price_column, "--price-column") if price_column
          else table.find(PRICE_NAMES))
    if pi is None:
        raise ValueError(f"{path}: missing price column (Close, Adj Close, Price, Last or Value; "
                         f"columns: {table.columns()}); name it with --price-column")
    given = {"open": open_column, "high": high_column, "low": low_column}
    idx = {k: (table.column(v, f"--{k}-column") if v else table.find([k])) for k, v in given.items()}
    found = [k for k, i in idx.items() if i is not None]
    if found and len(found) < 3:
        missing = [k for k in idx if idx[k] is None]
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)} (the file has "
                         f"{', '.join(found)}; columns: {table.columns()})")
    if volume_column and norm(volume_column) == "none":
        vi = None
    else:
        vi = (table.column(volume_column, "--volume-column") if volume_column
              else table.find(VOLUME_NAMES))
        if vi is None:
            raise ValueError(f"{path}: missing column(s) volume (Volume, TickVol or Vol; columns: "
                             f"{table.columns()}); name it with --volume-column, or "
                             "--volume-column none")
    if min_bars is not None and len(table.rows) < min_bars:
        raise ValueError(f"{path}: {len(table.rows)} bars; need at least {min_bars}"
                         + (f" ({need})" if need else ""))
    times, _ = _read_times(table, cols, tname)
    close = table.numbers(pi, "price", na)
    volume = table.numbers(vi, "volume", na) if vi is not None else np.zeros(len(close))
    columns = {"time": tname}
    if found:
        o, h, l = (table.numbers(idx[k], k, na) for k in ("open", "high", "low"))
        ci = table.find(["close"])
        if ci is not None and ci != pi:
            raw = table.numbers(ci, "close", na)
            scale = close / np.where(raw == 0, 1.0, raw)
            o, h, l = o * scale, h * scale, l * scale
        columns.update({k: table.header[idx[k]] for k in idx})
    else:
        columns.update(open="(previous close)", high="(max of open, close)", low="(min of open, close)")
    columns.update(close=table.header[pi], volume=table.header[vi] if vi is not None else None)
    order = _order(table, times, "time")
    gaps = np.isnan(close) | np.isnan(volume)
    if found:
        gaps |= np.isnan(o) | np.isnan(h) | np.isnan(l)
    dropped = int(gaps.sum())
    if dropped > MOST_MISSING * len(close):
        raise ValueError(f"{path}: {dropped} of {len(close)} bars have a missing value (more "
                         f"than {MOST_MISSING:.0%})")
    order = order[~gaps[order]]
    times, close, volume = times[order], close[order], volume[order]
    if min_bars is not None and len(close) < min_bars:
        raise ValueError(f"{path}: {len(close)} bars with every value ({dropped} dropped); need at "
                         f"least {min_bars}" + (f" ({need})" if need else ""))
    if found:
        o, h, l = o[order], h[order], l[order]
        bad = np.nonzero(h < l)[0]
        if len(bad):
            raise ValueError(f"{path}, line {table.rows[order[bad[0]]][0]}: high is below low")
    else:
        o = np.concatenate([close[:1], close[:-1]])
        h, l = np.maximum(o, close), np.minimum(o, close)
    return {"time": times, "open": o, "high": h, "low": l, "close": close, "volume": volume,
            "columns": columns, "dropped": dropped}
