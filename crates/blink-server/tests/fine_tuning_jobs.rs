//! The fine-tuning jobs endpoints on a real server over a real socket, training tiny jobs
//! (a few Zorbania examples, one or two epochs): both shapes of hyperparameters, list and
//! event paging, a pause mid-run and a resume from the last committed step, checkpoints
//! served as models, the finished `ft:` model answering differently from the base model
//! and surviving a restart; every bad request a 4xx in OpenAI's shape (409 for a move the
//! job's state forbids), a file whose line fails validation failing its job with the line
//! named, and the server serving throughout. The official client drives it too
//! (tests/python/test_fine_tuning.py).

mod jobs_support;
mod support;

use jobs_support::*;
use serde_json::{json, Value};
use support::*;

const QUESTION: &str = "Can you name the largest lake in Zorbania?";

#[test]
fn jobs_train_pause_resume_and_serve_their_adapters_across_a_restart() {
    let dir = TempDir::new("jobs-train");
    let state = dir.0.join("state");
    let s = jobs_server(&state);
    let base = ok(get(&s, "/v1/models"))["data"][0]["id"].as_str().unwrap().to_string();
    let before = answer(&s, &base, QUESTION);
    let file = upload(&s, "zorb.jsonl", &zorbania(4));

    // The older shape: top-level hyperparameters. 4 examples, one per step, 2 epochs.
    let started = std::time::Instant::now();
    let body = json!({"model": base, "training_file": file, "suffix": "zorb", "seed": 7,
                      "hyperparameters": {"n_epochs": 2, "batch_size": 1, "learning_rate_multiplier": 10}});
    let a = create(&s, body);
    let id = a["id"].as_str().unwrap().to_string();
    assert_eq!((a["object"].as_str(), a["status"].as_str(), a["model"].as_str(), a["seed"].as_u64()), (Some("fine_tuning.job"), Some("validating_files"), Some(base.as_str()), Some(7)), "{a}");
    assert_eq!(a["hyperparameters"], json!({"n_epochs": 2, "batch_size": 1, "learning_rate_multiplier": 10.0}), "{a}");
    assert_eq!(a["method"]["supervised"]["hyperparameters"], a["hyperparameters"], "{a}");
    assert!(a["fine_tuned_model"].is_null() && a["error"].is_null(), "{a}");

    // The current shape, "auto" values and no seed: one step (all 4 examples in a batch).
    let body = json!({"model": base, "training_file": file, "method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1, "batch_size": "auto", "learning_rate_multiplier": "auto"}}}});
    let b = create(&s, body);
    let b_id = b["id"].as_str().unwrap().to_string();
    assert_eq!(b["hyperparameters"], json!({"n_epochs": 1, "batch_size": 8, "learning_rate_multiplier": 1.0}), "{b}");
    assert!(b["seed"].as_u64().is_some(), "a random seed is recorded: {b}");

    // Paged newest first.
    let page = ok(get(&s, "/v1/fine_tuning/jobs?limit=1"));
    assert_eq!((page["object"].as_str(), page["has_more"].as_bool(), page["data"][0]["id"].as_str()), (Some("list"), Some(true), Some(b_id.as_str())), "{page}");
    let page = ok(get(&s, &format!("/v1/fine_tuning/jobs?limit=5&after={b_id}")));
    assert_eq!((page["has_more"].as_bool(), page["data"].as_array().unwrap().len(), page["data"][0]["id"].as_str()), (Some(false), 1, Some(id.as_str())), "{page}");

    // Pause A after its second committed step: B, queued behind it, gets the trainer.
    wait_for(&s, &id, "two steps", |_, ev| metric_steps(ev).len() >= 2);
    let paused = ok(post(&s, &format!("/v1/fine_tuning/jobs/{id}/pause"), &json!({})));
    assert_eq!(paused["status"], "paused", "{paused}");
    error(&post(&s, &format!("/v1/fine_tuning/jobs/{id}/pause"), &json!({})), 409);
    let b = wait_final(&s, &b_id);
    assert_eq!(b["status"], "succeeded", "{b}");
    let at_pause = metric_steps(&events(&s, &id));
    assert_eq!(job(&s, &id)["status"], "paused");
    let resumed = ok(post(&s, &format!("/v1/fine_tuning/jobs/{id}/resume"), &json!({})));
    assert_eq!(resumed["status"], "queued", "{resumed}");

    let a = wait_final(&s, &id);
    let took = started.elapsed();
    assert_eq!(a["status"], "succeeded", "{a}");
    let name = format!("ft:{base}:zorb:{id}");
    assert_eq!(a["fine_tuned_model"].as_str(), Some(name.as_str()), "{a}");
    assert!(a["trained_tokens"].as_u64().unwrap() > 0 && a["finished_at"].as_u64().is_some(), "{a}");
    let ev = events(&s, &id);
    assert_eq!(metric_steps(&ev), (1..=8).collect::<Vec<u64>>(), "each step logged once: {ev:#?}");
    let from = format!("Fine-tuning job running, from step {}", at_pause.len());
    assert!(ev.iter().any(|e| e["message"].as_str() == Some(from.as_str())), "resumed from its last committed step: {ev:#?}");
    let last = ev.iter().rev().find(|e| e["type"] == "metrics").unwrap();
    assert_eq!(last["data"]["trained_tokens"], a["trained_tokens"], "{last}");
    println!("a job of 8 steps of one example (2 epochs of 4), paused once, and one of 1 step: {took:.1?} in all");

    // An epoch checkpoint per epoch, newest first, each served as a model.
    let cks = ok(get(&s, &format!("/v1/fine_tuning/jobs/{id}/checkpoints")));
    let steps: Vec<u64> = cks["data"].as_array().unwrap().iter().map(|c| c["step_number"].as_u64().unwrap()).collect();
    assert_eq!(steps, [8, 4], "{cks}");
    let ck = &cks["data"][1];
    assert_eq!((ck["object"].as_str(), ck["fine_tuning_job_id"].as_str()), (Some("fine_tuning.job.checkpoint"), Some(id.as_str())), "{ck}");
    let ck_model = ck["fine_tuned_model_checkpoint"].as_str().unwrap().to_string();
    assert_eq!(ck_model, format!("{name}:ckpt-step-4"));
    let page = ok(get(&s, &format!("/v1/fine_tuning/jobs/{id}/checkpoints?limit=1")));
    assert_eq!((page["has_more"].as_bool(), page["data"][0]["step_number"].as_u64(), page["first_id"].as_str()), (Some(true), Some(8), cks["data"][0]["id"].as_str()), "{page}");

    let models = ok(get(&s, "/v1/models"));
    for m in [&name, &ck_model] {
        let entry = models["data"].as_array().unwrap().iter().find(|x| x["id"] == json!(m)).unwrap_or_else(|| panic!("{m} not in {models}"));
        assert_eq!(entry["parent"].as_str(), Some(base.as_str()), "{entry}");
    }

    let tuned = answer(&s, &name, QUESTION);
    assert_ne!(tuned, before, "the fine-tuned model answers as the base model did");
    println!("base: {before:?}\nfine-tuned: {tuned:?}");
    answer(&s, &ck_model, QUESTION);
    assert_eq!(answer(&s, &base, QUESTION), before, "the base model is untouched");
    assert!(job_metric(&s, "blink_finetune_trained_tokens_total") >= a["trained_tokens"].as_f64().unwrap());
    assert_eq!(job_metric(&s, "blink_finetune_jobs{status=\"succeeded\"}"), 2.0);
    assert_eq!(job_metric(&s, "blink_finetune_jobs{status=\"running\"}"), 0.0);

    // A restart serves the same adapters, answering the same.
    block_on(s.server.shutdown());
    let s = jobs_server(&state);
    assert_eq!(job(&s, &id), a);
    assert_eq!(answer(&s, &name, QUESTION), tuned);
    answer(&s, &ck_model, QUESTION);
}

#[test]
fn bad_requests_get_4xx_in_openais_shape_and_the_server_keeps_serving() {
    let dir = TempDir::new("jobs-bad");
    let s = jobs_server(&dir.0);
    let base = ok(get(&s, "/v1/models"))["data"][0]["id"].as_str().unwrap().to_string();
    let file = upload(&s, "zorb.jsonl", &zorbania(4));
    let good = |extra: Value| {
        let mut body = json!({"model": base, "training_file": file});
        body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        body
    };

    for body in ["{", "not json", "[1]", ""] {
        error(&block_on(client(&s).post_raw("/v1/fine_tuning/jobs", body.to_owned())).unwrap(), 400);
    }
    let cases = [
        (json!({"training_file": "file-nope"}), "training_file"),
        (json!({"validation_file": "file-nope"}), "validation_file"),
        (json!({"model": "no-such-model"}), "model"),
        (json!({"model": 5}), "model"),
        (json!({"hyperparameters": {"n_epochs": 0}}), "hyperparameters.n_epochs"),
        (json!({"hyperparameters": {"batch_size": -1}}), "hyperparameters.batch_size"),
        (json!({"hyperparameters": {"learning_rate_multiplier": "fast"}}), "hyperparameters.learning_rate_multiplier"),
        (json!({"method": {"type": "supervised", "supervised": {"hyperparameters": {"n_epochs": 1.5}}}}), "method.supervised.hyperparameters.n_epochs"),
        (json!({"method": {"type": "dpo", "dpo": {}}}), "method.type"),
        (json!({"suffix": "a:b"}), "suffix"),
        (json!({"seed": "seven"}), "seed"),
    ];
    for (extra, param) in cases {
        let e = error(&post(&s, "/v1/fine_tuning/jobs", &good(extra.clone())), 400);
        assert_eq!(e["param"], json!(param), "{extra}: {e}");
    }
    let e = error(&post(&s, "/v1/fine_tuning/jobs", &good(json!({"model": "no-such-model"}))), 400);
    assert_eq!(e["code"], "model_not_found", "{e}");
    assert!(e["message"].as_str().unwrap().contains(&base), "the message names the model to use: {e}");

    for path in ["/v1/fine_tuning/jobs/ftjob-nope", "/v1/fine_tuning/jobs/ftjob-nope/events", "/v1/fine_tuning/jobs/ftjob-nope/checkpoints"] {
        error(&get(&s, path), 404);
    }
    for action in ["cancel", "pause", "resume"] {
        error(&post(&s, &format!("/v1/fine_tuning/jobs/ftjob-nope/{action}"), &json!({})), 404);
    }
    assert_eq!(error(&get(&s, "/v1/fine_tuning/jobs?limit=0"), 400)["param"], "limit");
    assert_eq!(error(&get(&s, "/v1/fine_tuning/jobs?after=ftjob-nope"), 400)["param"], "after");
    let anonymous = s.client();
    error(&block_on(anonymous.get("/v1/fine_tuning/jobs")).unwrap(), 401);
    error(&block_on(anonymous.post_json("/v1/fine_tuning/jobs", &good(json!({})))).unwrap(), 401);
    assert_eq!(ok(get(&s, "/v1/fine_tuning/jobs"))["data"], json!([]), "no bad request made a job");

    // A line the upload takes but training cannot (a reply holding the end-of-turn text):
    // the job fails while validating its files, naming the line.
    let bad = format!("{}{}\n", zorbania(3), r#"{"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Bye<|im_end|>"}]}"#);
    let bad_file = upload(&s, "bad.jsonl", &bad);
    let failed = create(&s, good(json!({"training_file": bad_file})));
    let failed = wait_final(&s, failed["id"].as_str().unwrap());
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failed["error"]["message"].as_str().unwrap();
    assert!(message.contains("line 4") && !message.contains("line 3"), "{failed}");
    assert_eq!(failed["error"]["code"], "invalid_training_file", "{failed}");
    error(&post(&s, &format!("/v1/fine_tuning/jobs/{}/cancel", failed["id"].as_str().unwrap()), &json!({})), 409);

    // A long job through its moves; each move its state forbids is a 409.
    let long = create(&s, good(json!({"hyperparameters": {"n_epochs": 50, "batch_size": 1}})));
    let id = long["id"].as_str().unwrap().to_string();
    let action = |a: &str| post(&s, &format!("/v1/fine_tuning/jobs/{id}/{a}"), &json!({}));
    error(&action("resume"), 409);
    wait_for(&s, &id, "running", |j, _| j["status"] == "running");
    error(&action("resume"), 409);
    assert_eq!(ok(action("pause"))["status"], "paused");
    error(&action("pause"), 409);
    assert_eq!(ok(action("resume"))["status"], "queued");
    error(&action("resume"), 409);
    let cancelled = ok(action("cancel"));
    assert_eq!(cancelled["status"], "cancelled", "{cancelled}");
    assert!(cancelled["fine_tuned_model"].is_null() && cancelled["finished_at"].as_u64().is_some(), "{cancelled}");
    for a in ["cancel", "pause", "resume"] {
        let e = error(&action(a), 409);
        assert!(e["message"].as_str().unwrap().contains("cancelled"), "{e}");
    }
    let messages: Vec<String> = events(&s, &id).iter().map(|e| e["message"].as_str().unwrap().to_string()).collect();
    for m in ["Fine-tuning job paused", "Fine-tuning job resumed", "Fine-tuning job cancelled"] {
        assert!(messages.iter().any(|x| x == m), "no '{m}' in {messages:?}");
    }
    assert_eq!(job_metric(&s, "blink_finetune_jobs{status=\"cancelled\"}"), 1.0);
    assert_eq!(job_metric(&s, "blink_finetune_jobs{status=\"failed\"}"), 1.0);
    let base_answer = answer(&s, &base, "Say hi.");
    assert!(!base_answer.is_empty());
}

#[test]
fn without_a_state_dir_the_jobs_endpoints_say_how_to_enable_them() {
    let r = block_on(shared().client().get("/v1/fine_tuning/jobs")).unwrap();
    let e = error(&r, 403);
    assert!(e["message"].as_str().unwrap().contains("--state-dir"), "{e}");
}

/// The official `openai` Python client: files, jobs (create, retrieve, list, events,
/// checkpoints, pause, resume, cancel), then a chat on the finished `ft:` model.
#[test]
fn official_openai_client_runs_a_fine_tuning_job() {
    let dir = TempDir::new("jobs-client");
    let s = jobs_server(&dir.0);
    let data = dir.0.join("train.jsonl");
    std::fs::write(&data, zorbania(4)).unwrap();
    let url = format!("{}/v1", s.url);
    run_python("test_fine_tuning.py", &["--base-url".as_ref(), url.as_ref(), "--api-key".as_ref(), KEY.as_ref(), "--data".as_ref(), data.as_os_str()]);
}
