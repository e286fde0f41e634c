#!/usr/bin/env python3
"""Blink's files endpoints (fine-tuning data) against the official `openai` Python client.

Usage: test_files.py --base-url http://127.0.0.1:PORT/v1 --api-key KEY --data FILE --phase upload|restarted

The server must run with `--state-dir`, `--api-key KEY` and `--max-upload-bytes 8192`;
FILE is a valid chat fine-tuning JSONL under that size. Phase `upload` checks create,
retrieve, list, content and delete, and that a malformed upload, another purpose, an
over-large upload, an unknown id and a missing key each get their 4xx while the server
keeps serving; it leaves one file named `kept.jsonl`. Phase `restarted` (a new server on
the same state directory) checks that file is still there, whole. A missing `openai`
package is a failure, not a skip.
"""

import argparse
import io
import sys


from checks import require_openai, run_checks  # beside this script

openai = require_openai()
OpenAI = openai.OpenAI

UPLOAD, RESTARTED = [], []


def check(phase):
    def add(fn):
        phase.append(fn)
        return fn
    return add


class Ctx:
    def __init__(self, args):
        self.client = OpenAI(base_url=args.base_url, api_key=args.api_key, max_retries=0, timeout=120)
        self.anonymous = OpenAI(base_url=args.base_url, api_key="wrong-key", max_retries=0, timeout=120)
        with open(args.data, "rb") as f:
            self.data = f.read()

    def upload(self, name, content, purpose="fine-tune"):
        return self.client.files.create(file=(name, io.BytesIO(content)), purpose=purpose)

    def status_of(self, fn):
        """The HTTP status and message `fn` failed with (it must fail)."""
        try:
            fn()
        except openai.APIStatusError as e:
            return e.status_code, str(e)
        raise AssertionError("the call succeeded")

    def still_serving(self):
        model = self.client.models.list().data[0].id
        r = self.client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Say hi."}], max_tokens=4, temperature=0)
        assert r.choices[0].message.content, r


@check(UPLOAD)
def a_file_goes_up_and_comes_back_whole(c):
    f = c.upload("train.jsonl", c.data)
    assert f.id.startswith("file-") and f.object == "file", f
    assert (f.bytes, f.filename, f.purpose, f.status) == (len(c.data), "train.jsonl", "fine-tune", "processed"), f
    assert c.client.files.retrieve(f.id) == f
    assert f.id in [x.id for x in c.client.files.list()]
    assert c.client.files.content(f.id).read() == c.data
    deleted = c.client.files.delete(f.id)
    assert (deleted.id, deleted.deleted) == (f.id, True), deleted
    assert f.id not in [x.id for x in c.client.files.list()]
    status, _ = c.status_of(lambda: c.client.files.retrieve(f.id))
    assert status == 404, status


@check(UPLOAD)
def a_malformed_upload_names_its_bad_lines(c):
    bad = c.data + b'{"messages": [{"role": "user", "content": "no answer"}]}\n{"messages": [\n'
    lines = c.data.count(b"\n")
    status, message = c.status_of(lambda: c.upload("bad.jsonl", bad))
    assert status == 400, (status, message)
    assert f"line {lines + 1}" in message and f"line {lines + 2}" in message, message
    names = [x.filename for x in c.client.files.list()]
    assert "bad.jsonl" not in names, names
    c.still_serving()


@check(UPLOAD)
def other_purposes_big_uploads_unknown_ids_and_missing_keys_are_4xx(c):
    assert c.status_of(lambda: c.upload("t.jsonl", c.data, purpose="assistants"))[0] == 400
    big = c.data * (8192 // len(c.data) + 1)
    status, message = c.status_of(lambda: c.upload("big.jsonl", big))
    assert status == 413 and "8192" in message, (status, message)
    for call in (lambda: c.client.files.retrieve("file-nope"), lambda: c.client.files.delete("file-nope"),
                 lambda: c.client.files.content("file-nope")):
        assert c.status_of(call)[0] == 404
    assert c.status_of(lambda: c.anonymous.files.list())[0] == 401
    assert c.status_of(lambda: c.anonymous.files.create(file=("t.jsonl", io.BytesIO(c.data)), purpose="fine-tune"))[0] == 401
    c.still_serving()


@check(UPLOAD)
def one_file_is_kept_for_the_restart(c):
    kept = c.upload("kept.jsonl", c.data)
    assert c.client.files.retrieve(kept.id).filename == "kept.jsonl"


@check(RESTARTED)
def the_kept_file_survives_a_restart(c):
    files = [x for x in c.client.files.list() if x.filename == "kept.jsonl"]
    assert len(files) == 1, files
    assert c.client.files.content(files[0].id).read() == c.data
    assert [x.filename for x in c.client.files.list()] == ["kept.jsonl"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--api-key", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--phase", choices=["upload", "restarted"], required=True)
    args = ap.parse_args()
    run_checks(UPLOAD if args.phase == "upload" else RESTARTED, Ctx(args), f"test_files.py {args.phase}")


if __name__ == "__main__":
    main()
