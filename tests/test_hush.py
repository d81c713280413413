"""nbdurable/hush.py: an object's own chatter while nbdurable looks at it is dropped, only it."""

from __future__ import annotations

import logging
import threading
import warnings

import pytest

from nbdurable.hush import hush


def test_warnings_and_log_records_of_the_hushed_thread_are_dropped(caplog, recwarn):
    with hush():
        warnings.warn("from __getstate__", UserWarning, stacklevel=1)
        logging.getLogger("lib").warning("Removing unpickleable private attribute")
    assert not [w for w in recwarn if "__getstate__" in str(w.message)]
    assert "unpickleable" not in caplog.text
    warnings.warn("after", UserWarning, stacklevel=1)
    logging.getLogger("lib").warning("after the block")
    assert any("after" == str(w.message) for w in recwarn)
    assert "after the block" in caplog.text


def test_other_threads_and_the_filters_a_library_adds_are_untouched(caplog):
    before = len(warnings.filters)
    seen = threading.Event()
    go = threading.Event()

    def other() -> None:
        go.wait(10)
        logging.getLogger("job").warning("a background job's line")
        seen.set()

    worker = threading.Thread(target=other)
    worker.start()
    try:
        with hush():
            # an import during a load registers a filter: it must outlive the block
            warnings.filterwarnings("ignore", message="a library's own filter")
            go.set()
            assert seen.wait(10)
    finally:
        worker.join(10)
        warnings.filters[:] = [f for f in warnings.filters if "library's own" not in str(f[1])]
    assert "a background job's line" in caplog.text
    assert len(warnings.filters) == before


def test_prints_are_dropped_only_when_asked(capsys):
    with hush(streams=True):
        print("init a")
    with hush():
        print("kept")
    assert capsys.readouterr().out == "kept\n"


def test_an_error_filter_does_not_turn_an_objects_warning_into_an_error():
    # (pytest runs this suite with filterwarnings=error, as a strict user might.)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with hush():
            warnings.warn("dropped, not raised", UserWarning, stacklevel=1)
        with pytest.raises(UserWarning):
            warnings.warn("raised outside", UserWarning, stacklevel=1)


class _Loud:
    def __setstate__(self, state):
        print("restoring")
        warnings.warn("restored", UserWarning, stacklevel=1)
        self.__dict__.update(state)


def test_a_load_hushes_from_the_first_code_it_can_run(capsys, recwarn, monkeypatch):
    """What a restored object prints or warns is dropped; plain data, which runs no
    code, is loaded without entering the hush at all (it costs more than the load).
    """
    from nbdurable.store import values

    loud = _Loud()
    loud.n = 1
    data, plain = values.dumps(loud), values.dumps({"text": ["a", 1, 2.5, None]})
    entered = []
    real = values.hush
    monkeypatch.setattr(values, "hush", lambda **kw: entered.append(kw) or real(**kw))
    assert values.loads(data).n == 1
    assert capsys.readouterr().out == "" and not [w for w in recwarn if "restored" in str(w)]
    assert entered == [{"streams": True}]
    entered.clear()
    assert values.loads(plain) == {"text": ["a", 1, 2.5, None]}
    assert entered == []
    print("after")  # the hush was left: the thread prints again
    assert capsys.readouterr().out == "after\n"
