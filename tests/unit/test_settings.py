"""Settings from the environment: a bad value is one line naming the variable, never a default."""

from __future__ import annotations

import pytest

from runner.core.errors import InvalidInput
from runner.core.settings import whole_number


@pytest.mark.parametrize(("raw", "expected"), [(None, 7), ("", 7), ("  ", 7), ("0", 0), (" 19 ", 19)])
def test_a_whole_number_in_range_or_the_default(raw: str | None, expected: int) -> None:
    env = {} if raw is None else {"ROOTBENCH_X": raw}
    assert whole_number("ROOTBENCH_X", 7, 0, 19, env) == expected


@pytest.mark.parametrize("raw", ["-1", "20", "ten", "1.5", "0x3"])
def test_anything_else_is_invalid_input_naming_the_variable(raw: str) -> None:
    with pytest.raises(InvalidInput) as info:
        whole_number("ROOTBENCH_X", 7, 0, 19, {"ROOTBENCH_X": raw}, low_means="off")
    assert info.value.field == "ROOTBENCH_X"
    assert f"must be a whole number from 0 (off) to 19, not {raw!r}" in str(info.value)
