#!/usr/bin/env python3
"""Blink's server against the official `openai` Python client.

Usage: test_openai.py --base-url http://127.0.0.1:PORT/v1 [--api-key KEY]

Runs each check against a running `blink serve` on the default model (SmolLM2-135M-Instruct
Q4_1) and exits non-zero if any fails. A missing `openai` package is a failure, not a skip.
"""

import argparse
import json
import os
import sys


ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GOLDEN = os.path.join(ROOT, "testdata", "golden", "smollm2-135m-instruct-q4_1.json")

from checks import require_openai, run_checks  # beside this script

openai = require_openai()
OpenAI = openai.OpenAI

CHECKS = []


def check(fn):
    CHECKS.append(fn)
    return fn


def chat(client, content, **kw):
    return client.chat.completions.create(model=kw.pop("model", ""), messages=[{"role": "user", "content": content}], **kw)


@check
def models_list(client):
    models = client.models.list()
    ids = [m.id for m in models.data]
    assert len(ids) == 1, ids
    # The served id is accepted as the model name.
    r = chat(client, "Hi", model=ids[0], max_tokens=4, temperature=0)
    assert r.model == ids[0], r.model


@check
def chat_completion(client):
    r = chat(client, "What is the capital of France?", max_tokens=24, temperature=0)
    assert r.id.startswith("chatcmpl-"), r.id
    assert r.object == "chat.completion"
    assert len(r.choices) == 1
    c = r.choices[0]
    assert c.message.role == "assistant"
    assert c.message.content, "empty reply"
    assert c.finish_reason in ("stop", "length"), c.finish_reason
    u = r.usage
    assert u.prompt_tokens > 0 and 0 < u.completion_tokens <= 24, u
    assert u.total_tokens == u.prompt_tokens + u.completion_tokens, u
    if c.finish_reason == "length":
        assert u.completion_tokens == 24, u


@check
def streaming_chat_matches_whole(client):
    kw = dict(max_tokens=32, temperature=0)
    whole = chat(client, "Name three colours.", **kw)
    stream = chat(client, "Name three colours.", stream=True, stream_options={"include_usage": True}, **kw)
    chunks = list(stream)
    assert chunks, "no chunks"
    ids = {c.id for c in chunks}
    assert len(ids) == 1 and chunks[0].id.startswith("chatcmpl-"), ids
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant", chunks[0]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason], finishes
    assert text == whole.choices[0].message.content, (text, whole.choices[0].message.content)
    # Usage comes in a last chunk with no choices, and matches the whole response's.
    assert chunks[-1].choices == [] and chunks[-1].usage is not None, chunks[-1]
    assert all(c.usage is None for c in chunks[:-1])
    su, wu = chunks[-1].usage, whole.usage
    assert (su.prompt_tokens, su.completion_tokens, su.total_tokens) == \
        (wu.prompt_tokens, wu.completion_tokens, wu.total_tokens), (su, wu)
    content_chunks = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    assert content_chunks <= su.completion_tokens, (content_chunks, su)


@check
def a_final_assistant_message_is_continued(client):
    # As llama.cpp's server: the reply goes on from the assistant's text, it does not answer it.
    question = {"role": "user", "content": "What is the capital of France?"}
    whole = client.chat.completions.create(model="", messages=[question], max_tokens=16, temperature=0)
    text = whole.choices[0].message.content
    head = text[:text.index(" ", len(text) // 3)]
    rest = client.chat.completions.create(model="", messages=[question, {"role": "assistant", "content": head}],
                                          max_tokens=16, temperature=0).choices[0].message.content
    assert text.startswith(head + rest[:len(text) - len(head)]), (text, head, rest)
    assert not rest.startswith(head), (head, rest)


@check
def completion_with_stop(client):
    prompt = "The capital of France is"
    free = client.completions.create(model="", prompt=prompt, max_tokens=32, temperature=0)
    assert free.id.startswith("cmpl-") and free.object == "text_completion"
    text = free.choices[0].text
    assert len(text) > 12, text
    # A stop string from the middle of the free-running text cuts it there.
    stop = text[8:12]
    cut = text[:text.index(stop)]
    r = client.completions.create(model="", prompt=prompt, max_tokens=32, temperature=0, stop=[stop, "\u2603never"])
    assert r.choices[0].text == cut, (r.choices[0].text, cut, stop)
    assert r.choices[0].finish_reason == "stop"
    assert 0 < r.usage.completion_tokens <= free.usage.completion_tokens, (r.usage, free.usage)
    # The prompt came from the prefix cache the first request left, and a stop string
    # (which ends the request early) still reports it.
    assert r.usage.prompt_tokens_details.cached_tokens > 0, r.usage
    # The same streamed.
    chunks = list(client.completions.create(model="", prompt=prompt, max_tokens=32, temperature=0, stop=stop, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == cut
    assert chunks[-1].choices[0].finish_reason == "stop"


@check
def chat_logprobs(client):
    r = chat(client, "Count from one to five.", max_tokens=16, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens, (len(content), r.usage)
    joined = b"".join(bytes(t.bytes) for t in content).decode("utf-8", "replace")
    assert joined == r.choices[0].message.content, (joined, r.choices[0].message.content)
    for t in content:
        assert t.logprob <= 0.0, t
        assert len(t.top_logprobs) == 3, t
        lps = [a.logprob for a in t.top_logprobs]
        assert lps == sorted(lps, reverse=True), lps
        # Greedy: the chosen token is the most likely one.
        assert t.top_logprobs[0].token == t.token and abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5, t


@check
def completion_logprobs(client):
    r = client.completions.create(model="", prompt="One, two, three,", max_tokens=8, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    n = r.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n, lp
    assert "".join(lp.tokens) == r.choices[0].text, (lp.tokens, r.choices[0].text)
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset), lp.text_offset
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l <= 0.0 and 1 <= len(top) <= 2, (tok, l, top)
        assert max(top.values()) >= l - 1e-5
    # Emoji take several byte tokens each: those are named `bytes:\xNN`, so every
    # alternative stays a distinct key, and none is the replacement character.
    r = client.completions.create(model="", prompt="Emoji list: 😀😃😄😁😆😅🤣😂🙂🙃", max_tokens=12, temperature=0, logprobs=5)
    lp = r.choices[0].logprobs
    assert all(len(top) == 5 for top in lp.top_logprobs), lp.top_logprobs
    assert any(t.startswith("bytes:\\x") for t in lp.tokens), lp.tokens
    assert not any("\ufffd" in t for top in lp.top_logprobs for t in top), lp.top_logprobs
    # Alternatives come most likely first, as vLLM lists them.
    assert all(list(top.values()) == sorted(top.values(), reverse=True) for top in lp.top_logprobs), lp.top_logprobs


@check
def seed_reproducibility(client):
    # top_k and min_p are llama.cpp extensions: the client sends them through extra_body.
    kw = dict(max_tokens=40, temperature=1.0, top_p=1.0, extra_body={"top_k": 0, "min_p": 0.0})
    q = "Write one sentence about a cat."
    a = chat(client, q, seed=1234, **kw).choices[0].message.content
    b = chat(client, q, seed=1234, **kw).choices[0].message.content
    assert a == b, (a, b)
    others = [chat(client, q, seed=s, **kw).choices[0].message.content for s in (1, 2, 3)]
    assert any(o != a for o in others), (a, others)
    # -1 is llama.cpp's "random seed": a fresh draw each time.
    fresh = [chat(client, q, seed=-1, **kw).choices[0].message.content for _ in range(3)]
    assert len(set(fresh)) > 1, fresh


@check
def golden_chat_cases(client):
    with open(GOLDEN) as f:
        golden = json.load(f)
    for case in golden["chat"]:
        r = client.chat.completions.create(model="", messages=case["messages"], max_tokens=case["max_tokens"],
                                           temperature=case["temperature"])
        assert r.usage.prompt_tokens == case["prompt_tokens"], (case["messages"], r.usage, case["prompt_tokens"])
        text = r.choices[0].message.content
        assert text.startswith(case["exact_text_owed"]), (case["messages"], text, case["exact_text_owed"])
        # Streamed: same text, usage consistent with the whole response.
        chunks = list(client.chat.completions.create(model="", messages=case["messages"], max_tokens=case["max_tokens"],
                                                     temperature=case["temperature"], stream=True,
                                                     stream_options={"include_usage": True}))
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == text, (streamed, text)
        assert chunks[-1].usage.prompt_tokens == case["prompt_tokens"]
        assert chunks[-1].usage.completion_tokens == r.usage.completion_tokens


@check
def errors_are_openai_errors(client):
    try:
        chat(client, "Hi", n=2, max_tokens=4)
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as e:
        assert e.status_code == 400 and "n" == e.body.get("param"), e.body
    try:
        chat(client, "Hi", model="no-such-model", max_tokens=4)
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.status_code == 404, e
    try:
        chat(client, "Hi " * 2000, max_tokens=4)
        raise AssertionError("an over-long prompt was accepted")
    except openai.BadRequestError as e:
        assert e.code == "context_length_exceeded", e.body


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", default="none")
    args = ap.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=300)
    run_checks(CHECKS, client, f"openai client (openai {openai.__version__})")


if __name__ == "__main__":
    main()
