"""The CLI's handling of OSErrors: one line naming the path when the error names one, the traceback otherwise."""

from __future__ import annotations

import errno

import pytest

from datahub.cli import main


def _failing(exc: OSError):
    def app(**options: object) -> None:  # main calls app(standalone_mode=False)
        raise exc
    return app


def test_an_os_error_on_a_path_is_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(main, "app", _failing(NotADirectoryError(errno.ENOTDIR, "Not a directory", "/x/notes.txt/lake")))
    monkeypatch.setattr(main.sys, "argv", ["datahub", "inspect"])
    assert main._run() == 2
    err = capsys.readouterr().err
    assert "/x/notes.txt/lake: Not a directory; check that path and its permissions" in err


@pytest.mark.parametrize("exc", [ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"),
                                 TimeoutError("timed out"), OSError("no path here")])
def test_an_os_error_without_a_path_keeps_its_traceback(exc: OSError, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main, "app", _failing(exc))
    monkeypatch.setattr(main.sys, "argv", ["datahub", "inspect"])
    with pytest.raises(type(exc)):
        main._run()


@pytest.mark.parametrize("exc", [OSError(errno.EIO, "Input/output error", "/lake/samples/part-0.parquet"),
                                 OSError(errno.ENOSPC, "No space left on device", "/lake/_tmp/x")])
def test_an_io_error_in_the_middle_of_a_run_keeps_its_traceback(exc: OSError, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main, "app", _failing(exc))
    monkeypatch.setattr(main.sys, "argv", ["datahub", "inspect"])
    with pytest.raises(OSError):
        main._run()
