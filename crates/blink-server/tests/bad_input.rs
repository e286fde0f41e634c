//! Hostile and broken clients: each gets the right status (in OpenAI's error shape) or a
//! clean close, and the server keeps serving everyone else.

mod support;

use std::time::{Duration, Instant};

use blink_server::client::{Client, HttpResponse};
use blink_server::{ServerOptions, Server};
use serde_json::{json, Value};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const KEY: &str = "sk-blink-test";

/// One server with an API key, short timeouts and a 1 MiB body cap.
fn guarded() -> &'static TestServer {
    static S: std::sync::OnceLock<TestServer> = std::sync::OnceLock::new();
    S.get_or_init(|| {
        let opts = ServerOptions {
            api_key: Some(KEY.into()),
            max_body: 1 << 20,
            header_timeout: Duration::from_secs(2),
            body_timeout: Duration::from_secs(2),
            ..ServerOptions::default()
        };
        TestServer::start(opts, model_options())
    })
}

fn client() -> Client {
    guarded().client().with_api_key(Some(KEY.into()))
}

fn chat(body: Value) -> HttpResponse {
    block_on(client().post_json("/v1/chat/completions", &body)).expect("request")
}

fn hello(extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "temperature": 0});
    if let (Value::Object(b), Value::Object(e)) = (&mut body, extra) {
        b.extend(e);
    }
    body
}

/// Assert an OpenAI-shaped error with `status`; returns the `error` object.
fn expect_error(r: &HttpResponse, status: u16) -> Value {
    assert_eq!(r.status, status, "body: {}", r.text());
    let v = r.json().expect("a JSON error body");
    let e = v["error"].clone();
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "no message: {v}");
    assert!(e["type"].is_string(), "no type: {v}");
    assert!(e.get("param").is_some() && e.get("code").is_some(), "param/code missing: {v}");
    e
}

/// The server still answers a normal request.
fn still_serving() {
    let r = chat(hello(json!({})));
    assert_eq!(r.status, 200, "{}", r.text());
    assert!(r.json().unwrap()["choices"][0]["message"]["content"].is_string());
}

#[test]
fn malformed_json_is_400() {
    for body in ["{", "not json", "[1, 2]", "", "{\"messages\": [}"] {
        let r = block_on(client().post_raw("/v1/chat/completions", body.to_owned())).unwrap();
        expect_error(&r, 400);
    }
    still_serving();
}

#[test]
fn wrong_types_are_400_naming_the_field() {
    let cases = [
        (json!({"temperature": "hot"}), "temperature"),
        (json!({"max_tokens": "10"}), "max_tokens"),
        (json!({"stream": "yes"}), "stream"),
        (json!({"stop": 5}), "stop"),
        (json!({"seed": 1.5}), "seed"),
        (json!({"top_p": [1]}), "top_p"),
        (json!({"logprobs": 3}), "logprobs"),
        (json!({"messages": "hi"}), "messages"),
        (json!({"messages": [{"role": "user", "content": 7}]}), "messages"),
        (json!({"messages": [{"role": "wizard", "content": "hi"}]}), "messages"),
        (json!({"model": 3}), "model"),
        (json!({"stream": true, "stream_options": {"include_usage": "yes"}}), "include_usage"),
        (json!({"stream_options": {"include_usage": true}}), "stream_options"),
        (json!({"tool_choice": "required"}), "tool_choice"),
    ];
    for (extra, param) in cases {
        let r = chat(hello(extra.clone()));
        let e = expect_error(&r, 400);
        assert_eq!(e["param"], json!(param), "{extra}: {e}");
    }
}

#[test]
fn out_of_range_values_are_400() {
    for extra in [
        json!({"max_tokens": -5}),
        json!({"max_tokens": 0}),
        json!({"max_completion_tokens": -1}),
        json!({"temperature": -1}),
        json!({"top_p": 1.5}),
        json!({"presence_penalty": 3}),
        json!({"top_logprobs": 50, "logprobs": true}),
        json!({"top_logprobs": 2}),
        json!({"n": 2}),
        json!({"stop": ["a", "b", "c", "d", "e"]}),
        json!({"tools": [{"type": "function", "function": {"name": "f"}}]}),
        json!({"response_format": {"type": "json_object"}}),
    ] {
        let r = chat(hello(extra.clone()));
        expect_error(&r, 400);
    }
    // Huge max_tokens: beyond the context.
    for n in [1_000_000_000_000i64, 1025] {
        let e = expect_error(&chat(hello(json!({"max_tokens": n}))), 400);
        assert_eq!(e["code"], json!("context_length_exceeded"), "{e}");
        // The error names the field the client sent.
        let e = expect_error(&chat(hello(json!({"max_completion_tokens": n}))), 400);
        assert_eq!(e["param"], json!("max_completion_tokens"), "{e}");
        assert!(e["message"].as_str().unwrap().contains("plus max_completion_tokens"), "{e}");
    }
    still_serving();
}

#[test]
fn unknown_fields_are_ignored() {
    let r = chat(hello(json!({"frobnicate": {"x": [1, 2]}, "user": "u1", "metadata": {"a": "b"}, "store": false})));
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json().unwrap();
    assert_eq!(v["object"], json!("chat.completion"));
    assert_eq!(v["usage"]["completion_tokens"].as_u64().unwrap() + v["usage"]["prompt_tokens"].as_u64().unwrap(), v["usage"]["total_tokens"].as_u64().unwrap());
}

#[test]
fn over_long_prompt_is_context_length_exceeded() {
    let long = "word ".repeat(3000);
    let e = expect_error(&chat(json!({"messages": [{"role": "user", "content": long}], "max_tokens": 4})), 400);
    assert_eq!(e["code"], json!("context_length_exceeded"), "{e}");
    assert_eq!(e["param"], json!("messages"), "{e}");
    let r = block_on(client().post_json("/v1/completions", &json!({"prompt": long, "max_tokens": 4}))).unwrap();
    let e = expect_error(&r, 400);
    assert_eq!((&e["code"], &e["param"]), (&json!("context_length_exceeded"), &json!("prompt")), "{e}");
    still_serving();
}

#[test]
fn browsers_on_other_origins_may_call_the_api() {
    // A preflight carries no key, and is answered before the key is checked.
    let preflight = "OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: blink\r\nOrigin: http://example.com\r\n\
        Access-Control-Request-Method: POST\r\nAccess-Control-Request-Headers: content-type,authorization\r\nConnection: close\r\n\r\n";
    let answer = block_on(async {
        let mut s = TcpStream::connect(guarded().server.addr()).await.unwrap();
        s.write_all(preflight.as_bytes()).await.unwrap();
        read_until_closed(&mut s, STUCK).await.expect("the server closes after answering")
    });
    let answer = String::from_utf8_lossy(&answer).to_lowercase();
    assert!(answer.starts_with("http/1.1 204"), "{answer}");
    for line in ["access-control-allow-origin: *", "access-control-allow-methods: get, post, options", "access-control-allow-headers: content-type,authorization"] {
        assert!(answer.contains(line), "no {line:?} in {answer}");
    }
    // Every answer lets the page read it.
    let r = block_on(client().get("/v1/models")).unwrap();
    assert_eq!(r.headers.get("access-control-allow-origin").map(|v| v.as_bytes()), Some(&b"*"[..]), "{:?}", r.headers);
}

#[test]
fn endpoints_answer_without_the_v1_prefix_too() {
    assert_eq!(block_on(client().get("/models")).unwrap().json().unwrap()["object"], json!("list"));
    let r = block_on(client().post_json("/chat/completions", &hello(json!({})))).unwrap();
    assert_eq!(r.json().unwrap()["object"], json!("chat.completion"), "{}", r.text());
    let r = block_on(client().post_json("/completions", &json!({"prompt": "Hello", "max_tokens": 2}))).unwrap();
    assert_eq!(r.json().unwrap()["object"], json!("text_completion"), "{}", r.text());
}

#[test]
fn empty_or_missing_messages_are_400() {
    expect_error(&chat(json!({"messages": [], "max_tokens": 4})), 400);
    expect_error(&chat(json!({"max_tokens": 4})), 400);
    let r = block_on(client().post_json("/v1/completions", &json!({"prompt": [], "max_tokens": 4}))).unwrap();
    expect_error(&r, 400);
}

#[test]
fn api_key_is_required_except_for_health() {
    let anon = guarded().client();
    let r = block_on(anon.post_json("/v1/chat/completions", &hello(json!({})))).unwrap();
    assert_eq!(expect_error(&r, 401)["code"], json!("invalid_api_key"));
    let wrong = guarded().client().with_api_key(Some("sk-wrong".into()));
    expect_error(&block_on(wrong.get("/v1/models")).unwrap(), 401);
    expect_error(&block_on(wrong.get("/metrics")).unwrap(), 401);
    assert_eq!(block_on(anon.get("/health")).unwrap().status, 200);
    assert_eq!(block_on(client().get("/v1/models")).unwrap().status, 200);
}

#[test]
fn unknown_model_route_and_method() {
    expect_error(&chat(hello(json!({"model": "gpt-4o"}))), 404);
    expect_error(&block_on(client().get("/v1/nothing")).unwrap(), 404);
    expect_error(&block_on(client().get("/v1/chat/completions")).unwrap(), 405);
    // The served id, its file name and the empty name are all accepted.
    let id = block_on(client().get("/v1/models")).unwrap().json().unwrap()["data"][0]["id"].as_str().unwrap().to_owned();
    for name in [id.clone(), format!("{id}.gguf"), String::new()] {
        assert_eq!(chat(hello(json!({"model": name}))).status, 200, "model {name:?}");
    }
}

#[test]
fn body_over_the_cap_is_413() {
    let big = format!("{{\"messages\": [{{\"role\": \"user\", \"content\": \"{}\"}}]}}", "x".repeat(2 << 20));
    let r = block_on(client().post_raw("/v1/chat/completions", big)).unwrap();
    expect_error(&r, 413);
    still_serving();
}

#[test]
fn tokenize_and_detokenize_round_trip() {
    let c = client();
    let r = block_on(c.post_json("/tokenize", &json!({"content": "Hello world"}))).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let tokens = r.json().unwrap()["tokens"].clone();
    assert!(tokens.as_array().is_some_and(|t| !t.is_empty()), "{tokens}");
    let r = block_on(c.post_json("/detokenize", &json!({"tokens": tokens}))).unwrap();
    assert_eq!(r.json().unwrap()["content"], json!("Hello world"));
    expect_error(&block_on(c.post_json("/detokenize", &json!({"tokens": [-1]}))).unwrap(), 400);
    expect_error(&block_on(c.post_json("/detokenize", &json!({"tokens": [99999999]}))).unwrap(), 400);
    expect_error(&block_on(c.post_json("/tokenize", &json!({"content": 5}))).unwrap(), 400);

    // As llama.cpp's server: pieces on request (bytes where they are not UTF-8), and
    // special tokens written out.
    let r = block_on(c.post_json("/tokenize", &json!({"content": "Hi<|im_end|>é😊", "with_pieces": true}))).unwrap();
    let pieces = r.json().unwrap()["tokens"].as_array().unwrap().clone();
    assert_eq!(pieces[0]["piece"], json!("Hi"), "{pieces:?}");
    assert_eq!(pieces[1]["piece"], json!("<|im_end|>"), "{pieces:?}");
    assert!(pieces.iter().any(|p| p["piece"].is_array()), "the emoji's byte tokens should be byte lists: {pieces:?}");
    let mut bytes = Vec::new();
    for p in &pieces {
        match &p["piece"] {
            Value::String(s) => bytes.extend(s.as_bytes()),
            Value::Array(b) => bytes.extend(b.iter().map(|v| v.as_u64().unwrap() as u8)),
            other => panic!("piece {other}"),
        }
    }
    assert_eq!(String::from_utf8(bytes).unwrap(), "Hi<|im_end|>é😊");
    let ids: Vec<Value> = pieces.iter().map(|p| p["id"].clone()).collect();
    let r = block_on(c.post_json("/detokenize", &json!({"tokens": ids}))).unwrap();
    assert_eq!(r.json().unwrap()["content"], json!("Hi<|im_end|>é😊"));
}

/// Read until the peer closes; Ok(bytes read) or Err if it stays open past `limit`.
async fn read_until_closed(s: &mut TcpStream, limit: Duration) -> Result<Vec<u8>, Vec<u8>> {
    let deadline = tokio::time::Instant::now() + limit;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout_at(deadline, s.read(&mut buf)).await {
            Err(_) => return Err(got),
            Ok(Ok(0)) | Ok(Err(_)) => return Ok(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

#[test]
fn slowloris_headers_and_bodies_are_cut_off_while_others_are_served() {
    let addr = guarded().server.addr();
    block_on(async {
        // Half a request line and headers, then silence.
        let mut slow_head = TcpStream::connect(addr).await.unwrap();
        slow_head.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app").await.unwrap();
        // Whole headers, a tenth of the body, then silence.
        let mut slow_body = TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n{{\"messages\""
        );
        slow_body.write_all(head.as_bytes()).await.unwrap();
        // A connection that never sends anything.
        let mut silent = TcpStream::connect(addr).await.unwrap();

        // Meanwhile a normal client is served, however long that takes, while the three are
        // cut off by the server's 2 s timeouts. This wait is a bound on time because the
        // timeouts are what is tested: within 8 s of now, short of the defaults (10 s for
        // headers, 30 s for bodies); a timer fires on time on a slow machine too, only its
        // close is scheduled a little later.
        let limit = Duration::from_secs(8);
        let normal = async {
            let r = client().post_json("/v1/chat/completions", &hello(json!({}))).await.unwrap();
            assert_eq!(r.status, 200, "{}", r.text());
        };
        let ((), head, body, silent) = tokio::join!(
            normal,
            read_until_closed(&mut slow_head, limit),
            read_until_closed(&mut slow_body, limit),
            read_until_closed(&mut silent, limit),
        );
        head.expect("the slow-header connection was not closed");
        let answer = body.expect("the slow-body connection was not closed");
        let answer = String::from_utf8_lossy(&answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "slow body answered: {answer}");
        silent.expect("the silent connection was not closed");
    });
    still_serving();
}

#[test]
fn garbage_request_lines_get_closed() {
    let addr = guarded().server.addr();
    block_on(async {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03garbage\r\n\r\n").await.unwrap();
        let got = read_until_closed(&mut s, STUCK).await.expect("closed");
        let text = String::from_utf8_lossy(&got);
        assert!(got.is_empty() || text.starts_with("HTTP/1.1 400"), "{text}");
    });
    still_serving();
}

#[test]
fn a_client_gone_mid_stream_or_mid_answer_frees_its_sequence() {
    // Its own server, so other tests' requests cannot blur the engine's counters.
    let server = TestServer::start(ServerOptions::default(), model_options());
    let before = server.wait_idle();
    let body = json!({
        "messages": [{"role": "user", "content": "Write a very long story about a dragon."}],
        "max_tokens": 900, "ignore_eos": true, "temperature": 0, "stream": true,
    });
    block_on(async {
        let c = server.client();
        let mut streams = Vec::new();
        for _ in 0..3 {
            let mut s = c.stream("/v1/chat/completions", &body).await.expect("stream starts");
            for _ in 0..3 {
                s.next_event().await.expect("an event").expect("not ended");
            }
            streams.push(s);
        }
        assert!(server.stats().running > 0, "nothing running: {:?}", server.stats());
        drop(streams); // the clients vanish mid-stream
    });
    let streamed = server.wait_idle();
    assert_eq!(streamed.kv_blocks_used, before.kv_blocks_used);
    assert!(streamed.generated_tokens_total < 3 * 900, "the cancelled streams ran on: {streamed:?}");
    // A client waiting for a whole (non-streaming) answer vanishes once generation starts.
    block_on(async {
        let mut whole = body.clone();
        whole["stream"] = json!(false);
        let payload = whole.to_string();
        let request = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{payload}", payload.len());
        let mut waiting = TcpStream::connect(server.server.addr()).await.unwrap();
        waiting.write_all(request.as_bytes()).await.unwrap();
        let deadline = Instant::now() + STUCK;
        while server.stats().running == 0 {
            assert!(Instant::now() < deadline, "the request never started");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(waiting);
    });
    let after = server.wait_idle();
    assert_eq!(after.kv_blocks_used, before.kv_blocks_used);
    assert!(after.generated_tokens_total - streamed.generated_tokens_total < 900, "the cancelled request ran on: {after:?}");
    // /metrics agrees: three streams answered 200, one request left unanswered. And the
    // server still serves.
    let metrics = block_on(server.client().get("/metrics")).unwrap().text();
    assert_eq!(blink_server::metrics::sample(&metrics, "blink_running_sequences"), Some(0.0), "{metrics}");
    let requests = |status: u16| blink_server::metrics::sample(&metrics, &format!("blink_requests_total{{endpoint=\"/v1/chat/completions\",status=\"{status}\"}}"));
    assert_eq!((requests(200), requests(499)), (Some(3.0), Some(1.0)), "{metrics}");
    let r = block_on(server.client().post_json("/v1/chat/completions", &hello(json!({})))).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
}

#[test]
fn a_full_queue_is_503_and_loading_is_503() {
    // One running sequence, one waiting: the third request is refused.
    let opts = support::ModelOptions { parallel: 1, queue: 1, ..model_options() };
    let server = TestServer::start(ServerOptions::default(), opts);
    let body = json!({"messages": [{"role": "user", "content": "Count to a thousand."}], "max_tokens": 600, "ignore_eos": true, "stream": true});
    block_on(async {
        let c = server.client();
        let mut a = c.stream("/v1/chat/completions", &body).await.expect("first");
        // The role chunk, then text: the first request has been admitted and is running.
        for _ in 0..2 {
            a.next_event().await.expect("an event").expect("not ended");
        }
        let b = c.stream("/v1/chat/completions", &body).await.expect("second");
        let r = c.post_json("/v1/chat/completions", &hello(json!({}))).await.unwrap();
        assert_eq!(r.status, 503, "{}", r.text());
        assert_eq!(r.json().unwrap()["error"]["code"], json!("server_busy"));
        assert!(r.headers.contains_key("retry-after"));
        drop((a, b));
    });
    server.wait_idle();

    // Bound but not loaded: health and the API say 503.
    block_on(async {
        let bare = Server::bind("127.0.0.1:0", ServerOptions::default()).await.unwrap();
        let c = Client::new(&format!("http://{}", bare.addr())).unwrap();
        let h = c.get("/health").await.unwrap();
        assert_eq!((h.status, h.json().unwrap()), (503, json!({"status": "loading"})));
        let r = c.post_json("/v1/chat/completions", &hello(json!({}))).await.unwrap();
        assert_eq!(r.status, 503);
        bare.shutdown().await;
    });
}
