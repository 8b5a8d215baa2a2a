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
     "temperature > 0"),
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
