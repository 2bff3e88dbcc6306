"""Reliability and key hygiene: killed runs resume exactly, the key never leaks, bad settings
are named."""

import pytest

from ksemstamp.cli import main
from ksemstamp.config import WatermarkConfig

YAML_KEY = "yk3-YAMLKEY-distinctive-55e0"


def test_broken_yaml_error_names_the_file_not_its_content(tmp_path):
    # PyYAML quotes the offending line in its messages; that line may be the key.
    path = tmp_path / "c.yaml"
    path.write_text(f'key: "{YAML_KEY}\n')
    with pytest.raises(ValueError) as err:
        WatermarkConfig.from_yaml(path)
    assert str(path) in str(err.value) and "line" in str(err.value)
    assert YAML_KEY not in str(err.value) and err.value.__cause__ is None
    assert err.value.__context__ is None or err.value.__suppress_context__


def test_zero_batch_size_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["detect", "--batch-size", "0", "--text", "A. B."])
    assert exit_.value.code == 2 and "--batch-size" in capsys.readouterr().err
