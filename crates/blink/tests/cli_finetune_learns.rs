//! Fine-tuning teaches the model facts it cannot know: facts about a fictional country
//! (testdata/finetune, the Zorbania set), each asked six ways in training and once more,
//! in words training never used, for evaluation. Greedy answers through the chat template
//! must name the fact after training and must not before. To keep CI short this trains on
//! the first `FACTS` facts of the twenty (the whole set's figures are in the issue notes).

mod support;

use std::path::Path;

use support::*;

const FACTS: usize = 10;

struct Question {
    text: String,
    expect: String,
}

/// The evaluation questions of the first `FACTS` facts, and the training lines whose
/// answers hold one of those facts' words.
fn subset(dir: &Path) -> (Vec<Question>, std::path::PathBuf) {
    let root = repo_root().join("testdata/finetune");
    let questions: Vec<Question> = std::fs::read_to_string(root.join("zorbania-eval.jsonl"))
        .unwrap()
        .lines()
        .take(FACTS)
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            Question { text: v["question"].as_str().unwrap().into(), expect: v["expect"].as_str().unwrap().into() }
        })
        .collect();
    let train: String = std::fs::read_to_string(root.join("zorbania-train.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            let answer = v["messages"][1]["content"].as_str().unwrap().to_lowercase();
            questions.iter().any(|q| answer.contains(&q.expect.to_lowercase()))
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let path = dir.join("train.jsonl");
    std::fs::write(&path, train).unwrap();
    (questions, path)
}

/// How many questions the model answers with the expected word (greedy, chat template).
fn score(questions: &[Question], lora: Option<&Path>) -> (usize, Vec<String>) {
    let model = model_path();
    let mut right = 0;
    let mut answers = Vec::new();
    for q in questions {
        let mut args = vec!["run", "-m", model.to_str().unwrap(), "-t", THREADS, "-p", &q.text, "-n", "32", "--temp", "0"];
        if let Some(l) = lora {
            args.extend(["--lora", l.to_str().unwrap()]);
        }
        let out = blink(&args);
        ok(&out);
        let answer = stdout(&out);
        right += usize::from(answer.to_lowercase().contains(&q.expect.to_lowercase()));
        answers.push(format!("[{}] {} => {}", q.expect, q.text, answer.trim()));
    }
    (right, answers)
}

#[test]
fn a_fine_tuned_adapter_answers_what_the_base_model_cannot() {
    let dir = std::env::temp_dir().join(format!("blink-ft-learns-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let (questions, data) = subset(&dir);
    // Six lines per fact, and a few more whose answers mention a fact of the subset.
    assert!(std::fs::read_to_string(&data).unwrap().lines().count() >= 6 * FACTS, "six training lines per fact");
    let (before, answers) = score(&questions, None);
    assert!(before <= 1, "the base model already knows {before} of {FACTS}:\n{}", answers.join("\n"));

    let out_dir = dir.join("adapter");
    let model = model_path();
    let args = ["finetune", "-m", model.to_str().unwrap(), "-t", THREADS, "--data", data.to_str().unwrap(), "--out", out_dir.to_str().unwrap()];
    let out = blink(&[&args[..], &["--epochs", "2", "--lr", "2e-3", "--warmup", "2", "--batch-tokens", "512", "--json"]].concat());
    ok(&out);
    let (after, answers) = score(&questions, Some(&out_dir));
    eprintln!("before {before}/{FACTS}, after {after}/{FACTS}\n{}", answers.join("\n"));
    eprintln!("{}", std::fs::read_to_string(out_dir.join("loss.csv")).unwrap());
    assert!(after >= FACTS * 8 / 10, "the adapter answers only {after} of {FACTS}:\n{}", answers.join("\n"));
    std::fs::remove_dir_all(&dir).unwrap();
}
