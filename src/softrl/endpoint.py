"""An OpenAI-compatible chat-completions endpoint on 127.0.0.1, served by the policy's batched generator,
so that unmodified agent code (verifiers, an OpenAI client, any harness) rolls out through softrl and its
conversations become trajectories (docs/USAGE.md, "Agents through the endpoint").

    with ChatEndpoint(generator, tokenizer, "policy") as endpoint:   # endpoint.base_url: http://127.0.0.1:PORT/v1
        ... the agent talks to endpoint.base_url ...
        row = endpoint.trajectory(session, reward=1.0, task="my-agent")

Concurrent requests are batched: a request waits up to `batch_window_s` for others, and every waiting
request of the same temperature and top-p is sampled in one generate call. A request's prompt is
tokenised as an episode's turns are in training (`models.loading.turn_pieces`), so a conversation's
tokens are the ones SPO and AGRO train on; each call's sampled tokens and their behaviour log-probs are
recorded under its session (the `X-Session-ID` header verifiers sends, or the request's `user` field).
`trajectory(session, ...)` makes the session's last conversation one row: an episode whose policy turns
carry their sampled tokens and log-probs where re-tokenising reproduces them, else a text episode that
each run tokenises itself (SPO and AGRO need no log-probs).

Only what agents call is served: POST /v1/chat/completions (streamed as server-sent events where the
request asks, else one JSON object) and GET /v1/models. A bad request (not JSON, a model that is not
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
                 max_length: int = 0, port: int = 0, batch_window_s: float = 0.02, max_batch: int = 64):
        self.generator, self.tokenizer, self.model_name = generator, tokenizer, model_name
        self.max_new_tokens, self.max_length = max_new_tokens, max_length
        self.batch_window_s, self.max_batch = batch_window_s, max_batch
        self.sessions: dict[str, list[Call]] = {}
        self.batches: list[int] = []  # the size of each generate call, in order (batching is observable)
        self._pending: queue.Queue[Call | None] = queue.Queue()
        self._lock = threading.Lock()
        self._seed = 0
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
        self._server.shutdown()
        self._server.server_close()
        self._pending.put(None)

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
        tokens = encode_prompt(self.tokenizer, prompt_text) + [
            t for piece in turn_pieces(self.tokenizer, prompt_text, turns, policy_next=True) for t in piece]
        room = self.max_length - len(tokens) if self.max_length else self.max_new_tokens
        if room < 1:
            raise RequestError(400, f"the conversation is {len(tokens)} tokens: no room left in the model's "
                               f"{self.max_length} positions")
        asked = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_new_tokens
        temperature = body.get("temperature")
        temperature = 1.0 if temperature is None else temperature
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else stop
        if not (isinstance(asked, int) and asked >= 1 and isinstance(temperature, (int, float)) and temperature > 0
                and all(isinstance(s, str) for s in stop)):
            raise RequestError(400, f"max_tokens must be a positive integer, temperature > 0 (this endpoint samples) "
                               f"and stop texts, got {asked!r}, {temperature!r}, {stop!r}")
        call = Call(list(body["messages"]), tokens, min(asked, self.max_new_tokens, room), float(temperature),
                    float(body.get("top_p") or 1.0), tuple(stop))
        with self._lock:
            self.sessions.setdefault(session, []).append(call)
        self._pending.put(call)
        call.done.wait()
        if call.error is not None:
            raise RequestError(500, call.error)
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
        aligned = _aligned(response, mask, self._sampled_tokens(calls, turns))
        own = aligned is not None
        logprobs, mask = aligned if own else (None, mask)
        return Trajectory(prompt_id or prompt_id_of(prompt_text), transcript(turns), float(reward),
                          bool(reward >= 1) if passed is None else passed, task=task, prompt_text=prompt_text,
                          prompt_tokens=prompt_tokens if own else None, response_tokens=response if own else None,
                          tokenizer=tokenizer_fingerprint(self.tokenizer) if own else None, source=source,
                          run_id=run_id, policy_version=0 if own else -1, behavior_logprobs=logprobs,
                          decoding={"temperature": last.temperature, "top_p": last.top_p}, turns=turns,
                          action_mask=mask if own else None, finish=finish)

    @staticmethod
    def _sampled_tokens(calls: list[Call], turns: list[dict]) -> list[tuple[list[int], list[float]]] | None:
        """(tokens, log-probs) of each policy turn of `turns` as a call sampled it; None where the
        conversation's policy turns are not the calls' replies in order (the agent rewrote its history)."""
        chosen, remaining = [], iter(calls)
        for text in (t["content"] for t in turns if t["role"] == "assistant"):
            match = next((c for c in remaining if c.text == text), None)  # the calls in order, some skipped
            if match is None:
                return None
            chosen.append((match.tokens, match.logprobs))
        return chosen


def _aligned(response: list[int], mask: list[bool], sampled) -> tuple[list[float], list[bool]] | None:
    """(behaviour log-probs over `response`, the policy's mask) where each policy run of `mask` begins
    with what its call sampled: the tokens after them in the run (an EOS or end-of-turn marker the
    template adds to a reply cut at its length) are the template's, not the policy's, and are masked
    with log-prob 0, as the environment's are. None where a run does not begin so."""
    if sampled is None:
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
        if turn >= len(sampled):
            return None
        tokens, lps = sampled[turn]
        if response[i : i + len(tokens)] != tokens or len(tokens) > j - i:
            return None
        extra = j - i - len(tokens)
        logprobs += list(lps) + [0.0] * extra
        policy += [True] * len(tokens) + [False] * extra
        turn, i = turn + 1, j
    return (logprobs, policy) if turn == len(sampled) else None


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

        def _error(self, status: int, message: str) -> None:
            kind = "not_found_error" if status == 404 else "invalid_request_error" if status < 500 else "server_error"
            self._json(status, {"error": {"message": message, "type": kind, "code": status}})

        def do_GET(self) -> None:
            if self.path.rstrip("/") == "/v1/models":
                self._json(200, {"object": "list", "data": [{"id": endpoint.model_name, "object": "model",
                                                             "owned_by": "softrl"}]})
            else:
                self._error(404, f"no such path {self.path!r}: this endpoint serves /v1/chat/completions and /v1/models")

        def do_POST(self) -> None:
            if self.path.rstrip("/") != "/v1/chat/completions":
                self._error(404, f"no such path {self.path!r}: this endpoint serves /v1/chat/completions")
                return
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                self._error(400, f"the request body is not JSON ({e})")
                return
            if not isinstance(body, dict):
                self._error(400, f"the request body must be a JSON object, got {type(body).__name__}")
                return
            session = self.headers.get("X-Session-ID") or str(body.get("user") or "") or uuid.uuid4().hex
            try:
                call = endpoint.complete(body, session)
            except RequestError as e:
                self._error(e.status, str(e))
                return
            self._reply(body, call)

        def _reply(self, body: dict, call: Call) -> None:
            ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
            usage = {"prompt_tokens": len(call.prompt_tokens), "completion_tokens": len(call.tokens),
                     "total_tokens": len(call.prompt_tokens) + len(call.tokens)}
            logprobs = {"content": [{"token": endpoint.tokenizer.decode([t]), "logprob": lp}
                                    for t, lp in zip(call.tokens, call.logprobs)]} if body.get("logprobs") else None
            head = {"id": ident, "created": created, "model": endpoint.model_name}
            if not body.get("stream"):
                self._json(200, {**head, "object": "chat.completion", "usage": usage, "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": call.text},
                     "finish_reason": call.finish, "logprobs": logprobs}]})
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Connection", "close")
            self.end_headers()
            chunk = {**head, "object": "chat.completion.chunk"}
            events = [{**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": call.text},
                                             "logprobs": logprobs, "finish_reason": None}]},
                      {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": call.finish}]}]
            if (body.get("stream_options") or {}).get("include_usage"):
                events.append({**chunk, "choices": [], "usage": usage})
            for event in events:
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler
