// Greedy generation with llama.cpp, through node-llama-cpp's prebuilt CPU binaries
// (@node-llama-cpp/linux-x64), optionally with a LoRA adapter GGUF. Run by
// crates/blink/tests/cli_finetune_interop.rs.
//
//   node llamacpp_greedy.mjs JOB.json
//
// JOB.json: {"model": GGUF, "lora": GGUF or null, "scale": 1, "system": TEXT,
//            "prompts": [TEXT, ...], "max_tokens": N, "threads": 1,
//            "package_dir": a directory whose node_modules holds node-llama-cpp (default: this one)}
//
// Each prompt is rendered here as ChatML, exactly as Blink renders SmolLM2's template
// (scripts/llamacpp_ref/greedy.sh):
//   <|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n
// and tokenized with special tokens parsed and no BOS added (this model adds none). Decoding
// is greedy (temperature 0), one token at a time, with the two highest raw logits of each
// step, until an end-of-generation token or max_tokens.
//
// Prints one JSON line describing the runtime (llama.cpp release, build type, the addon and
// CPU backend files loaded), then one JSON line per prompt:
//   {"prompt", "prompt_ids", "ids", "margins", "runner_up_ids", "text", "prefixes"}
// `ids` includes an end-of-generation token if one came; `text` leaves it out; `margins[i]`
// is logit(best) - logit(second) at step i; prefixes[i] is the text of the first i tokens (a
// character cut in two by a token boundary left out).
//
// It never builds llama.cpp and never downloads anything: getLlama gets `build: "never"`
// and `skipDownload: true`, so without a usable prebuilt binary it fails instead.

import fs from "node:fs";
import { createRequire } from "node:module";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const fail = (msg) => {
    console.error(`llamacpp_greedy: ${msg}`);
    process.exit(1);
};

const major = Number(process.versions.node.split(".")[0]);
if (major < 20) fail(`node-llama-cpp 3 needs Node.js 20 or newer; this is ${process.version}`);

const job = JSON.parse(fs.readFileSync(process.argv[2], "utf8"));
const threads = job.threads ?? 1;
const packageDir = job.package_dir ?? path.dirname(fileURLToPath(import.meta.url));
const require = createRequire(path.join(packageDir, "package.json"));
let entry;
try {
    entry = require.resolve("node-llama-cpp");
} catch {
    fail(`node-llama-cpp is not installed in ${packageDir}: run \`npm install --omit=optional\` there (scripts/test.sh does)`);
}
const { getLlama, LlamaLogLevel } = await import(pathToFileURL(entry).href);

const llama = await getLlama({
    gpu: false,
    build: "never",
    skipDownload: true,
    usePrebuiltBinaries: true,
    progressLogs: false,
    maxThreads: threads,
    logLevel: LlamaLogLevel.error,
});
if (llama.buildType !== "prebuilt") fail(`expected node-llama-cpp's prebuilt binary, got a ${llama.buildType}`);

// Which files were really loaded: the addon must come from the prebuilt package.
const maps = fs.readFileSync("/proc/self/maps", "utf8");
const loaded = (re) => [...new Set(maps.split("\n").map((l) => l.split(/\s+/)[5]).filter((p) => p && re.test(p)))];
const addon = loaded(/llama-addon\.node$/);
if (addon.length !== 1 || !addon[0].includes("/@node-llama-cpp/linux-x64/bins/"))
    fail(`the addon loaded is not @node-llama-cpp/linux-x64's prebuilt one: ${JSON.stringify(addon)}`);

const model = await llama.loadModel({ modelPath: job.model, gpuLayers: 0 });
const context = await model.createContext({
    contextSize: 2048,
    batchSize: 512,
    threads,
    sequences: 1,
    ...(job.lora ? { lora: { adapters: [{ filePath: job.lora, scale: job.scale ?? 1 }] } } : {}),
});
const sequence = context.getSequence();

console.log(JSON.stringify({
    llama_cpp: llama.llamaCppRelease,
    build_type: llama.buildType,
    addon: addon[0],
    cpu_backends: loaded(/libggml-cpu[^/]*\.so$/).map((p) => p.split("/").pop()),
    lora: job.lora ?? null,
}));

const next = {
    generateNext: {
        token: true,
        logits: { filter: { tokens: [], includeTop: 2 } },
        options: { temperature: 0 },
    },
};

for (const prompt of job.prompts) {
    const rendered = `<|im_start|>system\n${job.system}<|im_end|>\n<|im_start|>user\n${prompt}<|im_end|>\n<|im_start|>assistant\n`;
    const promptIds = model.tokenize(rendered, true);
    await sequence.clearHistory();
    let input = promptIds.map((t, i) => (i === promptIds.length - 1 ? [t, next] : t));
    const ids = [], margins = [], runnerUp = [];
    for (let step = 0; step < job.max_tokens; step++) {
        const out = await sequence.controlledEvaluate(input);
        const n = out[input.length - 1]?.next;
        if (n?.token == null || n.logits == null) fail(`step ${step}: no token or logits came back`);
        const top = [...n.logits.entries()].sort((a, b) => b[1] - a[1]).slice(0, 2);
        if (top.length < 2 || top[0][0] !== n.token)
            fail(`step ${step}: the token chosen (${n.token}) is not the highest logit's (${JSON.stringify(top)})`);
        ids.push(n.token);
        margins.push(Math.round((top[0][1] - top[1][1]) * 1e4) / 1e4);
        runnerUp.push(top[1][0]);
        if (model.isEogToken(n.token)) break;
        input = [[n.token, next]];
    }
    const textIds = ids.filter((t) => !model.isEogToken(t));
    const prefixes = [];
    for (let i = 0; i <= textIds.length; i++) prefixes.push(model.detokenize(textIds.slice(0, i), false).replace(/\uFFFD+$/, ""));
    console.log(JSON.stringify({
        prompt,
        prompt_ids: promptIds,
        ids,
        margins,
        runner_up_ids: runnerUp,
        text: model.detokenize(textIds, false),
        prefixes,
    }));
}

await context.dispose();
await model.dispose();
await llama.dispose();
