"""The OpenAI-compatible endpoint (issue 50, part 4): the policy's batched generator behind
/v1/chat/completions on 127.0.0.1; concurrent requests sampled in one generate call; each call's tokens
and log-probs recorded per session, and a session's conversation one trajectory whose policy tokens
are the sampled ones; bad requests answered in one line while it serves on."""

import json
import threading
import urllib.error
import urllib.request

import pytest

from softrl.endpoint import ChatEndpoint
from softrl.models.generation import make_generator


@pytest.fixture
def endpoint(tiny):
    _, model, tokenizer = tiny
    with ChatEndpoint(make_generator(model, tokenizer, "hf"), tokenizer, "tiny", max_new_tokens=8,
                      batch_window_s=0.3) as served:
        yield served


def post(endpoint, body, session=None, raw=None):
    request = urllib.request.Request(endpoint.base_url + "/chat/completions",
                                     data=raw if raw is not None else json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json",
                                              **({"X-Session-ID": session} if session else {})})
    try:
        with urllib.request.urlopen(request, timeout=60) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_conversation_through_the_endpoint_becomes_an_episode_with_its_sampled_tokens(endpoint, tiny):
    from softrl.models.loading import encode_episode

    messages = [{"role": "user", "content": "12 3 4 -> 24?"}]
    for turn in range(2):
        status, text = post(endpoint, {"model": "tiny", "messages": messages, "temperature": 1.0, "logprobs": True},
                            session="episode-1")
        assert status == 200, text
        reply = json.loads(text)
        message = reply["choices"][0]["message"]
        assert message["role"] == "assistant" and reply["choices"][0]["finish_reason"] in ("stop", "length")
        assert reply["usage"]["completion_tokens"] == len(reply["choices"][0]["logprobs"]["content"]) <= 8
        messages += [message, {"role": "user", "content": "Try again."}] if turn == 0 else [message]
    row = endpoint.trajectory("episode-1", reward=1.0, task="agent")
    assert [t["role"] for t in row.turns] == ["assistant", "user", "assistant"] and row.passed
    calls = endpoint.sessions["episode-1"]
    assert [t["content"] for t in row.turns[::2]] == [c.text for c in calls]
    _, response, mask = encode_episode(tiny[2], row.prompt_text, row.turns)
    assert row.response_tokens == response  # training's tokenisation
    # the policy's tokens are the sampled ones; an EOS the template adds to a reply cut at its length is not
    assert [t for t, m in zip(response, row.action_mask) if m] == [t for c in calls for t in c.tokens]
    assert sum(mask) - sum(row.action_mask) == sum(c.finish == "length" for c in calls)
    sampled = [lp for c in calls for lp in c.logprobs]
    assert [lp for lp, m in zip(row.behavior_logprobs, row.action_mask) if m] == sampled
    assert all(lp == 0.0 for lp, m in zip(row.behavior_logprobs, row.action_mask) if not m)
    assert row.policy_version == 0 and row.finish == "done"


def test_concurrent_requests_are_sampled_in_one_generate_call(endpoint):
    answers = []
    threads = [threading.Thread(target=lambda i=i: answers.append(post(endpoint, {
        "model": "tiny", "messages": [{"role": "user", "content": f"{i} 5 -> 10?"}]}, session=f"s{i}")))
        for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [status for status, _ in answers] == [200] * 4
    assert max(endpoint.batches) >= 2 and sum(endpoint.batches) == 4  # batched, each request sampled once


def test_a_streamed_reply_is_server_sent_events_ending_with_done(endpoint):
    status, text = post(endpoint, {"model": "tiny", "messages": [{"role": "user", "content": "1 2 -> 3?"}],
                                   "stream": True, "stream_options": {"include_usage": True}})
    assert status == 200
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[1]["choices"][0]["finish_reason"] in ("stop", "length") and chunks[-1]["usage"]["total_tokens"] > 0


@pytest.mark.parametrize("raw, body, status, said", [
    (b"{not json", None, 400, "the request body is not JSON"),
    (None, [1, 2], 400, "must be a JSON object, got list"),
    (None, {"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]}, 404,
     "model 'gpt-4o' is not served here; this endpoint serves 'tiny'"),
    (None, {"model": "tiny", "n": 2, "messages": [{"role": "user", "content": "hi"}]}, 400, "n must be 1"),
    (None, {"model": "tiny", "messages": []}, 400, "request: field 'messages' must be a non-empty list"),
    (None, {"model": "tiny", "messages": [{"role": "assistant", "content": "hi"}]}, 400, "comes before any system or user"),
    (None, {"model": "tiny", "messages": [{"role": "user", "content": "q"}, {"role": "tool", "content": "4",
                                                                         "tool_call_id": "c9"}]}, 400,
     "answers tool_call_id 'c9', which the assistant message before it did not make"),
    (None, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}, 400,
     "temperature must be > 0"),
    (None, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": 5}, 400, "top_p in (0, 1]"),
    (None, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "top_p": "x"}, 400, "got 1.0 and 'x'"),
    (None, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stop": 5}, 400, "stop must be a text"),
    (None, {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": True}, 400,
     "max_tokens must be a positive integer"),
])
def test_a_bad_request_is_one_line_and_the_endpoint_serves_on(endpoint, raw, body, status, said):
    got, text = post(endpoint, body, raw=raw)
    error = json.loads(text)["error"]
    assert got == status and said in error["message"] and "\n" not in error["message"]
    ok, _ = post(endpoint, {"model": "tiny", "messages": [{"role": "user", "content": "1 2 -> 3?"}]})
    assert ok == 200


def test_the_models_list_names_the_served_model_and_an_unknown_session_is_a_key_error(endpoint):
    with urllib.request.urlopen(endpoint.base_url + "/models", timeout=30) as reply:
        assert [m["id"] for m in json.loads(reply.read())["data"]] == ["tiny"]
    with pytest.raises(KeyError, match="no calls were made in session 'nobody'"):
        endpoint.trajectory("nobody", reward=0.0)


def test_a_rewritten_history_keeps_the_text_and_drops_the_log_probs(endpoint):
    """An agent that edits the policy's earlier reply: the row is a text episode, tokenised by each run."""
    status, text = post(endpoint, {"model": "tiny", "messages": [{"role": "user", "content": "5 5 -> 25?"}]},
                        session="edited")
    assert status == 200
    post(endpoint, {"model": "tiny", "messages": [{"role": "user", "content": "5 5 -> 25?"},
                                                  {"role": "assistant", "content": "an edited reply"},
                                                  {"role": "user", "content": "again"}]}, session="edited")
    row = endpoint.trajectory("edited", reward=0.0)
    assert row.turns[0]["content"] == "an edited reply" and row.behavior_logprobs is None
    assert row.response_tokens is None and row.policy_version == -1 and not row.passed


def test_softrl_serve_stores_a_session_when_its_reward_comes(tiny, tmp_path):
    """An agent in another process: `softrl serve` answers its calls, and POST /v1/softrl/reward ends a
    session, its conversation a row in the store; bad rewards and unknown sessions are one line."""
    import signal
    import subprocess
    import sys

    from softrl.data import ExperienceStore

    proc = subprocess.Popen([sys.executable, "-m", "softrl", "serve", "--model", str(tiny[0]), "--port", "0",
                             "--store", str(tmp_path / "store"), "--source", "agent", "--max-new-tokens", "6",
                             "--name", "tiny"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        base_url = proc.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:") and base_url.endswith("/v1"), proc.stderr.read()

        class At:
            pass

        served = At()
        served.base_url = base_url
        messages = [{"role": "user", "content": "3 4 -> 12?"}]
        status, text = post(served, {"model": "tiny", "messages": messages}, session="run-7")
        assert status == 200, text

        def reward(body):
            request = urllib.request.Request(base_url + "/softrl/reward", data=json.dumps(body).encode())
            try:
                with urllib.request.urlopen(request, timeout=60) as reply:
                    return reply.status, json.loads(reply.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        status, said = reward({"session": "run-7", "reward": 2})
        assert status == 400 and "reward must be a finite number in [0, 1], got 2" in said["error"]["message"]
        assert reward({"session": "nobody", "reward": 1})[0] == 404
        status, said = reward({"session": "run-7", "reward": 1, "task": "agent-task"})
        assert status == 200 and said["turns"] == 1 and said["source"] == "agent"
        assert reward({"session": "run-7", "reward": 1})[0] == 404  # a session ends once
    finally:
        proc.send_signal(signal.SIGINT)  # under pytest-xdist the child inherits an ignored SIGINT: serve sets its own
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert "stored " in err and "Traceback" not in err and err.rstrip().endswith("stopped")
    rows = ExperienceStore(tmp_path / "store").trajectories(source="agent").to_pylist()
    assert len(rows) == 1 and rows[0]["task"] == "agent-task" and rows[0]["reward"] == 1.0
    assert rows[0]["prompt_text"] == "3 4 -> 12?" and rows[0]["turns"][0]["role"] == "assistant"


def test_softrl_serve_on_a_port_in_use_is_one_line(tiny, tmp_path):
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "softrl", "serve", "--model", str(tiny[0]), "--port", str(port),
                               "--store", str(tmp_path / "store")], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and f"--port {port}: cannot listen on 127.0.0.1:{port}" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_call_asked_with_a_changed_conversation_or_another_temperature_keeps_no_log_probs(endpoint):
    """Log-probs belong to the context and distribution they were sampled under: an agent that rewrote the
    user's first message, or sampled its turns at two temperatures, gets a text row."""
    def two_turns(session, first_user, later_user, temperatures):
        status, text = post(endpoint, {"model": "tiny", "messages": [{"role": "user", "content": first_user}],
                                       "temperature": temperatures[0]}, session=session)
        reply = json.loads(text)["choices"][0]["message"]
        post(endpoint, {"model": "tiny", "temperature": temperatures[1], "messages": [
            {"role": "user", "content": later_user}, reply, {"role": "user", "content": "again"}]}, session=session)
        return endpoint.trajectory(session, reward=1.0)

    assert two_turns("same", "2 2 -> 4?", "2 2 -> 4?", (1.0, 1.0)).behavior_logprobs is not None
    changed = two_turns("changed", "2 2 -> 4?", "2 2 -> 5?", (1.0, 1.0))
    assert changed.behavior_logprobs is None and changed.prompt_text == "2 2 -> 5?"
    assert two_turns("mixed", "2 2 -> 4?", "2 2 -> 4?", (1.0, 0.7)).behavior_logprobs is None


def test_a_failed_generation_is_a_500_line_and_the_endpoint_serves_on(tiny):
    _, model, tokenizer = tiny

    class Flaky:
        def __init__(self, inner):
            self.inner, self.calls = inner, 0

        def generate(self, prompts, params):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("CUDA error: device-side assert triggered\nmore")
            return self.inner.generate(prompts, params)

    with ChatEndpoint(Flaky(make_generator(model, tokenizer, "hf")), tokenizer, "tiny", max_new_tokens=4) as served:
        ask = {"model": "tiny", "messages": [{"role": "user", "content": "1 1 -> 2?"}]}
        status, text = post(served, ask, session="s")
        assert status == 500 and json.loads(text)["error"]["message"] == (
            "generation failed: RuntimeError: CUDA error: device-side assert triggered")
        assert "s" not in served.sessions  # a failed call is no turn of its session
        assert post(served, ask, session="s")[0] == 200 and len(served.sessions["s"]) == 1


def test_an_endpoint_closes_whether_or_not_it_started(tiny):
    _, model, tokenizer = tiny
    ChatEndpoint(make_generator(model, tokenizer, "hf"), tokenizer).close()  # returns, not hangs
    served = ChatEndpoint(make_generator(model, tokenizer, "hf"), tokenizer, "tiny", max_new_tokens=4).start()
    served.close()
    assert not any(thread.is_alive() for thread in served._threads)


def test_a_conversation_too_long_for_the_model_is_refused(tiny):
    _, model, tokenizer = tiny
    with ChatEndpoint(make_generator(model, tokenizer, "hf"), tokenizer, "tiny", max_length=16) as served:
        status, text = post(served, {"model": "tiny", "messages": [{"role": "user", "content": "x" * 40}]})
    assert status == 400 and "no room left in the model's 16 positions" in json.loads(text)["error"]["message"]
