#!/usr/bin/env python3
"""Fetch llama.cpp's tokenizer test vocabularies (test fixtures for Blink's tokenizer).

llama.cpp ships small GGUF vocabularies with expected tokenizations
(models/ggml-vocab-*.gguf, *.gguf.inp, *.gguf.out). They are not part of Blink's repository; this
script takes them from the PyPI source distribution of llama-cpp-python, which vendors llama.cpp:

  1. find the sdist URL in PyPI's simple index (https://pypi.org/simple/llama-cpp-python/),
  2. download it and verify its sha256,
  3. extract only vendor/llama.cpp/models/ggml-vocab-* into the cache directory.

Cache directory: $BLINK_VOCAB_DIR, else $XDG_CACHE_HOME/blink/vocab-fixtures, else
~/.cache/blink/vocab-fixtures. Idempotent: does nothing when the fixtures are already there.
Standard library only. Progress goes to stderr; exit status 0 on success, 1 on failure.
"""

import hashlib
import html.parser
import os
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request

SDIST = "llama_cpp_python-0.3.36.tar.gz"
SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
INDEX = "https://pypi.org/simple/llama-cpp-python/"
MEMBER_DIR = "vendor/llama.cpp/models/"
PREFIX = "ggml-vocab-"
# Written last: its presence (with the right hash) means the extraction completed.
MARKER = ".complete"


def log(msg):
    print(f"fetch-vocab-fixtures: {msg}", file=sys.stderr, flush=True)


def cache_dir():
    explicit = os.environ.get("BLINK_VOCAB_DIR")
    if explicit:
        return explicit
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "blink", "vocab-fixtures")


class LinkParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def find_url():
    log(f"looking up {SDIST} in {INDEX}")
    req = urllib.request.Request(INDEX, headers={"Accept": "text/html"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        page = resp.read().decode("utf-8", "replace")
    parser = LinkParser()
    parser.feed(page)
    for href in parser.links:
        url = urllib.parse.urljoin(INDEX, href)
        if urllib.parse.urlparse(url).path.rsplit("/", 1)[-1] == SDIST:
            return url.split("#", 1)[0]
    raise RuntimeError(f"{SDIST} not listed in {INDEX}")


def download(url, dest):
    log(f"downloading {url}")
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=120) as resp, open(dest, "wb") as out:
        total = int(resp.headers.get("Content-Length") or 0)
        done = 0
        next_report = 0
        while True:
            chunk = resp.read(1 << 20)
            if not chunk:
                break
            out.write(chunk)
            digest.update(chunk)
            done += len(chunk)
            if done >= next_report:
                pct = f" ({100 * done // total}%)" if total else ""
                log(f"  {done >> 20} MiB{pct}")
                next_report = done + (16 << 20)
    got = digest.hexdigest()
    if got != SHA256:
        raise RuntimeError(f"sha256 mismatch for {SDIST}: got {got}, expected {SHA256}")
    log("sha256 verified")


def extract(archive, dest):
    count = 0
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar:
            _, sep, rest = member.name.partition("/")
            if not sep or not rest.startswith(MEMBER_DIR):
                continue
            name = rest[len(MEMBER_DIR):]
            # Only plain files directly in models/ (no subdirectories, links or odd names).
            if not member.isfile() or "/" in name or not name.startswith(PREFIX):
                continue
            src = tar.extractfile(member)
            if src is None:
                continue
            tmp = os.path.join(dest, name + ".part")
            with src, open(tmp, "wb") as out:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
            os.replace(tmp, os.path.join(dest, name))
            count += 1
    if count == 0:
        raise RuntimeError(f"no {MEMBER_DIR}{PREFIX}* files in {SDIST}")
    return count


def main():
    dest = cache_dir()
    marker = os.path.join(dest, MARKER)
    try:
        with open(marker, encoding="utf-8") as f:
            if f.read().strip() == SHA256:
                log(f"fixtures already present in {dest}")
                return 0
    except OSError:
        pass
    try:
        os.makedirs(dest, exist_ok=True)
        url = find_url()
        with tempfile.TemporaryDirectory(dir=dest, prefix=".download-") as tmpdir:
            archive = os.path.join(tmpdir, SDIST)
            download(url, archive)
            log(f"extracting {MEMBER_DIR}{PREFIX}* into {dest}")
            count = extract(archive, dest)
        with open(marker, "w", encoding="utf-8") as f:
            f.write(SHA256 + "\n")
        log(f"done: {count} files in {dest}")
        return 0
    except Exception as e:  # report any failure as one clear line, then fail
        log(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
