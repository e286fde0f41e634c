//! The JSONL reader's validation: every bad line is refused with its number and reason.

use blink_train::data::{parse_jsonl, DataError, Role, MAX_LISTED};

const GOOD: &str = r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}"#;

/// The single bad line's reason, asserting that the error names exactly `line`.
fn refused(text: &str, line: usize) -> String {
    let err = parse_jsonl(text.as_bytes()).expect_err("the file must be refused");
    let lines = err.line_errors().unwrap_or_else(|| panic!("not a line error: {err}"));
    assert_eq!(lines.0.len(), 1, "{err}");
    assert_eq!(lines.0[0].line, line, "{err}");
    assert!(err.to_string().contains(&format!("line {line}: ")), "{err}");
    lines.0[0].reason.clone()
}

fn file(lines: &[&str]) -> String {
    lines.join("\n") + "\n"
}

#[test]
fn good_lines_parse() {
    let text = file(&[
        GOOD,
        r#"{"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A", "weight": 0}, {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "B", "weight": 1}]}"#,
    ]);
    let c = parse_jsonl(text.as_bytes()).unwrap();
    assert_eq!(c.len(), 2);
    assert_eq!((c[0].line, c[1].line), (1, 2));
    assert_eq!(c[0].messages[1].role, Role::Assistant);
    assert_eq!(c[0].messages[1].content, "Hello.");
    assert!(c[0].messages[1].learn && !c[0].messages[0].learn);
    let learn: Vec<bool> = c[1].messages.iter().map(|m| m.learn).collect();
    assert_eq!(learn, [false, false, false, false, true]);
}

#[test]
fn windows_line_ends_a_byte_order_mark_and_trailing_blank_lines_are_fine() {
    let text = format!("\u{feff}{GOOD}\r\n{GOOD}\r\n\r\n  \n");
    let c = parse_jsonl(text.as_bytes()).unwrap();
    assert_eq!(c.len(), 2);
    // No final newline at all is fine too.
    assert_eq!(parse_jsonl(GOOD.as_bytes()).unwrap().len(), 1);
}

#[test]
fn an_empty_file_is_refused() {
    for text in ["", "\n", "\n  \n\n"] {
        assert!(matches!(parse_jsonl(text.as_bytes()), Err(DataError::Empty)), "{text:?}");
    }
}

#[test]
fn a_blank_line_between_examples_is_refused() {
    let reason = refused(&file(&[GOOD, "", GOOD]), 2);
    assert!(reason.contains("blank line"), "{reason}");
}

#[test]
fn malformed_json_names_its_line() {
    let reason = refused(&file(&[GOOD, GOOD, r#"{"messages": [{"role": "user", "content": "Hi"}"#]), 3);
    assert!(reason.starts_with("invalid JSON at column"), "{reason}");
    assert!(!reason.contains("at line"), "{reason}");
}

#[test]
fn structure_errors() {
    let cases: &[(&str, &str)] = &[
        (r#"[1, 2]"#, "expected a JSON object"),
        (r#"{"prompt": "x"}"#, "unsupported field `prompt`"),
        (r#"{}"#, "no `messages` field"),
        (r#"{"messages": {}}"#, "`messages` must be an array"),
        (r#"{"messages": []}"#, "`messages` is empty"),
        (r#"{"messages": ["hi"]}"#, "messages[0] must be an object"),
        (r#"{"messages": [{"content": "x"}]}"#, "messages[0] has no `role`"),
        (r#"{"messages": [{"role": 3, "content": "x"}]}"#, "messages[0].role must be a string"),
        (r#"{"messages": [{"role": "user", "content": "x", "name": "bob"}, {"role": "assistant", "content": "y"}]}"#, "unsupported field `name`"),
        (r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null}]}"#, "messages[1].content must be a string, not null"),
    ];
    for (line, want) in cases {
        let reason = refused(&file(&[GOOD, line]), 2);
        assert!(reason.contains(want), "{line}: {reason}");
    }
}

#[test]
fn a_message_without_content_is_refused() {
    let reason = refused(&file(&[r#"{"messages": [{"role": "user"}, {"role": "assistant", "content": "y"}]}"#]), 1);
    assert_eq!(reason, "messages[0] has no `content`");
}

#[test]
fn an_unknown_role_is_refused() {
    let reason = refused(&file(&[GOOD, r#"{"messages": [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "y"}]}"#]), 2);
    assert!(reason.contains("role `tool`") && reason.contains("only system, user and assistant"), "{reason}");
}

#[test]
fn a_weight_other_than_0_or_1_is_refused() {
    for w in ["2", "-1", "0.5", "true", "\"1\""] {
        let line = format!(r#"{{"messages": [{{"role": "user", "content": "x"}}, {{"role": "assistant", "content": "y", "weight": {w}}}]}}"#);
        let reason = refused(&file(&[&line]), 1);
        assert!(reason.contains("messages[1].weight must be 0 or 1"), "{w}: {reason}");
    }
}

#[test]
fn a_weight_on_a_user_message_is_refused() {
    let reason = refused(&file(&[r#"{"messages": [{"role": "user", "content": "x", "weight": 1}, {"role": "assistant", "content": "y"}]}"#]), 1);
    assert!(reason.contains("only allowed on assistant messages (this one is `user`)"), "{reason}");
}

#[test]
fn a_conversation_without_an_assistant_turn_is_refused() {
    let reason = refused(&file(&[GOOD, r#"{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "x"}]}"#]), 2);
    assert!(reason.contains("no assistant message"), "{reason}");
}

#[test]
fn all_assistant_weights_zero_is_refused() {
    let line = r#"{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y", "weight": 0}, {"role": "user", "content": "x"}, {"role": "assistant", "content": "z", "weight": 0}]}"#;
    let reason = refused(&file(&[line]), 1);
    assert!(reason.contains("every assistant message has weight 0"), "{reason}");
}

#[test]
fn a_line_that_is_not_utf8_is_refused() {
    let mut bytes = format!("{GOOD}\n").into_bytes();
    bytes.extend_from_slice(b"{\"messages\": \xff}\n");
    let err = parse_jsonl(&bytes).unwrap_err();
    let lines = err.line_errors().unwrap();
    assert_eq!(lines.0[0].line, 2);
    assert!(lines.0[0].reason.contains("not UTF-8"), "{err}");
}

#[test]
fn every_bad_line_is_listed_up_to_the_cap() {
    let text = file(&[GOOD, "nope", GOOD, "{}", r#"{"messages": []}"#]);
    let err = parse_jsonl(text.as_bytes()).unwrap_err();
    let lines: Vec<usize> = err.line_errors().unwrap().0.iter().map(|e| e.line).collect();
    assert_eq!(lines, [2, 4, 5]);
    assert!(err.to_string().starts_with("the training data was refused: 3 bad lines:"), "{err}");

    let bad = MAX_LISTED + 5;
    let text = file(&vec!["nope"; bad]);
    let err = parse_jsonl(text.as_bytes()).unwrap_err();
    assert_eq!(err.line_errors().unwrap().0.len(), bad);
    let msg = err.to_string();
    assert_eq!(msg.matches("invalid JSON").count(), MAX_LISTED, "{msg}");
    assert!(msg.ends_with("... and 5 more"), "{msg}");
    assert!(msg.contains(&format!("line {MAX_LISTED}: ")) && !msg.contains(&format!("line {}: ", MAX_LISTED + 1)), "{msg}");
}
