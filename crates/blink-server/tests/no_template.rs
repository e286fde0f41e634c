//! A model file without a chat template is served with ChatML, as llama.cpp's server does:
//! a chat request gets the reply its ChatML prompt gets as a completion.

mod support;

use serde_json::json;
use support::*;

#[test]
fn a_model_without_a_chat_template_chats_in_chatml() {
    let mut bytes = std::fs::read(model_path()).unwrap();
    let key = b"tokenizer.chat_template";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap();
    bytes[at + key.len() - 1] = b'X';
    let path = std::env::temp_dir().join(format!("blink-server-no-template-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    let server = TestServer::start(ServerOptions::default(), ModelOptions { path: path.clone(), ..model_options() });
    // The file is mapped now; it can go.
    let _ = std::fs::remove_file(&path);

    let c = server.client();
    let chat = block_on(c.post_json("/v1/chat/completions", &json!({"messages": [{"role": "user", "content": "What is 2+2?"}], "max_tokens": 8, "temperature": 0}))).unwrap();
    assert_eq!(chat.status, 200, "{}", chat.text());
    let chat = chat.json().unwrap();
    let chatml = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n";
    let completion = block_on(c.post_json("/v1/completions", &json!({"prompt": chatml, "max_tokens": 8, "temperature": 0}))).unwrap().json().unwrap();
    assert_eq!(chat["usage"]["prompt_tokens"], completion["usage"]["prompt_tokens"]);
    assert_eq!(chat["choices"][0]["message"]["content"], completion["choices"][0]["text"]);
}
