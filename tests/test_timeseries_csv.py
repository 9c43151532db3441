"""examples/timeseries_csv.py: the layouts people's CSVs come in (pandas, MetaTrader, compact and
European dates, Unix seconds, semicolons and decimal commas, newest first, one price column),
each date format, the frequency and season inferred from the spacing, and a one-line error naming
the line and the value for each malformed file."""
import codecs
import os

import numpy as np
import pytest

from test_examples import EXAMPLES, load


@pytest.fixture(scope="module")
def tc():
    return load(os.path.join(EXAMPLES, "timeseries_csv.py"), "example_timeseries_csv")


def write(path, text, encoding="utf-8"):
    path.write_bytes(text.encode(encoding) if encoding != "utf-16" else codecs.BOM_UTF16_LE
                     + text.encode("utf-16-le"))
    return str(path)


def hours(n, start="2024-01-29T00:00"):
    return np.datetime64(start, "s") + 3600 * np.arange(n)


def ohlcv(i):
    o = 1.1 + 0.001 * np.sin(i / 7)
    return o, o + 0.002, o - 0.002, o + 0.0005, 100 + i


# -- layouts ---------------------------------------------------------------------------------------
def test_pandas_index_column_bars_and_series(tc, tmp_path):
    # DataFrame.to_csv with a tz-aware DatetimeIndex: empty first header, "+00:00" stamps.
    lines = [",open,high,low,close,volume"]
    for i, t in enumerate(hours(30)):
        lines.append(f"{str(t).replace('T', ' ')}+00:00," + ",".join(map(str, ohlcv(i))))
    bars = tc.read_bars(write(tmp_path / "df.csv", "\n".join(lines) + "\n"))
    assert bars["time"][0] == np.datetime64("2024-01-29T00:00:00") and len(bars["close"]) == 30
    assert bars["volume"][3] == 103 and bars["high"][0] == pytest.approx(1.102)
    assert bars["columns"]["time"] == "(unnamed)"
    # Series.to_csv of an unnamed series: header ",0"; the only numeric column is the value.
    s = tc.read_series(write(tmp_path / "s.csv", ",0\n2024-01-01,1.5\n2024-01-02,2.5\n2024-01-03,3\n"))
    assert s.values.tolist() == [1.5, 2.5, 3.0] and s.freq.label == "daily"
    assert (s.date_column, s.value_column) == ("(unnamed)", "0")


@pytest.mark.parametrize("encoding", ["utf-8", "utf-16"])
def test_metatrader5_export(tc, tmp_path, encoding):
    lines = ["<DATE>\t<TIME>\t<OPEN>\t<HIGH>\t<LOW>\t<CLOSE>\t<TICKVOL>\t<VOL>\t<SPREAD>"]
    for i in range(50):
        d, hh = divmod(i, 24)
        day = str(np.datetime64("2024-01-31") + d).replace("-", ".")
        lines.append(f"{day}\t{hh:02d}:00:00\t1.1\t1.2\t1.0\t1.15\t{i}\t0\t5")
    bars = tc.read_bars(write(tmp_path / "mt5.csv", "\r\n".join(lines) + "\r\n", encoding))
    assert bars["time"][13] == np.datetime64("2024-01-31T13:00:00")
    assert bars["time"][25] == np.datetime64("2024-02-01T01:00:00")
    assert bars["volume"][7] == 7 and bars["columns"]["volume"] == "<TICKVOL>"
    assert tc.infer_frequency(bars["time"]).label == "hourly"


def test_metatrader4_comma_export_and_series_from_date_and_time(tc, tmp_path):
    body = "Date,Time,Open,High,Low,Close,Volume\n" + "".join(
        f"2024.01.31,{h:02d}:{m:02d},1.1,1.2,1.0,{1 + h / 100 + m / 1e4},5\n"
        for h in range(2) for m in range(60))
    path = write(tmp_path / "mt4.csv", body)
    bars = tc.read_bars(path)
    assert bars["time"][61] == np.datetime64("2024-01-31T01:01:00")
    s = tc.read_series(path, value_column="close")
    assert s.freq.unit == "minute" and s.freq.season == 1440 and s.values[61] == pytest.approx(1.0101)


def test_compact_dates_semicolons_and_decimal_commas(tc, tmp_path):
    body = "DATE;AMOUNT\n" + "".join(f"{d.replace('-', '')};{i},5\n" for i, d in enumerate(
        str(np.datetime64("2024-01-30") + k) for k in range(4)))
    s = tc.read_series(write(tmp_path / "c.csv", body))
    assert s.times.astype("datetime64[D]").astype(str).tolist() == [
        "2024-01-30", "2024-01-31", "2024-02-01", "2024-02-02"]
    assert s.values.tolist() == [0.5, 1.5, 2.5, 3.5] and s.freq.label == "daily"


def test_weekly_series_named_columns_and_first_column_dates(tc, tmp_path):
    days = np.datetime64("2023-01-01") + 7 * np.arange(60)
    body = "Week,Region,Sales\n" + "".join(f"{d},north,{i}\n" for i, d in enumerate(days))
    s = tc.read_series(write(tmp_path / "w.csv", body))          # no date name: the first column
    f = s.freq
    assert (f.unit, f.every, f.season, f.label, f.gaps) == ("week", 1, 52, "weekly", 0)
    assert s.value_column == "Sales" and s.values[-1] == 59
    s2 = tc.read_series(str(tmp_path / "w.csv"), date_column="WEEK", value_column="sales")
    assert s2.times.tolist() == s.times.tolist()


@pytest.mark.parametrize("first, second, expect, step", [
    ("2024-01-31", "2024-02-01", "2024-01-31T00:00:00", 86400),
    ("2024-01-31 13:00", "2024-01-31 14:00", "2024-01-31T13:00:00", 3600),
    ("2024-01-31T13:00:00", "2024-01-31T13:01:00", "2024-01-31T13:00:00", 60),
    ("2024-01-31T13:00:00.250", "2024-01-31T13:00:01.500", "2024-01-31T13:00:00", 1),
    ("2024-01-31T13:00:00Z", "2024-01-31T14:00:00Z", "2024-01-31T13:00:00", 3600),
    # offsets are converted to UTC: across a daylight-saving change the order holds
    ("2024-10-27 02:30:00+02:00", "2024-10-27 02:00:00+01:00", "2024-10-27T00:30:00", 1800),
    ("2024-01-31T08:00:00-0500", "2024-01-31T09:00:00-0500", "2024-01-31T13:00:00", 3600),
    ("20240131", "20240201", "2024-01-31T00:00:00", 86400),
    ("2024.01.31", "2024.02.01", "2024-01-31T00:00:00", 86400),
    ("2024.01.31 13:00", "2024.01.31 14:00", "2024-01-31T13:00:00", 3600),
    ("2024/01/31", "2024/02/01", "2024-01-31T00:00:00", 86400),
    ("31.01.2024", "01.02.2024", "2024-01-31T00:00:00", 86400),
    ("31.01.2024 13:00:00.000", "31.01.2024 13:01:00.000", "2024-01-31T13:00:00", 60),
    ("1706706000", "1706709600", "2024-01-31T13:00:00", 3600),          # Unix seconds
    ("1706706000000", "1706706060000", "2024-01-31T13:00:00", 60),      # Unix milliseconds
    ("2024-01", "2024-02", "2024-01-01T00:00:00", 31 * 86400),
    ("2024", "2025", "2024-01-01T00:00:00", 366 * 86400),
])
def test_each_date_format(tc, tmp_path, first, second, expect, step):
    s = tc.read_series(write(tmp_path / "d.csv", f"timestamp,value\n{first},1\n{second},2\n"))
    assert str(s.times[0]) == expect
    assert int(np.diff(s.times.astype(np.int64))[0]) == step


@pytest.mark.parametrize("step, unit, every, season, label", [
    (60, "minute", 1, 1440, "minutely"),
    (300, "minute", 5, 288, "every 5 minutes"),
    (3600, "hour", 1, 24, "hourly"),
    (4 * 3600, "hour", 4, 6, "every 4 hours"),
    (86400, "day", 1, 7, "daily"),
    (7 * 86400, "week", 1, 52, "weekly"),
])
def test_frequency_from_the_median_step(tc, step, unit, every, season, label):
    t = np.datetime64("2024-01-06T00:00", "s") + step * np.arange(40)
    t = np.delete(t, [5, 6, 20])                                  # gaps do not change it
    f = tc.infer_frequency(t)
    assert (f.unit, f.every, f.season, f.label, f.step) == (unit, every, season, label, step)
    assert f.gaps == 2


def test_calendar_frequencies_and_business_days(tc):
    months = np.arange(np.datetime64("2020-01"), np.datetime64("2024-01")).astype("datetime64[s]")
    assert tc.infer_frequency(months)[:4:3] == ("month", 12)
    assert tc.infer_frequency(months[::3])[:4:3] == ("quarter", 4)
    years = np.arange(np.datetime64("1990"), np.datetime64("2020")).astype("datetime64[s]")
    assert tc.infer_frequency(years)[:4:3] == ("year", 1)
    days = np.arange(np.datetime64("2024-01-01"), np.datetime64("2024-03-01"))
    weekdays = days[np.is_busday(days)]
    weekdays = weekdays[weekdays != np.datetime64("2024-01-17")]  # one missing trading day
    f = tc.infer_frequency(weekdays.astype("datetime64[s]"))
    assert (f.unit, f.season, f.label, f.gaps) == ("business day", 5, "business-daily", 1)


def test_newest_first_is_reversed_and_one_price_column_makes_bars(tc, tmp_path):
    body = "Date,Price\n" + "".join(f"2024-02-{d:02d},{d}\n" for d in range(20, 0, -1))
    bars = tc.read_bars(write(tmp_path / "p.csv", body), volume_column="none")
    assert bars["close"].tolist() == list(range(1, 21))
    assert bars["open"].tolist() == [1] + list(range(1, 20))            # the previous close
    assert (bars["high"] >= bars["low"]).all() and bars["high"][3] == 4 and bars["low"][3] == 3
    assert (bars["volume"] == 0).all() and bars["columns"]["open"] == "(previous close)"


def test_price_column_choice_and_adjusted_close(tc, tmp_path):
    # Yahoo: Adj Close next to Close; trading on it scales Open, High and Low alike.
    body = ("Date,Open,High,Low,Close,Adj Close,Volume\n2024-01-02,10,12,9,11,5.5,100\n"
            "2024-01-03,11,13,10,12,6,200\n")
    plain = tc.read_bars(write(tmp_path / "y.csv", body))
    assert plain["close"].tolist() == [11, 12] and plain["open"].tolist() == [10, 11]
    adj = tc.read_bars(str(tmp_path / "y.csv"), price_column="adj close")
    assert adj["close"].tolist() == [5.5, 6] and adj["open"].tolist() == [5, 5.5]
    assert adj["high"].tolist() == [6, 6.5]
    named = tc.read_bars(write(tmp_path / "n.csv", "when|o|h|l|c|v\n".replace("|", ";")
                               + "2024-01-02;1;3;0,5;2;7\n2024-01-03;2;4;1;3;8\n"),
                         time_column="when", price_column="c", open_column="o", high_column="h",
                         low_column="l", volume_column="v")
    assert named["low"].tolist() == [0.5, 1] and named["volume"].tolist() == [7, 8]


# -- malformed files ----------------------------------------------------------------------------
@pytest.mark.parametrize("body, message", [
    ("date,value\n2024-01-01,1\n2024-13-02,2\n", "line 3: unparsable date '2024-13-02' in column 'date'"),
    ("date,value\n2024-01-01,1\n\n2024-01-03,2\n2024-01-04x,3\n", "line 5: unparsable date '2024-01-04x'"),
    ("date,value\n01/02/2024,1\n", "line 2: unparsable date '01/02/2024' in column 'date' (accepted: YYYY-MM-DD"),
    ("date,value\n20240101,1\n2024-01-02,2\n", "line 3: unparsable date '2024-01-02' in column 'date' (the file's dates are YYYYMMDD"),
    ("date,value\n2024-01-01,1\n2024-01-02,abc\n", "line 3: value 'abc' in column 'value' is not a number"),
    ("date,value\n2024-01-01,1\n2024-01-02,1.2.3\n", "line 3: value '1.2.3' in column 'value' is not a number"),
    ("date,value\n2024-01-01,1\n2024-01-02,inf\n", "line 3: value 'inf' in column 'value' is not finite"),
    ("date,value\n2024-01-02,1\n2024-01-03,2\n2024-01-01,3\n", "line 4: date 2024-01-01 is not after the previous row's 2024-01-03"),
    ("date,value\n2024-01-01\n", "line 2: 1 fields, expected at least 2"),
    ("", "empty file"),
    ("\n\n", "empty file"),
    ("date,value\n", "no data rows"),
    ("date value\n2024-01-01 1\n", "the header has one column"),
    ("date,a,b\n2024-01-01,1,2\n", "several numeric columns (a, b); choose one with --value-column"),
    ("name,value\nx,1\n", "no date or time column (columns: name, value)"),
    ("date,value\n2024-01-01,1\n", "too few rows: 1, need at least 2"),
])
def test_malformed_series(tc, tmp_path, body, message):
    with pytest.raises(ValueError) as e:
        tc.read_series(write(tmp_path / "bad.csv", body))
    assert message in str(e.value) and "\n" not in str(e.value) and "bad.csv" in str(e.value)


def test_malformed_series_flags_and_min_rows(tc, tmp_path):
    path = write(tmp_path / "s.csv", "date,value\n" + "".join(f"{1990 + i},{i}\n" for i in range(30)))
    with pytest.raises(ValueError, match="no column 'sales' in the header .*--value-column"):
        tc.read_series(path, value_column="sales")
    with pytest.raises(ValueError, match="no column 'day' in the header .*--date-column"):
        tc.read_series(path, date_column="day")
    with pytest.raises(ValueError, match=r"too few rows: 30, need at least 99 \(for a reason\)"):
        tc.read_series(path, min_rows=99, need="for a reason")
    with pytest.raises(ValueError, match="cannot read"):
        tc.read_series(str(tmp_path / "missing.csv"))


def bar_lines(header="Time,Open,High,Low,Close,Volume", n=10):
    names = header.lower().split(",")
    lines = [header]
    for i, t in enumerate(hours(n)):
        o, h, l, c, v = ohlcv(i)
        vals = {"open": o, "high": h, "low": l, "close": c, "volume": v, "size": v}
        lines.append(",".join([str(t).replace("T", " ")[:16]] + [f"{vals[k]:.5f}" for k in names[1:]]))
    return lines


def replace_field(line, column, text):
    f = line.split(",")
    f[column] = text
    return ",".join(f)


@pytest.mark.parametrize("header, edit, message", [
    ("Time,Open,High,Low,Volume", None, "missing price column (Close, Adj Close"),
    ("Time,Open,High,Low,Close,Size", None, "missing column(s) volume"),
    ("Time,Open,Low,Close,Volume", None, "missing column(s) high"),
    (None, (5, 0, "2024-01-29 3 pm"), "line 5: unparsable date '2024-01-29 3 pm' in column 'Time'"),
    (None, (7, 4, "x1.10"), "line 7: price 'x1.10' in column 'Close' is not a number"),
    (None, (3, 2, "1.0"), "line 3: high is below low"),
])
def test_malformed_bars(tc, tmp_path, header, edit, message):
    lines = bar_lines(header) if header else bar_lines()
    if edit:
        line, column, text = edit
        lines[line - 1] = replace_field(lines[line - 1], column, text)
    with pytest.raises(ValueError) as e:
        tc.read_bars(write(tmp_path / "bad.csv", "\n".join(lines) + "\n"))
    assert message in str(e.value) and "\n" not in str(e.value) and "bad.csv" in str(e.value)


def test_too_few_bars(tc, tmp_path):
    with pytest.raises(ValueError, match=r"10 bars; need at least 700 \(why\)"):
        tc.read_bars(write(tmp_path / "few.csv", "\n".join(bar_lines()) + "\n"), min_bars=700, need="why")


# -- missing values ----------------------------------------------------------------------------------
def gappy_weekly(tmp_path, n=120, missing=(5, 6, 40, 77), cell=""):
    """A weekly YYYYMMDD series (a straight line in time) with ``cell`` where ``missing`` are."""
    weeks = np.datetime64("2020-01-05") + 7 * np.arange(n)
    rows = [f"{str(d).replace('-', '')},{cell if i in missing else 2.0 * i + 1.0}\n"
            for i, d in enumerate(weeks)]
    return write(tmp_path / "gappy.csv", "date,co2\n" + "".join(rows)), weeks


@pytest.mark.parametrize("cell", ["", "NA", "NaN", "null", "n/a", "None"])
def test_missing_values_are_interpolated_in_time_by_default(tc, tmp_path, cell):
    path, weeks = gappy_weekly(tmp_path, cell=cell)
    s = tc.read_series(path)
    assert (s.filled, s.missing, len(s.values)) == (4, "interpolate", 120)
    np.testing.assert_allclose(s.values, 2.0 * np.arange(120) + 1.0)      # the line, gaps included
    assert s.freq.label == "weekly"


def test_interpolation_follows_the_timestamps_not_the_rows(tc, tmp_path):
    """A gap next to a missing week: the fill is where the line is at that date."""
    days = np.datetime64("2024-01-01") + np.array([0, 1, 2, 5, 6, 7])
    body = "date,v\n" + "".join(f"{d},{'' if i == 3 else float((d - days[0]).astype(int))}\n"
                                for i, d in enumerate(days))
    s = tc.read_series(write(tmp_path / "t.csv", body))
    assert s.values[3] == 5.0 and s.filled == 1


def test_missing_values_dropped_or_refused_on_request(tc, tmp_path):
    path, weeks = gappy_weekly(tmp_path)
    s = tc.read_series(path, missing="drop")
    assert (s.filled, s.missing, len(s.values)) == (4, "drop", 116)
    assert 40 not in ((s.values - 1.0) / 2.0).astype(int)
    with pytest.raises(ValueError, match=r"gappy.csv, line 7: value is missing \(4 missing in all\)"):
        tc.read_series(path, missing="error")
    with pytest.raises(ValueError, match="missing must be one of interpolate, drop, error"):
        tc.read_series(path, missing="zero")


def test_a_sentinel_is_missing_only_when_named(tc, tmp_path):
    path, _ = gappy_weekly(tmp_path, cell="-999.99")
    assert tc.read_series(path).values[5] == -999.99                     # a number like any other
    s = tc.read_series(path, na_values=["-999.99"])
    assert s.filled == 4 and s.values[5] == 11.0


def test_a_series_that_is_mostly_gaps_is_refused(tc, tmp_path):
    path, _ = gappy_weekly(tmp_path, n=20, missing=set(range(11)))
    with pytest.raises(ValueError, match="11 of 20 values are missing"):
        tc.read_series(path)


def test_bars_with_a_missing_value_are_dropped_and_counted(tc, tmp_path):
    t = hours(30)
    rows = []
    for i, ts in enumerate(t):
        o, h, l, c, v = ohlcv(i)
        c = "" if i in (3, 17) else c
        v = "NA" if i == 20 else v
        rows.append(f"{str(ts).replace('T', ' ')},{o},{h},{l},{c},{v}\n")
    bars = tc.read_bars(write(tmp_path / "b.csv", "Time,Open,High,Low,Close,Volume\n" + "".join(rows)))
    assert bars["dropped"] == 3 and len(bars["close"]) == 27
    assert np.isfinite(bars["close"]).all() and np.isfinite(bars["volume"]).all()
    assert t[3] not in bars["time"] and t[20] not in bars["time"]
