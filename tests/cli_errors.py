"""The check every bad-input test makes: exit 1 and one sentence naming the culprit."""


def assert_one_error(result, culprit: str, where: str) -> None:
    """Exit 1, no exception but SystemExit, one `alcli: error:` line on stderr naming `culprit`,
    no traceback, nothing on stdout."""
    assert result.exit_code == 1, where
    assert result.exception is None or isinstance(result.exception, SystemExit), where
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("alcli: error: "), where
    assert culprit in lines[0], where
    assert "Traceback" not in result.stderr and result.stdout == "", where
