"""examples/forecast.py: a tiny run learns and reports MAE/RMSE against both naive forecasts;
the CSV reader accepts each date format and rejects malformed files with a one-line error."""
import math
import os

import numpy as np
import pytest

from test_examples import EXAMPLES, load


@pytest.fixture(scope="module")
def fc():
    return load(os.path.join(EXAMPLES, "forecast.py"), "example_forecast")


def has_matplotlib():
    try:
        import matplotlib  # noqa: F401
        return True
    except ImportError:
        return False


def test_tiny_run_learns_and_reports(fc, capsys, tmp_path):
    png = tmp_path / "f.png"
    argv = ["--steps", "40", "--batch", "8", "--history", "16", "--horizon", "7", "--width", "8",
            "--log-every", "20", "--lr", "1e-2"] + (["--plot", str(png)] if has_matplotlib() else [])
    result = fc.main(argv)
    out = capsys.readouterr().out
    losses = result["losses"]
    assert len(losses) == 40 and all(math.isfinite(v) for v in losses)
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), (losses[:5], losses[-10:])
    rep = result["report"]
    assert set(rep) == {"model", "naive", "seasonal_naive"}
    for r in rep.values():
        assert set(r) == {"mae", "rmse"} and 0 < r["mae"] <= r["rmse"] and math.isfinite(r["rmse"])
    assert "MAE" in out and "RMSE" in out and "seasonal naive (7)" in out and "naive (last value)" in out
    assert f"{rep['model']['mae']:.4f}" in out
    assert [ln.split()[1] for ln in out.splitlines() if ln.startswith("step ")] == ["20", "40"]
    if has_matplotlib():
        assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote {png}" in out


def test_dropout_and_a_weekday_embedding(fc, capsys):
    """--dropout P and --weekday-embedding W: the graph holds them, the weekday input holds each
    history step's day of the week (Monday 0), and a tiny run learns."""
    g = fc.build_graph(history=16, horizon=7, width=8, dropout=0.3, weekday=3)
    assert [n.op for n in g.nodes if n.op in ("dropout", "embedding")] == ["embedding", "dropout"]
    assert g.inputs["weekday"].shape == (16,)
    values = np.arange(40.0)
    seconds = np.arange(40.0) * fc.DAY
    *_, wd = fc.windows(values, seconds, [20, 21], 16, 7, 1.0, weekday0=5)
    np.testing.assert_array_equal(wd[0], (np.arange(4, 20) + 5) % 7)
    result = fc.main(["--steps", "40", "--batch", "8", "--history", "16", "--horizon", "7",
                      "--width", "8", "--log-every", "20", "--lr", "1e-2", "--dropout", "0.2",
                      "--weekday-embedding", "3", "--no-progress"])
    losses = result["losses"]
    assert np.mean(losses[-10:]) < 0.6 * np.mean(losses[:5]), (losses[:5], losses[-10:])
    assert result["model"].plan.feeds.keys() == {"history", "times", "weekday"}


def test_plot_writes_a_png_or_says_matplotlib_is_missing(fc, tmp_path):
    s, v, freq = fc.synthetic(60)
    args = (str(tmp_path / "p.png"), [1.0, 0.5, 0.25], s, v, 40, v[40:47] + 0.1, freq)
    if has_matplotlib():
        fc.plot(*args)
        assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    else:
        with pytest.raises(SystemExit, match="--plot needs matplotlib"):
            fc.plot(*args)


def write(path, text):
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("dates,kind,gap", [
    (["2020-01-30", "2020-01-31", "2020-02-01"], "daily", [86400.0, 86400.0]),
    (["2019-12", "2020-01", "2020-02"], "monthly", [31 * 86400.0, 31 * 86400.0]),
    (["1999", "2000", "2001"], "yearly", [365 * 86400.0, 366 * 86400.0]),
])
def test_csv_reader_accepts_each_date_format(fc, tmp_path, dates, kind, gap):
    body = "value,date,other\n" + "".join(f"{i + 0.5},{d},x\n" for i, d in enumerate(dates))
    seconds, values, series = fc.read_csv(write(tmp_path / "s.csv", body))
    assert series.freq.label == kind
    assert values.tolist() == [0.5, 1.5, 2.5]
    assert seconds[0] == 0 and np.diff(seconds).tolist() == gap


def test_csv_runs_end_to_end_and_column_flags(fc, tmp_path, capsys):
    s, v, _ = fc.synthetic(120, seed=1)
    days = [str(np.datetime64("2021-03-01") + int(x // 86400)) for x in s]
    path = write(tmp_path / "d.csv", "day,y\n" + "".join(f"{d},{x:.3f}\n" for d, x in zip(days, v)))
    result = fc.main(["--csv", path, "--date-column", "day", "--value-column", "y", "--steps", "3",
                      "--batch", "8", "--history", "16", "--horizon", "7", "--width", "8"])
    assert result["kind"] == "daily" and "d.csv, daily, 120 values" in capsys.readouterr().out


@pytest.mark.parametrize("body,message", [
    ("date,cost,tax\n2020-01-01,1,2\n", "several numeric columns (cost, tax); choose one with --value-column"),
    ("date,value\n2020-01-01,1\n2020-13-02,2\n", "line 3: unparsable date '2020-13-02'"),
    ("date,value\n01/02/2020,1\n", "line 2: unparsable date '01/02/2020' in column 'date' (accepted: YYYY-MM-DD[ HH:MM[:SS]], YYYYMMDD"),
    ("date,value\n2020-01,1\n2020-02-01,2\n", "line 3: unparsable date '2020-02-01'"),
    ("date,value\n2020-01-01,1\n2020-01-02,abc\n", "line 3: value 'abc' in column 'value' is not a number"),
    ("date,value\n2020-01-02,1\n2020-01-03,1\n2020-01-01,2\n", "line 4: date 2020-01-01 is not after"),
    ("date,value\n2020-01-01\n", "line 2: 1 fields"),
    ("", "empty file"),
    ("date,value\n", "no data rows"),
    ("date,value\n2020-01-01,1\n", "too few rows: 1"),
])
def test_csv_reader_rejects_malformed_files(fc, tmp_path, body, message):
    with pytest.raises(ValueError) as e:
        fc.read_csv(write(tmp_path / "bad.csv", body))
    assert message in str(e.value) and "\n" not in str(e.value)
    assert "bad.csv" in str(e.value)


def test_too_few_rows_is_a_clear_command_line_error(fc, tmp_path, capsys):
    path = write(tmp_path / "short.csv", "date,value\n" + "".join(f"{1990 + i},{i}\n" for i in range(30)))
    with pytest.raises(SystemExit) as e:
        fc.main(["--csv", path])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "short.csv: too few rows: 30, need at least" in err and "Traceback" not in err
    with pytest.raises(SystemExit):
        fc.main(["--csv", str(tmp_path / "missing.csv")])
    assert "cannot read" in capsys.readouterr().err


TINY = ["--steps", "3", "--batch", "8", "--history", "16", "--horizon", "7", "--width", "8",
        "--no-progress"]


def test_weekly_series_with_its_own_column_names(fc, tmp_path, capsys):
    s, v, _ = fc.synthetic(120, seed=2)
    weeks = np.datetime64("2021-01-03") + 7 * np.arange(120)
    path = write(tmp_path / "w.csv", "Week;Store;Units\n" + "".join(
        f"{d};7;{x:.3f}\n".replace(".", ",") for d, x in zip(weeks, v)))
    result = fc.main(["--csv", path, "--value-column", "units"] + TINY)
    out = capsys.readouterr().out
    assert result["freq"].unit == "week" and set(result["report"]) == {"model", "naive", "seasonal_naive"}
    assert "w.csv, weekly, 120 values from 2021-01-03 to 2023-04-16" in out
    assert "season 52 steps, harmonics of year" in out and "seasonal naive (52)" in out


def test_compact_dates_and_a_pandas_index(fc, tmp_path, capsys):
    s, v, _ = fc.synthetic(120, seed=3)
    days = [str(np.datetime64("2021-03-01") + int(x // 86400)).replace("-", "") for x in s]
    path = write(tmp_path / "c.csv", ",sales\n" + "".join(f"{d},{x:.3f}\n" for d, x in zip(days, v)))
    result = fc.main(["--csv", path] + TINY)
    out = capsys.readouterr().out
    assert result["kind"] == "daily" and "c.csv, daily, 120 values from 2021-03-01 to 2021-06-28" in out
    assert "date column '(unnamed)', value column 'sales'" in out


def test_hourly_series_from_a_metatrader_export(fc, tmp_path, capsys):
    s, v, _ = fc.synthetic(120, seed=4)
    t = np.datetime64("2024-01-31T00:00", "s") + 3600 * np.arange(120)
    path = write(tmp_path / "h.csv", "<DATE>\t<TIME>\t<CLOSE>\t<TICKVOL>\n" + "".join(
        f"{str(x)[:10].replace('-', '.')}\t{str(x)[11:]}\t{y:.4f}\t5\n" for x, y in zip(t, v)))
    result = fc.main(["--csv", path, "--value-column", "<CLOSE>"] + TINY)
    out = capsys.readouterr().out
    assert result["freq"].label == "hourly" and "season 24 steps, harmonics of day, week" in out


def test_a_bad_line_exits_2_with_one_line(fc, tmp_path, capsys):
    lines = ["date,value"] + [f"{np.datetime64('2020-01-01') + i},{i}" for i in range(80)]
    lines[41] = "2020-02-30,40"
    with pytest.raises(SystemExit) as e:
        fc.main(["--csv", write(tmp_path / "b.csv", "\n".join(lines))] + TINY)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert "b.csv, line 42: unparsable date '2020-02-30' in column 'date'" in err


def weekly_with_gaps(fc, tmp_path, n=300, every=37, cell=""):
    """A weekly series with YYYYMMDD dates and one empty cell in ``every`` (2.7 %), like Mauna
    Loa's weekly CO2 record."""
    _, v, _ = fc.synthetic(n, seed=4)
    weeks = np.datetime64("1974-05-19") + 7 * np.arange(n)
    rows = [f"{str(d).replace('-', '')},{cell if i % every == 5 else f'{x:.3f}'}\n"
            for i, (d, x) in enumerate(zip(weeks, v))]
    return write(tmp_path / "co2_weekly.csv", "date,ppm\n" + "".join(rows)), sum(
        1 for i in range(n) if i % every == 5)


def test_a_weekly_series_with_empty_cells_trains_and_says_what_it_filled(fc, tmp_path, capsys):
    path, gaps = weekly_with_gaps(fc, tmp_path)
    assert 0.02 <= gaps / 300 <= 0.03
    result = fc.main(["--csv", path] + TINY)
    out = capsys.readouterr().out
    assert result["filled"] == (gaps, "interpolate")
    assert f"{gaps} missing values filled by linear interpolation in time" in out
    rep = result["report"]
    assert result["freq"].unit == "week" and "seasonal_naive" in rep
    assert all(math.isfinite(r["mae"]) for r in rep.values())
    assert "seasonal naive (52)" in out


def test_missing_value_options_on_the_command_line(fc, tmp_path, capsys):
    path, gaps = weekly_with_gaps(fc, tmp_path)
    result = fc.main(["--csv", path, "--missing", "drop"] + TINY)
    assert result["filled"] == (gaps, "drop")
    assert f"{gaps} rows with a missing value dropped" in capsys.readouterr().out
    with pytest.raises(SystemExit) as e:
        fc.main(["--csv", path, "--missing", "error"] + TINY)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "co2_weekly.csv, line 7: value is missing" in err and len(err.strip().splitlines()) == 1
    sentinel, _ = weekly_with_gaps(fc, tmp_path, cell="-999.99")
    result = fc.main(["--csv", sentinel, "--na-value", "-999.99"] + TINY)
    assert result["filled"] == (gaps, "interpolate")
    capsys.readouterr()


@pytest.mark.parametrize("model,ops,extra", [
    ("lstm", ["lstm"], ["--hidden", "12"]),
    ("attention", ["position_encoding", "self_attention", "add", "layer_norm"],
     ["--heads", "2", "--key-dim", "4", "--dropout", "0.1", "--weekday-embedding", "3"]),
])
def test_lstm_and_attention_models_learn_the_synthetic_series(fc, capsys, model, ops, extra):
    """--model lstm and --model attention: their encoder replaces the convolution (the embedding
    and head stay), a tiny run lowers the loss and beats the naive forecast on the weekly
    synthetic series, and the report gives the median time per step."""
    g = fc.build_graph(history=16, horizon=7, width=8, model=model, hidden=12, heads=2, key_dim=4)
    kinds = [n.op for n in g.nodes]
    assert "multi_window_conv" not in kinds and [k for k in kinds if k in ops] == ops
    assert "mamba4cast_embedding" in kinds or "time_encoding" in kinds
    assert g.outputs["forecast"].shape == (7,)
    result = fc.main(["--model", model, "--steps", "60", "--batch", "16", "--history", "16",
                      "--horizon", "7", "--width", "8", "--lr", "5e-3", "--log-every", "30",
                      "--no-progress"] + extra)
    out = capsys.readouterr().out
    losses, rep = result["losses"], result["report"]
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:5]), (losses[:5], losses[-10:])
    assert rep["model"]["mae"] < 0.6 * rep["naive"]["mae"], rep
    assert f"model {model}: compiled" in out
    assert 0 < result["step_seconds"] < 1 and f"median {result['step_seconds'] * 1e3:.2f} ms per step" in out
    if "--weekday-embedding" in extra:
        assert result["model"].plan.feeds.keys() == {"history", "times", "weekday"}


@pytest.mark.parametrize("argv,message", [
    (["--hidden", "8"], "--hidden applies to --model lstm only (this run is --model conv)"),
    (["--model", "lstm", "--heads", "2"], "--heads applies to --model attention only (this run is --model lstm)"),
    (["--model", "conv", "--key-dim", "4"], "--key-dim applies to --model attention only"),
    (["--model", "attention", "--heads", "0"], "--heads must be >= 1"),
    (["--model", "gru"], "argument --model: invalid choice: 'gru'"),
])
def test_an_option_of_another_model_is_refused_in_one_line(fc, capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        fc.main(argv + TINY)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and err.strip().splitlines()[-1].count(message) == 1
    assert "Traceback" not in err


def test_the_default_model_is_the_convolution(fc):
    kinds = [n.op for n in fc.build_graph(history=16, horizon=7, width=8).nodes]
    assert "multi_window_conv" in kinds and "lstm" not in kinds and "self_attention" not in kinds
    with pytest.raises(ValueError, match="model must be one of conv, lstm, attention, got 'gru'"):
        fc.build_graph(model="gru")
