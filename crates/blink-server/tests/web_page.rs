//! The chat page at `/` in headless Chromium (tests/web/chat_page.mjs, driven by
//! playwright-core): it loads, streams a reply as it arrives, stops it, and keeps the
//! conversation for the next turn, but not a refused turn, nor a conversation left by "New
//! chat" mid-reply. Chromium and the npm package are required, never skipped.

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

#[test]
fn chat_page_streams_a_conversation_in_headless_chromium() {
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    assert!(Path::new(&chromium).exists(), "{chromium} is missing: install Chromium (`apt-get install -y chromium`, as scripts/test.sh does) or set CHROMIUM");
    let web = repo_root().join("tests/web");
    assert!(
        web.join("node_modules/playwright-core").is_dir(),
        "playwright-core is missing: run `npm install` in {} (scripts/test.sh does)",
        web.display()
    );
    let server = shared();
    let shot = std::env::temp_dir().join("blink-chat-page.png");
    let out = Command::new("node")
        .arg(web.join("chat_page.mjs"))
        .arg(format!("{}/", server.url))
        .arg(&shot)
        .env("CHROMIUM", &chromium)
        .output()
        .unwrap_or_else(|e| panic!("cannot run node (install Node.js): {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the chat page test failed ({}):\n{stdout}\n{stderr}", out.status);
    println!("{stdout}");
}
