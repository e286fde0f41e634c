#!/usr/bin/env bash
# Greedy one-shot completion with llama.cpp (llama-completion), printing only the generated text.
#
# usage: greedy.sh [options] QUESTION [-- EXTRA_LLAMA_ARGS...]
#   -m, --model FILE     GGUF model (default: $LLAMA_MODEL or ~/.cache/blink/models/SmolLM2-135M-Instruct.Q4_1.gguf)
#   -n N                 tokens to generate (default 16; generation also stops at EOS/<|im_end|>)
#   --lora FILE          LoRA adapter GGUF (scale 1.0; repeatable)
#   --lora-scaled F:S    LoRA adapter with scale S (repeatable)
#   -s, --system TEXT    system message (default: SmolLM2's default system message, as its chat template inserts)
#   --raw                QUESTION is the complete prompt; no chat template is applied
#   --seed N             sampler seed (default 42; irrelevant for greedy, fixed anyway)
#   -t N                 threads (default 2)
#   -c N                 context size (default 2048)
#   --eos                print "[eos]" to stderr when generation stopped at an end-of-generation token
#   -- ARGS...           extra arguments passed to llama-completion verbatim
# env: LLAMA_BIN (default /opt/llama.cpp/build/bin/llama-completion),
#      GREEDY_LOG=FILE keeps llama.cpp's log (stderr) in FILE (otherwise it is shown only on failure).
#
# The prompt is rendered here as ChatML, exactly
#   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n
# and passed raw (-no-cnv, --no-escape); llama-completion tokenizes the prompt with special tokens parsed
# (common_tokenize(ctx, prompt, add_special=true, parse_special=true); this model adds no BOS).
# Sampling: --temp 0 --top-k 1 (a single candidate, i.e. argmax), fixed seed.
set -euo pipefail

BIN=${LLAMA_BIN:-/opt/llama.cpp/build/bin/llama-completion}
MODEL=${LLAMA_MODEL:-$HOME/.cache/blink/models/SmolLM2-135M-Instruct.Q4_1.gguf}
N=16
SEED=42
THREADS=2
CTX=2048
SYSTEM="You are a helpful AI assistant named SmolLM, trained by Hugging Face"
RAW=0
EOSFLAG=0
QUESTION=
HAVE_Q=0
LORA=()
EXTRA=()

die() { echo "greedy.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        -m|--model) MODEL=$2; shift 2 ;;
        -n) N=$2; shift 2 ;;
        --lora) LORA+=(--lora "$2"); shift 2 ;;
        --lora-scaled) LORA+=(--lora-scaled "$2"); shift 2 ;;
        -s|--system) SYSTEM=$2; shift 2 ;;
        --raw) RAW=1; shift ;;
        --seed) SEED=$2; shift 2 ;;
        -t) THREADS=$2; shift 2 ;;
        -c) CTX=$2; shift 2 ;;
        --eos) EOSFLAG=1; shift ;;
        -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        --) shift; EXTRA=("$@"); break ;;
        -*) die "unknown option $1" ;;
        *) [ $HAVE_Q = 0 ] || die "more than one QUESTION"; QUESTION=$1; HAVE_Q=1; shift ;;
    esac
done
[ $HAVE_Q = 1 ] || die "missing QUESTION (see --help)"
[ -x "$BIN" ] || die "llama-completion not found at $BIN"
[ -f "$MODEL" ] || die "model not found: $MODEL"

if [ $RAW = 1 ]; then
    PROMPT=$QUESTION
else
    PROMPT="<|im_start|>system"$'\n'"$SYSTEM<|im_end|>"$'\n'"<|im_start|>user"$'\n'"$QUESTION<|im_end|>"$'\n'"<|im_start|>assistant"$'\n'
fi

OUT=$(mktemp); ERR=${GREEDY_LOG:-$(mktemp)}
cleanup() { rm -f "$OUT"; [ -n "${GREEDY_LOG:-}" ] || rm -f "$ERR"; }
trap cleanup EXIT

if ! "$BIN" -m "$MODEL" ${LORA[@]+"${LORA[@]}"} -p "$PROMPT" --no-escape -no-cnv \
        -n "$N" --temp 0 --top-k 1 --seed "$SEED" -t "$THREADS" -c "$CTX" \
        --no-display-prompt --no-perf ${EXTRA[@]+"${EXTRA[@]}"} </dev/null >"$OUT" 2>"$ERR"; then
    cat "$ERR" >&2
    die "llama-completion failed"
fi

# llama-completion's stdout is: generated text, then " [end of text]\n" if it stopped at EOG, then "\n\n".
text=$(cat "$OUT"; printf x); text=${text%x}
text=${text%$'\n\n'}
eot=$' [end of text]\n'
if [ "${text%"$eot"}" != "$text" ]; then
    text=${text%"$eot"}
    [ $EOSFLAG = 0 ] || echo "[eos]" >&2
fi
printf '%s' "$text"
