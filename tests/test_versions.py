"""The start-up version gate (accel_plugin/versions.py): versions in range pass, the others
are refused naming the range."""

from __future__ import annotations

import pytest

from accel_plugin.versions import UnsupportedFrameworkVersion, check_framework_version


@pytest.mark.parametrize("installed", ["0.30.0", "0.32.0", "0.32.1.dev3+gabc", "0.31.0rc1"])
def test_versions_in_range_pass(installed):
    check_framework_version("vLLM", installed, ">=0.30,<0.33", tested=("0.32.0",), remedy="r")


@pytest.mark.parametrize("installed", ["0.29.9", "0.33.0", "0.33.0rc1", "1.0", "unknown", ""])
def test_versions_out_of_range_are_refused_naming_the_range(installed):
    with pytest.raises(UnsupportedFrameworkVersion) as err:
        check_framework_version("vLLM", installed, ">=0.30,<0.33", tested=("0.32.0",), remedy="do this")
    assert str(err.value).startswith("accel-plugin supports vLLM >=0.30,<0.33 (tested: 0.32.0")
    assert f"this is vLLM {installed}: do this" in str(err.value)
