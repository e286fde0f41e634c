#!/usr/bin/env python3
"""Chat templates of the families Blink runs, rendered by llama.cpp's server
(`POST /apply-template`, Jinja on), into testdata/golden/chat-templates.json.

Each family's template is one of llama.cpp's own copies (models/templates/*.jinja, as the
model vendors publish them), or for OLMo 2, which llama.cpp has no copy of, the one in
templates/ here (OLMo 2 Instruct's: the Tulu template of allenai's open-instruct after
`{{ bos_token }}`); the server runs the default model with that template
(`--chat-template-file`), so `bos_token` and `eos_token` are the default model's.

usage: make_chat_golden.py MODEL.gguf [OUT.json]   (needs llama-server in $LLAMA_BIN)
"""
import datetime
import json
import os
import subprocess
import sys
import time
import urllib.request

BIN = os.environ.get("LLAMA_BIN", "/opt/llama.cpp/build/bin")
TEMPLATES = os.environ.get("LLAMA_TEMPLATES", "/opt/llama.cpp/source/models/templates")
FAMILIES = {
    "gemma2": "google-gemma-2-2b-it.jinja",
    "phi3": "microsoft-Phi-3.5-mini-instruct.jinja",
    "smollm3": "HuggingFaceTB-SmolLM3-3B.jinja",
    "granite": "ibm-granite-granite-3.3-2B-Instruct.jinja",
    "qwen3moe": "Qwen-Qwen3-0.6B.jinja",
    "mistral": "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "olmo2": os.path.join(os.path.dirname(os.path.abspath(__file__)), "templates", "allenai-OLMo-2-1124-Instruct.jinja"),
}
CONVERSATIONS = [
    [{"role": "user", "content": "Hello"}],
    [{"role": "system", "content": "You are a helpful assistant"}, {"role": "user", "content": "Hello"},
     {"role": "assistant", "content": "Hi there"}, {"role": "user", "content": "Who are you"}],
    [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "   4   "},
     {"role": "user", "content": "Thanks! And 3+3? naïve café — 東京"}],
]
PORT = 18391


def post(path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def render(model, template_file):
    server = subprocess.Popen([f"{BIN}/llama-server", "-m", model, "--jinja", "--chat-template-file", template_file,
                               "--port", str(PORT), "-t", "1", "-c", "512", "--log-disable"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(120):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        return [post("/apply-template", {"messages": m})["prompt"] for m in CONVERSATIONS]
    finally:
        server.terminate()
        server.wait()


def main():
    model = sys.argv[1]
    out = sys.argv[2] if len(sys.argv) > 2 else os.path.join(os.path.dirname(__file__), "../../testdata/golden/chat-templates.json")
    families = []
    for family, name in FAMILIES.items():
        path = os.path.join(TEMPLATES, name)
        prompts = render(model, path)
        families.append({"family": family, "template_file": os.path.basename(name), "template": open(path).read(),
                         "cases": [{"messages": m, "prompt": p} for m, p in zip(CONVERSATIONS, prompts)]})
        print(family, "ok")
    golden = {"reference": "llama.cpp 0c1e57098 llama-server --jinja, POST /apply-template",
              "rendered_on": datetime.date.today().isoformat(), "bos_token": "<|im_start|>", "eos_token": "<|im_end|>",
              "families": families}
    with open(out, "w") as f:
        json.dump(golden, f, indent=1, ensure_ascii=False)
        f.write("\n")


if __name__ == "__main__":
    main()
