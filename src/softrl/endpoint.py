"""An OpenAI-compatible chat-completions endpoint on 127.0.0.1, served by the policy's batched generator,
so that unmodified agent code (verifiers, an OpenAI client, any harness) rolls out through softrl and its
conversations become trajectories (docs/USAGE.md, "Multi-turn episodes").

    with ChatEndpoint(generator, tokenizer, "policy") as endpoint:   # endpoint.base_url: http://127.0.0.1:PORT/v1
        ... the agent talks to endpoint.base_url ...
        row = endpoint.trajectory(session, reward=1.0, task="my-agent")

Concurrent requests are batched: a request waits up to `batch_window_s` for others, and every waiting
request of the same temperature, top-p and stop texts is sampled in one generate call. A request's prompt is
tokenised as an episode's turns are in training (`models.loading.turn_pieces`), so a conversation's
tokens are the ones SPO and AGRO train on; each call's sampled tokens and their behaviour log-probs are
recorded under its session (the `X-Session-ID` header verifiers sends, or the request's `user` field).
`trajectory(session, ...)` makes the session's last conversation one row: an episode whose policy turns
carry their sampled tokens and log-probs where re-tokenising reproduces them and each call was asked
with the conversation before it, else a text episode that each run tokenises itself (SPO and AGRO need
no log-probs). A stop text stays at the end of its reply, as the generator returns it.

Only what agents call is served: POST /v1/chat/completions (streamed as server-sent events where the
request asks, else one JSON object) and GET /v1/models; and, for an agent in another process (`softrl
serve`), POST /v1/softrl/reward `{"session": ID, "reward": R[, "prompt_id", "task"]}`, which ends a
session: its conversation becomes a row in the endpoint's store. A bad request (not JSON, a model that is not
served, n other than 1, messages that are not a conversation) is answered 400 or 404 with one line
naming what is wrong; the endpoint goes on serving.
"""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from softrl.data.chat import episode_of, prompt_text_of, transcript
from softrl.data.schema import Trajectory
from softrl.models.generation import SamplingParams
from softrl.models.loading import encode_episode, encode_prompt, tokenizer_fingerprint, turn_pieces
from softrl.tasks.base import prompt_id_of
from softrl.tasks.records import RecordError


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class RequestError(ValueError):
    """A request the endpoint refuses: its HTTP status and one line for the client."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


@dataclass
class Call:
    """One chat-completion call: the conversation it was asked with, the prompt tokens it was sampled
    after, and what it sampled (tokens through EOS, their behaviour log-probs, the text)."""

    messages: list[dict]
    prompt_tokens: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    stop: tuple[str, ...]
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    text: str = ""
    finish: str = ""
    done: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


def split_conversation(messages: Any) -> tuple[list[dict], list[dict]]:
    """(the prompt's messages, the turns after it) of a request's conversation, checked as an imported
    chat trace is (`data.chat.episode_of`), except that it need not hold an assistant message yet."""
    try:
        if not messages or not isinstance(messages, list) or \
                any(isinstance(m, dict) and m.get("role") == "assistant" for m in messages):
            return episode_of(messages, "request")
        prompt, _ = episode_of([*messages, {"role": "assistant", "content": ""}], "request")  # the reply to come
        return prompt, []
    except RecordError as e:
        raise RequestError(400, str(e)) from None


class ChatEndpoint:
    """The server, its batcher and the calls it recorded. A context manager: it serves from `start()`
    (entering) to `close()` (leaving). `port` 0 takes a free one."""

    def __init__(self, generator, tokenizer, model_name: str = "softrl-policy", max_new_tokens: int = 256,
                 max_length: int = 0, port: int = 0, batch_window_s: float = 0.02, max_batch: int = 64,
                 store=None, source: str = "endpoint", on_row=None, seed: int = 0):
        """`store` (an ExperienceStore) takes the rows of sessions ended through /v1/softrl/reward, under
        `source`; `on_row(row)` hears of each. `seed`: the first of the generate calls' seeds (one more
        each call). The generator is the endpoint's while it serves: HF's sets torch's global seed."""
        self.generator, self.tokenizer, self.model_name = generator, tokenizer, model_name
        self.store, self.source, self.on_row = store, source, on_row or (lambda row: None)
        self.max_new_tokens, self.max_length = max_new_tokens, max_length
        self.batch_window_s, self.max_batch = batch_window_s, max_batch
        self.sessions: dict[str, list[Call]] = {}
        self.batches: list[int] = []  # the size of each generate call, in order (batching is observable)
        self._pending: queue.Queue[Call | None] = queue.Queue()
        self._lock = threading.Lock()
        self._seed = seed * 1_000_003
        self._closed = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self._server.daemon_threads = True
        self._threads = [threading.Thread(target=self._server.serve_forever, daemon=True, name="softrl-endpoint"),
                         threading.Thread(target=self._batcher, daemon=True, name="softrl-endpoint-batcher")]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> ChatEndpoint:
        for thread in self._threads:
            thread.start()
        return self

    def close(self) -> None:
        """Stop serving: the server and the batcher end (a generate call under way first finishes), and
        any call still waiting is answered with an error."""
        self._closed.set()
        if self._threads[0].is_alive():  # shutdown() waits for serve_forever, which must have started
            self._server.shutdown()
        self._server.server_close()
        self._pending.put(None)
        if self._threads[1].is_alive():
            self._threads[1].join()
        while not self._pending.empty():
            call = self._pending.get()
            if call is not None:
                call.error = "the endpoint closed"
                call.done.set()

    def __enter__(self) -> ChatEndpoint:
        return self.start()

    def __exit__(self, *_) -> None:
        self.close()

    # --- serving -----------------------------------------------------------------------------------------

    def complete(self, body: dict, session: str) -> Call:
        """Sample one request's reply (batched with whatever else is waiting); raises RequestError."""
        model = body.get("model")
        if model != self.model_name:
            raise RequestError(404, f"model {model!r} is not served here; this endpoint serves {self.model_name!r}")
        if body.get("n", 1) != 1:
            raise RequestError(400, f"n must be 1 (one reply a call), got {body.get('n')!r}")
        prompt, turns = split_conversation(body.get("messages"))
        if turns and turns[-1]["role"] == "assistant":
            raise RequestError(400, "the conversation ends with an assistant message: the policy answers a "
                               "user or tool message")
        prompt_text = prompt_text_of(prompt)
        try:
            tokens = encode_prompt(self.tokenizer, prompt_text) + [
                t for piece in turn_pieces(self.tokenizer, prompt_text, turns, policy_next=True) for t in piece]
        except Exception as e:  # noqa: BLE001 - a chat template's error (one that drops past reasoning, say)
            raise RequestError(400, f"the conversation cannot be tokenised with the model's chat template "
                               f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
        room = self.max_length - len(tokens) if self.max_length else self.max_new_tokens
        if room < 1:
            raise RequestError(400, f"the conversation is {len(tokens)} tokens: no room left in the model's "
                               f"{self.max_length} positions")
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_new_tokens
        temperature = 1.0 if body.get("temperature") is None else body["temperature"]
        top_p = 1.0 if body.get("top_p") is None else body["top_p"]
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not (isinstance(asked, int) and not isinstance(asked, bool) and asked >= 1):
            raise RequestError(400, f"max_tokens must be a positive integer, got {asked!r}")
        if not (_number(temperature) and temperature > 0 and _number(top_p) and 0 < top_p <= 1):
            raise RequestError(400, f"temperature must be > 0 (this endpoint samples) and top_p in (0, 1], got "
                               f"{temperature!r} and {top_p!r}")
        if not (isinstance(stop, list) and all(isinstance(s, str) and s for s in stop)):
            raise RequestError(400, f"stop must be a text or a list of texts, got {stop!r}")
        call = Call(list(body["messages"]), tokens, min(asked, self.max_new_tokens, room), float(temperature),
                    float(top_p), tuple(stop))
        if self._closed.is_set():
            raise RequestError(503, "the endpoint is closing")
        self._pending.put(call)
        call.done.wait()
        if call.error is not None:
            raise RequestError(500, call.error)
        with self._lock:  # a session keeps the calls that sampled, in the order they were asked
            self.sessions.setdefault(session, []).append(call)
        return call

    def _batcher(self) -> None:
        """Every waiting call of the same decoding in one generate call: after the first arrives, wait
        `batch_window_s` for others."""
        while True:
            first = self._pending.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.batch_window_s
            while len(batch) < self.max_batch and (left := deadline - time.monotonic()) > 0:
                try:
                    more = self._pending.get(timeout=left)
                except queue.Empty:
                    break
                if more is None:
                    self._pending.put(None)
                    break
                batch.append(more)
            groups: dict[tuple, list[Call]] = {}
            for call in batch:
                groups.setdefault((call.temperature, call.top_p, call.stop), []).append(call)
            for (temperature, top_p, stop), calls in groups.items():
                self._sample(calls, temperature, top_p, stop)

    def _sample(self, calls: list[Call], temperature: float, top_p: float, stop: tuple[str, ...]) -> None:
        self._seed += 1
        try:
            params = SamplingParams(n=1, max_new_tokens=max(c.max_tokens for c in calls), temperature=temperature,
                                    top_p=top_p, stop=stop, seed=self._seed)
            self.batches.append(len(calls))
            samples = sorted(self.generator.generate([c.prompt_tokens for c in calls], params), key=lambda s: s.prompt_index)
            for call, sample in zip(calls, samples):
                keep = min(len(sample.tokens), call.max_tokens)  # one call for all: each cut to its own length
                call.tokens, call.logprobs = sample.tokens[:keep], sample.logprobs[:keep]
                call.text = sample.text if keep == len(sample.tokens) else self.tokenizer.decode(
                    call.tokens, skip_special_tokens=True)
                call.finish = "length" if sample.finish == "length" or keep < len(sample.tokens) else "stop"
        except Exception as e:  # noqa: BLE001 - the requests fail with the error; the endpoint serves on
            for call in calls:
                call.error = f"generation failed: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        for call in calls:
            call.done.set()

    # --- trajectories ------------------------------------------------------------------------------------

    def reward(self, body: dict) -> Trajectory:
        """End the session `body` names with its reward: its row goes to the store (RequestError: no
        store, an unknown session, a reward that is no number in [0, 1])."""
        from softrl.tasks.base import RewardError, check_reward

        if self.store is None:
            raise RequestError(400, "this endpoint keeps no store: end sessions with ChatEndpoint.trajectory")
        session = body.get("session")
        if session not in self.sessions:
            raise RequestError(404, f"no calls were made in session {session!r}")
        try:
            reward = check_reward(body.get("reward"), f"session {session}")
        except RewardError as e:
            raise RequestError(400, str(e)) from None
        extra = {k: body[k] for k in ("prompt_id", "task") if isinstance(body.get(k), str)}
        row = self.trajectory(session, reward, source=self.source, **extra)
        self.store.append([row])
        self.forget(session)
        self.on_row(row)
        return row

    def trajectory(self, session: str, reward: float, passed: bool | None = None, task: str = "endpoint",
                   prompt_id: str | None = None, source: str = "online", run_id: str | None = None,
                   finish: str = "done") -> Trajectory:
        """The session's conversation (its last call's messages and reply) as one row with its `reward`:
        an episode with the environment's turns masked; its policy turns keep the tokens and log-probs
        they were sampled with where the training tokenisation reproduces each (`_aligned`), else the row is text
        (each run tokenises it, and objectives that need behaviour log-probs refuse it)."""
        calls = self.sessions.get(session)
        if not calls:
            raise KeyError(f"no calls were made in session {session!r}")
        last = calls[-1]
        prompt, turns = split_conversation([*last.messages, {"role": "assistant", "content": last.text}])
        prompt_text = prompt_text_of(prompt)
        prompt_tokens, response, mask = encode_episode(self.tokenizer, prompt_text, turns)
        aligned = _aligned(prompt_tokens, response, mask, _policy_calls(calls, turns))
        own = aligned is not None
        logprobs, mask = aligned if own else (None, mask)
        return Trajectory(prompt_id or prompt_id_of(prompt_text), transcript(turns), float(reward),
                          bool(reward >= 1) if passed is None else passed, task=task, prompt_text=prompt_text,
                          prompt_tokens=prompt_tokens if own else None, response_tokens=response if own else None,
                          tokenizer=tokenizer_fingerprint(self.tokenizer) if own else None, source=source,
                          run_id=run_id, policy_version=0 if own else -1, behavior_logprobs=logprobs,
                          decoding={"temperature": last.temperature, "top_p": last.top_p}, turns=turns,
                          action_mask=mask if own else None, finish=finish)

    def forget(self, session: str) -> None:
        """Drop a session's calls (an episode abandoned, or one whose row was made)."""
        with self._lock:
            self.sessions.pop(session, None)


def _policy_calls(calls: list[Call], turns: list[dict]) -> list[Call] | None:
    """The call that sampled each policy turn of `turns`, in order (calls the conversation left out, an
    agent's retries, skipped); None where a policy turn is no call's reply (the agent rewrote it), or the
    calls sampled at different temperatures or top-p (their log-probs are of different distributions,
    and a row has one `decoding`)."""
    chosen, remaining = [], iter(calls)
    for text in (t["content"] for t in turns if t["role"] == "assistant"):
        match = next((c for c in remaining if c.text == text), None)
        if match is None:
            return None
        chosen.append(match)
    return chosen if len({(c.temperature, c.top_p) for c in chosen}) == 1 else None


def _aligned(prompt_tokens: list[int], response: list[int], mask: list[bool],
             calls: list[Call] | None) -> tuple[list[float], list[bool]] | None:
    """(behaviour log-probs over `response`, the policy's mask) where each policy run of `mask` was
    sampled by its call after exactly the tokens before it (the prompt and the response so far) and
    begins with what the call sampled: the tokens after those in the run (an EOS or end-of-turn marker
    the template adds to a reply cut at its length) are the template's, not the policy's, and are masked
    with log-prob 0, as the environment's are. None where any of that does not hold: the agent changed
    what a call was asked with, or a reply does not tokenise back to its sampled tokens."""
    if calls is None:
        return None
    logprobs, policy, i, turn = [], [], 0, 0
    while i < len(response):
        if not mask[i]:
            logprobs.append(0.0)
            policy.append(False)
            i += 1
            continue
        j = i
        while j < len(response) and mask[j]:
            j += 1
        if turn >= len(calls):
            return None
        call = calls[turn]
        n = len(call.tokens)
        if call.prompt_tokens != prompt_tokens + response[:i] or n > j - i or response[i : i + n] != call.tokens:
            return None
        logprobs += list(call.logprobs) + [0.0] * (j - i - n)
        policy += [True] * n + [False] * (j - i - n)
        turn, i = turn + 1, j
    return (logprobs, policy) if turn == len(calls) else None


def reply_payload(call: Call, body: dict, model_name: str, tokenizer) -> dict | list[dict]:
    """The OpenAI reply to request `body`, which `call` answered: a `chat.completion` object, or, where the
    request asks to stream, its `chat.completion.chunk` events (the whole reply in one delta, then the
    finish, then the usage where `stream_options.include_usage` asks)."""
    usage = {"prompt_tokens": len(call.prompt_tokens), "completion_tokens": len(call.tokens),
             "total_tokens": len(call.prompt_tokens) + len(call.tokens)}
    logprobs = {"content": [{"token": tokenizer.decode([t]), "logprob": lp}
                            for t, lp in zip(call.tokens, call.logprobs)]} if body.get("logprobs") else None
    head = {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "created": int(time.time()), "model": model_name}
    if not body.get("stream"):
        return {**head, "object": "chat.completion", "usage": usage, "choices": [
            {"index": 0, "message": {"role": "assistant", "content": call.text}, "finish_reason": call.finish,
             "logprobs": logprobs}]}
    chunk = {**head, "object": "chat.completion.chunk"}
    events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": call.text},
                                     "logprobs": logprobs, "finish_reason": None}]},
              {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": call.finish}]}]
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**chunk, "choices": [], "usage": usage})
    return events


def _handler(endpoint: ChatEndpoint):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *_) -> None:  # the endpoint is quiet; its calls are recorded
            pass

        def _json(self, status: int, payload: dict) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _events(self, events: list[dict]) -> None:
            """Server-sent events, then `[DONE]`, and the connection closed."""
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _error(self, status: int, message: str) -> None:
            kind = "not_found_error" if status == 404 else "invalid_request_error" if status < 500 else "server_error"
            self._json(status, {"error": {"message": message, "type": kind, "code": status}})

        def _body(self) -> dict:
            """The request's JSON object (RequestError: a Content-Length, body or object that is none)."""
            try:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            except ValueError:
                raise RequestError(400, f"Content-Length must be a number of bytes, got "
                                   f"{self.headers.get('Content-Length')!r}") from None
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(400, f"the request body is not JSON ({e})") from None
            if not isinstance(body, dict):
                raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
            return body

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": endpoint.model_name, "object": "model",
                                                             "owned_by": "softrl"}]})
            else:
                self._error(404, f"no such path {self.path!r}: this endpoint serves /v1/chat/completions and /v1/models")

        def do_POST(self) -> None:
            path = self.path.rstrip("/")
            if path not in ("/v1/chat/completions", "/v1/softrl/reward"):
                self._error(404, f"no such path {self.path!r}: this endpoint serves /v1/chat/completions and "
                            "/v1/softrl/reward")
                return
            try:
                body = self._body()
                if path == "/v1/softrl/reward":
                    row = endpoint.reward(body)
                    self._json(200, {"id": row.id, "turns": len(row.turns or []), "source": row.source})
                    return
                session = self.headers.get("X-Session-ID") or str(body.get("user") or "") or uuid.uuid4().hex
                payload = reply_payload(endpoint.complete(body, session), body, endpoint.model_name, endpoint.tokenizer)
            except RequestError as e:
                self._error(e.status, str(e))
                return
            except Exception as e:  # noqa: BLE001 - whatever else breaks, the client gets one line, the endpoint serves on
                self._error(500, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}")
                return
            if isinstance(payload, list):
                self._events(payload)
            else:
                self._json(200, payload)

    return Handler
