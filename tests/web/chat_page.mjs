// The chat page of `blink serve` in headless Chromium: load it, send a message, see the
// reply stream in, stop it, send another with the conversation kept; a refused turn and a
// conversation left by "New chat" mid-reply are not carried into the next request.
//
// Usage: node chat_page.mjs URL [SCREENSHOT.png]
// Chromium: $CHROMIUM, else /usr/bin/chromium (Debian's package).
import { chromium } from "playwright-core";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [url, screenshot] = process.argv.slice(2);
if (!url) {
  console.error("usage: node chat_page.mjs URL [SCREENSHOT.png]");
  process.exit(2);
}
const executablePath = process.env.CHROMIUM || "/usr/bin/chromium";
const profile = mkdtempSync(join(tmpdir(), "blink-chromium-"));
// Every wait below follows the page (an element, a text, a button's state); its limit,
// two minutes, is only a safety net, far beyond what a slow, busy machine needs.
const patience = 120_000;
const context = await chromium.launchPersistentContext(profile, {
  executablePath,
  headless: true,
  timeout: patience,
  args: ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"],
});
const fail = async (msg) => {
  console.log(`FAIL ${msg}`);
  console.log("web chat page: 0 passed, 1 failed");
  await context.close();
  rmSync(profile, { recursive: true, force: true });
  process.exit(1);
};

try {
  const page = await context.newPage();
  page.setDefaultTimeout(patience);
  const errors = [];
  page.on("pageerror", (e) => errors.push(String(e)));
  const chatBodies = [];
  page.on("request", (r) => {
    if (r.url().endsWith("/v1/chat/completions")) chatBodies.push(JSON.parse(r.postData() || "{}"));
  });

  const setMaxTokens = async (n) => {
    await page.fill("#max-tokens", String(n));
    await page.dispatchEvent("#max-tokens", "change");
  };
  const sendMessage = async (text) => {
    await page.fill("#input", text);
    await page.click("#send");
  };
  const idle = () => page.waitForFunction(() => document.getElementById("send").textContent === "Send");

  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("model").textContent.trim() !== "connecting…");
  const model = (await page.textContent("#model")).trim();
  if (!model.includes("SmolLM2")) await fail(`the header shows '${model}', not the served model`);

  // 1. A long answer: text must appear while the reply is still streaming; then stop it.
  await page.fill("#input", "Write a long story about a dragon and a knight.");
  await page.press("#input", "Enter");
  await page.waitForFunction(() => {
    const m = document.querySelector(".msg.assistant");
    return m && m.classList.contains("streaming") && m.textContent.length > 20;
  });
  const partial = await page.textContent(".msg.assistant");
  await page.click("#send"); // "Stop" while busy
  await page.waitForSelector(".msg.assistant[data-done='1']");
  const first = await page.textContent(".msg.assistant");
  if (!first.startsWith(partial)) await fail("the reply changed instead of growing");

  // 2. A short second turn with the conversation kept.
  await page.click("#toggle-settings");
  await setMaxTokens(16);
  await sendMessage("Thanks! Now just say hello.");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant[data-done='1']").length === 2);
  const replies = await page.$$eval(".msg.assistant", (els) => els.map((e) => e.textContent));
  if (!replies[1]) await fail("the second reply is empty");
  if ((await page.$$(".msg.error")).length) await fail(`an error was shown: ${await page.textContent(".msg.error")}`);
  const last = chatBodies[chatBodies.length - 1];
  const roles = (last.messages || []).map((m) => m.role).join(",");
  if (roles !== "user,assistant,user" || last.messages[1].content !== first || !last.stream || last.max_tokens !== 16) {
    await fail(`the second request did not carry the conversation: ${JSON.stringify(last)}`);
  }
  await page.waitForSelector(".stats"); // usage from the stream's last chunk

  // 3. A turn the server refuses (prompt plus max_tokens beyond the context) is shown as an
  // error and leaves the conversation: the next request does not carry it.
  await setMaxTokens(1000000);
  await sendMessage("This question is refused.");
  await page.waitForSelector(".msg.error");
  await idle();
  await setMaxTokens(8);
  await sendMessage("Say hello again.");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant[data-done='1']").length === 3);
  const afterError = chatBodies[chatBodies.length - 1].messages.map((m) => m.role + ":" + m.content);
  if (afterError.length !== 5 || afterError.some((m) => m.includes("refused")) || afterError[4] !== "user:Say hello again.") {
    await fail(`the refused turn stayed in the conversation: ${JSON.stringify(afterError)}`);
  }

  // 4. "New chat" while a reply streams: the next request starts a fresh conversation.
  await setMaxTokens(200);
  await sendMessage("Write a long story about a castle.");
  await page.waitForFunction(() => {
    const m = document.querySelector(".msg.assistant.streaming");
    return m && m.textContent.length > 20;
  });
  await page.click("#new");
  await idle();
  await setMaxTokens(8);
  await sendMessage("Say hello.");
  await page.waitForSelector(".msg.assistant[data-done='1']");
  const fresh = chatBodies[chatBodies.length - 1].messages;
  if (fresh.length !== 1 || fresh[0].role !== "user" || fresh[0].content !== "Say hello.") {
    await fail(`the new chat carried the old one: ${JSON.stringify(fresh)}`);
  }
  if (errors.length) await fail(`page errors: ${errors.join("; ")}`);
  if (screenshot) await page.screenshot({ path: screenshot, fullPage: true });
  console.log(`PASS chat page (${model}): streamed ${first.length} chars, then '${replies[1].slice(0, 40)}'`);
  console.log("web chat page: 1 passed, 0 failed");
} catch (e) {
  await fail(String(e && e.stack || e));
}
await context.close();
rmSync(profile, { recursive: true, force: true });
