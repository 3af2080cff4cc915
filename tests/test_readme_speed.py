"""The README's speed section is the one ``tests/benchmarks/readme_speed.py`` writes: its
table is rendered from the benchmarks' figures and replaced between its markers alone."""

from __future__ import annotations

import re
from typing import Any

import pytest

from tests.benchmarks.readme_speed import END, LOOPS, README, ROWS, START, render, replace_section

STAMP = {"machine": "a test box", "python": "3.11.7", "commit": "abc1234", "date": "2026-11-28"}


def _figures(scale: float) -> dict[str, Any]:
    """bench_rpc --json's shape: the bare echo at 10,000/s (sequential) and 200,000/s (100
    in flight) times ``scale``, the other rows at fixed shares of it."""
    shares = {"peerwire-gotalk": 0.8, "peerwire-chatter": 0.5, "hat-chatter": 0.1, "bare-echo": 1}
    rows = {
        name: {
            mode: {"rate": scale * base * share, "client_us": 1.0, "server_us": 1.0}
            for mode, base in (("sequential", 10_000), ("inflight100", 200_000))
        }
        for name, share in shares.items()
    }
    return {"loop": "asyncio", "rounds": 3, "seconds": 2.0, "rows": rows}


WORKERS = {
    "loop": "uvloop",
    "cores": 2,
    "work_us": 150.0,
    "rows": {"echo": {"1": 80_000.0, "2": 96_000.0}, "work": {"1": 4_000.0, "2": 7_000.0}},
}


def _table_rows(section: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in section.splitlines()
        if line.startswith("| ")
    ]


def test_render_gives_a_row_per_benchmark_row_with_shares_of_the_bare_echo() -> None:
    section = render({loop: _figures(1 + i) for i, loop in enumerate(LOOPS)}, WORKERS, STAMP)
    assert section.startswith(START) and section.endswith(END)
    header, *rows = _table_rows(section)
    assert len(header) == 1 + 2 * len(LOOPS)
    assert [row[0] for row in rows] == [label for _, label in ROWS]
    gotalk = rows[0]
    assert gotalk[1:] == [
        "8,000/s (0.80x)",
        "160,000/s (0.80x)",
        "16,000/s (0.80x)",
        "320,000/s (0.80x)",
    ]
    assert rows[-1][1:] == ["10,000/s", "200,000/s", "20,000/s", "400,000/s"]  # no share of itself
    assert "commit abc1234" in section and "medians of 3 rounds of 2 s" in section
    assert "`echo` 1.20x (80,000/s -> 96,000/s), `work` 1.75x (4,000/s -> 7,000/s)" in section


def test_a_row_the_run_lacks_says_so() -> None:
    figures = _figures(1)
    del figures["rows"]["hat-chatter"]
    section = render({loop: figures for loop in LOOPS}, WORKERS, STAMP)
    assert _table_rows(section)[3][1:] == ["not run"] * 4


def test_replace_section_changes_only_what_lies_between_the_markers() -> None:
    text = f"before\n{START}\nold table\n{END}\nafter\n"
    section = render({loop: _figures(1) for loop in LOOPS}, WORKERS, STAMP)
    replaced = replace_section(text, section)
    assert replaced == f"before\n{section}\nafter\n"
    assert replace_section(replaced, section) == replaced
    with pytest.raises(ValueError, match="markers"):
        replace_section("no markers here", section)


def test_the_readme_holds_a_rendered_section() -> None:
    """The README's section has the generator's stamp, header, rows (each with a figure
    per loop and mode) and workers' line: a table whose layout was edited by hand, or a
    generator changed without the README rewritten, fails here (the figures themselves
    are the run's)."""
    text = README.read_text()
    start, end = text.index(START), text.index(END)
    section = text[start : end + len(END)]
    expected = render({loop: _figures(1) for loop in LOOPS}, WORKERS, STAMP)
    assert _table_rows(section)[0] == _table_rows(expected)[0]
    rows = _table_rows(section)[1:]
    assert [row[0] for row in rows] == [label for _, label in ROWS]
    figure = re.compile(r"[\d,]+/s( \(\d\.\d\dx\))?|not run")
    assert all(figure.fullmatch(cell) for row in rows for cell in row[1:]), rows
    assert all(len(row) == len(_table_rows(expected)[0]) for row in rows), rows
    stamp = re.search(r"Measured (\S+ \S+ UTC) on (.+) \(Python ([\d.]+)\), commit (\w+)", section)
    assert stamp is not None, section
    assert "--workers 2` against 1 worker" in section
