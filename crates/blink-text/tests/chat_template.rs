//! Chat templates: the default model's template against llama.cpp's rendered prompts, and
//! Llama 3 / ChatML style templates written here, and Gemma / Phi-3 templates (no system
//! role) against llama.cpp's own expected prompts.

mod support;

use blink_gguf::GgufFile;
use blink_text::chat_template::{ChatMessage, ChatTemplate, TemplateError};
use serde_json::Value;
use support::{golden_dir, model_path};

fn msg(role: &str, content: &str) -> ChatMessage {
    ChatMessage::new(role, content)
}

#[test]
fn smollm2_template_matches_llama_cpp() {
    let file = GgufFile::open(model_path()).expect("default model");
    let tmpl = ChatTemplate::from_gguf(&file).expect("template metadata").expect("SmolLM2 has a template");
    assert_eq!(tmpl.bos_token(), "<|im_start|>");
    assert_eq!(tmpl.eos_token(), "<|im_end|>");
    let path = golden_dir().join("smollm2-135m-instruct-q4_1.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file")).expect("JSON");
    let chats = golden["chat"].as_array().expect("chat[]");
    assert_eq!(chats.len(), 2);
    for case in chats {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).expect("messages");
        let want = case["rendered_prompt"].as_str().expect("rendered_prompt");
        assert_eq!(tmpl.render(&messages, true).expect("render"), want);
    }
}

const LLAMA3: &str = "{{- bos_token }}\n\
{%- if messages[0]['role'] == 'system' %}\n\
    {%- set system_message = messages[0]['content']|trim %}\n\
    {%- set messages = messages[1:] %}\n\
{%- else %}\n\
    {%- set system_message = \"Today Date: \" + strftime_now(\"%d %b %Y\") %}\n\
{%- endif %}\n\
{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n\
{{- system_message }}\n\
{{- \"<|eot_id|>\" }}\n\
{%- for message in messages %}\n\
    {%- if message.role not in ['user', 'assistant'] %}\n\
        {{- raise_exception('Unknown role: ' + message.role) }}\n\
    {%- endif %}\n\
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' }}\n\
{%- endfor %}\n\
{%- if add_generation_prompt %}\n\
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n\
{%- endif %}\n";

#[test]
fn llama3_style_template() {
    let tmpl = ChatTemplate::new(LLAMA3, "<|begin_of_text|>", "<|eot_id|>").unwrap();
    let out = tmpl.render(&[msg("system", " Be brief. "), msg("user", "Hi!\n")], true).unwrap();
    assert_eq!(
        out,
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>\
         <|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>\
         <|start_header_id|>assistant<|end_header_id|>\n\n"
    );
    // Without a system message, today's date goes in (strftime_now).
    let out = tmpl.render(&[msg("user", "Hi")], false).unwrap();
    assert!(out.starts_with("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nToday Date: "), "{out}");
    assert!(out.ends_with("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"), "{out}");
    // A tokenizer that adds BOS itself gets the prompt without it, as in llama.cpp.
    let tmpl = tmpl.strip_special(true, false);
    assert!(tmpl.render(&[msg("user", "Hi")], true).unwrap().starts_with("<|start_header_id|>system"));
}

#[test]
fn raise_exception_is_an_error() {
    let tmpl = ChatTemplate::new(LLAMA3, "", "").unwrap();
    match tmpl.render(&[msg("tool", "x")], true) {
        Err(TemplateError::Raised(m)) => assert_eq!(m, "Unknown role: tool"),
        other => panic!("expected a raised error, got {other:?}"),
    }
    let err = tmpl.render(&[msg("tool", "x")], true).unwrap_err().to_string();
    assert!(err.contains("Unknown role: tool") && !err.contains('\u{1}'), "{err}");
}

/// Qwen 2.5 style: default system prompt, Python string methods, whitespace control.
const CHATML_QWEN: &str = "{%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- else %}
    {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or (message.role == \"assistant\") %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>' + '\\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
";

#[test]
fn chatml_style_template() {
    let tmpl = ChatTemplate::new(CHATML_QWEN, "", "<|im_end|>").unwrap();
    let conv = [msg("user", "  2+2? "), msg("assistant", "4"), msg("user", "And 3+3?")];
    assert_eq!(
        tmpl.render(&conv, true).unwrap(),
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n\
         <|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n\
         <|im_start|>user\nAnd 3+3?<|im_end|>\n<|im_start|>assistant\n"
    );
    let chatml = ChatTemplate::chatml();
    assert_eq!(
        chatml.render(&[msg("system", "S"), msg("user", "U")], true).unwrap(),
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn block_whitespace_follows_transformers() {
    // trim_blocks + lstrip_blocks: block tags leave no blank lines or indentation; the final
    // newline of the template is dropped (keep_trailing_newline = False).
    let src = "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n";
    let tmpl = ChatTemplate::new(src, "", "").unwrap();
    assert_eq!(tmpl.render(&[msg("user", "a"), msg("user", "b")], false).unwrap(), "[a]\n[b]\n");
    let tmpl = ChatTemplate::new("x\n", "", "").unwrap();
    assert_eq!(tmpl.render(&[], false).unwrap(), "x");
}

#[test]
fn python_methods_and_tojson() {
    let src = "{{ messages[0].content.split(',') | tojson }}|{{ messages[0].content.startswith('a') }}|\
               {{ messages[0].content.upper() }}|{{ {'k': [1, 2.5, none, true, 'é\"\\n']} | tojson }}|\
               {{ {'b': 1, 'a': {}} | tojson(indent=2, sort_keys=true) }}";
    let tmpl = ChatTemplate::new(src, "", "").unwrap();
    let out = tmpl.render(&[msg("user", "a,b")], false).unwrap();
    assert_eq!(
        out,
        "[\"a\", \"b\"]|True|A,B|{\"k\": [1, 2.5, null, true, \"é\\\"\\n\"]}|{\n  \"a\": {},\n  \"b\": 1\n}"
    );
}

#[test]
fn syntax_errors_are_reported_at_construction() {
    match ChatTemplate::new("{% for m in messages %}", "", "") {
        Err(TemplateError::Syntax(m)) => assert!(!m.is_empty()),
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn templates_are_shareable() {
    fn shareable<T: Send + Sync>() {}
    shareable::<ChatTemplate>();
}

/// A template is code from the model file: runaway loops, huge output and absurd `tojson`
/// arguments end in a render error, in bounded time, while a long real conversation renders.
#[test]
fn hostile_templates_end_in_errors() {
    let render_err = |src: &str| {
        let started = std::time::Instant::now();
        let r = ChatTemplate::new(src, "", "").unwrap().render(&[msg("user", "hi")], true);
        assert!(started.elapsed().as_secs() < 30, "{src}: took {:?}", started.elapsed());
        match r {
            Err(TemplateError::Render(m)) => m,
            other => panic!("{src}: expected a render error, got {other:?}"),
        }
    };
    let m = render_err("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}");
    assert!(m.contains("fuel"), "{m}");
    let m = render_err("{% for i in range(1000) %}{{ 'x' * 100000 }}{% endfor %}");
    assert!(m.contains("longer than 32 MiB"), "{m}");
    let m = render_err("{{ [1] | tojson(indent=10000000000) }}");
    assert!(m.contains("indent"), "{m}");
    render_err("{{ [1] | tojson(indent=9223372036854775808) }}");
    let m = render_err("{% set ns = namespace(v=[]) %}{% for i in range(200) %}{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v | tojson }}");
    assert!(m.contains("nested deeper"), "{m}");
    // Thousands of messages stay well within the bounds.
    let long: Vec<ChatMessage> = (0..4000).map(|i| msg(if i % 2 == 0 { "user" } else { "assistant" }, "some words here")).collect();
    let out = ChatTemplate::new(CHATML_QWEN, "", "").unwrap().render(&long, true).unwrap();
    assert!(out.len() > 4000 * 20);
}

/// A template that does not compile leaves the model usable with ChatML, and says so, as
/// llama.cpp does.
#[test]
fn a_template_that_does_not_compile_falls_back_to_chatml() {
    let real = GgufFile::open(model_path()).expect("default model");
    let mut w = blink_gguf::GgufWriter::new();
    for (k, v) in real.metadata() {
        if k.starts_with("tokenizer.") || k == "general.architecture" {
            w.add(k.as_str(), v.clone()).unwrap();
        }
    }
    w.set("tokenizer.chat_template", blink_gguf::Value::from("{% for x in %}")).unwrap();
    let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let (tmpl, warning) = ChatTemplate::from_gguf_or_chatml(&file).unwrap();
    assert!(warning.unwrap().contains("does not compile"));
    assert_eq!(tmpl.unwrap().render(&[msg("user", "U")], true).unwrap(), "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n");
    // The file's own template, when it compiles, comes with no warning.
    let (tmpl, warning) = ChatTemplate::from_gguf_or_chatml(&real).unwrap();
    assert!(tmpl.is_some() && warning.is_none());
}

/// A backslash-newline inside a string literal continues the line, as in jinja2 (Python's
/// string escapes); elsewhere it is text.
#[test]
fn backslash_newlines_in_string_literals_continue_the_line() {
    let render = |src: &str| ChatTemplate::new(src, "", "").unwrap().render(&[], false).unwrap();
    assert_eq!(render("{{ \"one \\\ntwo\" }}"), "one two");
    assert_eq!(render("{% set s = 'a\\\nb' %}{{ s }}|x\\\ny"), "ab|x\\\ny");
    // An escaped backslash before a newline is a backslash and a newline.
    assert_eq!(render("{{ 'a\\\\\nb' }}"), "a\\\nb");
}

/// A final assistant message is continued (llama.cpp's server prefills it): the turns before
/// it with the generation prompt, then its text, with no end of turn.
#[test]
fn a_final_assistant_message_is_continued() {
    let file = GgufFile::open(model_path()).expect("default model");
    let tmpl = ChatTemplate::from_gguf(&file).unwrap().unwrap();
    let tok = blink_text::tokenizer::Tokenizer::from_gguf(&file).unwrap();
    let question = [msg("user", "What is the capital of France?")];
    let prefix = "The capital of France is";
    let continued = tmpl.prompt_tokens(&tok, &[question[0].clone(), msg("assistant", prefix)]).unwrap();
    let want = format!("{}{prefix}", tmpl.render(&question, true).unwrap());
    assert_eq!(continued, tok.encode(&want, true, true));
    assert!(tok.decode(&continued, true).ends_with("<|im_start|>assistant\nThe capital of France is"));
    let twice = [question[0].clone(), msg("assistant", "Paris."), msg("assistant", prefix)];
    assert!(matches!(tmpl.prompt_tokens(&tok, &twice), Err(TemplateError::Render(_))));
}

/// The conversation llama.cpp's `test-chat-template.cpp` renders with every template.
fn llama_cpp_conversation() -> Vec<ChatMessage> {
    vec![
        msg("system", "You are a helpful assistant"),
        msg("user", "Hello"),
        msg("assistant", "Hi there"),
        msg("user", "Who are you"),
        msg("assistant", "   I am an assistant   "),
        msg("user", "Another question"),
    ]
}

#[test]
fn templates_without_a_system_role_get_it_in_the_first_user_message() {
    // Templates and expected prompts from llama.cpp's test-chat-template.cpp (its Jinja
    // path): Gemma refuses a system message, Phi-3-mini leaves it out.
    let gemma = r#"{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + '\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{'<start_of_turn>model\n'}}{% endif %}"#;
    let gemma_expected = "<start_of_turn>user\nYou are a helpful assistant\nHello<end_of_turn>\n<start_of_turn>model\nHi there<end_of_turn>\n<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\nI am an assistant<end_of_turn>\n<start_of_turn>user\nAnother question<end_of_turn>\n<start_of_turn>model\n";
    let phi3 = "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') %}{{'<|user|>' + '\n' + message['content'] + '<|end|>' + '\n' + '<|assistant|>' + '\n'}}{% elif (message['role'] == 'assistant') %}{{message['content'] + '<|end|>' + '\n'}}{% endif %}{% endfor %}";
    let phi3_expected = "<|user|>\nYou are a helpful assistant\nHello<|end|>\n<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n   I am an assistant   <|end|>\n<|user|>\nAnother question<|end|>\n<|assistant|>\n";
    for (source, expected) in [(gemma, gemma_expected), (phi3, phi3_expected)] {
        let t = ChatTemplate::new(source, "", "").unwrap();
        assert_eq!(t.render(&llama_cpp_conversation(), true).unwrap(), expected);
    }
    // A system message with no user message after it becomes one.
    let t = ChatTemplate::new(gemma, "", "").unwrap();
    assert_eq!(t.render(&[msg("system", "Be brief.")], true).unwrap(), "<start_of_turn>user\nBe brief.<end_of_turn>\n<start_of_turn>model\n");
    // A template with a system role gets the conversation as it is.
    let chatml = ChatTemplate::chatml().render(&llama_cpp_conversation(), false).unwrap();
    assert!(chatml.starts_with("<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello<|im_end|>"), "{chatml}");
}

#[test]
fn templates_see_what_llama_cpp_and_jinja2_give_them() {
    let render = |source: &str| ChatTemplate::new(source, "", "").unwrap().render(&[msg("user", "Hi")], true).unwrap();
    // llama.cpp's server passes enable_thinking (true) and today's date_string.
    assert_eq!(render("{% if enable_thinking is true %}thinking{% endif %}"), "thinking");
    let date = render("{{ date_string }}");
    let parts: Vec<&str> = date.split(' ').collect();
    let months = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
    assert!(parts.len() == 3 && parts[0].len() == 2 && months.contains(&parts[1]) && parts[2].len() == 4, "{date}");
    // jinja2's length of an undefined value is 0 (Apriel's and DeepSeek V3.2's templates
    // rely on it), and transformers' generation marks render their content.
    assert_eq!(render("{% if tools is not none and tools|length > 0 %}tools{% endif %}{{ tools|count }}"), "0");
    assert_eq!(render("{{ messages|length }}"), "1");
    assert!(ChatTemplate::new("{{ 5|length }}", "", "").unwrap().render(&[], false).is_err());
    let marked = "{% for m in messages %}{%- generation -%}\n[{{ m.content }}]\n{%- endgeneration %}{% endfor %}";
    assert_eq!(render(marked), "[Hi]");
}

#[test]
fn tojson_takes_json_dumps_arguments() {
    let render = |source: &str| ChatTemplate::new(source, "", "").unwrap().render(&[], false);
    // What Python's json.dumps writes for the same arguments.
    assert_eq!(render("{{ {'a': [1, 'é']} | tojson(separators=(',', ':')) }}").unwrap(), r#"{"a":[1,"é"]}"#);
    assert_eq!(render("{{ 'é😀' | tojson(ensure_ascii=true) }}").unwrap(), r#""\u00e9\ud83d\ude00""#);
    assert_eq!(render("{{ 'é' | tojson(ensure_ascii=false) }}").unwrap(), r#""é""#);
    assert!(render("{{ [1] | tojson(separators=(',',)) }}").is_err());
    assert!(render("{{ [1] | tojson(bogus=1) }}").is_err());
}

/// Today's date as `strftime(format)`, by Blink's own `strftime_now` (tested against known
/// dates in the crate's unit tests).
fn today(format: &str) -> String {
    ChatTemplate::new(format!("{{{{ strftime_now('{format}') }}}}"), "", "").unwrap().render(&[], false).unwrap()
}

#[test]
fn family_templates_render_as_llama_cpps_server_renders_them() {
    // The vendors' templates of Gemma 2, Phi-3.5, SmolLM3, Granite 3.3, Qwen3 (as
    // Qwen3-MoE), Mistral Nemo and OLMo 2 Instruct, rendered by llama-server's
    // /apply-template with the default model's special tokens
    // (scripts/llamacpp_ref/make_chat_golden.py).
    let path = golden_dir().join("chat-templates.json");
    let golden: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("golden file")).expect("JSON");
    let (bos, eos) = (golden["bos_token"].as_str().unwrap(), golden["eos_token"].as_str().unwrap());
    // Granite writes today's date when no system message is given: the golden's day, as
    // the template formats it, becomes today's.
    let rendered_on: Vec<u32> = golden["rendered_on"].as_str().unwrap().split('-').map(|p| p.parse().unwrap()).collect();
    let months = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October", "November", "December"];
    let then = format!("{} {:02}, {}", months[rendered_on[1] as usize - 1], rendered_on[2], rendered_on[0]);
    let families = golden["families"].as_array().unwrap();
    assert_eq!(families.len(), 7);
    for family in families {
        let name = family["family"].as_str().unwrap();
        let tmpl = ChatTemplate::new(family["template"].as_str().unwrap(), bos, eos).unwrap_or_else(|e| panic!("{name}: {e}"));
        for case in family["cases"].as_array().unwrap() {
            let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
            let want = case["prompt"].as_str().unwrap().replace(&then, &today("%B %d, %Y"));
            let got = tmpl.render(&messages, true).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(got, want, "{name}: {messages:?}");
        }
    }
}
