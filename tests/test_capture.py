"""Tests for nbdurable.ipython.capture: unit tests on a plain shell, then real kernels."""

from __future__ import annotations

import contextlib
import io
import json
import sys
import textwrap
import threading

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.display import HTML, clear_output, display
from kernel_util import make_notebook, outputs_of, run_notebook, stream_text

from nbdurable.ipython.capture import (
    WIDGET_PLACEHOLDER,
    WIDGET_VIEW_MIME,
    Capture,
    join_stream_text,
    replay,
    show_last_expr,
    strip_widget_views,
    underlying,
    unrecorded,
)
from nbdurable.ipython.kernelio import _marker_prefix_at_end
from nbdurable.ipython.widgettext import has_own_text

# A 1x1 PNG.
PNG_B64 = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
    "AAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


@pytest.fixture
def shell():
    return InteractiveShell.instance()


def patched_state(shell):
    """Everything Capture patches, to check it is restored."""
    return (
        sys.stdout,
        sys.stderr,
        dict(vars(shell.display_pub)),
        dict(vars(shell.displayhook)),
    )


def stream(name, text):
    return {"output_type": "stream", "name": name, "text": text}


def in_cell(shell, body):
    """Run `body()` inside a real ``shell.run_cell``, as a kernel runs a cell.

    Returns that cell's execution count. The count an ``execute_result``
    carries is only defined while a cell runs, and IPython 8 and 9 keep it in
    different places (9 increments ``execution_count`` before the cell, and its
    ``displayhook.prompt_count`` is ``execution_count - 1``), so the unit tests
    check it inside a cell rather than against either attribute.
    """
    shell.user_ns["_nbdurable_test_body"] = body
    try:
        result = shell.run_cell("_nbdurable_test_body()", store_history=True)
    finally:
        shell.user_ns.pop("_nbdurable_test_body", None)
    result.raise_error()
    return result.execution_count


# -- unit tests on a plain InteractiveShell ---------------------------------------


def test_records_true_order_and_types(shell, capsys):
    captured = []

    def body():
        with Capture(shell) as cap:
            print("one")
            print("two", file=sys.stderr)
            display(HTML("<b>three</b>"))
            print("four")
            show_last_expr(shell, 6 * 7)
        captured.append(cap)

    number = in_cell(shell, body)
    (cap,) = captured

    assert cap.outputs == [
        stream("stdout", "one\n"),
        stream("stderr", "two\n"),
        {
            "output_type": "display_data",
            "data": {
                "text/plain": "<IPython.core.display.HTML object>",
                "text/html": "<b>three</b>",
            },
            "metadata": {},
        },
        stream("stdout", "four\n"),
        {
            "output_type": "execute_result",
            "data": {"text/plain": "42"},
            "metadata": {},
            "execution_count": number,
        },
    ]
    # Everything still went through live.
    out = capsys.readouterr()
    assert "one\n" in out.out and "four\n" in out.out and "42" in out.out
    assert out.err == "two\n"


def test_plain_shell_prints_are_not_recorded_twice(shell, capsys):
    # A plain DisplayPublisher prints text/plain and a plain DisplayHook prints
    # "Out[n]: 42": both are the display itself, not stream output.
    with Capture(shell) as cap:
        display("shown")
        show_last_expr(shell, 42)
    assert [o["output_type"] for o in cap.outputs] == ["display_data", "execute_result"]
    assert "Out[" in capsys.readouterr().out


def test_show_last_expr_sets_underscore_and_skips_none(shell):
    with Capture(shell) as cap:
        show_last_expr(shell, None)
        assert cap.outputs == []
        show_last_expr(shell, "value")
    assert shell.user_ns["_"] == "value"
    assert cap.outputs[-1]["data"] == {"text/plain": "'value'"}
    assert "quiet" not in vars(shell.displayhook)


def test_merges_consecutive_chunks_of_one_stream(shell):
    with Capture(shell) as cap:
        sys.stdout.write("a")
        sys.stdout.write("b\n")
        print("c")
        sys.stderr.write("e\n")
        print("d")
    assert cap.outputs == [
        stream("stdout", "ab\nc\n"),
        stream("stderr", "e\n"),
        stream("stdout", "d\n"),
    ]


@pytest.mark.parametrize(
    ("chunks", "expected"),
    [
        (["\r10%", "\r50%", "\r100%", "\n"], "100%\n"),
        (["abc\r", "d"], "dbc"),
        (["abc\r", "\n", "x"], "abc\r\nx"),  # \r\n: a newline, kept as printed
        (["a\r\nb\rc\n"], "a\r\nc\n"),  # a subprocess's CRLF
        (["line\n", "10%\r"], "line\n10%\r"),
        (["a\rb\nc\rd\n"], "b\nd\n"),
        (["no carriage returns\n", "here"], "no carriage returns\nhere"),
    ],
)
def test_carriage_returns_overwrite_their_line(chunks, expected):
    text = ""
    for chunk in chunks:
        text = join_stream_text(text, chunk)
    assert text == expected


def test_progress_bar_stays_one_line(shell):
    with Capture(shell) as cap:
        for i in range(1000):
            sys.stderr.write(f"\r{i:4d}/1000")
        sys.stderr.write("\n")
    assert cap.outputs == [stream("stderr", " 999/1000\n")]


def test_restores_everything_on_exit(shell):
    before = patched_state(shell)
    with Capture(shell):
        assert sys.stdout is not before[0]
        assert "publish" in vars(shell.display_pub)
    assert patched_state(shell) == before


@pytest.mark.parametrize("exc_type", [ValueError, KeyboardInterrupt])
def test_restores_everything_on_exception(shell, exc_type):
    before = patched_state(shell)
    with pytest.raises(exc_type), Capture(shell) as cap:
        print("before the error")
        raise exc_type("boom")
    assert patched_state(shell) == before
    assert cap.outputs == [stream("stdout", "before the error\n")]


def test_nested_captures(shell):
    before = patched_state(shell)
    with Capture(shell) as outer:
        print("outer 1")
        outer_stdout = sys.stdout
        with Capture(shell) as inner:
            print("inner")
            display("shown inside")
        assert sys.stdout is outer_stdout
        print("outer 2")
    assert patched_state(shell) == before
    inner_display = {
        "output_type": "display_data",
        "data": {"text/plain": "'shown inside'"},
        "metadata": {},
    }
    assert inner.outputs == [stream("stdout", "inner\n"), inner_display]
    assert outer.outputs == [
        stream("stdout", "outer 1\ninner\n"),
        inner_display,
        stream("stdout", "outer 2\n"),
    ]


def test_a_display_in_unrecorded_is_shown_not_recorded(shell):
    # An approval's buttons: a question about this execution, not an output to replay.
    from nbdurable.ipython.capture import unrecorded

    with Capture(shell) as cap:
        print("before")
        with unrecorded():
            display("the buttons")
        display("after")
    assert cap.outputs == [
        stream("stdout", "before\n"),
        {"output_type": "display_data", "data": {"text/plain": "'after'"}, "metadata": {}},
    ]


def test_outputs_hidden_by_capture_output_are_not_recorded(shell, capsys):
    from IPython.utils.capture import capture_output

    with Capture(shell) as cap:
        with capture_output() as hidden:
            print("hidden")
            display("hidden display")
        print("shown")
    assert cap.outputs == [stream("stdout", "shown\n")]
    assert hidden.stdout == "hidden\n" and len(hidden.outputs) == 1
    assert capsys.readouterr().out == "shown\n"


def test_nested_run_cell_does_not_recurse(shell, capsys):
    # IPython 9 patches sys.stdout.write around run_cell; the patch lands on the
    # tee, not on the stream beneath it (where it would call the tee again).
    with Capture(shell) as cap:
        shell.run_cell("print(1)")
        print(2)
    assert cap.outputs == [stream("stdout", "1\n2\n")]
    assert "write" not in vars(sys.stdout)
    assert capsys.readouterr().out == "1\n2\n"


def test_a_patch_on_the_stream_that_calls_the_tee_does_not_recurse(shell, capsys):
    # What IPython 9's run_cell did to the stream beneath the tee before the
    # tee kept such patches to itself: the stream's write calls sys.stdout.write.
    with Capture(shell) as cap:
        beneath = underlying(sys.stdout)
        beneath.write = lambda text: sys.stdout.write(text)
        try:
            print("once")
        finally:
            del beneath.write
    assert cap.outputs == [stream("stdout", "once\n")]
    assert capsys.readouterr().out == "once\n"


def test_a_write_that_writes_again_is_recorded_in_order(shell):
    class Prefixing(io.StringIO):
        busy = False

        def write(self, text):
            if text.strip() and not self.busy:
                self.busy = True
                try:
                    sys.stdout.write("> ")  # back into the tee, from inside its write
                finally:
                    self.busy = False
            return super().write(text)

    target = Prefixing()
    with contextlib.redirect_stdout(target), Capture(shell) as cap:
        print("once")
    assert target.getvalue() == "> once\n"
    assert cap.outputs == [stream("stdout", "> once\n")]


def test_unrecorded_text_is_shown_but_not_recorded(shell, capsys):
    with Capture(shell) as cap:
        print("kept")
        with unrecorded():
            print("a notice", file=sys.stderr)
        print("kept too")
    assert cap.outputs == [stream("stdout", "kept\nkept too\n")]
    assert capsys.readouterr().err == "a notice\n"


@pytest.mark.parametrize(
    ("text", "kept"),
    [("abc", 0), ("abc\x00", 1), ("abc\x00nbd", 4), ("\x00nbdurable-sync-1", 17), ("x\x00y", 0)],
)
def test_a_split_marker_is_held_back(text, kept):
    assert _marker_prefix_at_end(text, "\x00nbdurable-sync-12\x00") == kept


def test_a_sync_marker_split_between_two_pipe_reads_is_cut_out():
    from types import SimpleNamespace

    from nbdurable.ipython.kernelio import StreamTap

    fake = SimpleNamespace(parent_header={}, name="stdout")
    tap = StreamTap(fake, lambda name, text: None, lambda: False)
    got = []
    write = tap._wrap_write(got.append, threading.current_thread())
    marker = tap._marker
    write("abc" + marker[:5])
    assert got == ["abc"] and not tap._synced.is_set()
    write(marker[5:] + "def")
    assert "".join(got) == "abcdef" and tap._synced.is_set()
    write("\x00 is not a marker")
    assert "".join(got) == "abcdef\x00 is not a marker"


def test_which_widgets_have_text_for_their_state():
    import ipywidgets

    class Bar(ipywidgets.HBox):
        def __repr__(self):
            return "50%"

    class MySlider(ipywidgets.IntSlider):
        pass

    assert has_own_text(ipywidgets.IntSlider())
    assert has_own_text(MySlider())
    assert has_own_text(Bar())
    assert not has_own_text(ipywidgets.HBox())
    assert not has_own_text(ipywidgets.Output())


def test_widget_outputs_get_the_final_state_text(shell):
    import ipywidgets

    slider = ipywidgets.IntSlider(value=1)
    with Capture(shell) as cap:
        display(slider)
        slider.value = 5
    (out,) = cap.outputs
    assert out["data"]["text/plain"] == "IntSlider(value=5)"
    assert out["data"][WIDGET_VIEW_MIME]["model_id"] == slider.model_id
    assert cap.unfaithful == []
    with Capture(shell) as cap:
        display(ipywidgets.VBox([slider]))
    assert cap.unfaithful == ["VBox widget"]


def test_a_widget_closed_in_the_cell_is_not_recorded(shell):
    """Closing a widget removes its views from the frontend: nothing is left to replay."""
    import ipywidgets

    slider = ipywidgets.IntSlider(value=1)
    with Capture(shell) as cap:
        print("before")
        display(slider)
        display(slider, display_id="again")
        slider.value = 2
        slider.close()
        print("after")
    assert cap.outputs == [stream("stdout", "before\n"), stream("stdout", "after\n")]
    assert cap.unfaithful == []


def test_a_span_shows_its_widgets_as_they_are_at_its_end(shell):
    """What a sub-step displayed, taken when the call ends: a bar at its last value, a closed
    widget not at all (the cell's own record is finished later, the same way)."""
    import ipywidgets

    kept, closed = ipywidgets.IntSlider(value=1), ipywidgets.IntSlider(value=1)
    with Capture(shell) as cap:
        mark = cap.mark()
        display(kept)
        display(closed)
        kept.value = 3
        closed.close()
        span = cap.since(mark)
        kept.value = 4
    assert [o["data"]["text/plain"] for o in span] == ["IntSlider(value=3)"]
    assert WIDGET_VIEW_MIME in span[0]["data"]
    assert [o["data"]["text/plain"] for o in cap.outputs] == ["IntSlider(value=4)"]


def test_a_capture_is_used_once(shell):
    cap = Capture(shell)
    with cap:
        pass
    with pytest.raises(RuntimeError, match="new Capture"), cap:
        pass


def test_threads_may_print(shell):
    def work(n):
        for i in range(200):
            sys.stdout.write(f"{n}-{i}\n")

    with Capture(shell) as cap:
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert len(cap.outputs) == 1
    lines = cap.outputs[0]["text"].splitlines()
    assert sorted(lines) == sorted(f"{n}-{i}" for n in range(4) for i in range(200))


def test_clear_output_drops_what_it_clears(shell):
    with Capture(shell) as cap:
        print("gone")
        display("gone too")
        clear_output()
        print("kept")
    assert cap.outputs == [
        {"output_type": "clear_output", "wait": False},
        stream("stdout", "kept\n"),
    ]


def test_clear_output_wait_applies_at_next_output(shell):
    with Capture(shell) as cap:
        print("a")
        clear_output(wait=True)
        assert cap.outputs == [
            stream("stdout", "a\n"),
            {"output_type": "clear_output", "wait": True},
        ]
        for i in range(100):
            clear_output(wait=True)
            print(i)
    assert cap.outputs == [{"output_type": "clear_output", "wait": True}, stream("stdout", "99\n")]


def test_display_ids_and_updates(shell):
    with Capture(shell) as cap:
        handle = display("v1", display_id="d1")
        handle.update("v2")
    assert cap.outputs == [
        {
            "output_type": "display_data",
            "data": {"text/plain": "'v1'"},
            "metadata": {},
            "transient": {"display_id": "d1"},
        },
        {
            "output_type": "update_display_data",
            "data": {"text/plain": "'v2'"},
            "metadata": {},
            "transient": {"display_id": "d1"},
        },
    ]


def test_data_is_made_json_able(shell):
    import base64

    png = base64.b64decode(PNG_B64)
    with Capture(shell) as cap:
        shell.display_pub.publish(
            data={"image/png": png, "application/json": {"t": (1, 2), "nan": float("nan")}},
            metadata={"image/png": {"width": 1}},
        )
    (out,) = cap.outputs
    assert out["data"] == {"image/png": PNG_B64, "application/json": {"t": [1, 2], "nan": "nan"}}
    json.dumps(cap.outputs, allow_nan=False)


def test_strip_widget_views():
    view = {"version_major": 2, "version_minor": 0, "model_id": "abc"}
    assert strip_widget_views({"text/plain": "IntSlider(value=3)", WIDGET_VIEW_MIME: view}) == {
        "text/plain": "IntSlider(value=3)"
    }
    assert strip_widget_views(
        {"text/plain": "W()", "text/html": "<i>w</i>", WIDGET_VIEW_MIME: view}
    ) == {"text/plain": "W()", "text/html": "<i>w</i>"}
    assert strip_widget_views({WIDGET_VIEW_MIME: view}) == {"text/plain": WIDGET_PLACEHOLDER}
    assert strip_widget_views({"text/plain": "x"}) == {"text/plain": "x"}


def test_replay_round_trips_on_a_plain_shell(shell):
    with Capture(shell) as first:
        print("one")
        print("two", file=sys.stderr)
        handle = display(HTML("<b>x</b>"), display_id="h")
        handle.update("updated")
        clear_output(wait=True)
        print("three")
        show_last_expr(shell, [1, 2])
    with Capture(shell) as second:
        replay(shell, first.outputs)
    assert second.outputs == first.outputs


def test_replay_shows_widget_fallbacks(shell):
    view = {"version_major": 2, "version_minor": 0, "model_id": "abc"}
    recorded = [
        {
            "output_type": "display_data",
            "data": {"text/plain": "IntSlider(value=3)", WIDGET_VIEW_MIME: view},
            "metadata": {WIDGET_VIEW_MIME: {"x": 1}},
        },
        {
            "output_type": "execute_result",
            "data": {WIDGET_VIEW_MIME: view},
            "metadata": {},
            "execution_count": 1,
        },
    ]
    captured = []

    def body():
        with Capture(shell) as cap:
            replay(shell, recorded)
        captured.append(cap)

    number = in_cell(shell, body)
    (cap,) = captured
    assert cap.outputs == [
        {
            "output_type": "display_data",
            "data": {"text/plain": "IntSlider(value=3)"},
            "metadata": {},
        },
        {
            "output_type": "execute_result",
            "data": {"text/plain": WIDGET_PLACEHOLDER},
            "metadata": {},
            "execution_count": number,
        },
    ]


def test_replay_refuses_unknown_outputs_before_emitting_anything(shell, capsys):
    recorded = [stream("stdout", "not yet\n"), {"output_type": "error", "ename": "E"}]
    with pytest.raises(ValueError, match="output 1: output_type 'error'"):
        replay(shell, recorded)
    assert capsys.readouterr().out == ""


# -- real kernels ----------------------------------------------------------------

SETUP = """\
import ast, json, pathlib, sys
from IPython.core.magic import register_cell_magic
from nbdurable.ipython.capture import Capture, replay, show_last_expr

saved = {}

@register_cell_magic
def cap(line, cell):
    shell = get_ipython()
    tree = ast.parse(cell)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    with Capture(shell) as capture:
        exec(compile(tree, "<cap>", "exec"), shell.user_ns)
        if last is not None:
            code = compile(ast.Expression(last.value), "<cap>", "eval")
            show_last_expr(shell, eval(code, shell.user_ns))
    saved[line.strip()] = json.loads(json.dumps(capture.outputs))
"""

CELLS = {
    "setup": SETUP,
    "order": """\
        %%cap order
        from IPython.display import HTML, display
        print("one")
        print("two", file=sys.stderr)
        display(HTML("<b>three</b>"))
        print("four")
        6 * 7
        """,
    "order_check": "print(json.dumps([_, max(Out), Out[max(Out)]]))",
    "order_replay": "replay(get_ipython(), saved['order'])",
    "interleave": """\
        %%cap interleave
        for i in range(3):
            print("out", i)
            print("err", i, file=sys.stderr)
        """,
    "interleave_replay": "replay(get_ipython(), saved['interleave'])",
    "interleave_plain": """\
        for i in range(3):
            print("out", i)
            print("err", i, file=sys.stderr)
        """,
    "widget": """\
        %%cap widget
        import ipywidgets
        w = ipywidgets.IntSlider(value=3, description="n")
        display(w)
        print("after")
        w
        """,
    "widget_replay": "replay(get_ipython(), saved['widget'])",
    "clear": """\
        %%cap clear
        from IPython.display import clear_output
        print("gone")
        clear_output()
        print("kept")
        handle = display("v1", display_id="d1")
        handle.update("v2")
        print("end")
        """,
    "clear_replay": "replay(get_ipython(), saved['clear'])",
    "wait": """\
        %%cap wait
        print("a")
        clear_output(wait=True)
        print("b")
        """,
    "wait_replay": "replay(get_ipython(), saved['wait'])",
    "image": f"""\
        %%cap image
        import base64
        from IPython.display import Image
        Image(data=base64.b64decode("{PNG_B64}"))
        """,
    "image_replay": "replay(get_ipython(), saved['image'])",
    "dump": """\
        import os
        pathlib.Path("captured.json").write_text(json.dumps(saved))
        print(os.environ.get("NBDURABLE_TEST_MARK"))
        """,
}
INDEX = {name: i for i, name in enumerate(CELLS)}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """Run the capture notebook once in a real kernel; return (nb, captured, cwd)."""
    cwd = tmp_path_factory.mktemp("capture-kernel")
    nb = make_notebook([textwrap.dedent(source) for source in CELLS.values()])
    nb = run_notebook(nb, cwd=cwd, env={"NBDURABLE_TEST_MARK": "marked"}, timeout=60)
    captured = json.loads((cwd / "captured.json").read_text())
    return nb, captured


def cell(nb, name, **kwargs):
    return outputs_of(nb, INDEX[name], **kwargs)


def count(nb, name):
    return nb.cells[INDEX[name]].execution_count


@pytest.mark.kernel
def test_kernel_env_and_cwd_reach_the_kernel(executed):
    nb, _ = executed
    assert stream_text(cell(nb, "dump")) == "marked\n"


@pytest.mark.kernel
def test_kernel_live_outputs_in_true_order(executed):
    nb, captured = executed
    live = cell(nb, "order")
    assert [(o["output_type"], o.get("name")) for o in live] == [
        ("stream", "stdout"),
        ("stream", "stderr"),
        ("display_data", None),
        ("stream", "stdout"),
        ("execute_result", None),
    ], live
    assert live[0]["text"] == "one\n" and live[1]["text"] == "two\n"
    assert live[2]["data"]["text/html"] == "<b>three</b>"
    assert live[3]["text"] == "four\n"
    assert live[4]["data"] == {"text/plain": "42"}
    assert live[4]["execution_count"] == count(nb, "order")
    # What was recorded is exactly what the frontend got.
    assert captured["order"] == live


@pytest.mark.kernel
def test_kernel_show_last_expr_sets_underscore_and_out(executed):
    nb, _ = executed
    underscore, last_out, value = json.loads(stream_text(cell(nb, "order_check")))
    assert (underscore, last_out, value) == (42, count(nb, "order"), 42)


@pytest.mark.kernel
def test_kernel_replay_is_identical_with_current_execution_count(executed):
    nb, _ = executed
    replayed = cell(nb, "order_replay")
    assert cell(nb, "order_replay", execution_count=False) == cell(
        nb, "order", execution_count=False
    )
    assert replayed[-1]["output_type"] == "execute_result"
    assert replayed[-1]["execution_count"] == count(nb, "order_replay")
    assert count(nb, "order_replay") != count(nb, "order")


@pytest.mark.kernel
def test_kernel_interleaved_streams_are_grouped_as_a_plain_cell_shows_them(executed):
    # ipykernel buffers each stream and sends it a moment after its first write:
    # a quick cell shows its stdout lines together, then its stderr lines. A
    # captured cell shows, records and replays exactly that.
    nb, captured = executed
    plain = cell(nb, "interleave_plain")
    assert stream_text(plain) == "out 0\nout 1\nout 2\n"
    assert stream_text(plain, "stderr") == "err 0\nerr 1\nerr 2\n"
    assert cell(nb, "interleave") == plain
    assert captured["interleave"] == plain
    assert cell(nb, "interleave_replay") == plain


@pytest.mark.kernel
def test_kernel_widgets_replay_as_static_fallback(executed):
    nb, captured = executed
    live = cell(nb, "widget")
    assert WIDGET_VIEW_MIME in live[0]["data"] and WIDGET_VIEW_MIME in live[2]["data"]
    assert [o["output_type"] for o in captured["widget"]] == [
        "display_data",
        "stream",
        "execute_result",
    ]
    fallback = {"text/plain": "IntSlider(value=3, description='n')"}
    replayed = cell(nb, "widget_replay")
    assert replayed == [
        {"output_type": "display_data", "data": fallback, "metadata": {}},
        stream("stdout", "after\n"),
        {
            "output_type": "execute_result",
            "data": fallback,
            "metadata": {},
            "execution_count": count(nb, "widget_replay"),
        },
    ]


@pytest.mark.kernel
def test_kernel_clear_output_and_display_updates_round_trip(executed):
    nb, captured = executed
    shown = [
        stream("stdout", "kept\n"),
        {"output_type": "display_data", "data": {"text/plain": "'v2'"}, "metadata": {}},
        stream("stdout", "end\n"),
    ]
    assert cell(nb, "clear") == shown
    assert cell(nb, "clear_replay") == shown
    transient = {"display_id": "d1"}
    assert captured["clear"] == [
        {"output_type": "clear_output", "wait": False},
        stream("stdout", "kept\n"),
        {
            "output_type": "display_data",
            "data": {"text/plain": "'v1'"},
            "metadata": {},
            "transient": transient,
        },
        {
            "output_type": "update_display_data",
            "data": {"text/plain": "'v2'"},
            "metadata": {},
            "transient": transient,
        },
        stream("stdout", "end\n"),
    ]
    assert cell(nb, "wait") == [stream("stdout", "b\n")]
    assert cell(nb, "wait_replay") == [stream("stdout", "b\n")]
    assert captured["wait"] == [
        {"output_type": "clear_output", "wait": True},
        stream("stdout", "b\n"),
    ]


@pytest.mark.kernel
def test_kernel_images_are_base64_and_round_trip(executed):
    nb, captured = executed
    (recorded,) = captured["image"]
    # IPython 8.0's Image encodes with binascii.b2a_base64's trailing newline
    # (later releases pass newline=False): what matters is that the frontend,
    # the record and the replay all carry the same text.
    assert recorded["data"]["image/png"].rstrip("\n") == PNG_B64
    live = cell(nb, "image", execution_count=False)
    assert live == [{k: v for k, v in recorded.items() if k != "execution_count"}]
    assert cell(nb, "image_replay", execution_count=False) == live


def test_since_a_mark_is_what_was_shown_after_it(shell):
    # What a sub-step call printed is the span of the cell's outputs after a mark:
    # the rest of a stream it cut, and every output after it.
    with Capture(shell) as cap:
        print("before", end="")
        mark = cap.mark()
        print(" during")
        display("shown")
        print("also", file=sys.stderr)
        span = cap.since(mark)
        assert cap.since(cap.mark()) == []
    assert [o["output_type"] for o in span] == ["stream", "display_data", "stream"]
    assert span[0] == stream("stdout", " during\n") and span[2] == stream("stderr", "also\n")
    assert cap.outputs[0] == stream("stdout", "before during\n"), "the capture itself is unchanged"


def test_a_drain_of_the_childrens_pipe_that_stops_at_its_bound_leaves_the_pipe_read(monkeypatch):
    """A drain stopped by its bound finishes later; the pipe's stream still reads after it.

    The stream wakes on the edge of the socket's file descriptor, which the drain's reads
    consumed: left to it, the rest (and every later child message) would stay unread.
    Real sockets and a real ``ZMQStream``; the IO thread's loop is this test's.
    """
    import asyncio
    import time
    import types

    import zmq
    from zmq.eventloop.zmqstream import ZMQStream

    from nbdurable.ipython import kernelio

    monkeypatch.setattr(kernelio, "DRAIN_BOUND", 2)
    ctx = zmq.Context()
    child, pipe_socket = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    child.bind("inproc://children")
    pipe_socket.connect("inproc://children")
    forwarded: list[bytes] = []

    async def io_loop() -> None:
        pipe = ZMQStream(pipe_socket)
        pub = types.SimpleNamespace(
            _pipe_flag=True,
            _pipe_uuid=b"uuid",
            _pipe_in=pipe,
            _handle_pipe_msg=lambda frames: forwarded.append(frames[1]),
        )
        pipe.on_recv(pub._handle_pipe_msg)
        children = kernelio._ChildPipe.of(types.SimpleNamespace(pub_thread=pub))
        children.listen(lambda msg: None)

        async def until(n: int) -> None:
            deadline = time.monotonic() + 10
            while len(forwarded) < n and time.monotonic() < deadline:
                await asyncio.sleep(0.01)

        for i in range(5):  # written by a worker while the cell ran
            child.send_multipart([b"uuid", b"m%d" % i])
        assert pipe_socket.poll(1000)
        children.drain()  # the end of the cell: two now, the rest on the loop's next turns
        await until(5)
        child.send_multipart([b"uuid", b"later"])  # the stream's own reading
        await until(6)
        children.unlisten(children.listeners[0])
        pipe.close()

    try:
        asyncio.run(io_loop())
    finally:
        ctx.destroy(linger=0)
    assert forwarded == [b"m0", b"m1", b"m2", b"m3", b"m4", b"later"]
