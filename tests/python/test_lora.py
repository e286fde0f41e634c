#!/usr/bin/env python3
"""Blink's LoRA serving against the official `openai` Python client.

Usage: test_lora.py --base-url http://127.0.0.1:PORT/v1 --lora-dir DIR

The server must run the default model with `--lora r8=<golden adapter-r8>` and
`--lora-dir DIR`, where DIR holds the golden adapters as `adapter-r8/`, `adapter-r4-qv/` and
`adapter-r8.f32.gguf`. The script writes its broken adapters into DIR. It checks:
completions and chat through an adapter, streamed and not; that the adapter changes the
answer and the GGUF and PEFT forms of one adapter give the same one; run-time load, in-place
reload and unload, also while requests on that adapter run; `/v1/models`; llama.cpp's
`/lora-adapters` and the per-request `lora` field; concurrent requests over several adapters;
and that every bad input gets its 4xx while the server keeps serving. A missing `openai`
package is a failure, not a skip.
"""

import argparse
import json
import os
import struct
import sys
import threading
import urllib.error
import urllib.request


from checks import require_openai, run_checks  # beside this script

openai = require_openai()
OpenAI = openai.OpenAI

CHECKS = []
PROMPT = "Once upon a time, there was a little"
STORY = "Tell me a long story about a dragon."


def check(fn):
    CHECKS.append(fn)
    return fn


class Ctx:
    def __init__(self, base_url, lora_dir):
        self.v1 = base_url.rstrip("/")
        self.root = self.v1[:-3] if self.v1.endswith("/v1") else self.v1
        self.dir = lora_dir
        self.client = OpenAI(base_url=self.v1, api_key="none", max_retries=0, timeout=300)
        self.base = self.client.models.list().data[0].id

    def http(self, method, path, body=None, raw=None):
        """(status, parsed JSON) of a request to the server's root."""
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        req = urllib.request.Request(self.root + path, data=data, method=method, headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                return r.status, json.loads(r.read() or b"null")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def load(self, name, path, inplace=False):
        status, body = self.http("POST", "/v1/load_lora_adapter", {"lora_name": name, "lora_path": path, "load_inplace": inplace})
        assert status == 200, (status, body)
        return body["adapter"]

    def unload(self, name):
        status, body = self.http("POST", "/v1/unload_lora_adapter", {"lora_name": name})
        assert status == 200, (status, body)

    def complete(self, model, prompt=PROMPT, n=16, **extra):
        r = self.client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0, extra_body=extra or None)
        return r.choices[0].text

    def chat(self, model, content, n=16):
        r = self.client.chat.completions.create(model=model, messages=[{"role": "user", "content": content}], max_tokens=n, temperature=0)
        assert r.model == model, r.model
        return r.choices[0].message.content

    def chat_stream(self, model, content, n, on_first=None, **extra):
        text, first = "", True
        stream = self.client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": content}], max_tokens=n, temperature=0, stream=True, extra_body=extra or None
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                text += chunk.choices[0].delta.content
                if first and on_first:
                    on_first()
                first = False
        return text

    def ids(self):
        status, items = self.http("GET", "/lora-adapters")
        assert status == 200, items
        return {a["name"]: a["id"] for a in items}


@check
def models_lists_the_adapters_with_their_parent(c):
    models = {m.id: m for m in c.client.models.list().data}
    assert c.base in models and "r8" in models, list(models)
    assert models["r8"].model_extra["parent"] == c.base, models["r8"]
    assert c.client.models.retrieve("r8").id == "r8"


@check
def an_adapter_changes_the_answer_streamed_or_not(c):
    base, r8 = c.complete(c.base), c.complete("r8")
    assert base != r8, (base, r8)
    streamed = "".join(ch.choices[0].text for ch in c.client.completions.create(model="r8", prompt=PROMPT, max_tokens=16, temperature=0, stream=True))
    assert streamed == r8, (streamed, r8)
    whole = c.chat("r8", STORY, n=24)
    assert c.chat_stream("r8", STORY, 24) == whole
    assert c.chat(c.base, STORY, n=24) != whole


@check
def gguf_and_peft_forms_of_one_adapter_answer_alike(c):
    c.load("r8-gguf", "adapter-r8.f32.gguf")
    try:
        assert c.complete("r8-gguf") == c.complete("r8")
        assert c.chat("r8-gguf", STORY, n=24) == c.chat("r8", STORY, n=24)
    finally:
        c.unload("r8-gguf")


@check
def the_lora_field_and_default_scales_as_llama_cpp(c):
    ids = c.ids()
    r8 = c.complete("r8")
    assert c.complete(c.base, lora=[{"id": ids["r8"], "scale": 1.0}]) == r8
    assert c.complete(c.base, lora=[{"id": ids["r8"], "scale": 0.0}]) == c.complete(c.base)
    status, body = c.http("POST", "/lora-adapters", [{"id": ids["r8"], "scale": 1.0}])
    assert status == 200, body
    try:
        # Requests that pick no adapter now run with r8.
        assert c.complete(c.base) == r8
        status, items = c.http("GET", "/lora-adapters")
        assert [a["scale"] for a in items if a["name"] == "r8"] == [1.0], items
    finally:
        status, body = c.http("POST", "/lora-adapters", [])
        assert status == 200, body
    assert c.complete(c.base) != r8


@check
def load_reload_in_place_and_unload(c):
    r8, r4 = c.complete("r8"), None
    c.load("swap", "adapter-r4-qv")
    try:
        r4 = c.complete("swap")
        assert r4 != r8
        c.load("swap", "adapter-r8", inplace=True)
        assert c.complete("swap") == r8
    finally:
        c.unload("swap")
    try:
        c.complete("swap")
        raise AssertionError("an unloaded adapter still answered")
    except openai.NotFoundError as e:
        assert e.code == "model_not_found", e.body


@check
def a_request_in_flight_keeps_its_weights_through_reload_and_unload(c):
    # Long enough (the end of generation ignored) that the change lands mid-request.
    n = 160
    want = c.chat_stream("r8", STORY, n, ignore_eos=True)
    for change in ("reload", "unload"):
        c.load("busy", "adapter-r8")
        seen = {}

        def act():
            if change == "reload":
                c.load("busy", "adapter-r4-qv", inplace=True)
            else:
                c.unload("busy")
            seen["running"] = running_sequences(c)

        got = c.chat_stream("busy", STORY, n, on_first=act, ignore_eos=True)
        assert seen["running"] >= 1, f"the request ended before the {change}: the check proves nothing"
        assert got == want, (change, got, want)
        if change == "reload":
            assert c.chat_stream("busy", STORY, n, ignore_eos=True) != want
            c.unload("busy")
        try:
            c.complete("busy")
            raise AssertionError("an unloaded adapter still answered")
        except openai.NotFoundError:
            pass


@check
def concurrent_requests_over_adapters_match_their_runs_alone(c):
    c.load("r4", "adapter-r4-qv")
    try:
        prompts = ["The three primary colors are", PROMPT, "def fibonacci(n):", "In 1492,"]
        work = [(m, p) for p in prompts for m in (c.base, "r8", "r4")][:8]
        alone = [c.complete(m, p) for m, p in work]
        got = [None] * len(work)
        errors = []

        def run(i, m, p):
            try:
                got[i] = c.complete(m, p)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(i, m, p)) for i, (m, p) in enumerate(work)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        assert got == alone, [(w, a, g) for w, a, g in zip(work, alone, got) if a != g]
    finally:
        c.unload("r4")


def running_sequences(c):
    with urllib.request.urlopen(c.root + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("blink_running_sequences "):
                return float(line.split()[1])
    raise AssertionError("no blink_running_sequences in /metrics")


def safetensors(tensors):
    """A safetensors file of f32 tensors {name: (shape, values)}."""
    header, blob = {}, b""
    for name, (shape, values) in tensors.items():
        data = struct.pack(f"<{len(values)}f", *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + blob


def peft(name, config, tensors=None, raw_model=None):
    d = os.path.join(c_dir(), name)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        f.write(config if isinstance(config, str) else json.dumps(config))
    with open(os.path.join(d, "adapter_model.safetensors"), "wb") as f:
        f.write(raw_model if raw_model is not None else safetensors(tensors))
    return name


def c_dir():
    return CTX.dir


def lora_pair(layer, rank, rows, cols, module="q_proj"):
    pre = f"base_model.model.model.layers.{layer}.self_attn.{module}"
    return {f"{pre}.lora_A.weight": ([rank, cols], [0.01] * (rank * cols)), f"{pre}.lora_B.weight": ([rows, rank], [0.01] * (rows * rank))}


CONFIG = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj"], "peft_type": "LORA"}


@check
def bad_input_gets_a_4xx_and_the_server_keeps_serving(c):
    before = c.complete("r8")
    cases = [
        ("a missing file", {"lora_name": "x", "lora_path": "no-such-adapter"}, 400),
        ("malformed adapter_config.json", {"lora_name": "x", "lora_path": peft("bad-json", "{not json", lora_pair(0, 4, 576, 576))}, 400),
        ("malformed safetensors", {"lora_name": "x", "lora_path": peft("bad-st", CONFIG, raw_model=b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\": garbage}")}, 400),
        ("a rank other than the config's", {"lora_name": "x", "lora_path": peft("bad-rank", dict(CONFIG, r=8), lora_pair(0, 4, 576, 576))}, 400),
        ("a shape of another base model", {"lora_name": "x", "lora_path": peft("other-base", CONFIG, lora_pair(0, 4, 2048, 2048))}, 400),
        ("a layer the model lacks", {"lora_name": "x", "lora_path": peft("deep", CONFIG, lora_pair(40, 4, 576, 576))}, 400),
        ("a path outside --lora-dir", {"lora_name": "x", "lora_path": "/etc"}, 403),
        ("a path climbing out of --lora-dir", {"lora_name": "x", "lora_path": "../" * 8 + "etc/passwd"}, 403),
        ("a name already taken", {"lora_name": "r8", "lora_path": "adapter-r4-qv"}, 400),
        ("the base model's name", {"lora_name": c.base, "lora_path": "adapter-r4-qv"}, 400),
        ("an empty name", {"lora_name": "", "lora_path": "adapter-r4-qv"}, 400),
        ("no path", {"lora_name": "x"}, 400),
    ]
    for what, body, status in cases:
        got, answer = c.http("POST", "/v1/load_lora_adapter", body)
        assert got == status, (what, got, answer)
        assert answer["error"]["message"], (what, answer)
    got, answer = c.http("POST", "/v1/load_lora_adapter", raw=b"{\"lora_name\": ")
    assert got == 400, ("malformed JSON", got, answer)
    got, answer = c.http("POST", "/v1/unload_lora_adapter", {"lora_name": "never-loaded"})
    assert (got, answer["error"]["code"]) == (404, "model_not_found"), answer
    ids = c.ids()
    for what, lora in [
        ("an unknown id", [{"id": 9999, "scale": 1}]),
        ("a scale that is not a number", [{"id": ids["r8"], "scale": "inf"}]),
        ("not a list", {"id": ids["r8"]}),
    ]:
        try:
            c.complete(c.base, lora=lora)
            raise AssertionError(f"{what} in `lora` was accepted")
        except openai.BadRequestError as e:
            assert e.body.get("param") == "lora", (what, e.body)
    got, answer = c.http("POST", "/v1/completions", raw=b'{"prompt": "Hi", "max_tokens": 2, "lora": [{"id": 0, "scale": 1e999}]}')
    assert got == 400, ("a scale beyond f64", got, answer)
    got, answer = c.http("POST", "/lora-adapters", [{"id": ids["r8"], "scale": "big"}])
    assert got == 400, ("POST /lora-adapters with a bad scale", got, answer)
    try:
        c.complete("r8", lora=[{"id": ids["r8"], "scale": 1}])
        raise AssertionError("an adapter named by model and by lora was accepted")
    except openai.BadRequestError:
        pass
    try:
        c.complete("no-such-adapter")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert e.code == "model_not_found", e.body
    # Still serving, and with the same answers.
    assert c.complete("r8") == before
    assert set(c.ids()) == {"r8"}, c.ids()


CTX = None


def main():
    global CTX
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--lora-dir", required=True)
    args = ap.parse_args()
    CTX = Ctx(args.base_url, args.lora_dir)
    run_checks(CHECKS, CTX, f"lora (openai {openai.__version__})")


if __name__ == "__main__":
    main()
