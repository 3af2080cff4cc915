"""Defects found in the ``peerwire`` command line: each test fails on the code it was written
against, and is bounded in time."""

from __future__ import annotations

import pytest

from rpc import cli


@pytest.mark.parametrize("option", ["--timeout", "--connect-timeout"])
@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "soon"])
def test_a_timeout_that_is_no_number_of_seconds_above_0_is_a_usage_error(
    option: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2 with the option named, before connecting (port 9 refuses: exit 3 had it
    tried). Before, only a word was refused: ``--timeout nan`` waited without bound,
    ``--timeout -1`` or ``0`` failed every call at once (exit 4, "no result within -1.0 s"),
    ``--connect-timeout -1`` exited 3 saying connecting timed out, and
    ``--connect-timeout nan`` exited 1 with a ValueError."""
    with pytest.raises(SystemExit) as exited:
        cli.main(["call", "tcp+gotalk://127.0.0.1:9", "echo", option, value])
    assert exited.value.code == 2
    assert option in capsys.readouterr().err
