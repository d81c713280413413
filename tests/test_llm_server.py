"""The test model server itself: counts across processes, bounds, self-stop."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from llm_server import LLMServer, read_log

SERVER = Path(__file__).with_name("llm_server.py")


def _post(url, body):
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.read()


def _wait_for(predicate, what, deadline=60.0):
    end = time.monotonic() + deadline
    while not predicate():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_standalone_server_logs_every_request_for_another_process(tmp_path):
    port_file, log = tmp_path / "port", tmp_path / "requests.jsonl"
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--port-file", str(port_file), "--log", str(log)],
    )
    try:
        _wait_for(port_file.exists, "the port file")
        base = f"http://127.0.0.1:{port_file.read_text()}"
        body = {"model": "m", "messages": [{"role": "user", "content": "hello there"}]}
        _, raw = _post(base + "/v1/chat/completions", body)
        reply = json.loads(raw)
        assert reply["choices"][0]["message"]["content"] == "answer #1 to: hello there"
        _, raw = _post(base + "/v1/messages", {**body, "max_tokens": 5})
        assert json.loads(raw)["content"][0]["text"] == "answer #2 to: hello there"
        with urllib.request.urlopen(base + "/_stats", timeout=30) as r:
            stats = json.loads(r.read())
        assert stats["total"] == 2
        assert stats["requests"] == {"/v1/chat/completions": 1, "/v1/messages": 1}
        assert stats["usage"] == {"input_tokens": 4, "output_tokens": 10}
        assert [(e["n"], e["path"]) for e in read_log(log)] == [
            (1, "/v1/chat/completions"),
            (2, "/v1/messages"),
        ]
    finally:
        proc.kill()
        proc.wait()


def test_bounded_and_stops_itself():
    with LLMServer(max_requests=1, lifetime=1.0) as server:
        body = {"messages": [{"role": "user", "content": "x"}]}
        assert _post(server.url + "/v1/chat/completions", body)[0] == 200
        with pytest.raises(urllib.error.HTTPError) as err:
            _post(server.url + "/v1/chat/completions", body)
        assert err.value.code == 503
        err.value.close()
        assert server.total == 1
        _wait_for(lambda: server._httpd is None, "the server to stop itself")


def test_stream_chunks_and_usage_chunk():
    with LLMServer() as server:
        body = {
            "messages": [{"role": "user", "content": "a b c"}],
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        _, raw = _post(server.openai_base_url + "/chat/completions", body)
        frames = [f for f in raw.decode().split("\n\n") if f]
        assert frames[-1] == "data: [DONE]"
        last = json.loads(frames[-2][len("data: ") :])
        assert last["choices"] == [] and last["usage"]["prompt_tokens"] == 3
        text = "".join(
            json.loads(f[6:])["choices"][0]["delta"].get("content") or "" for f in frames[:-2]
        )
        assert text == "answer #1 to: a b c"
